"""From a [[workload]] to the harness sessions that measure it on one side."""

from __future__ import annotations

from pathlib import Path

from harness import tiny_model
import json

from harness.engine_session import EnginePool, WorkerSession
from harness.serve_session import ServeSession
from harness.interleave import CommandSession, Session, SessionFactory
from harness.trials import BASELINE, CommandSpec

from .config import Config, WorkloadConfig
from .errors import AgentsearchError


class UnsupportedWorkload(AgentsearchError):
    pass


def session_factory(config: Config, workload: WorkloadConfig, worktrees: dict[str, Path], scratch: Path, pool: EnginePool | None = None) -> SessionFactory:
    """A factory (side, restart) -> Session for ``workload`` with each side in its worktree.

    Warm-engine workloads lease their engines from ``pool`` (the caller closes it)."""
    if workload.kind in ("vllm-throughput", "vllm-latency", "vllm-serve"):
        if pool is None:
            raise ValueError("warm-engine workloads need an EnginePool")
        return engine_factory(config, workload, worktrees, scratch, pool)
    if workload.kind != "command":
        raise UnsupportedWorkload(f"workload {workload.name!r}: kind {workload.kind!r} is not supported by this version yet")
    assert workload.command

    def make(side: str, restart: int) -> Session:
        env = {**config.target.env, **workload.env}
        spec = CommandSpec(
            command=workload.command or "",
            worktree=worktrees[side],
            metric=workload.metric,
            timeout_s=workload.timeout_s,
            env=env,
        )
        return CommandSession(spec, scratch / f"{workload.name}-{side}-{restart}")

    return make


def model_path(workload: WorkloadConfig) -> str:
    if workload.model != "tiny":
        return workload.model
    try:
        return str(tiny_model.ensure_in_child())
    except (RuntimeError, OSError) as exc:
        raise UnsupportedWorkload(f"workload {workload.name!r}: {exc}") from None


def engine_spec(workload: WorkloadConfig) -> dict:
    """What the warm worker needs: kind, model, engine arguments, workload parameters."""
    engine = {"enforce_eager": True, "max_model_len": 1024, "seed": 0, **workload.engine}
    return {"kind": workload.kind, "model": model_path(workload), "engine": engine, "params": dict(workload.params)}


def engine_factory(config: Config, workload: WorkloadConfig, worktrees: dict[str, Path], scratch: Path, pool: EnginePool) -> SessionFactory:
    spec = engine_spec(workload)

    env = {**config.target.env, **workload.env}
    serve = workload.kind == "vllm-serve"
    ident = json.dumps({"serve": serve, "model": spec["model"], "engine": spec["engine"], "env": env}, sort_keys=True)

    def make(side: str, restart: int) -> Session:
        key = f"{side}/{restart}/{ident}"
        n = len(pool)
        if serve:
            def engine() -> ServeSession:
                return ServeSession(spec, worktrees[side], worktrees[BASELINE], env, scratch / f"serve-{side}-{restart}-{n}",
                                    workload.metric, workload.timeout_s, workload.startup_timeout_s)
        else:
            def engine() -> WorkerSession:  # type: ignore[misc]
                return WorkerSession(spec, worktrees[side], env, scratch / f"engine-{side}-{restart}-{n}.log",
                                     workload.metric, workload.timeout_s, workload.startup_timeout_s)
        return pool.lease(key, engine, workload.kind, spec["params"], workload.metric)

    return make


def restarts_for(workload: WorkloadConfig) -> int:
    """Session restarts per evaluation (warm-engine workloads restart; commands never need to)."""
    return 1 if workload.kind == "command" else workload.restarts


__all__ = ["session_factory", "restarts_for", "UnsupportedWorkload", "BASELINE"]

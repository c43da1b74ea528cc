"""From a [[workload]] to the harness sessions that measure it on one side.

Every session is guarded: after each measurement both worktrees must be as they were built
(``Sides.check``), else the trial fails with "worktree modified during a trial".
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from harness import tiny_model

from harness.engine_session import EnginePool, WorkerSession
from harness.serve_session import ServeSession
from harness.interleave import CommandSession, Session, SessionFactory
from harness.trials import BASELINE, CommandSpec, TrialOutcome

from .config import Config, WorkloadConfig
from .errors import AgentsearchError

if TYPE_CHECKING:
    from .sides import Sides


class UnsupportedWorkload(AgentsearchError):
    pass


# share of generated tokens (greedy, same requests) a timed round must agree on with the other side
OUTPUT_AGREEMENT = 0.9


def agreement(a: tuple[tuple[int, ...], ...], b: tuple[tuple[int, ...], ...]) -> float:
    """Mean over requests of the common prefix of both sides' token ids, over the longer of the two."""
    if len(a) != len(b):
        return 0.0
    shares = []
    for x, y in zip(a, b):
        n = 0
        for p, q in zip(x, y):
            if p != q:
                break
            n += 1
        shares.append(n / max(len(x), len(y)) if (x or y) else 1.0)
    return sum(shares) / len(shares) if shares else 1.0


class OutputsMatch:
    """Timed runs prove their own outputs: what one side generated for a seed must be what the other
    side generated for the same seed (the same requests). Greedy decoding, so near-ties aside the
    tokens are equal; a side that does less work — skips requests, stops early, answers from a cache
    it could not have, or is fast only when it is not being verified — fails the trial in the act."""

    def __init__(self, threshold: float = OUTPUT_AGREEMENT):
        self.threshold = threshold
        self.seen: dict[int, tuple[str, tuple[tuple[int, ...], ...] | None, object]] = {}

    def check(self, side: str, seed: int, outcome: TrialOutcome) -> str:
        if not outcome.ok:
            return ""
        mine = (side, outcome.outputs, outcome.metrics.get("input_tokens"))
        other = self.seen.pop(seed, None)
        if other is None or other[0] == side:
            self.seen[seed] = mine
            return ""
        if (other[1] is None) != (mine[1] is None):
            return "outputs check: one side reported the tokens it generated and the other did not"
        if mine[1] is None or other[1] is None:
            return ""  # a workload without outputs (command workloads declare none)
        if other[2] != mine[2]:
            return f"outputs check: the two sides processed different inputs for seed {seed} ({other[2]} vs {mine[2]} input tokens)"
        share = agreement(other[1], mine[1])
        if share < self.threshold:
            return (f"outputs check: the tokens generated for the same requests (seed {seed}) differ between the sides: "
                    f"{share:.1%} agree, at least {self.threshold:.0%} required (greedy decoding)")
        return ""


class GuardedSession:
    """A session whose every measurement is followed by the worktree check and the outputs check."""

    def __init__(self, inner: Session, check: Callable[[], str], side: str = "", match: OutputsMatch | None = None):
        self.inner, self.check, self.side, self.match = inner, check, side, match

    def start(self) -> None:
        self.inner.start()

    def measure(self, seed: int) -> TrialOutcome:
        outcome = self.inner.measure(seed)
        why = self.check() or (self.match.check(self.side, seed, outcome) if self.match else "")
        if why:
            return dataclasses.replace(outcome, ok=False, value=None, error=why)
        return outcome

    def close(self) -> None:
        self.inner.close()


def session_factory(config: Config, workload: WorkloadConfig, sd: "Sides", pool: EnginePool | None = None,
                    out: str = "") -> SessionFactory:
    """A factory (side, restart) -> Session for ``workload`` with each side in its worktree.

    Warm-engine workloads lease their engines from ``pool`` (the caller closes it). Outputs go to the
    side's own output directory (``out`` names a sub-directory), logs where no side can read them."""
    if workload.kind in ("vllm-throughput", "vllm-latency", "vllm-serve"):
        if pool is None:
            raise ValueError("warm-engine workloads need an EnginePool")
        raw = engine_factory(config, workload, sd, pool, out)
    elif workload.kind != "command":
        raise UnsupportedWorkload(f"workload {workload.name!r}: kind {workload.kind!r} is not supported by this version yet")
    else:
        assert workload.command

        def raw(side: str, restart: int) -> Session:
            env = {**config.target.env, **workload.env}
            spec = CommandSpec(
                command=workload.command or "",
                worktree=sd.worktrees[side],
                metric=workload.metric,
                timeout_s=workload.timeout_s,
                env=env,
            )
            return CommandSession(spec, sd.out(side) / (out or "trials") / f"{workload.name}-{restart}")

    match = OutputsMatch()

    def make(side: str, restart: int) -> Session:
        return GuardedSession(raw(side, restart), sd.check, side, match)

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


def engine_factory(config: Config, workload: WorkloadConfig, sd: "Sides", pool: EnginePool, out: str = "") -> SessionFactory:
    spec = engine_spec(workload)
    worktrees, logs = sd.worktrees, sd.logs / (out or "engines")

    env = {**config.target.env, **workload.env}
    serve = workload.kind == "vllm-serve"
    ident = json.dumps({"serve": serve, "model": spec["model"], "engine": spec["engine"], "env": env}, sort_keys=True)

    def make(side: str, restart: int) -> Session:
        key = f"{side}/{restart}/{ident}"
        n = len(pool)
        if serve:
            def engine() -> ServeSession:
                return ServeSession(spec, worktrees[side], worktrees[BASELINE], env, logs / f"serve-{side}-{restart}-{n}",
                                    workload.metric, workload.timeout_s, workload.startup_timeout_s)
        else:
            def engine() -> WorkerSession:  # type: ignore[misc]
                return WorkerSession(spec, worktrees[side], env, logs / f"engine-{side}-{restart}-{n}.log",
                                     workload.metric, workload.timeout_s, workload.startup_timeout_s)
        return pool.lease(key, engine, workload.kind, spec["params"], workload.metric)

    return make


def restarts_for(workload: WorkloadConfig) -> int:
    """Session restarts per evaluation (warm-engine workloads restart; commands never need to)."""
    return 1 if workload.kind == "command" else workload.restarts


__all__ = ["session_factory", "restarts_for", "UnsupportedWorkload", "BASELINE"]

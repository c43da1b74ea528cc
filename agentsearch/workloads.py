"""From a [[workload]] to the harness sessions that measure it on one side."""

from __future__ import annotations

from pathlib import Path

from harness.interleave import CommandSession, Session, SessionFactory
from harness.trials import BASELINE, CommandSpec

from .config import Config, WorkloadConfig
from .errors import AgentsearchError


class UnsupportedWorkload(AgentsearchError):
    pass


def session_factory(config: Config, workload: WorkloadConfig, worktrees: dict[str, Path], scratch: Path) -> SessionFactory:
    """A factory (side, restart) -> Session for ``workload`` with each side in its worktree."""
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


def restarts_for(workload: WorkloadConfig) -> int:
    """Session restarts per evaluation (warm-engine workloads restart; commands never need to)."""
    return 1 if workload.kind == "command" else 2


__all__ = ["session_factory", "restarts_for", "UnsupportedWorkload", "BASELINE"]

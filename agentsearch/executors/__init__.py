"""Where evaluations run: ``local`` (in this process, one after another: the episode loop as it
always was) or ``ray`` (in parallel, one evaluation per node of a Ray cluster).

``node`` is the code a worker node runs (a git bundle in, an ``Evaluation`` out);
``ray_executor`` places those evaluations on the cluster. The orchestrator (``agentsearch.loop``)
stays the one writer of the history and the one mover of the baseline.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..config import ExecutorConfig
from ..errors import ConfigError
from .node import Job, NodeInfo, NodeResult


def settings(
    config: ExecutorConfig, kind: str | None = None, parallel: int | None = None, address: str | None = None
) -> ExecutorConfig:
    """The [executor] config with the command line's overrides, validated like the file."""
    import dataclasses

    changes: dict[str, Any] = {
        k: v for k, v in (("kind", kind), ("parallel", parallel), ("address", address)) if v is not None
    }
    try:
        return dataclasses.replace(config, **changes)
    except ValueError as exc:
        msg, _, key = str(exc).rpartition("|")
        raise ConfigError(f"--{key}: {msg}") from None


def build(
    s: ExecutorConfig, run_errors: tuple[type[BaseException], ...], say: Callable[[str, str], None] | None = None
) -> Any:
    """The Ray executor for ``s`` (the local one is the episode loop itself)."""
    from .ray_executor import RayExecutor

    return RayExecutor(s.address, s.parallel, s.cpus, s.gpus, s.drain_after, run_errors, say)


__all__ = ["Job", "NodeInfo", "NodeResult", "build", "settings"]

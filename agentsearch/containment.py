"""Where measured code runs: the bubblewrap sandbox policy, in one place.

``decide(config)`` says whether this machine and the target's ``[gate] sandbox`` policy give a
sandbox (and the verdict detail when not); ``contained(...)`` runs a block with every child
process of both sides inside it — the state directory, history and harness (with its
corpus) hidden, no network, writes only to the worktrees and the scratch directory.
Evaluate, verify, calibrate and profile all measure under the same conditions.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

from harness import coverage, sandbox

from .config import Config
from .workspace import Workspace


@dataclass(frozen=True)
class Decision:
    use: bool
    status: str  # pass | skipped | fail (as the gate's check)
    detail: str


def decide(config: Config) -> Decision:
    policy = config.gate.sandbox
    if policy == "off":
        return Decision(False, "skipped", "disabled by [gate] sandbox = off: candidate code ran with network and could read the state directory")
    ok, why = sandbox.probe()
    if ok:
        return Decision(True, "pass", "bubblewrap: no network (serving: loopback), read-only system, state, history and harness hidden")
    if policy == "required":
        return Decision(False, "fail", f"[gate] sandbox = required but {why}")
    return Decision(False, "skipped", f"not sandboxed: {why}")


def sandbox_for(ws: Workspace, worktrees: Mapping[str, Path], scratch: Path) -> sandbox.Sandbox:
    """Both sides run with the state directory, history and harness (with its corpus) hidden."""
    import agentsearch
    import harness
    import history
    from harness.engine_session import WORKER

    hide = [str(ws.state)] + [str(Path(m.__file__).resolve().parent) for m in (agentsearch, harness, history)]
    return sandbox.Sandbox(
        hide=tuple(dict.fromkeys(hide)), writable=(*map(str, worktrees.values()), str(scratch)),
        # HOME/TMPDIR: short (unix socket paths, e.g. vLLM's ZMQ ipc sockets, allow 107 bytes)
        expose=(str(WORKER), str(coverage.TRACER_DIR)), home=tempfile.mkdtemp(prefix="agentsearch-"),
    )


@contextlib.contextmanager
def contained(ws: Workspace, decision: Decision, worktrees: Mapping[str, Path], scratch: Path) -> Iterator[sandbox.Sandbox | None]:
    """Run the block with every child inside the sandbox (when ``decision.use``)."""
    sb = sandbox_for(ws, worktrees, scratch) if decision.use else None
    try:
        with sandbox.use(sb):
            yield sb
    finally:
        if sb is not None:
            shutil.rmtree(sb.home, ignore_errors=True)

"""Whether measured code runs sandboxed: the ``[gate] sandbox`` policy, in one place.

``decide(config)`` says whether this machine and the target's policy give a sandbox, and the
gate's ``sandbox`` check: ``pass`` when every child of both sides runs in its own bubblewrap
sandbox (``agentsearch.sides`` builds them); ``review`` when it cannot (``auto`` on a machine
without bubblewrap) or must not (``off``) — code that ran unconfined is never merged
automatically; ``fail`` when ``required`` and the machine cannot.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness import sandbox

from .config import Config


@dataclass(frozen=True)
class Decision:
    use: bool
    status: str  # pass | review | fail (as the gate's check)
    detail: str


def decide(config: Config) -> Decision:
    policy = config.gate.sandbox
    if policy == "off":
        return Decision(
            False,
            "review",
            "disabled by [gate] sandbox = off: candidate code ran unconfined "
            "(network, state directory, the other side); held for review",
        )
    ok, why = sandbox.probe()
    if ok:
        return Decision(
            True,
            "pass",
            "bubblewrap per side: only its own worktree and outputs writable, protected files pinned "
            "read-only, the other side, state, history and harness not mounted, private /tmp, /dev/shm and $HOME, "
            "no network (serving: loopback)",
        )
    if policy == "required":
        return Decision(False, "fail", f"[gate] sandbox = required but {why}")
    return Decision(False, "review", f"not sandboxed: {why}; held for review")

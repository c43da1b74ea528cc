"""Proposers: where candidate changes come from (patch queue, configuration sweep, agent).

A proposer offers ``Candidate``s one at a time; the episode loop applies each to a fresh
proposal worktree on the *current* baseline (so queued proposals are always re-based onto
the latest merge), commits it, and judges it. A proposer is rebuilt on ``--resume`` from the
manifest recorded when the episode started, so its queue never depends on the file system
after that.
"""

from .base import Candidate, Context, Proposer, ProposerError
from .registry import PROPOSERS, build, rebuild

__all__ = ["PROPOSERS", "Candidate", "Context", "Proposer", "ProposerError", "build", "rebuild"]

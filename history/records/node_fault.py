"""``node-fault``: a parallel evaluation lost with its node or worker process (judged again elsewhere, same seeds)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import Record


@dataclass(frozen=True)
class NodeFault(Record):
    KIND: ClassVar[str] = "node-fault"

    number: int
    proposal: str
    node: str  # the Ray node id
    error: str  # what Ray (or the node code) said
    attempt: int  # the lost attempt (1 = the first)
    drained: bool  # the node gets no more work in this episode

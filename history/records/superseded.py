"""``superseded``: a parallel episode's result measured against a baseline that a merge moved since.

Kept for the record (its verdict, statistics and trials), never merged on: the proposal is judged
again on the new baseline and that verdict is the one that counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .base import Record


@dataclass(frozen=True)
class Superseded(Record):
    KIND: ClassVar[str] = "superseded"

    number: int
    proposal: str
    baseline: str  # the baseline it was measured against
    new_baseline: str  # the baseline it is judged again on
    candidate: str
    seed: int
    verdict: str | None  # what that measurement said (None: the node returned an error)
    reasons: tuple[str, ...] = ()
    node: Mapping[str, Any] = field(default_factory=dict)  # node id, host name, environment fingerprint, attempt
    statistics: tuple[Mapping[str, Any], ...] = ()  # one per workload (a statistic's fields)
    trials: tuple[Mapping[str, Any], ...] = ()  # side, workload, seed, value, ok of each trial

"""``trial``: one timed run of one side of one pair (harness.trials.TrialRecord plus where it belongs)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .base import Record


@dataclass(frozen=True)
class Trial(Record):
    KIND: ClassVar[str] = "trial"
    OPEN: ClassVar[bool] = True  # harness.trials.TrialRecord may grow fields; they are kept in ``extra``

    number: int  # the proposal's number in its episode
    candidate: str  # commits of the two sides
    baseline: str
    measurement: str  # key of (tree of this side, workload, seed, environment): the same measurement twice
    workload: str
    side: str  # baseline | candidate
    seed: int
    pair: int
    position: int  # 0 = first of its pair, 1 = second
    order: str  # "AB" (baseline first) or "BA"
    session: int  # engine/session restart index
    ok: bool
    value: float | None  # the metric (None when the trial failed)
    metrics: Mapping[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    error: str = ""  # for people: why it failed
    stderr_tail: str = ""
    phase: str = "objective"  # objective | guard | confirmation | calibration
    failure: str = ""  # a FailureKind value when it failed (crash, timeout, changed-outputs); '' when ok or older
    extra: Mapping[str, Any] = field(default_factory=dict, kw_only=True)

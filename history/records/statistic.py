"""``statistic``: one workload's sequential comparison (agentsearch.evaluation.WorkloadSummary)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .base import Record


@dataclass(frozen=True)
class Statistic(Record):
    KIND: ClassVar[str] = "statistic"
    OPEN: ClassVar[bool] = True  # a summary may grow fields; they are kept in ``extra``

    number: int
    name: str  # the workload
    role: str  # objective | guard | confirmation
    pairs: int
    max_pairs: int
    decision: str  # harness.sequential: win, lose, inconclusive, ok, regressed, not-confirmed, failed, not-run
    reason: str  # for people
    speedup: float | None
    ci: tuple[float, ...] | None
    p_value: float | None
    baseline_median: float | None
    candidate_median: float | None
    winsorized: int
    calibrated: bool
    metric: str = ""
    unit: str = ""
    early_stop: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict, kw_only=True)

"""One workload's sequential comparison: ``WorkloadSummary`` (a part of every verdict and evaluation record, and
what ``agentsearch.evaluation`` measures) and the ``statistic`` record that logs it on its own."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, TypeVar

from .base import Part, Record

S = TypeVar("S", bound="WorkloadSummary")


class Role(StrEnum):
    """What a workload's measurement was for (every release wrote these words)."""

    # in the order an evaluation measures them (and a report shows them)
    OBJECTIVE = "objective"  # the win the gate asks for
    GUARD = "guard"  # another workload that must not regress
    GUARD_CHECK = "guard-check"  # a guard's regression measured again on fresh engines: part of that guard's call
    CONFIRMATION = "confirmation"  # the objective again, on fresh engines and seeds

    @staticmethod
    def rank(value: str) -> int:
        """The position of a recorded role (a trial's ``phase``, a summary's ``role``) in that order; a word this
        release does not know goes last."""
        order = [r.value for r in Role]
        return order.index(value) if value in order else len(order)


# harness.sequential's decisions that stop a comparison before its last pair
STOPPING = ("win", "lose", "regressed")


@dataclass(frozen=True)
class WorkloadSummary(Part):
    """A workload's comparison as measured and as recorded (the same object from the gate to the log and back)."""

    OPEN: ClassVar[bool] = True  # a summary may grow fields; an older reader keeps them in ``extra``

    name: str  # the workload
    role: Role
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
    metric: str = ""  # the measured metric (its name and unit for headlines and tables)
    unit: str = ""
    foreign_load: int = 0  # timed trials taken while processes outside the comparison used the machine (harness.quiet)
    trial_s: float | None = None  # median duration of one timed trial
    higher_is_better: bool | None = None  # the metric's direction (None in records from before it was kept)
    extra: Mapping[str, Any] = field(default_factory=dict, kw_only=True)

    @property
    def early_stop(self) -> bool:
        return self.role != Role.CONFIRMATION and self.decision in STOPPING and self.pairs < self.max_pairs

    @classmethod
    def from_json(cls: type[S], data: Mapping[str, Any], where: str = "") -> S:
        # ``early_stop`` is written for readers of the JSON; it is derived, not stored
        return super().from_json({k: v for k, v in data.items() if k != "early_stop"}, where)

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "early_stop": self.early_stop}


def objective_in(workloads: Mapping[str, WorkloadSummary], name: str | None) -> WorkloadSummary | None:
    """The objective's summary among a verdict's ``workloads``: by its name, or (records that did not name it)
    by its role."""
    if name and name in workloads:
        return workloads[name]
    return next((w for w in workloads.values() if w.role == Role.OBJECTIVE), None)


@dataclass(frozen=True)
class Statistic(WorkloadSummary, Record):
    """``statistic``: a workload's summary, logged for proposal ``number`` when it was measured."""

    KIND: ClassVar[str] = "statistic"

    number: int = field(kw_only=True)

    @classmethod
    def of_summary(cls, number: int, summary: WorkloadSummary) -> Statistic:
        """The record of ``summary``, measured for proposal ``number``."""
        return cls.of({"number": number, **summary.to_json()})

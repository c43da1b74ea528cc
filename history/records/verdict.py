"""``verdict``: the gate's decision on one proposal, with the evaluation it was made from.

A static verdict (the patch does not apply, a duplicate, an internal error) has no evaluation
fields; a measured one carries the evaluation's (workloads, confirmation, distribution, ...).
``failed_check`` and ``failure`` say structurally why a rejection happened; ``reasons`` say it
in English for people.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

from .base import Part, Record
from .checks import FailureKind
from .statistic import WorkloadSummary, objective_in


class CheckStatus(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    SKIPPED = "skipped"  # allowed only where the target opts out (e.g. no [verify] section)
    REVIEW = "review"  # passed, but needs a person (plausibility bound)


@dataclass(frozen=True)
class CheckResult(Part):
    """One check as the gate judged it and as recorded: its name (a CheckName value), status, detail and failure kind.
    The gate builds its checks as ``agentsearch.gate.Check`` (this class with the gate's fail-closed rules)."""

    name: str
    status: CheckStatus
    detail: str
    failure: FailureKind | None = None  # set when status is fail

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "status", CheckStatus(self.status))  # "error", None, "FAIL": never a pass
        except ValueError:
            raise ValueError(f"check {self.name!r}: unknown status {self.status!r}") from None


def failures_of(checks: tuple[CheckResult, ...]) -> tuple[FailureKind, ...]:
    """The failure kinds of the failed checks, in their order."""
    return tuple(c.failure for c in checks if c.status == "fail" and c.failure is not None)


@dataclass(frozen=True)
class Verdict(Record):
    KIND: ClassVar[str] = "verdict"
    OPEN: ClassVar[bool] = True  # the evaluation's fields (workloads, distribution, timing, ...) are kept in ``extra``

    number: int
    proposal: str
    title: str | None
    branch: str | None
    verdict: str  # merge | reject | review
    reasons: tuple[str, ...]  # for people: "<check>: <detail>"
    checks: tuple[CheckResult, ...]
    baseline: str  # the baseline commit it was judged on
    candidate: str | None  # None when nothing was committed
    content_key: str | None  # same code, baseline, config and environment: judged once
    speedup: float | None  # of the objective
    objective: str | None = None  # the objective workload's name (measured verdicts)
    failed_check: str | None = None  # the first failed check (a CheckName value); None for a merge
    failure: FailureKind | None = None  # its failure kind
    workloads: Mapping[str, WorkloadSummary] = field(default_factory=dict)  # per workload, measured
    confirmation: WorkloadSummary | None = None  # the objective measured again on fresh engines and seeds
    extra: Mapping[str, Any] = field(default_factory=dict, kw_only=True)

    @property
    def objective_summary(self) -> WorkloadSummary | None:
        return objective_in(self.workloads, self.objective)

    @property
    def failures(self) -> tuple[FailureKind, ...]:
        return failures_of(self.checks)

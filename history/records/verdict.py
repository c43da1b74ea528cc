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
from .coverage import CoverageReport
from .distribution import DistributionCheck
from .statistic import WorkloadSummary, objective_in
from .timing import Timing


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
        object.__setattr__(self, "name", str(self.name))  # a CheckName is kept as its word
        try:
            object.__setattr__(self, "status", CheckStatus(self.status))  # "error", None, "FAIL": never a pass
        except ValueError:
            raise ValueError(f"check {self.name!r}: unknown status {self.status!r}") from None


def failures_of(checks: tuple[CheckResult, ...]) -> tuple[FailureKind, ...]:
    """The failure kinds of the failed checks, in their order."""
    return tuple(c.failure for c in checks if c.status == "fail" and c.failure is not None)


class Outcome(StrEnum):
    """The gate's three answers (equal to their strings: ``Outcome.MERGE == "merge"``)."""

    MERGE = "merge"
    REJECT = "reject"
    REVIEW = "review"  # every check passed, one needs a person (never merged automatically)


@dataclass(frozen=True)
class Judgement(Part):
    """The gate's answer on one proposal (``agentsearch.gate.judge``): the outcome, the reasons for people, the
    checks it was made from, and structurally why a rejection happened (its first failed check and that check's
    failure kind). A ``Verdict`` and an ``Evaluation`` record carry these same fields (``judgement`` gives them back
    as this part); the log keeps them flat, as every released version wrote them."""

    verdict: Outcome
    reasons: tuple[str, ...]
    checks: tuple[CheckResult, ...]
    failed_check: str | None = None  # the first failed check (a CheckName value); None for a merge or a review
    failure: FailureKind | None = None  # its failure kind

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "verdict", Outcome(self.verdict))
        except ValueError:
            raise ValueError(f"unknown verdict {self.verdict!r}") from None
        if self.verdict != Outcome.MERGE and not self.reasons:
            raise ValueError("a rejection needs at least one reason")

    @property
    def failures(self) -> tuple[FailureKind, ...]:
        return failures_of(self.checks)


class JudgedFields:
    """What a record that carries a judgement's fields reads from them."""

    verdict: Outcome
    reasons: tuple[str, ...]
    checks: tuple[CheckResult, ...]
    failed_check: str | None
    failure: FailureKind | None

    @property
    def judgement(self) -> Judgement:
        return Judgement(self.verdict, self.reasons, self.checks, self.failed_check, self.failure)

    @property
    def failures(self) -> tuple[FailureKind, ...]:
        return failures_of(self.checks)


@dataclass(frozen=True)
class MeasuredFields(Part):
    """What an evaluation recorded beside its judgement and workloads, kept by its ``evaluation`` record and a
    measured ``verdict`` alike (empty on a static verdict). The distribution check, the coverage pass and the timing
    are typed (``DistributionCheck``, ``CoverageReport``, ``Timing``); the environment is ``harness.environment``'s
    facts about the machine and its software, kept as written."""

    environment: Mapping[str, Any] = field(default_factory=dict, kw_only=True)  # the machine and its software
    timing: Timing = field(default_factory=Timing, kw_only=True)  # wall time split (all 0 on a static verdict)
    coverage: CoverageReport | None = field(default=None, kw_only=True)  # the coverage pass, when it ran
    distribution: DistributionCheck | None = field(default=None, kw_only=True)  # the distribution checks
    baseline_side: str = field(default="fresh", kw_only=True)  # "warm": kept from the episode's previous evaluation
    baseline_engines_reused: int = field(default=0, kw_only=True)  # baseline engines kept warm


@dataclass(frozen=True)
class Verdict(JudgedFields, MeasuredFields, Record):
    """The verdict on one proposal of an episode: its judgement, and for a measured one the evaluation's fields
    (``Evaluation.as_verdict``); a static one (``static``: the patch does not apply, a duplicate, an error) has none."""

    KIND: ClassVar[str] = "verdict"
    OPEN: ClassVar[bool] = True  # the evaluation's fields (workloads, distribution, timing, ...) are kept in ``extra``

    number: int
    proposal: str
    title: str | None
    branch: str | None
    verdict: Outcome
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
    # a measured verdict's evaluation: the ref it judged, its master seed and the false-merge level it spent (None
    # before any measurement, and alpha in records from before it was kept)
    ref: str | None = None
    seed: int | None = None
    alpha: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, kw_only=True)

    @property
    def objective_summary(self) -> WorkloadSummary | None:
        return objective_in(self.workloads, self.objective)

    @classmethod
    def static(cls, judgement: Judgement, **fields: Any) -> Verdict:
        """The verdict of a proposal judged without a measurement (``fields``: number, proposal, title, branch,
        baseline, candidate, content_key)."""
        return cls.of({**judgement.to_json(), "speedup": None, **fields})

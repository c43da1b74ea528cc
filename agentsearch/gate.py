"""The fail-closed gate: a pure function from the checks an evaluation ran to a verdict.

MERGE only when every required check is present and passed. A missing check, a failed one,
an error or an inconclusive statistic is a REJECT with its reason; a too-good-to-be-true
speedup is held for manual REVIEW (never merged automatically).
"""

from __future__ import annotations

from dataclasses import dataclass

from history.records import GATE_ORDER, CheckResult, CheckStatus, FailureKind, Judgement, Outcome, default_failure
from history.records.checks import SKIPPABLE as CHECK_SKIPPABLE

MERGE, REJECT, REVIEW = Outcome.MERGE, Outcome.REJECT, Outcome.REVIEW

Status = CheckStatus


# in the order an evaluation runs them (the names and their order: history.records.checks)
REQUIRED_CHECKS = tuple(c.value for c in GATE_ORDER)
# skipped only with the reason in its detail: the target opted out, the machine cannot, or it does not apply
SKIPPABLE = {c.value for c in CHECK_SKIPPABLE}


@dataclass(frozen=True)
class Check(CheckResult):
    """A check as the gate takes it: the recorded ``CheckResult`` under the fail-closed rules (a skip needs its reason
    and a skippable check, a failure its reason; a failure's kind defaults to the check's)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.status == Status.SKIPPED and not self.detail:
            raise ValueError(f"check {self.name!r}: a skipped check needs its reason")
        if self.status == Status.SKIPPED and self.name not in SKIPPABLE:
            raise ValueError(f"check {self.name!r} cannot be skipped")
        if self.status == Status.FAIL and not self.detail:
            raise ValueError("a failed check needs a reason")
        if self.status == Status.FAIL and self.failure is None:
            object.__setattr__(self, "failure", default_failure(self.name))
        if self.status != Status.FAIL:
            object.__setattr__(self, "failure", None)


def judge(checks: list[Check]) -> Judgement:
    """Merge iff every required check passed (or was legitimately skipped), each reported once.

    The reasons come in the gate's order (required checks, then the others as first reported); a
    rejection's cause is the first failure in that order — a check reported twice is one (the evaluation
    that reported it is broken: an internal error), a failed check another — and only when nothing failed,
    the first required check that did not run (kind ``missing``). A REVIEW needs everything else to pass."""
    by_name: dict[str, list[Check]] = {}
    for c in checks:
        by_name.setdefault(c.name, []).append(c)
    names = [*REQUIRED_CHECKS, *(n for n in by_name if n not in REQUIRED_CHECKS)]
    reasons: list[str] = []
    causes: list[tuple[str, FailureKind | None]] = []  # failures in the gate's order: the first is the cause
    missing: list[str] = []
    review = False
    for name in names:
        reported = by_name.get(name, [])
        if not reported:
            missing.append(name)
            reasons.append(f"{name}: did not run")
            continue
        if len(reported) > 1:
            reasons.append(f"{name}: reported twice")
            causes.append((name, FailureKind.INTERNAL_ERROR))
        for check in reported:
            if check.status == Status.FAIL:
                reasons.append(f"{name}: {check.detail}")
                causes.append((name, check.failure))
            elif check.status == Status.REVIEW:  # e.g. the plausibility bound, an implausible op-level speedup (micro)
                review = True
                reasons.append(f"{name}: {check.detail}")
    ordered = tuple(c for n in names for c in by_name.get(n, []))
    if causes:  # the first failure is the cause; 'did not run' entries after it are consequences
        name, kind = causes[0]
        return Judgement(REJECT, tuple(_trim(reasons)), ordered, failed_check=name, failure=kind)
    if missing:
        return Judgement(REJECT, tuple(reasons), ordered, failed_check=missing[0], failure=FailureKind.MISSING)
    if review:
        return Judgement(REVIEW, tuple(reasons), ordered)
    return Judgement(MERGE, (), ordered)


def _trim(reasons: list[str]) -> list[str]:
    real = [r for r in reasons if not r.endswith(": did not run")]
    return real or reasons

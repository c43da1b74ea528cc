"""The fail-closed gate: a pure function from the checks an evaluation ran to a verdict.

MERGE only when every required check is present and passed. A missing check, a failed one,
an error or an inconclusive statistic is a REJECT with its reason; a too-good-to-be-true
speedup is held for manual REVIEW (never merged automatically).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from history.records import GATE_ORDER, CheckName, FailureKind, default_failure

MERGE = "merge"
REJECT = "reject"
REVIEW = "review"

VERDICT_SCHEMA = 1


class Status(str, Enum):
    PASS = "pass"
    FAIL = "fail"
    SKIPPED = "skipped"  # allowed only where the target opts out (e.g. no [verify] section)
    REVIEW = "review"  # passed, but needs a person (plausibility bound)


# in the order an evaluation runs them (the names and their order: history.records.checks)
REQUIRED_CHECKS = tuple(c.value for c in GATE_ORDER)
# skipped only with the reason in its detail: the target opted out, the machine cannot, or it does not apply
SKIPPABLE = {c.value for c in (CheckName.DISTRIBUTION, CheckName.CONFIRMATION, CheckName.SANDBOX, CheckName.COVERAGE,
                               CheckName.FUNCTIONAL_TESTS)}


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    failure: FailureKind | None = None  # a failed check's kind; None: the check's default kind

    def __post_init__(self) -> None:
        if self.status == Status.SKIPPED and self.name not in SKIPPABLE:
            raise ValueError(f"check {self.name!r} cannot be skipped")
        if self.status == Status.FAIL and not self.detail:
            raise ValueError("a failed check needs a reason")
        if self.status == Status.FAIL and self.failure is None:
            object.__setattr__(self, "failure", default_failure(self.name))
        if self.status != Status.FAIL:
            object.__setattr__(self, "failure", None)

    def to_json(self) -> dict[str, str | None]:
        return {"name": self.name, "status": self.status.value, "detail": self.detail,
                "failure": self.failure.value if self.failure else None}


@dataclass(frozen=True)
class Verdict:
    verdict: str
    reasons: tuple[str, ...]
    checks: tuple[Check, ...]
    schema_version: int = VERDICT_SCHEMA
    failed_check: str | None = None  # the check whose reason comes first (a rejection's cause)
    failure: FailureKind | None = None  # its kind (MISSING when a required check did not run)

    def __post_init__(self) -> None:
        if self.verdict not in (MERGE, REJECT, REVIEW):
            raise ValueError(f"unknown verdict {self.verdict!r}")
        if self.verdict != MERGE and not self.reasons:
            raise ValueError("a rejection needs at least one reason")


def judge(checks: list[Check]) -> Verdict:
    """Merge iff every required check passed (or was legitimately skipped)."""
    by_name: dict[str, Check] = {}
    reasons: list[str] = []
    for c in checks:
        if c.name in by_name:
            reasons.append(f"{c.name}: reported twice")
        by_name[c.name] = c
    review = False
    for name in REQUIRED_CHECKS:
        check = by_name.get(name)
        if check is None:
            reasons.append(f"{name}: did not run")
        elif check.status == Status.FAIL:
            reasons.append(f"{name}: {check.detail}")
        elif check.status == Status.REVIEW:
            review = True
            reasons.append(f"{name}: {check.detail}")
    ordered = tuple(by_name[n] for n in REQUIRED_CHECKS if n in by_name) + tuple(
        c for c in checks if c.name not in REQUIRED_CHECKS
    )
    for c in checks:
        if c.name not in REQUIRED_CHECKS and c.status in (Status.FAIL, Status.REVIEW):
            reasons.append(f"{c.name}: {c.detail}")
            review = review or c.status == Status.REVIEW  # e.g. an implausible op-level speedup (micro)
    if any(by_name.get(n) is None or by_name[n].status == Status.FAIL for n in REQUIRED_CHECKS) or any(
        c.status == Status.FAIL for c in checks
    ):
        # the first failure is the cause; 'did not run' entries after it are consequences
        failed = [by_name[n] for n in REQUIRED_CHECKS if n in by_name and by_name[n].status == Status.FAIL] + [
            c for c in checks if c.name not in REQUIRED_CHECKS and c.status == Status.FAIL]
        if failed:
            return Verdict(REJECT, tuple(_trim(reasons)), ordered, failed_check=failed[0].name, failure=failed[0].failure)
        missing = next(n for n in REQUIRED_CHECKS if n not in by_name)
        return Verdict(REJECT, tuple(_trim(reasons)), ordered, failed_check=missing, failure=FailureKind.MISSING)
    if review:
        return Verdict(REVIEW, tuple(reasons), ordered)
    return Verdict(MERGE, (), ordered)


def _trim(reasons: list[str]) -> list[str]:
    real = [r for r in reasons if not r.endswith(": did not run")]
    return real or reasons

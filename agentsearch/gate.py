"""The fail-closed gate: a pure function from the checks an evaluation ran to a verdict.

MERGE only when every required check is present and passed. A missing check, a failed one,
an error or an inconclusive statistic is a REJECT with its reason; a too-good-to-be-true
speedup is held for manual REVIEW (never merged automatically).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

MERGE = "merge"
REJECT = "reject"
REVIEW = "review"

VERDICT_SCHEMA = 1


class Status(str, Enum):
    PASS = "pass"
    FAIL = "fail"
    SKIPPED = "skipped"  # allowed only where the target opts out (e.g. no [verify] section)
    REVIEW = "review"  # passed, but needs a person (plausibility bound)


# in the order an evaluation runs them
REQUIRED_CHECKS = (
    "based-on-baseline",
    "protected-paths",
    "sandbox",
    "build",
    "functional-tests",
    "objective",
    "coverage",
    "guard-workloads",
    "confirmation",
    "plausibility",
    "distribution",
)
# skipped only with the reason in its detail: the target opted out, the machine cannot, or it does not apply
SKIPPABLE = {"distribution", "confirmation", "sandbox", "coverage", "functional-tests"}


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str

    def __post_init__(self) -> None:
        if self.status == Status.SKIPPED and self.name not in SKIPPABLE:
            raise ValueError(f"check {self.name!r} cannot be skipped")
        if self.status == Status.FAIL and not self.detail:
            raise ValueError("a failed check needs a reason")


@dataclass(frozen=True)
class Verdict:
    verdict: str
    reasons: tuple[str, ...]
    checks: tuple[Check, ...]
    schema_version: int = VERDICT_SCHEMA

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
        if c.name not in REQUIRED_CHECKS and c.status == Status.FAIL:
            reasons.append(f"{c.name}: {c.detail}")
    if any(by_name.get(n) is None or by_name[n].status == Status.FAIL for n in REQUIRED_CHECKS) or any(
        c.status == Status.FAIL for c in checks
    ):
        # the first failure is the cause; 'did not run' entries after it are consequences
        return Verdict(REJECT, tuple(_trim(reasons)), ordered)
    if review:
        return Verdict(REVIEW, tuple(reasons), ordered)
    return Verdict(MERGE, (), ordered)


def _trim(reasons: list[str]) -> list[str]:
    real = [r for r in reasons if not r.endswith(": did not run")]
    return real or reasons

"""``stack-check`` and ``stack-bisect``: what the merges of a range add up to (`agentsearch stack`).

Every merge is judged against the baseline of its moment; a stack check measures main's tip against the
range's start with the gate's own design, next to the product of the merges' own estimates, and (with
leave-one-out) each merge's marginal contribution at today's operating point. A bisection names the merge
where a workload's regression entered, with each step's evidence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from .base import Part, Record
from .statistic import Role, WorkloadSummary

STACK_VERDICTS = ("delivers", "under-delivers", "inconclusive")
REMOVAL_DECISIONS = ("contributes", "passenger", "harmful", "unknown", "does-not-revert")
STEP_OUTCOMES = ("different", "same", "unknown")
REGRESSED = "regressed"  # harness.sequential.REGRESSED: a guard's decision (history sits below harness)
JUDGED = ("ok", "unconfirmed")  # a guard within its limit: passed, or a first call that did not hold on fresh engines


def regressed(guards: tuple[WorkloadSummary, ...]) -> tuple[WorkloadSummary, ...]:
    """The guards that regressed beyond the gate's limit and held on fresh engines: a first call and its re-measure
    both ``regressed`` (a first call that did not hold is recorded ``unconfirmed``; one whose re-measure did not finish
    is in ``unresolved``)."""
    held = {g.name for g in guards if g.role == Role.GUARD_CHECK and g.decision == REGRESSED}
    return tuple(g for g in guards if g.role == Role.GUARD and g.decision == REGRESSED and g.name in held)


def failing(guards: tuple[WorkloadSummary, ...]) -> tuple[WorkloadSummary, ...]:
    """The guards whose run at the tip ended in neither a pass nor a regression (failed, not run): not judged."""
    return tuple(g for g in guards if g.role == Role.GUARD and g.decision not in (*JUDGED, REGRESSED))


def unresolved(guards: tuple[WorkloadSummary, ...]) -> tuple[WorkloadSummary, ...]:
    """The guards whose first call was a regression and whose re-measure on fresh engines did not finish (failed,
    or never ran): not known either way."""
    done = {g.name for g in regressed(guards)}
    return tuple(g for g in guards if g.role == Role.GUARD and g.decision == REGRESSED and g.name not in done)


@dataclass(frozen=True)
class StackMerge(Part):
    """One merge of the range, with the estimate the gate merged it on."""

    merge: str  # the merge commit
    proposal: str | None
    title: str | None
    speedup: float | None  # its speedup when it was merged: the confirmation's, else the objective's
    ci: tuple[float, ...] | None  # and that speedup's confidence interval
    source: str = "confirmation"  # confirmation (fresh seeds, a fixed number of pairs: not inflated by the sequential
    #                               test's early stop) | objective (no confirmation ran)


@dataclass(frozen=True)
class Removal(Part):
    """Leave-one-out: the tip against the tip with one merge reverted (a scratch commit, never on a branch)."""

    merge: str
    decision: (
        str  # contributes | passenger | harmful (the tip significantly slower with it) | unknown | does-not-revert
    )
    reason: str
    scratch: str | None = None  # the tip with this merge reverted
    marginal: float | None = None  # the tip's speedup over the scratch commit: what this merge adds today
    ci: tuple[float, ...] | None = None
    pairs: int = 0
    # what it adds today is significantly below what it was merged on, by more than [gate] min_effect: where a
    # stack's gain was lost (None: not tested, a number missing; checks before 2026-12-06)
    shrank: bool | None = None

    def __post_init__(self) -> None:
        if self.decision not in REMOVAL_DECISIONS:
            raise ValueError(f"removal of {self.merge[:12]}: unknown decision {self.decision!r}")


@dataclass(frozen=True)
class Interference(Part):
    """Two merges removed together against the product of their single removals: the pairs a passenger points to
    (its gain may live on in another merge, or the two cancel)."""

    merges: tuple[str, ...]  # the two merges
    interfere: bool  # the joint removal differs significantly from the product of the single ones
    reason: str
    scratch: str | None = None  # the tip with both reverted
    joint: float | None = None  # the tip over the tip without both
    ci: tuple[float, ...] | None = None
    expected: float | None = None  # the product of the two single marginal contributions
    p_value: float | None = None  # two-sided, log scale
    pairs: int = 0


@dataclass(frozen=True)
class StackCheck(Record):
    KIND: ClassVar[str] = "stack-check"

    since: str  # the range's start (a commit on the baseline)
    tip: str  # the baseline's tip measured
    objective: str  # the workload
    merges: tuple[StackMerge, ...]  # in the order they were merged
    verdict: str  # delivers | under-delivers | inconclusive
    reasons: tuple[str, ...]
    seed: int
    cumulative: float | None  # the tip's speedup over the start
    ci: tuple[float, ...] | None
    # the product of the merges' own estimates (since 2026-12-06: each confirmation corrected for its pass
    # condition, agentsearch.stack.kept)
    product: float | None
    product_ci: tuple[float, ...] | None
    pairs: int = 0
    removals: tuple[Removal, ...] = ()  # leave-one-out, when asked for
    interference: tuple[Interference, ...] = ()  # the pairs the removals pointed to, tested
    seconds: float = 0.0  # what the whole check cost in wall time
    # the guards, the tip against the start, as the gate judged them (a regression re-measured on fresh engines);
    # empty in checks recorded before 2026-12-06
    guards: tuple[WorkloadSummary, ...] = ()
    unmeasured: tuple[str, ...] = ()  # guards of the config the evaluation stopped before (since 2026-12-06)

    def __post_init__(self) -> None:
        if self.verdict not in STACK_VERDICTS:
            raise ValueError(f"unknown stack verdict {self.verdict!r}")
        if self.verdict != "delivers" and not self.reasons:
            raise ValueError("a stack check that does not deliver says why")

    @property
    def passengers(self) -> tuple[str, ...]:
        return tuple(r.merge for r in self.removals if r.decision == "passenger")

    @property
    def shrank(self) -> tuple[str, ...]:
        """The merges whose contribution today is significantly below their estimate when merged."""
        return tuple(r.merge for r in self.removals if r.shrank)

    @property
    def interfering(self) -> tuple[tuple[str, ...], ...]:
        return tuple(i.merges for i in self.interference if i.interfere)

    @property
    def regressed_guards(self) -> tuple[str, ...]:
        """The guards the tip regressed against the start beyond ``[gate] max_regression``, confirmed on fresh
        engines: merges each within the limit that add up to more than it (``stack bisect --metric`` names where)."""
        return tuple(g.name for g in regressed(self.guards))

    @property
    def holds(self) -> bool:
        """Main is what its merges claimed: the gain delivered, and every guard measured and within its limit over
        the range."""
        return (
            self.verdict == "delivers"
            and not self.regressed_guards
            and not unresolved(self.guards)
            and not failing(self.guards)
            and not self.unmeasured
        )

    def summary(self) -> dict[str, Any]:
        """The check in a line of an episode's JSON."""
        return {
            "verdict": self.verdict,
            "cumulative": self.cumulative,
            "product": self.product,
            "passengers": list(self.passengers),
            "regressed_guards": list(self.regressed_guards),
            "holds": self.holds,
        }


@dataclass(frozen=True)
class BisectStep(Part):
    """One step: a commit of the merge sequence measured against the range's start on one workload."""

    commit: str  # the baseline after its ``index``-th commit of the range (0: the start itself)
    index: int
    outcome: str  # different | same | unknown
    reason: str
    seed: int
    speedup: float | None = None
    ci: tuple[float, ...] | None = None
    pairs: int = 0

    def __post_init__(self) -> None:
        if self.outcome not in STEP_OUTCOMES:
            raise ValueError(f"bisect step at {self.commit[:12]}: unknown outcome {self.outcome!r}")


@dataclass(frozen=True)
class StackBisect(Record):
    KIND: ClassVar[str] = "stack-bisect"

    since: str
    tip: str
    workload: str  # the metric bisected (a workload of the config)
    merges: tuple[
        str, ...
    ]  # the commits searched: the baseline's first-parent line in the range (merges, reverts), in order
    steps: tuple[BisectStep, ...]  # in the order they ran
    culprit: str | None  # the commit where the regression entered; None: not found (reason says why)
    proposal: str | None  # the culprit's proposal, when it is a merge agentsearch made
    reason: str
    seconds: float = 0.0

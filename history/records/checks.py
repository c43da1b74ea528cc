"""The vocabulary of verdicts: check names and failure kinds, in one place.

A failed check carries a ``FailureKind``: what went wrong, as a word a program can count
(insights, the sweep bandit, reports). The check's ``detail`` is the English for people;
nothing reads it back. ``agentsearch.gate`` orders the checks; this module only names them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum


class CheckName(str, Enum):
    """Every check an evaluation or the episode can report, in the order they run."""

    def __str__(self) -> str:
        return self.value

    PATCH_APPLIES = "patch-applies"  # the episode: the proposal applies and changes something
    NOT_A_DUPLICATE = "not-a-duplicate"  # the episode: not judged before under the same content key
    JUDGING = "judging"  # the episode: judging the proposal raised an unexpected error
    BASED_ON_BASELINE = "based-on-baseline"
    PROTECTED_PATHS = "protected-paths"
    SANDBOX = "sandbox"
    BUILD = "build"
    FUNCTIONAL_TESTS = "functional-tests"
    OBJECTIVE = "objective"
    COVERAGE = "coverage"
    GUARD_WORKLOADS = "guard-workloads"
    CONFIRMATION = "confirmation"
    PLAUSIBILITY = "plausibility"
    DISTRIBUTION = "distribution"
    MICRO = "micro"  # kernel proposals: the op-level stage before any engine (agentsearch.micro)
    # a change of serving.json alone: does the engine's resolved configuration change? (before any engine)
    TAKES_EFFECT = "takes-effect"
    # the baseline failed beside the candidate and passed alone: the evaluation was measured again on fresh engines
    BASELINE_ALONE = "baseline-alone"


class FailureKind(str, Enum):
    """Why a check failed. The values are what records store."""

    def __str__(self) -> str:
        return self.value

    PATCH_FAILED = "patch-failed"  # does not apply to the baseline
    NO_CHANGE = "no-change"  # applies but changes nothing
    DUPLICATE = "duplicate"  # the same content was judged before
    INTERNAL_ERROR = "internal-error"  # agentsearch itself failed while judging
    STALE_BASE = "stale-base"  # not based on the current baseline
    PROTECTED_PATH = "protected-path"  # touches a protected file
    SANDBOX = "sandbox"  # the sandbox could not be set up or was escaped
    BUILD_FAILED = "build-failed"
    TESTS_FAILED = "tests-failed"
    CRASH = "crash"  # a trial (or the candidate's process) failed
    TIMEOUT = "timeout"  # a trial or the tests ran past their limit
    CHANGED_OUTPUTS = "changed-outputs"  # the candidate produced other outputs than the baseline
    MEASUREMENT_ERROR = "measurement-error"  # the measuring machinery failed on this candidate
    SETUP_ERROR = "setup-error"  # the workload's set-up (model, engine) could not start
    NO_EFFECT = "no-effect"  # no worthwhile speedup (or the changed code never ran)
    SLOWER = "slower"  # the objective got slower, or a guard workload regressed
    INCONCLUSIVE = "inconclusive"  # the pairs ran out before a decision
    NOT_CONFIRMED = "not-confirmed"  # the win did not hold on fresh seeds
    DISTRIBUTION = "distribution"  # the output distribution moved
    COVERAGE = "coverage"  # the coverage pass itself failed
    WORKTREE_CHANGED = "worktree-changed"  # a run changed a worktree it must not
    MISSING = "missing"  # a required check did not run
    # the outputs moved, and main itself diverges from the reference there: not the proposal's doing
    MAIN_DIVERGES = "main-diverges"


@dataclass(frozen=True)
class CheckSpec:
    """One check's facts, in one place: what it vouches for (the report's note), the failure kind it has when its
    site names none, whether a target may skip it (with the reason in its detail: it opted out, the machine cannot,
    or it does not apply), and whether every evaluation must report it (the gate requires those, in this order).
    The tables below are derived from ``CHECKS``; what a check runs is ``agentsearch.evaluation.PIPELINE``'s."""

    name: CheckName
    note: str
    default_failure: FailureKind
    skippable: bool = False
    required: bool = False


CHECKS: tuple[CheckSpec, ...] = (
    # the episode's, before anything is measured
    CheckSpec(CheckName.PATCH_APPLIES, "the patch applies to the current baseline", FailureKind.PATCH_FAILED),
    CheckSpec(CheckName.NOT_A_DUPLICATE, "the same code was not judged before", FailureKind.DUPLICATE),
    CheckSpec(CheckName.JUDGING, "judging the proposal raised no unexpected error", FailureKind.INTERNAL_ERROR),
    # an evaluation's, in the order the gate runs and reports them
    CheckSpec(
        CheckName.BASED_ON_BASELINE,
        "the candidate contains the baseline it was measured against",
        FailureKind.STALE_BASE,
        required=True,
    ),
    CheckSpec(
        CheckName.PROTECTED_PATHS,
        "no protected file (bench, config, harness inputs) was touched",
        FailureKind.PROTECTED_PATH,
        required=True,
    ),
    CheckSpec(
        CheckName.SANDBOX,
        "both sides ran without network, with state, history and harness hidden",
        FailureKind.SANDBOX,
        skippable=True,
        required=True,
    ),
    CheckSpec(CheckName.BUILD, "both worktrees built and installed", FailureKind.BUILD_FAILED, required=True),
    CheckSpec(
        CheckName.FUNCTIONAL_TESTS,
        "the target's own tests pass on the candidate",
        FailureKind.TESTS_FAILED,
        skippable=True,
        required=True,
    ),
    CheckSpec(
        CheckName.OBJECTIVE,
        "significant win on the objective (interleaved pairs, sequential test)",
        FailureKind.CRASH,
        required=True,
    ),
    CheckSpec(
        CheckName.COVERAGE,
        "the changed Python lines ran during the measurement",
        FailureKind.COVERAGE,
        skippable=True,
        required=True,
    ),
    CheckSpec(CheckName.GUARD_WORKLOADS, "no other workload regressed significantly", FailureKind.CRASH, required=True),
    CheckSpec(
        CheckName.CONFIRMATION,
        "the win held on fresh input seeds",
        FailureKind.CRASH,
        skippable=True,
        required=True,
    ),
    CheckSpec(
        CheckName.PLAUSIBILITY,
        "the speedup is within the plausibility bound",
        FailureKind.INCONCLUSIVE,
        required=True,
    ),
    CheckSpec(
        CheckName.DISTRIBUTION,
        "token distributions match on the public corpus and the hidden holdout",
        FailureKind.DISTRIBUTION,
        skippable=True,
        required=True,
    ),
    # kernel proposals only: a wrong result at op level (a slowdown says SLOWER)
    CheckSpec(
        CheckName.MICRO,
        "kernel proposals: the op is right on every generated and hidden case and not slower at op level (before "
        "any engine)",
        FailureKind.CHANGED_OUTPUTS,
    ),
    # a change of serving.json alone: resolved by each side's vLLM before any engine starts (knob no-ops)
    CheckSpec(
        CheckName.TAKES_EFFECT,
        "a change of the serving config alone changes the engine's resolved configuration or environment (before "
        "any engine)",
        FailureKind.NO_EFFECT,
        skippable=True,
    ),
    # recorded (a pass) when the baseline failed beside the candidate once and passed alone
    CheckSpec(
        CheckName.BASELINE_ALONE,
        "the baseline's failure beside the candidate was the machine's: it passed alone, and everything was "
        "measured again on fresh engines",
        FailureKind.CRASH,
    ),
)
SPEC: dict[CheckName, CheckSpec] = {c.name: c for c in CHECKS}

# the order the gate runs (and reports) the checks of an evaluation; agentsearch.gate requires them all
GATE_ORDER = tuple(c.name for c in CHECKS if c.required)
# skipped only with the reason in its detail
SKIPPABLE = frozenset(c.name for c in CHECKS if c.skippable)
# the kind a failed check has when its site says nothing more specific
DEFAULT_FAILURE: dict[CheckName, FailureKind] = {c.name: c.default_failure for c in CHECKS}
# what each check vouches for, in words (reports)
NOTES: dict[str, str] = {c.name.value: c.note for c in CHECKS}

# the candidate broke the workload (as opposed to not winning): the sweep bandit penalises these
BREAKING = frozenset(
    {
        FailureKind.CRASH,
        FailureKind.TIMEOUT,
        FailureKind.BUILD_FAILED,
        FailureKind.MEASUREMENT_ERROR,
        FailureKind.SETUP_ERROR,
    }
)
# rejected for a reason worth telling the next proposer to avoid (besides breaking)
AVOID = frozenset(
    {
        FailureKind.DISTRIBUTION,
        FailureKind.PROTECTED_PATH,
        FailureKind.CHANGED_OUTPUTS,
        FailureKind.NO_EFFECT,
        FailureKind.COVERAGE,
    }
)


def default_failure(check: str) -> FailureKind:
    """The failure kind of a failed ``check`` whose site named none (unknown checks: crash)."""
    try:
        return DEFAULT_FAILURE[CheckName(check)]
    except ValueError:
        return FailureKind.CRASH


def decision_failure(action: str, ci: Sequence[float] | None = None) -> FailureKind:
    """The failure kind of a statistical decision that is not the wanted one (see harness.sequential);
    ``ci``: the speedup's confidence interval (an objective whose whole interval is below 1 is slower)."""
    if action == "lose":
        return FailureKind.SLOWER if ci and ci[-1] < 1 else FailureKind.NO_EFFECT
    return {
        "inconclusive": FailureKind.INCONCLUSIVE,
        "regressed": FailureKind.SLOWER,
        "not-confirmed": FailureKind.NOT_CONFIRMED,
        "failed": FailureKind.CRASH,
    }.get(action, FailureKind.INCONCLUSIVE)

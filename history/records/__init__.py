"""Typed history records: one module per kind, each a frozen, validated dataclass.

``load(kind, data, version)`` upgrades a line's data to the current schema and validates it
into its class; writers build the class and pass it to ``HistoryLog.append``. The vocabulary
of verdicts (check names, failure kinds) is in ``checks``. No git, no vllm.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .base import SCHEMA_VERSION, Part, Record, RecordError
from .checks import (
    AVOID,
    BREAKING,
    CHECKS,
    GATE_ORDER,
    CheckName,
    CheckSpec,
    FailureKind,
    decision_failure,
    default_failure,
)
from .coverage import CoverageReport
from .distribution import STATS, Distribution, DistributionCheck, ReferenceCheck, RegimeComparison, worst_of_sets
from .episode_finished import EpisodeFinished
from .episode_resumed import EpisodeResumed
from .episode_started import EpisodeStarted
from .evaluation import Evaluation
from .forge import PrCommand, PrPosted, PrReview
from .insight import Insight
from .merge import Merge
from .node_fault import NodeFault
from .profile import Profile
from .proposal_created import CATEGORIES, ProposalCreated
from .recheck import Recheck
from .repair import Repair
from .revert import Revert
from .run_error import RunError
from .stack import BisectStep, Interference, Removal, StackBisect, StackCheck, StackMerge
from .statistic import Role, Statistic, WorkloadSummary
from .superseded import Superseded
from .timing import Timing
from .trial import Trial, TrialRecord
from .upgrade import UPGRADERS, upgrade
from .verdict import CheckResult, CheckStatus, Judgement, Outcome, Verdict

CLASSES: tuple[type[Record], ...] = (
    EpisodeStarted,
    EpisodeResumed,
    EpisodeFinished,
    ProposalCreated,
    Trial,
    Statistic,
    Distribution,
    Evaluation,
    Verdict,
    Merge,
    Revert,
    Recheck,
    Insight,
    Profile,
    Repair,
    RunError,
    Superseded,
    NodeFault,
    StackCheck,
    StackBisect,
    PrReview,
    PrPosted,
    PrCommand,
)
BY_KIND: dict[str, type[Record]] = {c.KIND: c for c in CLASSES}
KINDS = tuple(BY_KIND)


def load(kind: str, data: Mapping[str, Any], version: int) -> Record:
    """The record of one line (upgraded from ``version``); RecordError says what does not fit."""
    cls = BY_KIND.get(kind)
    if cls is None:
        raise RecordError(f"unknown record kind {kind!r}")
    try:
        current = upgrade(kind, data, version)
    except ValueError as exc:
        raise RecordError(str(exc)) from None
    return cls.from_json(current, kind)


__all__ = [
    "AVOID",
    "BREAKING",
    "CHECKS",
    "CheckSpec",
    "BY_KIND",
    "CATEGORIES",
    "CLASSES",
    "GATE_ORDER",
    "KINDS",
    "SCHEMA_VERSION",
    "UPGRADERS",
    "CheckName",
    "CheckResult",
    "CheckStatus",
    "Judgement",
    "Outcome",
    "CoverageReport",
    "Distribution",
    "DistributionCheck",
    "ReferenceCheck",
    "RegimeComparison",
    "STATS",
    "worst_of_sets",
    "EpisodeFinished",
    "EpisodeResumed",
    "EpisodeStarted",
    "Evaluation",
    "FailureKind",
    "Insight",
    "Merge",
    "NodeFault",
    "Part",
    "PrCommand",
    "PrPosted",
    "PrReview",
    "Profile",
    "ProposalCreated",
    "Recheck",
    "Record",
    "RecordError",
    "Repair",
    "Revert",
    "RunError",
    "Role",
    "Statistic",
    "WorkloadSummary",
    "Superseded",
    "Timing",
    "Trial",
    "TrialRecord",
    "Verdict",
    "decision_failure",
    "default_failure",
    "load",
    "upgrade",
    "BisectStep",
    "Interference",
    "Removal",
    "StackBisect",
    "StackCheck",
    "StackMerge",
]

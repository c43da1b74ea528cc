"""``trial``: one timed run of one side of one pair.

``TrialRecord`` is the trial as the harness measured it (``harness.interleave`` builds it, an evaluation keeps it,
``evaluate --json`` lists it); the ``Trial`` record is the same trial in an episode's log, with where it belongs
(the proposal's number, the two sides' commits and the measurement's key).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .base import Part, Record, RecordError

BASELINE, CANDIDATE = "baseline", "candidate"


@dataclass(frozen=True)
class TrialRecord(Part):
    """One trial: its outcome and where it sat in the interleaved schedule."""

    workload: str
    side: str  # baseline | candidate
    seed: int
    pair: int  # -1: a session's warm-up round (recorded only when it failed)
    position: int  # 0 = first of its pair, 1 = second
    order: str  # "AB" (baseline first) or "BA"
    session: int  # engine/session restart index
    ok: bool
    value: float | None  # the metric (None when the trial failed)
    metrics: Mapping[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0  # the orchestrator's round trip
    error: str = ""  # for people: why it failed
    stderr_tail: str = ""
    phase: str = "objective"  # the round that measured it: a statistic.Role value
    failure: str = ""  # a FailureKind value when it failed (crash, timeout, changed-outputs, ...); '' when ok or older

    def __post_init__(self) -> None:
        if self.side not in (BASELINE, CANDIDATE):
            raise RecordError(f"side must be baseline or candidate, got {self.side!r}")
        if self.ok and (self.value is None or not math.isfinite(self.value) or self.value <= 0):
            raise RecordError("a successful trial needs a positive, finite value")
        if not self.ok and not self.error:
            raise RecordError("a failed trial needs an error")


@dataclass(frozen=True)
class Trial(TrialRecord, Record):
    KIND: ClassVar[str] = "trial"
    OPEN: ClassVar[bool] = True  # TrialRecord may grow fields; a newer one's are kept in ``extra``

    number: int = field(kw_only=True)  # the proposal's number in its episode
    candidate: str = field(kw_only=True)  # commits of the two sides
    baseline: str = field(kw_only=True)
    measurement: str = field(kw_only=True)  # key of (tree of this side, workload, seed, environment)
    extra: Mapping[str, Any] = field(default_factory=dict, kw_only=True)

    @classmethod
    def of_run(
        cls,
        t: TrialRecord,
        *,
        number: int,
        candidate: str,
        baseline: str,
        measurement: str,
        extra: Mapping[str, Any] | None = None,
    ) -> Trial:
        """The record of trial ``t`` of proposal ``number`` (``extra``: what the executor adds, e.g. its node)."""
        return cls(
            **{f.name: getattr(t, f.name) for f in dataclasses.fields(TrialRecord)},
            number=number,
            candidate=candidate,
            baseline=baseline,
            measurement=measurement,
            extra=dict(extra or {}),
        )

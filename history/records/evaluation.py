"""``evaluation``: `agentsearch evaluate REF` judged a ref (agentsearch.evaluation.Evaluation)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .base import Record
from .checks import FailureKind
from .statistic import WorkloadSummary, objective_in
from .trial import TrialRecord
from .verdict import CheckResult, JudgedFields, MeasuredFields, Outcome, Verdict


@dataclass(frozen=True)
class Evaluation(JudgedFields, MeasuredFields, Record):
    """What `agentsearch evaluate REF` judged: the judgement, the workloads' summaries, and (in ``extra``) the
    distribution, coverage, environment, timing and trials."""

    KIND: ClassVar[str] = "evaluation"
    OPEN: ClassVar[bool] = True  # distribution, coverage, environment, timing, trials, ... are kept in ``extra``

    verdict: Outcome
    reasons: tuple[str, ...]
    ref: str
    baseline: str
    candidate: str
    seed: int
    checks: tuple[CheckResult, ...]
    alpha: float | None = None
    objective: str | None = None
    failed_check: str | None = None
    failure: FailureKind | None = None
    workloads: Mapping[str, WorkloadSummary] = field(default_factory=dict)  # per workload, measured
    confirmation: WorkloadSummary | None = None  # the objective measured again on fresh engines and seeds
    extra: Mapping[str, Any] = field(default_factory=dict, kw_only=True)

    @property
    def objective_summary(self) -> WorkloadSummary | None:
        return objective_in(self.workloads, self.objective)

    def as_verdict(self, **fields: Any) -> Verdict:
        """The verdict of a measured proposal: this evaluation's judgement and fields (not its trials, which are
        records of their own), the objective's speedup, and ``fields`` (number, proposal, title, branch,
        content_key, and whatever the executor adds)."""
        data = self.to_json()
        data.pop("trials", None)
        s = self.objective_summary
        return Verdict.of({**data, "speedup": s.speedup if s else None, **fields})

    @property
    def trials(self) -> tuple[TrialRecord, ...]:
        """The evaluation's trials, as the harness recorded them (keys a released version wrote beside a trial's
        fields, such as its own ``schema_version``, are left out)."""
        raw = self.extra.get("trials") or ()
        known = {f.name for f in dataclasses.fields(TrialRecord)}
        return tuple(
            TrialRecord.from_json({k: v for k, v in t.items() if k in known}, f"evaluation.trials[{i}]")
            for i, t in enumerate(raw)
            if isinstance(t, Mapping)
        )

"""Main's drift from the reference, merge by merge: how far the outputs moved from the stock code in all.

Every distribution check compares the candidate with the pinned reference as well as with the baseline
(agentsearch.verify, ``reference``); a merged candidate is main from then on, so its reference comparison is
main's divergence after that merge. ``drift_curve`` reads it back from the history: one ``DriftPoint`` per
merge (a revert is a point of its own: main went back, unmeasured). No git, no vllm.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .records import Distribution, Evaluation, Merge, ReferenceCheck, Revert


@dataclass(frozen=True)
class DriftPoint:
    seq: int  # the merge (or revert) record's place in the history
    proposal: str
    commit: str  # main after it
    event: str  # merge | revert
    reference: str = ""  # the reference commit the check judged against ('' : not measured)
    budget: str = ""
    # regime label -> path -> the worst of the public and holdout sets for each of STATS (same_top_pct: the lowest)
    regimes: Mapping[str, Mapping[str, Mapping[str, float | None]]] = field(default_factory=dict)

    @property
    def measured(self) -> bool:
        return bool(self.regimes)

    def worst(self, stat: str) -> float | None:
        """The worst ``stat`` over every regime and path (None when not measured)."""
        vals = [p.get(stat) for paths in self.regimes.values() for p in paths.values() if p.get(stat) is not None]
        if not vals:
            return None
        return min(vals) if stat == "same_top_pct" else max(vals)  # type: ignore[type-var]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def drift_curve(entries: Iterable[Any]) -> list[DriftPoint]:
    """One point per merge and revert, in order, with the merged candidate's comparison against the reference
    (from its distribution record, or the evaluation it was merged by)."""
    checks: dict[str, ReferenceCheck | None] = {}
    points: list[DriftPoint] = []
    for e in entries:
        r = e.record
        if isinstance(r, Distribution) and e.proposal:
            checks[e.proposal] = r.reference
        elif isinstance(r, Evaluation) and r.distribution is not None:
            checks[e.proposal or r.ref or ""] = r.distribution.reference
        elif isinstance(r, Merge) and r.ok:
            ref = checks.get(e.proposal or "")
            points.append(
                DriftPoint(
                    e.seq,
                    e.proposal or "",
                    r.new,
                    "merge",
                    ref.commit if ref else "",
                    ref.budget if ref else "",
                    ref.worst_by_regime() if ref else {},
                )
            )
        elif isinstance(r, Revert):
            points.append(DriftPoint(e.seq, e.proposal or "", r.new, "revert"))
    return points

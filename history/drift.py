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

STATS = ("kl_mean", "kl_p99", "kl_max", "dlogprob_max", "same_top_pct")


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


def worst_of_sets(sets: Mapping[str, Any]) -> dict[str, dict[str, float | None]]:
    out: dict[str, dict[str, float | None]] = {}
    for stats in sets.values():
        for path, st in (stats or {}).items():
            row = out.setdefault(path, {k: None for k in STATS})
            for k in STATS:
                v = st.get(k) if isinstance(st, Mapping) else None
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    cur = row[k]
                    row[k] = float(v) if cur is None else (min(cur, v) if k == "same_top_pct" else max(cur, v))
    return out


def drift_curve(entries: Iterable[Any]) -> list[DriftPoint]:
    """One point per merge and revert, in order, with the merged candidate's comparison against the reference
    (from its distribution record, or the evaluation it was merged by)."""
    checks: dict[str, Mapping[str, Any]] = {}
    points: list[DriftPoint] = []
    for e in entries:
        d = e.data or {}
        if e.kind == "distribution" and e.proposal:
            checks[e.proposal] = d
        elif e.kind == "evaluation" and isinstance(d.get("distribution"), Mapping):
            checks[e.proposal or d.get("ref") or ""] = d["distribution"]
        elif e.kind == "merge" and d.get("ok"):
            ref = (checks.get(e.proposal or "") or {}).get("reference") or {}
            regimes = {
                r.get("label", "?"): worst_of_sets(r.get("sets") or {})
                for r in ref.get("regimes") or []
                if isinstance(r, Mapping)
            }
            points.append(
                DriftPoint(
                    e.seq,
                    e.proposal or "",
                    str(d.get("new") or ""),
                    "merge",
                    str(ref.get("commit") or ""),
                    str(ref.get("budget") or ""),
                    regimes,
                )
            )
        elif e.kind == "revert":
            points.append(DriftPoint(e.seq, e.proposal or "", str(d.get("new") or ""), "revert"))
    return points


__all__ = ["DriftPoint", "drift_curve", "worst_of_sets", "STATS"]

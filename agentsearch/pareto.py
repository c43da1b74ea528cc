"""The trade view (`agentsearch stack pareto`): where each merge of a range sits on the objective against every guard.

A serving team optimizes throughput *under* latency objectives: a merge that buys +20% throughput with a 15% worse
p99 TTFT is a trade, not a win. The gate already rejects a trade beyond a guard's limit (``max_regression``, the
regression confirmed on fresh engines) and names it. This view reads the history, measures nothing, and shows the
range's proposals on the plane of the objective's change (x) against each guard's change (y), both with their 95%
intervals, as the gate measured them: the merges (kept), and the proposals a guard rejected (the trades refused).
Changes are speedups in the gate's sense (for a latency, baseline / candidate), so up and right is better.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from history.records import Evaluation as EvaluationRecord
from history.records import Merge, Revert, Role, Verdict, WorkloadSummary

from .records import read_entries
from .stack import merge_range
from .workspace import Workspace, git


@dataclass(frozen=True)
class Change:
    """One workload's change in one proposal's verdict, as the gate measured it."""

    workload: str
    metric: str
    speedup: float | None
    ci: tuple[float, ...] | None
    decision: str

    def to_json(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "metric": self.metric,
            "speedup": self.speedup,
            "ci": list(self.ci) if self.ci else None,
            "decision": self.decision,
        }


@dataclass(frozen=True)
class Trade:
    """A proposal of the range: merged, or rejected by a guard; its objective's and its guards' changes."""

    proposal: str
    title: str | None
    merge: str | None  # the merge commit (None: a guard rejected it)
    objective: Change | None
    guards: tuple[Change, ...]  # a guard whose regression was measured again on fresh engines: that measurement
    reason: str  # the rejecting guard's reason ('' for a merge)

    def to_json(self) -> dict[str, Any]:
        return {
            "proposal": self.proposal,
            "title": self.title,
            "merge": self.merge,
            "objective": self.objective.to_json() if self.objective else None,
            "guards": [g.to_json() for g in self.guards],
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Pareto:
    since: str
    tip: str
    objective: str
    max_regression: float
    trades: tuple[Trade, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "since": self.since,
            "tip": self.tip,
            "objective": self.objective,
            "max_regression": self.max_regression,
            "trades": [t.to_json() for t in self.trades],
        }

    def guards(self) -> list[str]:
        """The guard workloads any trade measured, in order of first appearance."""
        return list(dict.fromkeys(g.workload for t in self.trades for g in t.guards))


def _change(name: str, w: WorkloadSummary) -> Change:
    return Change(name, w.metric, w.speedup, (w.ci[0], w.ci[1]) if w.ci and len(w.ci) == 2 else None, w.decision)


def _trade(proposal: str, v: Verdict | EvaluationRecord, merge: str | None) -> Trade:
    objective = v.objective or ""
    obj = None
    guards: dict[str, Change] = {}
    for name, w in v.workloads.items():
        role = w.role
        if name == objective or role == Role.OBJECTIVE:
            obj = _change(name, w)
        elif role == Role.GUARD:
            guards.setdefault(name, _change(name, w))
        elif role == Role.GUARD_CHECK:  # the regression measured again on fresh engines: what decided, so what is shown
            first = name.removesuffix(" (fresh engines)")
            guards[first] = _change(first, w)
    reason = "" if merge else next((r for r in v.reasons if r.startswith("guard-workloads:")), "")
    title = v.title if isinstance(v, Verdict) else v.extra.get("title")
    return Trade(proposal, title if isinstance(title, str) else None, merge, obj, tuple(guards.values()), reason)


def pareto(ws: Workspace, since: str | None, max_regression: float) -> Pareto:
    """The range's merges and its guard-rejected proposals (judged on a baseline inside the range), oldest first."""
    rng = merge_range(ws, since)
    entries = read_entries(ws)
    reverted = {e.record.merge for e in entries if isinstance(e.record, Revert)}
    merged = {
        e.proposal: e.record.new
        for e in entries
        if isinstance(e.record, Merge) and e.record.ok and e.record.new not in reverted
    }
    in_range = {m.merge for m in rng.merges}
    objective = ""
    trades: dict[str, Trade] = {}  # by proposal: its last verdict (a merge after a re-evaluation wins)
    for e in entries:
        v = e.record
        if not isinstance(v, (Verdict, EvaluationRecord)) or not e.proposal:
            continue
        commit = merged.get(e.proposal)
        if commit in in_range and v.verdict == "merge":
            trades[e.proposal] = _trade(e.proposal, v, commit)
        elif (
            v.failed_check == "guard-workloads"
            and v.baseline
            and git.is_ancestor(ws.repo_dir, rng.since, v.baseline)
            and git.is_ancestor(ws.repo_dir, v.baseline, rng.tip)
        ):
            trades[e.proposal] = _trade(e.proposal, v, None)
        else:
            continue
        objective = objective or (v.objective or "")
    return Pareto(rng.since, rng.tip, objective, max_regression, tuple(trades.values()))

"""A proposal as its records say: created, then judged, then merged, and what became of the merge since.

One class for the episode that drives a proposal (it sets the verdict and the merge as they are recorded) and for
every reader of the history that asks what was tried and how it went: the insights, the proposers, the agent's
prompt and workbench. ``proposals_of`` rebuilds them from history entries. No git, no vllm.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .records import (
    BREAKING,
    FailureKind,
    Merge,
    Outcome,
    ProposalCreated,
    Revert,
    StackCheck,
    Verdict,
    WorkloadSummary,
)
from .records.agent_session import AgentSession

# the candidate broke the workload (crash, hang, failed build or tests, other outputs) rather than just not winning
BROKE = BREAKING | {FailureKind.TESTS_FAILED, FailureKind.CHANGED_OUTPUTS}


@dataclass
class Proposal:
    """One proposal: its ``proposal-created`` record, its verdict and merge once recorded, and whether the merge was
    reverted since or found a passenger by the latest leave-one-out (``agentsearch stack --leave-one-out``)."""

    created: ProposalCreated
    episode: str = ""
    verdict: Verdict | None = None
    merge: Merge | None = None
    reverted: bool = False  # merged, then reverted: not a win
    passenger: bool | None = None  # None: no leave-one-out has judged its merge

    # ---------------------------------------------------------------- what was proposed
    @property
    def number(self) -> int:
        return self.created.number

    @property
    def id(self) -> str:
        return self.created.proposal

    @property
    def key(self) -> str:
        return self.created.key

    @property
    def title(self) -> str:
        return self.created.title

    @property
    def rationale(self) -> str:
        return self.created.rationale

    @property
    def category(self) -> str:
        return self.created.category or "other"

    @property
    def proposer(self) -> str:
        return self.created.proposer

    @property
    def files(self) -> tuple[str, ...]:
        return self.created.files

    @property
    def meta(self) -> Mapping[str, Any]:
        return self.created.meta

    @property
    def knobs(self) -> Mapping[str, Any]:
        """knob -> [old, new] for a sweep's proposal ({} otherwise)."""
        return self.meta.get("knobs") or {}

    @property
    def revision(self) -> int:
        """How many revisions deep (an agent's revision of a rejected proposal is 1 deeper than its parent)."""
        return int(self.meta.get("revision") or 0)

    @property
    def parent(self) -> str | None:
        """The proposal this one revises."""
        return self.meta.get("parent")

    # ---------------------------------------------------------------- how it went
    @property
    def judged(self) -> bool:
        return self.verdict is not None

    @property
    def outcome(self) -> Outcome | None:
        return self.verdict.verdict if self.verdict else None

    @property
    def merged(self) -> bool:
        return self.merge is not None and self.merge.ok

    @property
    def speedup(self) -> float | None:
        return self.verdict.speedup if self.verdict else None

    @property
    def effect(self) -> float | None:
        """The objective's measured change (speedup - 1), when measured."""
        return None if self.speedup is None else self.speedup - 1

    @property
    def reasons(self) -> tuple[str, ...]:
        return self.verdict.reasons if self.verdict else ()

    @property
    def workloads(self) -> Mapping[str, WorkloadSummary]:
        return self.verdict.workloads if self.verdict else {}

    @property
    def failed_check(self) -> str | None:
        return self.verdict.failed_check if self.verdict else None

    @property
    def failures(self) -> tuple[FailureKind, ...]:
        return self.verdict.failures if self.verdict else ()

    @property
    def failed_checks(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.verdict.checks if c.status == "fail") if self.verdict else ()

    @property
    def is_win(self) -> bool:
        """Judged a merge and not reverted since (what the insights count as a win)."""
        return self.outcome == Outcome.MERGE and not self.reverted

    @property
    def is_failure(self) -> bool:
        """Did the candidate break (crash, hang, failed build) rather than just not win?"""
        return any(f in BROKE for f in self.failures)

    @property
    def reason_class(self) -> str:
        """One word for why it was rejected: its first failed check's name."""
        return self.failed_check or "none"


def proposals_of(entries: Iterable[Any]) -> list[Proposal]:
    """Every proposal with its verdict (all episodes), from history entries, in the order they were created."""
    found: dict[str, Proposal] = {}
    merged: dict[str, str] = {}
    reverted: set[str] = set()
    today: dict[str, str] = {}  # merge -> its latest leave-one-out decision
    for e in entries:
        r = e.record
        if isinstance(r, ProposalCreated):
            found[e.proposal] = Proposal(r, e.episode or "")
        elif isinstance(r, Verdict) and e.proposal in found:
            found[e.proposal].verdict = r
        elif isinstance(r, Merge):
            if e.proposal in found:
                found[e.proposal].merge = r
            if r.ok:
                merged[r.new] = e.proposal
        elif isinstance(r, Revert):
            reverted.add(r.merge)
        elif isinstance(r, StackCheck):
            for x in r.removals:  # the latest leave-one-out of each merge decides
                today[x.merge] = x.decision
    for sha in reverted:
        if (p := found.get(merged.get(sha, ""))) is not None:
            p.reverted = True
    for sha, decision in today.items():
        if (p := found.get(merged.get(sha, ""))) is not None:
            p.passenger = decision == "passenger"
    return list(found.values())


def judge_costs(rows: Iterable[Proposal], elapsed_s: float | None = None) -> dict[str, Any] | None:
    """What the judge spent and what it bought, over judged proposals: decisions, the judge's seconds (every
    verdict's wall time: the machine held for it), engine starts (where recorded, 0.8 on), the merged percent of the
    objective (merges still standing, as ``agent_costs`` counts it); seconds per decision, decisions per hour (of
    ``elapsed_s``, the episode's wall clock, when given: proposers' time included; else of the judge's seconds) and
    machine-seconds per merged percent. None: nothing judged."""
    decisions, seconds, starts, known, merged_pct = 0, 0.0, 0, 0, 0.0
    for r in rows:
        v = r.verdict
        if v is None:
            continue
        decisions += 1
        seconds += v.timing.wall_s
        if v.timing.engine_starts is not None:
            starts, known = starts + v.timing.engine_starts, known + 1
        if r.is_win and r.merged and r.effect is not None:
            merged_pct += r.effect * 100.0
    if not decisions:
        return None
    hours = (elapsed_s if elapsed_s else seconds) / 3600.0
    return {
        "decisions": decisions,
        "judge_s": round(seconds, 3),
        "s_per_decision": round(seconds / decisions, 1),
        "decisions_per_hour": round(decisions / hours, 2) if hours > 0 else None,
        "engine_starts": starts if known else None,
        "engine_starts_per_decision": round(starts / known, 2) if known else None,
        "merged_pct": round(merged_pct, 3),
        "machine_s_per_merged_pct": round(seconds / merged_pct, 3) if merged_pct > 0 else None,
    }


def judge_line(c: Mapping[str, Any]) -> str:
    """``judge_costs`` for people, one line: what the budget buys."""

    def n(x: float) -> str:
        return f"{x:,.0f}" if abs(x) >= 10 else f"{x:.2g}"

    starts = f", {c['engine_starts_per_decision']:g} engine starts" if c.get("engine_starts_per_decision") else ""
    rate = f"{n(c['decisions_per_hour'])} decisions/hour" if c.get("decisions_per_hour") else "—"
    per = (
        f"{n(c['machine_s_per_merged_pct'])} machine-s per merged percent ({c['merged_pct']:+.1f}% merged)"
        if c.get("machine_s_per_merged_pct") is not None
        else "no merged win"
    )
    return f"judge: {c['decisions']} decisions, {n(c['s_per_decision'])} s each{starts}; {rate}; {per}"


def agent_costs(rows: Iterable[Proposal]) -> dict[str, Any] | None:
    """What the agent sessions cost (dollars, tokens, machine seconds, calls by kind) and what they bought:
    dollars and machine-seconds per merged percent of the objective (merges still standing). None: no agent."""
    sessions = []
    merged_pct = 0.0
    for r in rows:
        try:
            s = AgentSession.of(r.meta)
        except ValueError:  # a session account that does not fit: counted as no agent's
            s = None
        if s is None:
            continue
        sessions.append(s)
        if r.is_win and r.merged and r.effect is not None:  # a win that landed (its merge record ok)
            merged_pct += r.effect * 100.0
    if not sessions:
        return None
    tot = AgentSession.totals(sessions)
    machine_s = tot["tool_seconds"]
    tot.update(
        merged_pct=round(merged_pct, 3),
        cost_usd=round(tot["cost_usd"], 6),
        usd_per_merged_pct=round(tot["cost_usd"] / merged_pct, 6) if merged_pct > 0 else None,
        machine_s_per_merged_pct=round(machine_s / merged_pct, 3) if merged_pct > 0 else None,
    )
    return tot

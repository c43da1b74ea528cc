"""`agentsearch history [verify]`: the judged proposals and evaluations, and the chain check.

Read-only and quick to start: no pandas, scipy or torch here (a table is drawn with rich)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from history import records as rec
from history.drift import DriftPoint, drift_curve
from history.proposals import agent_costs, judge_costs, judge_line, proposals_of
from history.records import Evaluation as EvaluationRecord

from ..errors import EXIT_FAIL, AgentsearchError
from ..headline import headline, pct, unit
from ..records import append, read_entries, verify_history
from ..workspace import Workspace
from ..workspace.history_head import episode_start
from .output import compact_table, fit, out, print_json

RECHECK = {True: "recheck holds", False: "recheck FAILED", None: ""}


def rows(ws: Workspace) -> list[dict[str, Any]]:
    """Every evaluation (`evaluate`) and verdict (episodes) in order, with what became of a merge:
    merged, reverted, the last recheck."""
    entries = read_entries(ws)
    merge_of = {e.proposal: r.new for e in entries if isinstance(r := e.record, rec.Merge) and r.ok}
    reverted = {r.merge: r.new for e in entries if isinstance(r := e.record, rec.Revert)}
    recheck = {r.merge: r.holds for e in entries if isinstance(r := e.record, rec.Recheck)}
    units = _units(ws)
    out_rows = []
    for e in entries:
        r = e.record
        if not isinstance(r, (rec.Verdict, rec.Evaluation)):
            continue
        obj = r.objective_summary
        merge = merge_of.get(e.proposal) if isinstance(r, rec.Verdict) else None
        ref = r.ref if isinstance(r, rec.Evaluation) else None
        out_rows.append(
            {
                "seq": e.seq,
                "kind": "episode" if isinstance(r, rec.Verdict) else "evaluate",
                "episode": e.episode,
                "proposal": e.proposal or ref,
                "title": (r.title if isinstance(r, rec.Verdict) else None) or ref,
                "branch": (r.branch if isinstance(r, rec.Verdict) else None) or ref,
                "candidate": (r.candidate or "")[:12],
                "baseline": (r.baseline or "")[:12],
                "verdict": r.verdict,
                "speedup": obj.speedup if obj else None,
                "ci": list(obj.ci) if obj and obj.ci else None,
                "pairs": obj.pairs if obj else None,
                "reasons": list(r.reasons),
                "headline": headline(r, units),
                "merged": merge is not None,
                "merge": merge,
                "reverted": merge is not None and merge in reverted,
                "revert": reverted.get(merge) if merge else None,
                "recheck": recheck.get(merge) if merge else None,
            }
        )
    return out_rows


def _units(ws: Workspace) -> dict[str, str]:
    """workload -> unit from the config, for records older than the unit in the record."""
    try:
        return {w.name: unit(w.metric, w.unit) for w in ws.config().workloads}
    except (AgentsearchError, OSError, ValueError):
        return {}


def state(r: dict[str, Any]) -> str:
    """What became of a verdict: merged / reverted / not merged, and the last recheck."""
    if r["kind"] == "evaluate":
        return "evaluate"  # evaluate never merges
    if r["merged"]:
        base = "reverted" if r["reverted"] else "merged"
        return f"{base}, {RECHECK[r['recheck']]}" if r["recheck"] is not None else base
    return "NOT merged" if r["verdict"] == "merge" else ""


def show(target: Path, as_json: bool) -> int:
    ws = Workspace.open(target)
    data = rows(ws)
    drift = drift_curve(read_entries(ws))
    if as_json:
        print_json({"evaluations": data, "drift": [p.to_json() for p in drift]})
        return 0
    if not data:
        out.print("no evaluations recorded yet")
        return 0
    out.print(table(data, out.width))
    if drift:
        out.print(drift_table(drift, out.width))
    judged = [p for p in proposals_of(read_entries(ws)) if p.judged]
    jc = judge_costs(judged)
    if jc:
        out.print(judge_line(jc))
    ag = agent_costs(judged)
    if ag:
        per = (
            "no merged win yet"
            if ag.get("usd_per_merged_pct") is None
            else (
                f"${ag['usd_per_merged_pct']:.4f} and {ag['machine_s_per_merged_pct']:.1f} machine-s per merged percent"
            )
        )
        out.print(
            f"agents: {ag['sessions']} sessions, ${ag['cost_usd']:.4f}, {ag['tokens_in']} tokens in / "
            f"{ag['tokens_out']} out, {ag['tool_seconds']:.0f} s of workbench calls; {ag['merged_pct']:+.1f}% merged: "
            f"{per}"
        )
    return 0


def agents(ws: Workspace) -> dict[str, Any] | None:
    """The agent sessions' costs over the history and what they bought (``agent_costs``)."""
    return agent_costs(p for p in proposals_of(read_entries(ws)) if p.judged)


def _g(v: float | None) -> str:
    return "—" if v is None else f"{v:.3g}"


def drift_table(points: list[DriftPoint], width: int = 100) -> Any:
    """Main's divergence from the reference after each merge (history.drift): the worst over regimes and paths."""
    rows = []
    for p in points:
        ident = (p.proposal or "?").rsplit("/", 1)[-1]
        if p.event == "revert":
            rows.append(
                [fit(ident, 14), p.commit[:10], "reverted", "—", "—", "—", "—", "main went back (not measured)"]
            )
            continue
        if not p.measured:
            rows.append(
                [fit(ident, 14), p.commit[:10], "merged", "—", "—", "—", "—", "no reference comparison recorded"]
            )
            continue
        rows.append(
            [
                fit(ident, 14),
                p.commit[:10],
                "merged",
                _g(p.worst("kl_mean")),
                _g(p.worst("kl_max")),
                _g(p.worst("dlogprob_max")),
                _g(p.worst("same_top_pct")),
                f"vs {p.reference[:10]} at {', '.join(p.regimes)}; budget: {p.budget}",
            ]
        )
    return compact_table(
        "main's drift from the reference, merge by merge (worst over regimes and paths)",
        ["#", "main", "event", "KL mean", "KL max", "|Δlp| max", "same top %", "against"],
        rows,
        width,
        right=(3, 4, 5, 6),
    )


def table(data: list[dict[str, Any]], width: int = 100) -> Any:
    """One line per verdict that fits ``width`` columns, the title and the reason ellipsized to
    what is left; each episode under its own heading row."""
    color = {"merge": "green", "reject": "red", "review": "yellow"}
    rows, styles = [], []
    episode = None
    for r in data:
        if r["kind"] == "episode" and r["episode"] != episode:
            rows.append(["", "", "", "", "", "", f"episode {r['episode']}"])
            styles.append(["", "", "", "", "", "", "bold"])
        episode = r["episode"] if r["kind"] == "episode" else None
        ident = (r["proposal"] or "?").rsplit("/", 1)[-1] if r["kind"] == "episode" else (r["proposal"] or "?")
        reason = "; ".join(r["reasons"]) or (r["headline"].split(" — ", 1)[-1] if r["verdict"] == "merge" else "—")
        rows.append(
            [
                fit(ident, 14),
                r["verdict"] or "—",
                state(r),
                pct(r["speedup"]),
                "—" if r["pairs"] is None else str(r["pairs"]),
                r["title"] or "",
                reason,
            ]
        )
        styles.append(["", color.get(r["verdict"] or "", "")])
    return compact_table(
        "history (every record: agentsearch history --json)",
        ["#", "verdict", "state", "Δ obj.", "pairs", "title", "reason"],
        rows,
        width,
        right=(3, 4),
        styles=styles,
    )


def verify_chain(target: Path, as_json: bool = False) -> int:
    ws = Workspace.open(target)
    rep = verify_history(ws)
    if as_json:
        print_json(
            {
                "ok": rep.ok,
                "records": rep.records,
                "bad_line": rep.bad_line,
                "reason": rep.reason or None,
                "torn_tail": bool(rep.torn_tail),
            }
        )
        return 0 if rep.ok else EXIT_FAIL
    if not rep.ok:
        where = f" at line {rep.bad_line}" if rep.bad_line else ""
        click.echo(f"history verify: FAILED{where}: {rep.reason}", err=True)
        return EXIT_FAIL
    extra = " (a torn last line from an interrupted write will be repaired on the next write)" if rep.torn_tail else ""
    start = episode_start(read_entries(ws))
    vouched = (
        f"; every commit on {ws.baseline_branch!r} since {start[:12]} is a recorded merge or revert"
        if start
        else f"; no episode recorded, so no commit on {ws.baseline_branch!r} was checked"
    )
    click.echo(f"history verify: ok, {rep.records} records{extra}{vouched}")
    return 0


def record_evaluation(
    ws: Workspace, record: EvaluationRecord, proposal: str | None = None, episode: str | None = None
) -> None:
    append(ws, record, episode, proposal)

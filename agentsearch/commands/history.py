"""`agentsearch history [verify]`: the judged proposals and evaluations, and the chain check.

Read-only and quick to start: no pandas, scipy or torch here (a table is drawn with rich)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ..errors import EXIT_FAIL, AgentsearchError
from ..headline import headline, pct, unit
from ..records import append, read_entries, verify_history
from ..workspace import Workspace
from .output import out, print_json

RECHECK = {True: "recheck holds", False: "recheck FAILED", None: ""}


def rows(ws: Workspace) -> list[dict[str, Any]]:
    """Every evaluation (`evaluate`) and verdict (episodes) in order, with what became of a merge:
    merged, reverted, the last recheck."""
    entries = read_entries(ws)
    merge_of = {e.proposal: e.data.get("new") for e in entries if e.kind == "merge" and e.data.get("ok")}
    reverted = {e.data.get("merge"): e.data.get("new") for e in entries if e.kind == "revert"}
    recheck: dict[str, bool] = {}
    for e in entries:
        if e.kind == "recheck":
            recheck[e.data.get("merge")] = bool(e.data.get("holds"))
    units = _units(ws)
    out_rows = []
    for e in entries:
        if e.kind not in ("evaluation", "verdict"):
            continue
        d = e.data
        obj = (d.get("workloads") or {}).get(d.get("objective", ""), {})
        merge = merge_of.get(e.proposal) if e.kind == "verdict" else None
        pairs = obj.get("pairs")
        out_rows.append({
            "seq": e.seq, "kind": "episode" if e.kind == "verdict" else "evaluate", "episode": e.episode,
            "proposal": e.proposal or d.get("ref"), "title": d.get("title") or d.get("ref"),
            "branch": d.get("branch") or d.get("ref"), "candidate": (d.get("candidate") or "")[:12],
            "baseline": (d.get("baseline") or "")[:12], "verdict": d.get("verdict"), "speedup": obj.get("speedup"),
            "ci": obj.get("ci"), "pairs": None if pairs is None else int(pairs), "reasons": list(d.get("reasons", [])),
            "headline": headline(d, units),
            "merged": merge is not None, "merge": merge, "reverted": merge is not None and merge in reverted,
            "revert": reverted.get(merge) if merge else None, "recheck": recheck.get(merge) if merge else None,
        })
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
    if as_json:
        print_json(data, key="evaluations")
        return 0
    if not data:
        out.print("no evaluations recorded yet")
        return 0
    out.print(table(data, out.width))
    return 0


def fit(text: str, width: int) -> str:
    """One line of at most ``width`` characters, ellipsized."""
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def table(data: list[dict[str, Any]], width: int = 100) -> Any:
    """A compact table that fits ``width`` columns: one line per verdict, the title and the
    reason ellipsized to what is left; each episode under its own heading row."""
    from rich.markup import escape
    from rich.table import Table

    cells = []
    for r in data:
        ident = (r["proposal"] or "?").rsplit("/", 1)[-1] if r["kind"] == "episode" else (r["proposal"] or "?")
        reason = "; ".join(r["reasons"]) or (r["headline"].split(" — ", 1)[-1] if r["verdict"] == "merge" else "—")
        cells.append([fit(ident, 14), r["verdict"] or "—", state(r), pct(r["speedup"]),
                      "—" if r["pairs"] is None else str(r["pairs"]), r["title"] or "", reason])
    heads = ["#", "verdict", "state", "Δ obj.", "pairs", "title", "reason"]
    fixed = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads[:5])]
    left = max(24, width - sum(fixed) - len(heads) + 1)
    title_w = min(max(len(heads[5]), *(len(c[5]) for c in cells)), max(8, left // 3))
    reason_w = max(10, left - title_w - 1)
    t = Table(box=None, pad_edge=False, padding=(0, 1, 0, 0), header_style="bold", title_justify="left",
              title="history (every record: agentsearch history --json)")
    for i, h in enumerate(heads):
        t.add_column(h, no_wrap=True, justify="right" if i in (3, 4) else "left")
    color = {"merge": "green", "reject": "red", "review": "yellow"}
    episode = None
    for r, c in zip(data, cells):
        if r["kind"] == "episode" and r["episode"] != episode:
            t.add_row("", "", "", "", "", "", f"[bold]episode {escape(fit(str(r['episode']), reason_w - 8))}[/]")
        episode = r["episode"] if r["kind"] == "episode" else None
        v = c[1]
        t.add_row(escape(c[0]), f"[{color[v]}]{v}[/]" if v in color else escape(v), escape(c[2]), c[3], c[4],
                  escape(fit(c[5], title_w)), escape(fit(c[6], reason_w)))
    return t


def verify_chain(target: Path, as_json: bool = False) -> int:
    ws = Workspace.open(target)
    rep = verify_history(ws)
    if as_json:
        print_json({"ok": rep.ok, "records": rep.records, "bad_line": rep.bad_line, "reason": rep.reason or None,
                    "torn_tail": bool(rep.torn_tail)})
        return 0 if rep.ok else EXIT_FAIL
    if not rep.ok:
        where = f" at line {rep.bad_line}" if rep.bad_line else ""
        click.echo(f"history verify: FAILED{where}: {rep.reason}", err=True)
        return EXIT_FAIL
    extra = " (a torn last line from an interrupted write will be repaired on the next write)" if rep.torn_tail else ""
    click.echo(f"history verify: ok, {rep.records} records{extra}")
    return 0


def record_evaluation(ws: Workspace, data: dict, proposal: str | None = None, episode: str | None = None) -> None:
    append(ws, "evaluation", episode, proposal, data)

"""`agentsearch history [verify]`: the judged proposals and evaluations, and the chain check."""

from __future__ import annotations

from pathlib import Path

import click
import pandas as pd

from ..errors import EXIT_FAIL
from ..records import append, read_entries, verify_history
from ..workspace import Workspace
from .output import out, print_json

def rows(ws: Workspace) -> list[dict]:
    entries = read_entries(ws)
    merged = {e.proposal for e in entries if e.kind == "merge" and e.data.get("ok")}
    out_rows = []
    for e in entries:
        if e.kind not in ("evaluation", "verdict"):
            continue
        d = e.data
        obj = (d.get("workloads") or {}).get(d.get("objective", ""), {})
        out_rows.append({
            "seq": e.seq, "proposal": e.proposal or d.get("ref"), "title": d.get("title") or d.get("ref"),
            "branch": d.get("branch") or d.get("ref"), "candidate": (d.get("candidate") or "")[:12],
            "baseline": (d.get("baseline") or "")[:12], "verdict": d.get("verdict"), "speedup": obj.get("speedup"),
            "pairs": obj.get("pairs"), "reasons": list(d.get("reasons", [])),
            "merged": e.kind == "verdict" and e.proposal in merged,
        })
    return out_rows


def show(target: Path, as_json: bool) -> int:
    ws = Workspace.open(target)
    data = rows(ws)
    if as_json:
        print_json(data)
        return 0
    if not data:
        out.print("no evaluations recorded yet")
        return 0
    df = pd.DataFrame(data)
    df["speedup"] = df["speedup"].map(lambda x: "—" if x is None or pd.isna(x) else f"{x - 1:+.2%}")
    df["reasons"] = df["reasons"].map(lambda r: "; ".join(r)[:100] or "—")
    with pd.option_context("display.max_colwidth", 100, "display.width", 200):
        click.echo(df.drop(columns=["seq"]).to_string(index=False))
    return 0


def verify_chain(target: Path) -> int:
    ws = Workspace.open(target)
    rep = verify_history(ws)
    if not rep.ok:
        where = f" at line {rep.bad_line}" if rep.bad_line else ""
        click.echo(f"history verify: FAILED{where}: {rep.reason}", err=True)
        return EXIT_FAIL
    extra = " (a torn last line from an interrupted write will be repaired on the next write)" if rep.torn_tail else ""
    click.echo(f"history verify: ok, {rep.records} records{extra}")
    return 0


def record_evaluation(ws: Workspace, data: dict, proposal: str | None = None, episode: str | None = None) -> None:
    append(ws, "evaluation", episode, proposal, data)

"""`agentsearch profile [REF]`: the ranked table of where a workload's time goes."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from history.records import Profile

from .. import preflight
from ..profiling import profile
from ..records import append
from ..workspace import Workspace
from .output import out, print_json, progress, safe


def run(target: Path, as_json: bool, ref: str | None, workload: str | None, seed: int | None) -> int:
    ws = Workspace.open(target)
    if ref is not None:
        ws.resolve(ref)
    with ws.lock(), progress() as say:
        preflight.require(ws, say=say)  # seconds: a set-up error is the run's (exit 5)
        data = profile(ws, ref, workload, seed, say)
        append(ws, Profile.of(data), None, None)
    if as_json:
        print_json(data)
        return 0
    out.print(
        f"[bold]{data['workload']}[/] at {data['commit'][:12]} on {data['device']}: {data['wall_s']:.2f} s profiled"
    )
    for title, key in (
        ("by engine phase", "by_phase"),
        ("by op / kernel (self time)", "by_op"),
        ("by module (self time)", "by_module"),
    ):
        t = Table(title=title)
        for col in ("name", "seconds", "share"):
            t.add_column(col)
        for r in data[key][:12]:
            t.add_row(safe(str(r["name"]))[:70], f"{r['seconds']:.3f}", f"{r['share_pct']:.1f}%")
        out.print(t)
    return 0

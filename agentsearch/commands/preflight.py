"""`agentsearch preflight [--run]`: the checks every measuring command runs first, on their own."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from .. import preflight as pf
from ..errors import EXIT_RUN_ERROR
from ..workspace import Workspace
from .output import out, print_json, progress, safe

STYLE = {pf.OK: "green", pf.WARN: "yellow", pf.FAIL: "red", pf.SKIPPED: "dim"}


def run(target: Path, as_json: bool, dynamic: bool, refresh: bool) -> int:
    ws = Workspace.open(target)
    base = ws.baseline_commit()
    config = ws.config(base)
    with progress() as say:
        found = pf.check(ws, config, base, say, refresh=refresh)
        if dynamic and pf.first_failure(found) is None:
            failure = pf.baseline_alone(ws, config, base, say=say)
            names = ", ".join(w.name for w in config.workloads)
            found.append(
                pf.Finding(
                    "baseline", pf.FAIL, failure, "fix the baseline (or the machine): nothing can be judged against it"
                )
                if failure
                else pf.Finding("baseline", pf.OK, f"builds alone and runs each workload once ({names})")
            )
        elif not dynamic:
            found.append(
                pf.Finding(
                    "baseline",
                    pf.SKIPPED,
                    "not run (--run builds the baseline alone, starts its engines and runs each workload once)",
                )
            )
    ok = pf.first_failure(found) is None
    if as_json:
        print_json(
            {"schema_version": pf.PREFLIGHT_SCHEMA, "ok": ok, "baseline": base, "checks": [asdict(f) for f in found]}
        )
    else:
        for f in found:
            fix = f"\n{'':19}fix: {safe(f.fix)}" if f.fix and f.status != pf.OK else ""
            out.print(f"[{STYLE[f.status]}]{f.status:>7}[/] {f.name:<11} {safe(f.detail)}{fix}")
    return 0 if ok else EXIT_RUN_ERROR

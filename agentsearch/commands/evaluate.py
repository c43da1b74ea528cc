"""`agentsearch evaluate REF`: measure REF against the baseline and print the verdict."""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape
from rich.table import Table

from ..errors import EXIT_GATE_REJECT, AgentsearchError
from ..evaluation import Evaluation, evaluate
from ..gate import MERGE
from ..workspace import Workspace
from .history import record_evaluation
from .output import out, print_json, progress


def run(target: Path, as_json: bool, ref: str, seed: int | None, keep_worktrees: bool, baseline: str | None = None,
        alpha: float | None = None) -> int:
    ws = Workspace.open(target)
    ws.resolve(ref)  # bad refs are bad input, before any work
    if baseline is not None:
        ws.resolve(baseline)
    if alpha is not None and not 0 < alpha < 1:
        raise AgentsearchError(f"--alpha {alpha}: expected a number strictly between 0 and 1")
    with ws.lock(), progress() as say:
        result = evaluate(ws, ref, seed=seed, progress=say, keep_worktrees=keep_worktrees, baseline=baseline, alpha=alpha)
        data = result.to_json()
        data["objective"] = ws.config(result.baseline).objective.name
        record_evaluation(ws, data)
    if as_json:
        print_json(result.to_json())
    else:
        show(result)
    return 0 if result.verdict.verdict == MERGE else EXIT_GATE_REJECT


def fmt_pct(x: float | None) -> str:
    return "—" if x is None else f"{x - 1:+.2%}"


def show(result: Evaluation) -> None:
    v = result.verdict
    color = {"merge": "green", "reject": "red", "review": "yellow"}[v.verdict]
    out.print(f"[bold {color}]{v.verdict.upper()}[/] {escape(result.ref)} ({result.candidate[:12]}) vs baseline {result.baseline[:12]}")
    for reason in v.reasons:
        out.print(f"  - {escape(reason)}")
    if result.workloads:
        t = Table(title="workloads")
        for col in ("workload", "role", "baseline", "candidate", "speedup", "95% CI", "p", "pairs", "decision"):
            t.add_column(col)
        for w in result.workloads.values():
            t.add_row(
                w.name, w.role,
                "—" if w.baseline_median is None else f"{w.baseline_median:.4g}",
                "—" if w.candidate_median is None else f"{w.candidate_median:.4g}",
                fmt_pct(w.speedup),
                "—" if w.ci is None else f"[{w.ci[0] - 1:+.2%}, {w.ci[1] - 1:+.2%}]",
                "—" if w.p_value is None else f"{w.p_value:.2g}",
                f"{w.pairs}/{w.max_pairs}" + (" (early)" if w.early_stop else ""),
                w.decision,
            )
        out.print(t)
    c = Table(title="gate checks")
    c.add_column("check")
    c.add_column("status")
    c.add_column("detail")
    for check in v.checks:
        c.add_row(check.name, check.status.value, escape(check.detail))
    out.print(c)
    t = result.timing()
    out.print(
        f"wall {t['wall_s']:.1f} s = engines {t['engine_s']:.1f} s + measurement {t['measurement_s']:.1f} s "
        f"+ overhead {t['overhead_s']:.1f} s ({t['overhead_pct']:.1f}%); seed {result.seed}"
    )

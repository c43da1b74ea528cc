"""`agentsearch evaluate REF`: measure REF against the baseline and print the verdict."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from history.records import Role

from ..errors import EXIT_GATE_REJECT, AgentsearchError
from ..evaluation import Evaluation, evaluate
from ..gate import MERGE, REVIEW
from ..headline import ci_text, decision_label, headline, number, p_text, pct
from ..workspace import Workspace, git
from .history import record_evaluation
from .output import out, print_json, progress, safe


def run(
    target: Path,
    as_json: bool,
    ref: str,
    seed: int | None,
    keep_worktrees: bool,
    baseline: str | None = None,
    alpha: float | None = None,
) -> int:
    ws = Workspace.open(target)
    ws.resolve(ref)  # bad refs are bad input, before any work
    if baseline is not None:
        ws.resolve(baseline)
    if alpha is not None and not 0 < alpha < 1:
        raise AgentsearchError(f"--alpha {alpha}: expected a number strictly between 0 and 1")
    with ws.lock(), progress() as say:
        result = evaluate(
            ws, ref, seed=seed, progress=say, keep_worktrees=keep_worktrees, baseline=baseline, alpha=alpha
        )
        objective = ws.config(result.baseline).objective.name
        record = result.record(objective)
        record_evaluation(ws, record)
    if as_json:
        from ..report import Evidence, figures

        shown = figures(Evidence(ref, "evaluation", record, ()))  # how each figure was obtained (provenance)
        print_json(
            {
                **result.to_json(),
                "objective": objective,
                "headline": headline(record),
                "figures": [f.to_json() for f in shown],
            }
        )
    else:
        same = git.tree_of(ws.repo_dir, result.candidate) == git.tree_of(ws.repo_dir, result.baseline)
        show(result, objective, git.branch_exists(ws.repo_dir, ref), no_change=same)
    return 0 if result.verdict.verdict == MERGE else EXIT_GATE_REJECT


def show(
    result: Evaluation, objective: str, ref_is_branch: bool | None = None, no_change: bool = False, advice: bool = True
) -> None:
    """The verdict in one line (number and unit), what evaluate did not do, reasons, the
    per-workload table (fits 80 columns: the CI is never cut), the gate checks and the time."""
    v = result.verdict
    color = {"merge": "green", "reject": "red", "review": "yellow"}[v.verdict]
    line = headline(result.record(objective))
    word, _, rest = line.partition(" — ")
    out.print(f"[bold {color}]{word}[/]" + (f" — {safe(rest)}" if rest else ""))
    out.print(
        f"  {safe(result.ref)} ({result.candidate[:12]}) against baseline {result.baseline[:12]}, seed {result.seed}"
    )
    if no_change:
        out.print(
            "  REF changes nothing (the same tree as the baseline): this was an A/A measurement of the baseline "
            "against itself"
        )
    for reason in v.reasons:
        out.print(f"  - {safe(reason)}")
    if result.workloads or result.confirmation:
        t = Table(title="workloads", box=None, pad_edge=False, padding=(0, 1, 0, 0), header_style="bold")
        t.add_column("workload", no_wrap=True, overflow="ellipsis", max_width=14)
        t.add_column("baseline", justify="right", no_wrap=True)
        t.add_column("candidate", justify="right", no_wrap=True)
        t.add_column("Δ", justify="right", no_wrap=True)
        t.add_column("95% CI", justify="right", no_wrap=True)
        t.add_column("p", justify="right", no_wrap=True)
        t.add_column("pairs", justify="right", no_wrap=True)
        t.add_column("decision", overflow="fold")
        rows = [*result.workloads.values(), *([result.confirmation] if result.confirmation else [])]
        for w in rows:
            u = f" {w.unit}" if w.unit else ""
            name = "confirm" if w.role == Role.CONFIRMATION else w.name + ("*" if w.role == Role.OBJECTIVE else "")
            t.add_row(
                safe(name),
                number(w.baseline_median),
                number(w.candidate_median) + u,
                pct(w.speedup),
                "—" if w.ci is None else ci_text(w.ci),
                p_text(w.p_value),
                str(w.pairs),
                decision_label(w),
            )
        t.caption = "* objective" + ("; confirm: the objective again on fresh seeds" if result.confirmation else "")
        out.print(t)
    c = Table(title="gate checks", box=None, pad_edge=False, padding=(0, 1, 0, 0), header_style="bold")
    c.add_column("check", no_wrap=True)
    c.add_column("status", no_wrap=True)
    c.add_column("detail", overflow="fold")
    for check in v.checks:
        c.add_row(check.name, check.status.value, safe(check.detail))
    out.print(c)
    out.print(result.timing().line())
    if advice:
        out.print(next_step(result, ref_is_branch))


def next_step(result: Evaluation, ref_is_branch: bool | None) -> str:
    """evaluate never merges: say so, and how to."""
    verdict = result.verdict.verdict
    if verdict == MERGE:
        if ref_is_branch:
            how = f"`agentsearch episode --branches {result.ref}` judges it again and merges on a win"
        else:
            how = (
                f"put it on a branch (`git branch NAME {result.candidate[:12]}`), "
                "then `agentsearch episode --branches NAME` judges it again and merges on a win"
            )
        return f"not merged: evaluate never merges; {how}"
    if verdict == REVIEW:
        return (
            f"not merged: held for review (too good to be true); read `agentsearch report {safe(result.ref)}` "
            "and merge by hand if it holds up"
        )
    return "not merged (rejected)"

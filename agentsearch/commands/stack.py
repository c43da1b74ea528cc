"""`agentsearch stack [--since REF] [--leave-one-out]` and `agentsearch stack bisect [--metric W]`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from history.records import Role
from history.records.stack import StackBisect, StackCheck

from ..errors import EXIT_FAIL, AgentsearchError
from ..headline import pct
from ..workspace import Workspace
from .output import compact_table, err, out, print_json, progress, safe

if TYPE_CHECKING:
    from ..stack import Journal


def _ci(ci: tuple[float, ...] | None) -> str:
    return f"[{pct(ci[0])}, {pct(ci[1])}]" if ci and len(ci) == 2 else "—"


def show_check(r: StackCheck) -> None:
    out.print(f"stack {r.since[:12]} → {r.tip[:12]}: {len(r.merges)} merge(s), objective {safe(r.objective)}")
    rows = [
        [m.merge[:12], safe(m.proposal or "—"), safe((m.title or "")[:48]), pct(m.speedup), _ci(m.ci)] for m in r.merges
    ]
    out.print(
        compact_table(
            "the merges, as the gate merged them",
            ["merge", "proposal", "title", "Δ then", "95% CI"],
            rows,
            out.width,
            right=(3,),
        )
    )
    out.print(f"product of their estimates: {pct(r.product)} {_ci(r.product_ci)}")
    out.print(
        f"measured, the tip against the start: {pct(r.cumulative)} {_ci(r.ci)} after {r.pairs} pairs (seed {r.seed})"
    )
    if r.removals:
        rows = [
            [
                x.merge[:12],
                x.decision + (", shrank" if x.shrank else ""),
                pct(x.marginal),
                _ci(x.ci),
                str(x.pairs),
                safe(x.reason[:80]),
            ]
            for x in r.removals
        ]
        out.print(
            compact_table(
                "leave-one-out: the tip against the tip without each merge",
                ["merge", "decision", "marginal", "95% CI", "pairs", "why"],
                rows,
                out.width,
                right=(2, 4),
            )
        )
    if r.interference:
        rows = [
            [
                " + ".join(m[:12] for m in x.merges),
                "interfere" if x.interfere else "—",
                pct(x.joint),
                pct(x.expected),
                "—" if x.p_value is None else f"{x.p_value:.2g}",
                safe(x.reason[:80]),
            ]
            for x in r.interference
        ]
        out.print(
            compact_table(
                "interference: the pairs the removals point to, removed together",
                ["merges", "flag", "without both", "product of singles", "p", "why"],
                rows,
                out.width,
                right=(2, 3),
            )
        )
    if r.guards:
        rows = [
            [
                safe(g.name) + (" (fresh engines)" if g.role == Role.GUARD_CHECK else ""),
                g.decision,
                pct(g.speedup),
                _ci(g.ci),
                str(g.pairs),
            ]
            for g in r.guards
        ]
        out.print(
            compact_table(
                "guards, the tip against the start (a regression re-measured on fresh engines)",
                ["guard", "decision", "Δ", "95% CI", "pairs"],
                rows,
                out.width,
                right=(2, 4),
            )
        )
    colour = {"delivers": "green", "under-delivers": "red"}.get(r.verdict, "yellow")
    out.print(f"[{colour}]{r.verdict}[/]" + "".join(f"\n  {safe(x)}" for x in r.reasons) + f"  ({r.seconds:.0f} s)")
    if r.passengers:
        out.print(
            "passengers (no significant contribution at today's operating point): "
            + ", ".join(p[:12] for p in r.passengers)
            + "; `agentsearch revert MERGE` removes one"
        )


def show_bisect(r: StackBisect) -> None:
    out.print(f"bisect {safe(r.workload)} over {len(r.merges)} merge(s) {r.since[:12]} → {r.tip[:12]}")
    rows = [
        [str(i), f"{s.index}", s.commit[:12], s.outcome, pct(s.speedup), _ci(s.ci), str(s.pairs)]
        for i, s in enumerate(r.steps, 1)
    ]
    out.print(
        compact_table(
            "steps (each commit against the start)",
            ["step", "commit #", "commit", "outcome", "Δ", "95% CI", "pairs"],
            rows,
            out.width,
            right=(4, 6),
        )
    )
    out.print(("[red]" if r.culprit else "[yellow]") + safe(r.reason) + "[/]" + f"  ({r.seconds:.0f} s)")


def write_report(record: StackCheck | StackBisect, path: Path) -> None:
    """The record as Markdown at ``path`` (a stack check's waterfall as a PNG beside it), or as one self-contained
    HTML page when ``path`` ends in .html."""
    from ..report import stack_html, stack_markdown, stack_waterfall

    image = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix.lower() in (".html", ".htm"):
            path.write_text(stack_html(record))
        else:
            if isinstance(record, StackCheck):
                png = path.with_suffix(".waterfall.png")
                png.write_bytes(stack_waterfall(record, "png"))
                image = png.name
            path.write_text(stack_markdown(record, image))
    except OSError as exc:  # the check is recorded in the history: `agentsearch history` still has it
        raise AgentsearchError(
            f"--report {path}: {exc.strerror or exc}; the check itself is recorded in the history"
        ) from None
    err.print(safe(f"report: {path}" + (f" (+ {image})" if image else "")))


def writable(report: Path | None) -> None:
    """Refuse a report path that cannot be written before anything is measured (one line)."""
    if report is None:
        return
    parent = report.parent if str(report.parent) else Path(".")
    if report.is_dir() or (report.exists() and not os.access(report, os.W_OK)):
        raise AgentsearchError(f"--report {report}: not a writable file; name a file, e.g. reports/stack.md")
    probe = parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise AgentsearchError(f"--report {report}: {probe} is not a writable directory")


def _measure(target: Path, as_json: bool, report: Path | None, measure: Any, show: Any, ok: Any) -> int:
    """Check the report path, measure under the workspace lock with progress, then write, print and exit."""
    writable(report)
    ws = Workspace.open(target)
    with ws.lock(), progress() as say:
        record = measure(ws, say)
    if report is not None:
        write_report(record, report)
    if as_json:
        extra = (
            {"holds": record.holds, "regressed_guards": list(record.regressed_guards)}
            if isinstance(record, StackCheck)
            else {}
        )
        print_json({**record.to_json(), **extra})  # what the exit status says, in words
    else:
        show(record)
    return 0 if ok(record) else EXIT_FAIL


def _journal(ws: Workspace, kind: type[StackCheck | StackBisect], resume: bool, fresh: bool) -> Journal:
    """The progress file of a check or a bisection: emptied for --fresh; for --resume, one must exist; otherwise
    none may (a plain run never starts over an unfinished one)."""
    from ..stack import Journal

    journal = Journal(ws.state, kind=kind)
    if fresh:
        journal.clear()
    elif resume and not journal.path.exists():
        raise AgentsearchError(f"no unfinished {journal.what} to resume; start one with `{journal.command}`")
    elif not resume and journal.path.exists():
        try:
            saved = journal.load()
        except AgentsearchError as exc:
            raise AgentsearchError(f"{exc}: start afresh with `{journal.command} --fresh`") from None
        if saved is not None and saved.final:  # killed between the journal's write and the history's
            raise AgentsearchError(
                f"a {journal.what} of {saved.record.tip[:12]} finished but was not recorded: record it with "
                f"`{journal.command} --resume` (nothing is measured)"
            )
        done, tip = "", "the tip"
        if saved is not None:
            r = saved.record
            tip = r.tip[:12]
            if isinstance(r, StackCheck) and saved.leave_one_out:
                done = f" ({len(r.removals)} of {len(r.merges)} removals measured)"
            elif isinstance(r, StackBisect):
                done = f" ({len(r.steps)} step(s) measured)"
        raise AgentsearchError(
            f"a {journal.what} of {tip} is unfinished{done}: continue it with `{journal.command} --resume`, or "
            f"discard it with `{journal.command} --fresh`"
        )
    return journal


def _resume_alone(resume: bool, fresh: bool, **options: object) -> None:
    """--resume continues the saved run's own range and options: no other option goes with it."""
    given = [name for name, value in options.items() if value is not None and value is not False]
    if resume and (fresh or given):
        flags = ", ".join(f"--{n.replace('_', '-')}" for n in ("fresh", *options))
        raise AgentsearchError(f"--resume continues the unfinished run with its own range and options: drop {flags}")


def run(
    target: Path,
    as_json: bool,
    since: str | None,
    leave_one_out: bool,
    seed: int | None,
    report: Path | None = None,
    resume: bool = False,
    fresh: bool = False,
) -> int:
    from ..stack import check  # the measuring stack (scipy, ...) only when measuring

    _resume_alone(resume, fresh, since=since, leave_one_out=leave_one_out, seed=seed)

    def measure(ws: Workspace, say: Any) -> StackCheck:
        journal = _journal(ws, StackCheck, resume, fresh)
        return check(ws, since, seed=seed, leave_one_out=leave_one_out, progress=say, journal=journal)

    return _measure(target, as_json, report, measure, show_check, lambda r: r.holds)


def run_bisect(
    target: Path,
    as_json: bool,
    since: str | None,
    metric: str | None,
    seed: int | None,
    report: Path | None = None,
    resume: bool = False,
    fresh: bool = False,
) -> int:
    from ..stack import bisect

    _resume_alone(resume, fresh, since=since, metric=metric, seed=seed)

    def measure(ws: Workspace, say: Any) -> StackBisect:
        journal = _journal(ws, StackBisect, resume, fresh)
        return bisect(ws, metric, since, seed=seed, progress=say, journal=journal)

    return _measure(target, as_json, report, measure, show_bisect, lambda r: r.culprit is not None)


def show_pareto(p: Any) -> None:
    guards = p.guards()
    out.print(
        f"trades {p.since[:12]} → {p.tip[:12]}: objective {safe(p.objective)}, guards "
        f"{', '.join(safe(g) for g in guards) or 'none'}"
    )

    def cell(c: Any) -> str:
        return "—" if c is None or c.speedup is None else f"{pct(c.speedup)} {_ci(c.ci)}"

    rows = [
        [
            str(i),
            safe(t.proposal),
            safe((t.title or "")[:40]),
            "merged" if t.merge else "rejected",
            cell(t.objective),
            *(cell(next((g for g in t.guards if g.workload == name), None)) for name in guards),
        ]
        for i, t in enumerate(p.trades, 1)
    ]
    out.print(
        compact_table(
            f"each proposal's change (positive is better; a guard's limit is {-p.max_regression:.0%})",
            ["#", "proposal", "title", "kept", "objective", *map(safe, guards)],
            rows,
            out.width,
        )
    )
    for i, t in enumerate(p.trades, 1):
        if t.reason:
            out.print(f"  {i}: {safe(t.reason[:200])}")


def run_pareto(target: Path, as_json: bool, since: str | None, report: Path | None = None) -> int:
    from ..pareto import pareto
    from ..report import pareto_html, pareto_markdown, pareto_plot

    writable(report)
    ws = Workspace.open(target)
    view = pareto(ws, since, ws.config().gate.max_regression)
    if report is not None:
        try:
            report.parent.mkdir(parents=True, exist_ok=True)
            if report.suffix.lower() in (".html", ".htm"):
                report.write_text(pareto_html(view))
            else:
                png = report.with_suffix(".trades.png")
                png.write_bytes(pareto_plot(view, "png"))
                report.write_text(pareto_markdown(view, png.name))
        except OSError as exc:
            raise AgentsearchError(f"--report {report}: {exc.strerror or exc}") from None
        err.print(safe(f"report: {report}"))
    if as_json:
        print_json(view.to_json())
    else:
        show_pareto(view)
    return 0

"""`agentsearch verify REF`: distribution checks only, with a per-path / per-language table."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.table import Table

from .. import preflight
from ..errors import EXIT_FAIL
from ..verify import VerifyResult, verify
from ..workspace import Workspace
from .output import out, print_json, progress, safe

if TYPE_CHECKING:
    from history.records import ReferenceCheck


def run(target: Path, as_json: bool, ref: str) -> int:
    ws = Workspace.open(target)
    ws.resolve(ref)
    with ws.lock(), progress() as say:
        preflight.require(ws, say=say)  # a set-up error (model, overlay, environment) is the run's: exit 5
        result = verify(ws, ref, say)
    if as_json:
        print_json(result.to_json())
    else:
        show(ref, result)
    return 0 if result.verdict == "pass" else EXIT_FAIL


def _fmt(x: float | None, spec: str = ".2g") -> str:
    return "—" if x is None else format(x, spec)


def _kl(s: dict) -> str:
    """Mean KL with its standard error, as llama.cpp prints it."""
    if s.get("kl_mean") is None:
        return "—"
    se = s.get("kl_mean_se")
    return _fmt(s["kl_mean"]) + ("" if se is None else f" ± {se:.2g}")


def _same_top(s: dict) -> str:
    pct = s.get("same_top_pct")
    if pct is None:
        return _fmt(s.get("top1_agreement"), ".4f")
    se = s.get("same_top_pct_se")
    return f"{pct:.2f}" + ("" if se is None else f" ± {se:.2f}") + " %"


def show(ref: str, r: VerifyResult) -> None:
    _show_headline(ref, r)
    out.print(_sets_table(r))
    if r.draws:
        out.print(_draws_line(r.draws))
    if r.reference:
        out.print(_reference_table(r.reference))
        if r.blame == "main":
            out.print(
                "[bold red]main itself diverges from the reference[/] where this check failed: the cause is on main, "
                "not in this change"
            )
    if r.floor:
        out.print(
            "noise floor (baseline vs itself, shuffled batch): "
            + ", ".join(
                f"{p}: max KL {_fmt(s['kl_max'])}, max |Δ logprob| {_fmt(s['dlogprob_max'])}"
                for p, s in r.floor.items()
            )
        )
    if r.languages:
        out.print(_languages_table(r.languages))


def _show_headline(ref: str, r: VerifyResult) -> None:
    """The verdict, the mode and the prompt counts, then each reason."""
    color = "green" if r.verdict == "pass" else "red"
    sel = f" (of {r.corpus_size})" if r.corpus_size and r.corpus_size != r.public_size + r.holdout_size else ""
    out.print(
        f"[bold {color}]{r.verdict.upper()}[/] {safe(ref)}: mode {r.mode}, public {r.public_size} prompts, holdout "
        f"{r.holdout_size} prompts{sel}"
    )
    for reason in r.reasons:
        out.print(f"  - {safe(reason)}")


def _sets_table(r: VerifyResult) -> Table:
    t = Table(title="per set and path (KL in nats; Δp: probability of the baseline's top token)")
    for col in (
        "set",
        "path",
        "positions",
        "mean KL ± SE",
        "KL p99.9",
        "KL p99",
        "KL p95",
        "KL p90",
        "KL p50",
        "max KL",
        "RMS Δp",
        "max |Δ logprob|",
        "same top",
        "div.",
        "pass",
    ):
        t.add_column(col)
    for set_name, paths in r.sets.items():
        for path, s in paths.items():
            pc = s.get("kl_percentiles") or {}
            t.add_row(
                set_name,
                path,
                str(s["positions"]),
                _kl(s),
                *(_fmt(pc.get(k)) for k in ("99.9", "99", "95", "90", "50")),
                _fmt(s["kl_max"]),
                _fmt(s.get("dp_rms")),
                _fmt(s["dlogprob_max"]),
                _same_top(s),
                str(s["divergences"]),
                "yes" if s["passed"] else "NO",
            )
    return t


def _draws_line(d: dict) -> str:
    """The paired draw test in one line."""
    if d.get("draws"):
        return (
            f"draw test (same seeds on both sides): {d['changed']} of {d['draws']} draws changed; noise floor "
            f"{d['floor_changed']}, unrelated seeds {d['unrelated_changed']}; Fisher p {_fmt(d.get('p'))}; "
            f"{d['testable']} of {d['contexts']} contexts x settings testable: "
            f"{d['status'].upper() if d['status'] == 'fail' else d['status']}"
        )
    return (
        f"draw test: {d['status']} ({len(d.get('not_testable') or [])} of {d['contexts']} contexts x settings "
        "have a single category)"
    )


def _reference_table(against: ReferenceCheck) -> Table:
    """The candidate's (and, where it failed, main's) comparisons with the reference, per regime, set and path."""
    rt = Table(title=(f"against the reference {safe(against.commit[:12])} (judged with {safe(against.budget)})"))
    for col in ("compared", "path", "positions", "mean KL ± SE", "max KL", "max |Δ logprob|", "same top", "pass"):
        rt.add_column(col)
    for who, entries in (("candidate", against.regimes), ("main", against.main)):
        for entry in entries:
            for set_name, ref_paths in entry.sets.items():
                for path, rs in ref_paths.items():
                    rt.add_row(
                        f"{who} at {safe(entry.label)}, {set_name}",
                        path,
                        str(rs["positions"]),
                        _kl(rs),
                        _fmt(rs["kl_max"]),
                        _fmt(rs["dlogprob_max"]),
                        _same_top(rs),
                        "yes" if rs["passed"] else "NO",
                    )
    return rt


def _languages_table(languages: dict[str, dict[str, Any]]) -> Table:
    lt = Table(title="public prompts per language")
    cols = ["language"]
    lang_paths = sorted({p for v in languages.values() for p in v}, key=["prefill", "decode", "sample"].index)
    for p in lang_paths:
        cols += [f"{p} mean KL", f"{p} same top"]
    for col in cols:
        lt.add_column(col)
    for lang, per in languages.items():
        row = [lang]
        for p in lang_paths:
            ps = per.get(p, {})
            row += [_fmt(ps.get("kl_mean")), _same_top(ps) if ps else "—"]
        lt.add_row(*row)
    return lt

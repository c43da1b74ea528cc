"""`agentsearch verify REF`: distribution checks only, with a per-path / per-language table."""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape
from rich.table import Table

from ..errors import EXIT_FAIL
from ..verify import VerifyResult, verify
from ..workspace import Workspace
from .output import out, print_json, progress


def run(target: Path, as_json: bool, ref: str) -> int:
    ws = Workspace.open(target)
    ws.resolve(ref)
    with ws.lock(), progress() as say:
        result = verify(ws, ref, say)
    if as_json:
        print_json(result.to_json())
    else:
        show(ref, result)
    return 0 if result.verdict == "pass" else EXIT_FAIL


def _fmt(x: float | None, spec: str = ".2g") -> str:
    return "—" if x is None else format(x, spec)


def show(ref: str, r: VerifyResult) -> None:
    color = "green" if r.verdict == "pass" else "red"
    out.print(f"[bold {color}]{r.verdict.upper()}[/] {escape(ref)}: mode {r.mode}, public {r.public_size} prompts, holdout {r.holdout_size} prompts")
    for reason in r.reasons:
        out.print(f"  - {escape(reason)}")
    t = Table(title="per set and path")
    for col in ("set", "path", "positions", "mean KL", "p99 KL", "max KL", "max |Δ logprob|", "top-1 agree", "divergences", "first div. (median)", "pass"):
        t.add_column(col)
    for set_name, paths in r.sets.items():
        if set_name == "sample":
            continue
        for path, s in paths.items():
            t.add_row(set_name, path, str(s["positions"]), _fmt(s["kl_mean"]), _fmt(s["kl_p99"]), _fmt(s["kl_max"]),
                      _fmt(s["dlogprob_max"]), _fmt(s["top1_agreement"], ".4f"), str(s["divergences"]),
                      _fmt(s["first_divergence_median"], ".0f"), "yes" if s["passed"] else "NO")
    out.print(t)
    smp = (r.sets.get("sample") or {}).get("sample")
    if smp:
        out.print(f"sample path: {smp['contexts']} contexts x settings, {smp['draws']} draws each: max TV {_fmt(smp['tv_max'], '.3f')} "
                  f"(noise floor mean {_fmt(smp['floor_tv_mean'], '.3f')}), min p {_fmt(smp['min_p'])}: {'pass' if smp['passed'] else 'FAIL'}")
    if r.floor:
        out.print("noise floor (baseline vs itself, shuffled batch): " + ", ".join(
            f"{p}: max KL {_fmt(s['kl_max'])}, max |Δ logprob| {_fmt(s['dlogprob_max'])}" for p, s in r.floor.items()))
    if r.languages:
        lt = Table(title="public prompts per language")
        for col in ("language", "prefill max KL", "prefill top-1", "decode max KL", "decode divergences"):
            lt.add_column(col)
        for lang, paths in r.languages.items():
            pre, dec = paths.get("prefill", {}), paths.get("decode", {})
            lt.add_row(lang, _fmt(pre.get("kl_max")), _fmt(pre.get("top1_agreement"), ".4f"), _fmt(dec.get("kl_max")), str(dec.get("divergences", "—")))
        out.print(lt)

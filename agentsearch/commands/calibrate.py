"""`agentsearch calibrate`: the baseline against itself; noise per workload, stored for the gate."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from harness.gate_defaults import MACHINE_PROBE_S
from harness.quiet import SHORT_TRIAL_S

from .. import preflight
from ..calibration import calibrate
from ..workspace import Workspace
from .output import out, print_json, progress


def run(target: Path, as_json: bool, pairs: int, machine_probe_s: float = MACHINE_PROBE_S) -> int:
    ws = Workspace.open(target)
    with ws.lock(), progress() as say:
        preflight.require(ws, say=say)  # seconds: a set-up error is the run's (exit 5)
        cal = calibrate(ws, pairs=pairs, progress=say, machine_probe_s=machine_probe_s)
    if as_json:
        print_json(cal.to_json())
        return 0
    t = Table(title=f"A/A calibration of {cal.baseline[:12]} ({pairs} pairs per workload)")
    for col in (
        "workload",
        "CV",
        "sd log-ratio",
        "drift /100 trials",
        "outliers",
        "order effect",
        "A/A speedup",
        "pairs for 90% power",
    ):
        t.add_column(col)
    for w in cal.workloads.values():
        t.add_row(
            w.workload,
            f"{w.cv:.2%}",
            f"{w.sd_log_ratio:.4f}",
            f"{w.drift_per_100:+.2%} (p={w.drift_p:.2g})",
            str(w.outliers),
            f"{w.order_effect:+.3%}",
            f"{w.aa_speedup - 1:+.2%} [{w.aa_ci[0] - 1:+.2%}, {w.aa_ci[1] - 1:+.2%}]",
            str(w.pairs_needed),
        )
    out.print(t)
    for w in cal.workloads.values():
        if w.outputs_floor is not None:
            out.print(
                f"{w.workload}: the outputs rule's rounding floor on this engine ({w.outputs_dtype}): "
                f"{w.outputs_floor:.3g} nats over {w.outputs_positions} positions (two batch orders, decode against "
                f"prefill); a flip is one the reference could make within {w.outputs_tie:.3g} nats"
            )
        elif w.outputs_note:
            out.print(f"{w.workload}: the outputs rule's rounding floor was not measured: {w.outputs_note}")
        if w.detectable is not None:
            what = "regression" if w.guard else "speedup"
            sign = (
                -w.detectable / (1 + w.detectable) if w.guard else w.detectable
            )  # a regression: the slower side at that log-ratio
            sessions = (
                (
                    f" in engine sessions of {w.per_session} pairs (a session's effect on the mean: SD "
                    f"{w.between_var**0.5:.4f}, from {w.sessions} sessions)"
                )
                if w.per_session
                else ""
            )
            out.print(
                f"{w.workload}: smallest {what} detectable with 90% power within {w.budget_pairs} pairs{sessions}: "
                f"{sign:+.1%} (one t-test at the last look)"
            )
        if w.detectable is not None or w.detectable_gate is not None:
            what = "regression flagged" if w.guard else "speedup merged"
            steps = (
                "sequential looks"
                + (", each proposal's session effect" if w.per_session else "")
                + ("" if w.guard else ", the confirmation")
            )
            found = (
                "none within 100%"
                if w.detectable_gate is None
                else f"{(-w.detectable_gate if w.guard else w.detectable_gate):+.1%}"
            )
            out.print(
                f"{w.workload}: smallest {what} with 90% power by the gate's own decisions ({steps}; simulated at this "
                f"noise): {found}"
            )
        quiet = [
            f"trials {w.trial_s:.2f} s each (median)" if w.trial_s is not None else "",
            f"load average {w.load_avg:.2f}" if w.load_avg is not None else "",
            f"{w.foreign_trials} under foreign load",
            f"placement {w.placement}" if w.placement else "",
        ]
        out.print(f"{w.workload}: " + "; ".join(q for q in quiet if q))
        if w.trial_s is not None and w.trial_s < SHORT_TRIAL_S:
            out.print(
                f"{w.workload}: trials of {w.trial_s:.1f} s are short (jitter weighs more than in trials of "
                f"{SHORT_TRIAL_S:g} s or more): give each more work (vLLM workloads: params.prompts; commands: more "
                "iterations)"
            )
    for w in cal.workloads.values():
        if w.machine_floor_sd is not None:
            own = (w.sd_log_ratio**2 - w.machine_floor_sd**2) ** 0.5 if w.sd_log_ratio > w.machine_floor_sd else 0.0
            out.print(
                f"{w.workload}: the machine alone (a pure-CPU loop, the same alternation: {w.slices} part(s) per side "
                f"of {(w.trial_s or 0) / w.slices:.2f} s) gives a per-pair SD of {w.machine_floor_sd:.4f} (speed SD "
                f"{w.machine_speed_sd:.1%} per part, {w.machine_floor_pairs} pairs); the engine's own share of "
                f"{w.sd_log_ratio:.4f} is about {own:.4f}"
            )
    if cal.machine_probe:
        out.print(f"machine probe: {cal.machine_probe}")
    out.print(f"stored in {ws.state / 'calibration.json'}; the gate uses it while the config and machine stay the same")
    return 0

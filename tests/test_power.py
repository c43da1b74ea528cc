"""The gate's power by simulation (harness.power): the real sequential decisions, not a formula."""

from __future__ import annotations

import dataclasses

import pytest

from agentsearch.config import GateConfig
from agentsearch.gate_design import design_for
from harness.power import Noise, detectable, rate
from harness.statistics import NoisePrior, min_detectable

GATE = GateConfig()
DESIGN = design_for(GATE)
LEVEL = GATE.proposal_alpha * 0.8  # the final look's share: what the formula tests at


def test_merge_rate_grows_with_the_effect_and_never_merges_a_no_op():
    sd = 0.032
    prior, noise = NoisePrior(sd * sd, 29), Noise.from_calibration(sd, 0.0, 1)
    rates = [
        rate(DESIGN, prior, noise, e, reps=100, confirm_pairs=GATE.confirm_pairs) for e in (0.0, 0.015, 0.03, 0.06)
    ]
    assert rates[0] == 0.0 and rates == sorted(rates) and rates[-1] >= 0.95 and 0.1 < rates[2] < 0.95, rates


def test_the_gate_finds_less_than_the_formula_says_once_it_estimates_the_session_effect():
    """One session: the sequential decisions find about what one t-test at the last look finds. Two engine sessions
    per side: the proposal's own session effect is estimated (one degree of freedom), and the smallest 3%-scale win
    merged with 90% power is clearly larger than the formula's, which counts only the calibration's tau² (here 0)."""
    sd = 0.032
    prior = NoisePrior(sd * sd, 29)
    formula = min_detectable(sd, GATE.max_pairs, LEVEL, 0.9, 29)
    one = detectable(DESIGN, prior, Noise.from_calibration(sd, 0.0, 1), reps=100, confirm_pairs=GATE.confirm_pairs)
    two = detectable(DESIGN, prior, Noise.from_calibration(sd, 0.0, 2), reps=100, confirm_pairs=GATE.confirm_pairs)
    assert one is not None and two is not None
    assert 0.85 * formula < one < 1.25 * formula, (formula, one)
    assert two > 1.1 * formula and two > one, (formula, one, two)


def test_a_quiet_workload_is_bounded_by_min_effect_and_a_noisy_one_by_the_budget():
    """Nearly no noise: the formula says a tiny effect, but the gate wants a point estimate of half of min_effect.
    A guard is found at about the formula's regression; noise far beyond the budget finds nothing within 100%."""
    quiet = detectable(DESIGN, NoisePrior(1e-8, 29), Noise(1e-5), reps=50, confirm_pairs=GATE.confirm_pairs)
    assert quiet is not None and GATE.min_effect / 2 <= quiet < GATE.min_effect / 2 * 1.1
    guard_design = dataclasses.replace(DESIGN, max_pairs=16)
    sd = 0.12
    guard = detectable(guard_design, NoisePrior(sd * sd, 9), Noise.from_calibration(sd, 0.0, 2), reps=100, guard=True)
    formula = -math_expm1_neg(min_detectable(sd, 16, GATE.regression_alpha, 0.9, 9, 0.0, 8))
    assert guard is not None and guard == pytest.approx(formula, rel=0.2), (guard, formula)
    assert (
        detectable(
            DESIGN, NoisePrior(4.0, 29), Noise.from_calibration(2.0, 0.0, 1), reps=20, confirm_pairs=GATE.confirm_pairs
        )
        is None
    )
    with pytest.raises(ValueError):
        Noise(-0.1)


def math_expm1_neg(speedup_effect: float) -> float:
    """The formula's regression (a log-ratio of the same size, downwards) as a negative fraction."""
    return -speedup_effect / (1 + speedup_effect)


def test_gate_quality_benchmark_runs_its_scenarios_and_the_attack():
    """The benchmark script end to end on a few proposals: its rows, where the wins went (with the Sessions flag),
    and the lottery of slowdowns, which cannot be merged."""
    import subprocess
    import sys

    from .conftest import ROOT

    script = str(ROOT / "benchmarks" / "gate_quality.py")
    proc = subprocess.run(
        [
            sys.executable,
            script,
            "--reps",
            "16",
            "--calibrate-pairs",
            "10",
            "--scenario",
            "0.0226:0.005:2",
            "--effect",
            "0.1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "CV 2.3% + instance 0.5%, restarts 2" in proc.stdout and "where the true 10% wins went" in proc.stdout
    assert "10% win detected" in proc.stdout
    proc = subprocess.run(
        [sys.executable, script, "--reps", "16", "--calibrate-pairs", "10", "--only", "lottery of slowdowns"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("false merges  0.00% (0 of 16)") == 2, proc.stdout
    bad = subprocess.run([sys.executable, script, "--scenario", "0.02:x:2"], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "expected CV:INSTANCE:RESTARTS[:LOTTERY]" in bad.stderr
    bad = subprocess.run([sys.executable, script, "--max-pairs", "1"], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "--max-pairs / --confirm-pairs: expected an integer >= min_pairs" in bad.stderr, (
        bad.stderr
    )
    bad = subprocess.run([sys.executable, script, "--effect", "-2"], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and bad.stderr.strip().splitlines()[-1].startswith("--effect: expected a speedup"), (
        bad.stderr
    )


def test_calibrate_simulates_the_noise_it_calibrated():
    """Round trip: A/A calibrations simulated at a known per-trial SD and instance SD, analysed as `calibrate` analyses
    them; the noise `calibrate` then simulates the gate at recovers both on average. The calibration's variance counts
    the sessions' spread, which the simulated instances add again: the trial SD must come from within the sessions
    (from the variance across them it reads 16% high at these numbers), and the instances from the sessions' spread."""
    import numpy as np

    from agentsearch.calibration import _done, _fixed_design, analyze, simulation_noise
    from agentsearch.config import load_config_text
    from harness.interleave import run_interleaved
    from harness.power import SimulatedSide

    cfg = load_config_text(
        '[[workload]]\nname = "obj"\nkind = "vllm-throughput"\nmetric = "output_tok_s"\nrestarts = 2\n'
    )
    w = cfg.workload("obj")
    trial_sd, instance_sd = 0.02, 0.02
    got, across = [], []
    for i in range(300):
        rng = np.random.default_rng([7, i])
        side = lambda name, _i: SimulatedSide(rng.normal(0.0, instance_sd), trial_sd, rng)  # noqa: E731, B023 - called within the iteration
        run = run_interleaved("obj", side, _fixed_design(20), _done, lambda k: k, True, restarts=2)
        noise = analyze("obj", run.trials, run.log_ratios, cfg, run.sessions, placement="shared")
        got.append(simulation_noise(noise, cfg, w))
        across.append(noise.var / 2)
    assert all(n.restarts == 2 and n.confirm_restarts == 1 and not n.alternate for n in got)
    assert np.mean([n.trial_sd**2 for n in got]) == pytest.approx(trial_sd**2, rel=0.08)
    assert np.mean([n.instance_sd**2 for n in got]) == pytest.approx(instance_sd**2, rel=0.35)
    assert np.mean(across) > 1.1 * trial_sd**2  # the variance across sessions: what the simulation used to take


def test_the_simulated_confirmation_runs_on_the_gates_placement(monkeypatch):
    """The simulated proposal measures its objective with the workload's sessions and placement and its confirmation as
    agentsearch.evaluation does: fresh engines, `confirm_restarts` sessions (two under split placement), alternate rounds
    under alternate placement."""
    import harness.power as P

    calls = []
    real = P.run_interleaved

    def spy(*args, **kwargs):
        calls.append({k: kwargs.get(k) for k in ("restarts", "alternate")})
        return real(*args, **kwargs)

    monkeypatch.setattr(P, "run_interleaved", spy)
    quiet = NoisePrior(1e-6, 29)
    for noise in (Noise(1e-3, 0.0, 2, False, 2), Noise(1e-3, 0.0, 2, True, 1)):
        calls.clear()
        assert P.found(DESIGN, quiet, noise, 0.2, __import__("numpy").random.default_rng(1), confirm_pairs=4)
        assert calls == [
            {"restarts": 2, "alternate": noise.alternate},
            {"restarts": noise.confirm_restarts, "alternate": noise.alternate},
        ]


def test_the_starters_objective_finds_3pct_wins_where_two_sessions_of_six_did_not():
    """The starter's objective design (5 engine sessions of 6 pairs, 30 at most, a confirmation of 4 pairs on fresh
    engines) at this machine's quiet per-pair SD (0.032, no instance effect) merges most true 3% wins; the design it
    replaced (2 sessions of 6, 12 pairs) merged about half. Neither merges a no-op."""
    from pathlib import Path

    from agentsearch.commands.starter import starter_config
    from agentsearch.config import load_config_text
    from agentsearch.gate_design import workload_design
    from agentsearch.workloads import restarts_for

    cfg = load_config_text(starter_config(Path("/nonexistent/site-packages")))
    w = cfg.workload("throughput")
    assert (restarts_for(w), cfg.gate.max_pairs, cfg.gate.confirm_pairs) == (5, 30, 4)
    sd = 0.032
    prior = NoisePrior(sd * sd, 29)
    now = workload_design(design_for(cfg.gate), w)
    before = dataclasses.replace(now, max_pairs=12)
    got = {
        name: rate(
            design, prior, Noise.from_calibration(sd, 0.0, r), 0.03, reps=200, confirm_pairs=cfg.gate.confirm_pairs
        )
        for name, design, r in (("now", now, 5), ("before", before, 2))
    }
    assert got["now"] >= 0.82 and got["before"] <= 0.65, got
    assert (
        rate(now, prior, Noise.from_calibration(sd, 0.0, 5), 0.0, reps=100, confirm_pairs=cfg.gate.confirm_pairs) == 0.0
    )

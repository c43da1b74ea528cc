"""Guard false alarms and power, simulated through the gate's own code path (issue #43).

    .venv/bin/python benchmarks/guard_alarms.py [--reps 2000] [--seed 1]

A guard workload is measured with ``run_interleaved`` + ``decide_guard`` on simulated engine sessions
(``benchmarks.gate_quality.SimSession``: a per-pair noise and, per engine instance, an effect fixed for
its life), with the gate's guard design (``agentsearch.gate_design.workload_design``). A regression call
is then re-measured on fresh instances (``[gate] guard_check_sessions``) and seeds with ``decide_regression``,
as ``agentsearch.evaluation`` does. For each scenario it prints the rate of regression calls before and
after that re-measurement, for an A/A guard (a false alarm), for a planted 10% regression (power) and,
for comparison, the old rule (``--`` column: the first call alone, sessions not counted); the last two columns are the
mean pairs a gate re-measure used (of ``guard_check_pairs``: it stops early for OK when two fresh sessions measure no
slowdown at all).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentsearch.config import GateConfig, WorkloadConfig  # noqa: E402
from agentsearch.gate_design import design_for, workload_design  # noqa: E402
from benchmarks.gate_quality import Clock, Scenario, SimSession  # noqa: E402
from harness.interleave import run_interleaved  # noqa: E402
from harness.sequential import REGRESSED, decide_guard, decide_regression, guard_check_design  # noqa: E402

ONE_FRESH_PAIR = (4, 1)  # the re-measure before 2026-12-06: 4 pairs on one fresh pair of instances


FRESH_PAIRS: list[int] = []  # pairs each gate re-measure used (it may stop early for OK, 0.8 on)


def recheck(sc: Scenario, effect: float, rng: np.random.Generator, clock: Clock, pairs: int, sessions: int) -> bool:
    """The re-measurement on fresh engines and seeds (``pairs`` over ``sessions`` sessions): does it hold?"""
    again = run_interleaved(
        "guard",
        lambda side, i: SimSession(sc, effect, side, clock, rng),
        guard_check_design(pairs, sessions=sessions),
        decide_regression,
        lambda i: 20_000 + i,
        True,
        restarts=sessions,
    )
    assert again.decision is not None
    if sessions > 1:
        FRESH_PAIRS.append(again.pairs)
    return again.decision.action == REGRESSED


def one(
    sc: Scenario, effect: float, gate: GateConfig, rng: np.random.Generator, counted: bool
) -> tuple[bool, bool, bool]:
    """(first call: regressed; after the gate's re-measurement on fresh engines: regressed; after one fresh pair of
    instances, the re-measure before 2026-12-06: regressed), both re-measures of the same first call."""
    w = WorkloadConfig(name="guard", command="-", metric="v", restarts=sc.restarts)
    design = workload_design(design_for(gate), w)
    clock = Clock()
    session = lambda side, i: SimSession(sc, effect, side, clock, rng)  # noqa: E731
    decide = decide_guard if counted else (lambda d_, x, prior=None, clusters=None: decide_guard(d_, x, prior, None))
    run = run_interleaved("guard", session, design, decide, lambda i: i, True, restarts=sc.restarts)
    assert run.decision is not None
    if run.decision.action != REGRESSED:
        return False, False, False
    gate_check = recheck(sc, effect, rng, clock, gate.guard_check_pairs, gate.guard_check_sessions)
    return True, gate_check, recheck(sc, effect, rng, clock, *ONE_FRESH_PAIR)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    gate = GateConfig()
    rng = np.random.default_rng(args.seed)
    scenarios = [
        # serve-c1 on this machine: per-pair SD ~0.10-0.13 (README, calibrate), an instance ~10% apart for its life
        Scenario("CV 10%, instance 5%, 1 session", 0.10, instance=0.05, restarts=1),
        Scenario("CV 10%, instance 5%, 2 sessions", 0.10, instance=0.05, restarts=2),
        Scenario("CV 6%, instance 3%, 1 session", 0.06, instance=0.03, restarts=1),
        Scenario("CV 3%, instance 5%, 1 session", 0.03, instance=0.05, restarts=1),
        Scenario("CV 3%, instance 5%, 2 sessions", 0.03, instance=0.05, restarts=2),
        Scenario("CV 3%, no instance effect, 1 session", 0.03, restarts=1),
    ]
    print(
        f"guard level (regression_alpha) {gate.regression_alpha}, floor -{gate.max_regression:.0%}; "
        f"{args.reps} guards per cell; re-measure: {gate.guard_check_pairs} pairs over {gate.guard_check_sessions} "
        f"fresh sessions (the gate's), {ONE_FRESH_PAIR[0]} pairs on one (before 2026-12-06)"
    )
    print(
        f"{'scenario':<38} {'A/A: old rule':>13} {'first call':>10} {'after fresh':>11} {'(one pair)':>10} "
        f"{'-10%: first':>11} {'after fresh':>11} {'(one pair)':>10} {'fresh pairs: A/A':>16} {'-10%':>5}"
    )
    t0 = time.time()
    for sc in scenarios:
        old = sum(one(sc, 0.0, gate, rng, counted=False)[0] for _ in range(args.reps)) / args.reps
        FRESH_PAIRS.clear()
        aa = np.array([one(sc, 0.0, gate, rng, counted=True) for _ in range(args.reps)]).mean(axis=0)
        aa_pairs = np.mean(FRESH_PAIRS) if FRESH_PAIRS else float("nan")
        FRESH_PAIRS.clear()
        bad = np.array([one(sc, -0.10, gate, rng, counted=True) for _ in range(args.reps)]).mean(axis=0)
        bad_pairs = np.mean(FRESH_PAIRS) if FRESH_PAIRS else float("nan")
        print(
            f"{sc.name:<38} {old:>13.2%} {aa[0]:>10.2%} {aa[1]:>11.2%} {aa[2]:>10.2%} "
            f"{bad[0]:>11.1%} {bad[1]:>11.1%} {bad[2]:>10.1%} {aa_pairs:>16.1f} {bad_pairs:>5.1f}",
            flush=True,
        )
    print(f"runtime {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()

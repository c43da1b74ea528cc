"""Tail-latency guards: false alarms and power, simulated request by request through the gate's own code (#41).

    .venv/bin/python benchmarks/serving_tails.py [--reps 400] [--seed 1] [--shape engine|lognormal]
    .venv/bin/python benchmarks/serving_tails.py --goodput [--reps 1000] [--cv 0.117]

Each trial draws ``n`` per-request TTFTs: a lognormal (median 1, log-SD ``--sigma``, or the shape measured on
the embedded default's engine: ``--shape engine`` resamples the per-request TTFTs in ``--from``), times the
trial's noise and the engine instance's effect fixed for its life (``benchmarks.gate_quality``'s model). A
trial's value is the metric's estimate over its requests: the Harrell-Davis p99 (what ``harness.tails`` uses),
the sample p99 (numpy's linear interpolation: vLLM's benchmark, GuideLLM) or the Harrell-Davis p50 (a median
guard). The guard is judged by ``run_interleaved`` + ``decide_guard`` with the gate's default design, and a
regression call is re-measured on fresh instances with ``decide_regression``, as ``agentsearch.evaluation``
does. Scenarios: A/A (false alarms), a tail-only regression (2% of requests delayed so that the p99 grows by
10%, the median unchanged) and a median regression (every request 10% slower).

Prints, per requests-per-trial and estimator, the share of guards that end in a regression (after the fresh
re-measurement), and the pairs used.

``--goodput``: the goodput objective (requests per second that met the SLO, ``harness.tails``) judged as the gate
judges an objective (``decide_objective`` at the proposal's level, then the confirmation on fresh instances), with
the SLO placed where a given share of the baseline's requests meets it (the edge: 50%; easy: 99%). Scenarios: A/A
(every merge is a false merge; the level is the gate's alpha per proposal) and a candidate whose requests are all
10% faster (the goodput it gains depends on the SLO's place). Prints the share merged and the pairs used.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentsearch.calibration import _done, _fixed_design, analyze  # noqa: E402
from agentsearch.config import GateConfig, WorkloadConfig, load_config_text  # noqa: E402
from agentsearch.gate_design import design_for, workload_design  # noqa: E402
from harness import tails  # noqa: E402
from harness.interleave import run_interleaved  # noqa: E402
from harness.sequential import (  # noqa: E402
    OK,
    REGRESSED,
    WIN,
    confirmation_design,
    decide_confirmation,
    decide_guard,
    decide_objective,
    decide_regression,
    guard_check_design,
)
from harness.statistics import NoisePrior  # noqa: E402
from harness.trials import CANDIDATE, TrialOutcome  # noqa: E402

TAIL_SHARE = 0.02  # requests the tail-only regression delays


def estimators() -> dict:
    return {
        "HD p99": lambda x: tails.harrell_davis(x, 0.99),
        "sample p99": lambda x: float(np.percentile(x, 99)),
        "HD p50": lambda x: tails.harrell_davis(x, 0.5),
    }


class Shape:
    """Per-request TTFTs of a quiet trial, median about 1."""

    def __init__(self, sigma: float, sample: np.ndarray | None = None):
        self.sigma, self.sample = sigma, sample

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.sample is not None:
            return rng.choice(self.sample, size=n, replace=True)
        return rng.lognormal(0.0, self.sigma, size=n)

    def tail_factor(self, rng: np.random.Generator) -> float:
        """How much the delayed 2% are slowed so that the (large-sample) p99 grows by 10%."""
        x = self.draw(rng, 400_000)
        target = 1.10 * np.percentile(x, 99)
        lo, hi = 1.0, 50.0
        for _ in range(50):
            k = (lo + hi) / 2
            y = x.copy()
            y[: int(TAIL_SHARE * len(y))] *= k
            lo, hi = (k, hi) if np.percentile(y, 99) < target else (lo, k)
        return (lo + hi) / 2


class Sim:
    def __init__(
        self,
        shape: Shape,
        n: int,
        cv: float,
        instance: float,
        kind: str,
        k: float,
        est,
        side: str,
        rng: np.random.Generator,
    ):
        self.shape, self.n, self.cv, self.kind, self.k, self.est, self.rng = shape, n, cv, kind, k, est, rng
        self.mu = rng.normal(0.0, instance) if instance else 0.0
        self.bad = side == CANDIDATE and kind != "A/A"

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass

    def measure(self, seed: int) -> TrialOutcome:
        x = self.shape.draw(self.rng, self.n) * math.exp(self.mu + self.rng.normal(0.0, self.cv))
        if self.bad and self.kind == "tail":
            x[self.rng.random(self.n) < TAIL_SHARE] *= self.k
        elif self.bad and self.kind == "median":
            x *= 1.10
        v = self.est(x)
        return TrialOutcome(True, v, {"v": v}, 0.0)


def one(
    shape: Shape,
    n: int,
    cv: float,
    instance: float,
    kind: str,
    k: float,
    est,
    gate: GateConfig,
    rng: np.random.Generator,
) -> tuple[bool, int]:
    w = WorkloadConfig(name="guard", command="-", metric="v", restarts=1)
    design = workload_design(design_for(gate), w)
    run = run_interleaved(
        "guard",
        lambda side, i: Sim(shape, n, cv, instance, kind, k, est, side, rng),
        design,
        decide_guard,
        lambda i: i,
        False,
        restarts=1,
    )
    assert run.decision is not None
    pairs = run.pairs
    if run.decision.action != REGRESSED:
        return False, pairs
    again = run_interleaved(
        "guard",
        lambda side, i: Sim(shape, n, cv, instance, kind, k, est, side, rng),
        guard_check_design(gate.guard_check_pairs, gate.max_regression, gate.regression_alpha),
        decide_regression,
        lambda i: 20_000 + i,
        False,
        restarts=gate.guard_check_sessions,
    )
    assert again.decision is not None
    return again.decision.action == REGRESSED, pairs


class GoodputSim:
    """A serving trial's goodput: ``n`` requests on the same schedule (``rate`` per second) on both sides, each
    meeting the TTFT SLO or not; the trial's noise and the instance's effect scale every request's TTFT."""

    def __init__(self, shape: Shape, n: int, cv: float, instance: float, slo: float, faster: float, side: str, rng):
        self.shape, self.n, self.cv, self.slo, self.rng = shape, n, cv, slo, rng
        self.mu = rng.normal(0.0, instance) if instance else 0.0
        self.scale = 1.0 / faster if side == CANDIDATE else 1.0

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass

    def measure(self, seed: int) -> TrialOutcome:
        x = self.shape.draw(self.rng, self.n) * self.scale * math.exp(self.mu + self.rng.normal(0.0, self.cv))
        good = int(np.sum(x <= self.slo))
        v = good * RATE / self.n  # requests per second that met the SLO, over the schedule's duration
        if good == 0:  # no request met it: a non-positive value fails the trial, as in the gate
            return TrialOutcome(False, None, {}, 0.0, error="no request met the SLO")
        return TrialOutcome(True, v, {"v": v}, 0.0)


RATE = 80.0  # requests per second (the engine benchmark's load)
CAL_CONFIG = load_config_text('[[workload]]\nname = "goodput"\ncommand = "true"\nmetric = "v"\n')


def one_goodput(
    shape: Shape,
    n: int,
    cv: float,
    instance: float,
    slo: float,
    faster: float,
    gate: GateConfig,
    rng,
    restarts: int,
    calibrate_pairs: int,
):
    """(merged, pairs, outcome): the A/A calibration's prior (``agentsearch calibrate``: the baseline on both sides,
    in as many engine sessions), the objective's sequential test, then the confirmation on fresh instances."""
    design = design_for(gate)
    prior = None
    if calibrate_pairs:

        def aa(side: str, i: int) -> GoodputSim:
            return GoodputSim(shape, n, cv, instance, slo, 1.0, side, rng)

        cal = run_interleaved(
            "goodput", aa, _fixed_design(calibrate_pairs), _done, lambda i: i, True, restarts=restarts
        )
        noise = analyze("goodput", cal.trials, cal.log_ratios, CAL_CONFIG, cal.sessions)
        prior = NoisePrior(noise.var, noise.df, noise.between_var)

    def factory(side: str, i: int) -> GoodputSim:
        return GoodputSim(shape, n, cv, instance, slo, faster, side, rng)

    run = run_interleaved(
        "goodput", factory, design, decide_objective, lambda i: i, True, prior=prior, restarts=restarts
    )
    if run.failure or run.decision is None:
        return False, run.pairs, "failed"
    if run.decision.action != WIN:
        return False, run.pairs, run.decision.action
    conf = run_interleaved(
        "goodput",
        factory,
        confirmation_design(gate.confirm_pairs),
        functools.partial(decide_confirmation, won=run.decision.estimate),
        lambda i: 10_000 + i,
        True,
        prior=prior,
    )
    ok = conf.decision is not None and conf.decision.action == OK
    return ok, run.pairs + conf.pairs, "merge" if ok else "not confirmed"


def goodput(args: argparse.Namespace, shape: Shape, rng: np.random.Generator) -> None:
    gate = GateConfig()
    base = shape.draw(rng, 400_000)
    print(
        f"goodput objective: {RATE:g} requests/s, per-request TTFT lognormal (log-SD {args.sigma}), trial noise "
        f"{args.cv:.1%}, instance effect {args.instance:.0%}, {args.restarts} engine sessions per side, "
        f"calibration {args.calibrate_pairs or 'none'} pairs; "
        f"level {gate.proposal_alpha:g} per proposal, max "
        f"{gate.max_pairs} pairs, then {gate.confirm_pairs} fresh pairs; {args.reps} evaluations per cell"
    )
    print(f"{'requests':>8} {'SLO met':>7} {'A/A merged':>10} {'A/A failed':>10} {'-10% TTFT merged':>16} {'pairs':>6}")
    t0 = time.time()
    for n in (int(x) for x in args.requests.split(",")):
        for met in (0.5, 0.8, 0.95, 0.99):
            slo = float(np.quantile(base, met))
            aa = [
                one_goodput(shape, n, args.cv, args.instance, slo, 1.0, gate, rng, args.restarts, args.calibrate_pairs)
                for _ in range(args.reps)
            ]
            win = [
                one_goodput(shape, n, args.cv, args.instance, slo, 1.10, gate, rng, args.restarts, args.calibrate_pairs)
                for _ in range(args.reps)
            ]
            merged = sum(m for m, _, _ in aa) / args.reps
            failed = sum(o == "failed" for _, _, o in aa) / args.reps
            print(
                f"{n:>8} {met:>7.0%} {merged:>10.2%} {failed:>10.1%} {sum(m for m, _, _ in win) / args.reps:>16.1%} "
                f"{np.mean([p for _, p, _ in aa]):>6.1f}",
                flush=True,
            )
    print(f"runtime {time.time() - t0:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sigma", type=float, default=0.35, help="log-SD of a trial's per-request TTFTs (lognormal shape)")
    ap.add_argument(
        "--from", dest="source", default="", help="an `evaluate --json` output whose trials carry ttft samples"
    )
    ap.add_argument("--cv", type=float, default=0.03, help="per-trial noise (log-SD) shared by a trial's requests")
    ap.add_argument(
        "--instance", type=float, default=0.02, help="SD of an engine instance's effect, fixed for its life"
    )
    ap.add_argument("--requests", default="200,1000,2000")
    ap.add_argument("--goodput", action="store_true", help="the goodput objective's false merges and power")
    ap.add_argument("--restarts", type=int, default=1, help="--goodput: engine sessions per side (the objective's)")
    ap.add_argument(
        "--calibrate-pairs", type=int, default=0, help="--goodput: pairs of the A/A calibration (0: no prior)"
    )
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    sample = None
    if args.source:
        data = json.loads(Path(args.source).read_text())
        sample = np.array([v for t in data["trials"] for v in t["metrics"].get("ttft_samples_ms", [])], dtype=float)
        sample = sample / np.median(sample)
    shape = Shape(args.sigma, sample)
    if args.goodput:
        goodput(args, shape, rng)
        return
    k = shape.tail_factor(rng)
    gate = GateConfig()
    print(
        f"per-request TTFT: {'measured' if sample is not None else f'lognormal, log-SD {args.sigma}'}; "
        f"trial noise {args.cv:.0%}, "
        f"instance effect {args.instance:.0%}; guard level {gate.regression_alpha}, "
        f"floor -{gate.max_regression:.0%}, "
        f"max {gate.max_pairs} pairs, then {gate.guard_check_pairs} fresh pairs "
        f"over {gate.guard_check_sessions} sessions; "
        f"{args.reps} guards per cell"
    )
    print(
        f"tail-only regression: {TAIL_SHARE:.0%} of requests x{k:.2f} (p99 +10%, median unchanged); "
        "median regression: every request x1.10"
    )
    print(
        f"{'requests':>8} {'estimator':<11} {'A/A false':>9} {'tail +10%':>9} {'median +10%':>11} {'pairs (A/A)':>11}"
    )
    t0 = time.time()
    for n in (int(x) for x in args.requests.split(",")):
        for name, est in estimators().items():
            cells, pairs = [], []
            for kind in ("A/A", "tail", "median"):
                res = [one(shape, n, args.cv, args.instance, kind, k, est, gate, rng) for _ in range(args.reps)]
                cells.append(sum(r for r, _ in res) / args.reps)
                if kind == "A/A":
                    pairs = [p for _, p in res]
            print(
                f"{n:>8} {name:<11} {cells[0]:>9.2%} {cells[1]:>9.1%} {cells[2]:>11.1%} {np.mean(pairs):>11.1f}",
                flush=True,
            )
    print(f"runtime {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()

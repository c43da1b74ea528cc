"""How often does the stack check call an honest stack short, and how often does it catch a real shortfall?

Simulated, through the real statistics: each merge's recorded estimate is its confirmation (``--confirm-pairs``
paired log-ratios with per-pair SD ``--sd``, estimated by ``harness.statistics.paired_estimate`` with its t interval,
as the gate's confirmation reports it); the stack check's cumulative gain is the tip against the start over
``--pairs`` pairs, estimated the same way; ``agentsearch.stack.product`` and ``agentsearch.stack.stack_verdict``
(the code `agentsearch stack` runs) give the verdict. Scenarios: K merges of true effect ``--effect`` each that
compose (the cumulative gain is the product: every *under-delivers* is a false alarm), and stacks whose true
cumulative gain falls ``--shortfall`` below the product (a passenger whose gain a later merge took over, or two
merges that partly cancel): the detection rate. Also the same honest stacks judged with the objective's early-stopped
estimates, inflated by the winner's curse (``--curse``), to show why the confirmation's are used.

A merge's confirmation is kept only when it measures a speedup (``decide_confirmation``): each is drawn again until
its mean is above zero. A/A-like stacks (true effect 0 or 1% per merge: merges that won by luck) are the case where
that selection matters; the column *unadjusted* judges them against the raw product, the others against the product
the stack check uses (each confirmation corrected for its pass condition, ``agentsearch.stack.kept``).

    python benchmarks/stack_quality.py [--reps 4000] [--seed 1] [--sd 0.03] [--pairs 12] [--confirm-pairs 4]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
from scipy.stats import t as student

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentsearch.stack import product, stack_verdict  # noqa: E402
from harness.statistics import paired_estimate  # noqa: E402
from history.records.stack import StackMerge  # noqa: E402


def estimate(rng: np.random.Generator, log_effect: float, sd: float, pairs: int) -> tuple[float, tuple[float, float]]:
    """A paired estimate of exp(log_effect) from ``pairs`` simulated pairs, with its 95% t interval."""
    est = paired_estimate(list(rng.normal(log_effect, sd, size=pairs)))
    half = float(student.ppf(0.975, est.df)) * est.se
    return est.speedup, (math.exp(est.mean - half), math.exp(est.mean + half))


def rate(
    rng: np.random.Generator, reps: int, k: int, effect: float, shortfall: float, curse: float, a: argparse.Namespace
) -> dict[str, float]:
    counts = {"delivers": 0, "under-delivers": 0, "inconclusive": 0, "unadjusted": 0}
    for _ in range(reps):
        merges = []
        for i in range(k):
            s, ci = estimate(rng, math.log(1 + effect), a.sd, a.confirm_pairs)
            while s <= 1.0:  # the gate keeps a confirmation only when it measures a speedup
                s, ci = estimate(rng, math.log(1 + effect), a.sd, a.confirm_pairs)
            if curse:  # the objective's early stop: the recorded estimate is inflated by ``curse`` (a fraction)
                s, ci = s * (1 + curse), (ci[0] * (1 + curse), ci[1] * (1 + curse))
            merges.append(StackMerge(f"m{i}", None, None, s, ci))
        true_cum = k * math.log(1 + effect) + math.log(1 - shortfall)
        cum, cum_ci = estimate(rng, true_cum, a.sd, a.pairs)
        prod, prod_ci = product(tuple(merges))
        verdict, _ = stack_verdict(cum, cum_ci, prod, prod_ci, a.alpha, a.margin)
        counts[verdict] += 1
        raw, raw_ci = product(tuple(merges), selection=False)
        counts["unadjusted"] += stack_verdict(cum, cum_ci, raw, raw_ci, a.alpha, a.margin)[0] == "under-delivers"
    return {v: n / reps for v, n in counts.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--sd", type=float, default=0.03, help="per-pair SD of the log-ratio (the toy and the CPU engine: 0.02-0.04)"
    )
    ap.add_argument("--pairs", type=int, default=12, help="pairs of the stack check's own measurement")
    ap.add_argument("--confirm-pairs", type=int, default=4, help="pairs of each merge's confirmation")
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--margin", type=float, default=0.02, help="[gate] min_effect: the shortfall worth acting on")
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    print(
        f"per-pair SD {a.sd:g}, stack check {a.pairs} pairs, confirmations {a.confirm_pairs} pairs, alpha {a.alpha:g}, "
        f"margin {a.margin:.0%}, {a.reps} stacks per row"
    )
    print(
        f"{'merges':>6} {'effect':>7} {'true shortfall':>15} {'estimates':>22} {'under-delivers':>15} "
        f"{'delivers':>9} {'inconclusive':>13} {'unadjusted':>11}"
    )
    rows = [(k, e, 0.0, 0.0) for k in (2, 4, 6) for e in (0.0, 0.01)]  # A/A-like: merges that won by luck
    rows += [(k, e, 0.0, 0.0) for k in (2, 4, 6) for e in (0.03, 0.10)]
    rows += [(k, 0.10, sf, 0.0) for k in (2, 4) for sf in (0.05, 0.10, 0.20)]
    rows += [(k, 0.03, 0.10, 0.0) for k in (2, 6)]  # small wins: where the correction costs power
    rows += [(k, 0.10, 0.0, 0.03) for k in (2, 4, 6)]
    for k, effect, shortfall, curse in rows:
        r = rate(rng, a.reps, k, effect, shortfall, curse, a)
        what = "confirmation" if not curse else f"inflated +{curse:.0%} each"
        print(
            f"{k:>6} {effect:>7.0%} {shortfall:>15.0%} {what:>22} {r['under-delivers']:>15.1%} "
            f"{r['delivers']:>9.1%} {r['inconclusive']:>13.1%} {r['unadjusted']:>11.1%}"
        )


if __name__ == "__main__":
    main()

"""How often does the gate get it right? Simulated noisy workloads through the real code path.

Every simulated proposal runs through ``harness.interleave.run_interleaved`` (the same ABBA
scheduling, sequential looks and decisions as ``agentsearch evaluate``) with sessions that
return simulated measurements instead of running a child process; the A/A calibration runs
through ``agentsearch.calibration.analyze``. Prints, per scenario: the false-merge rate of A/A
proposals, the detection rate and mean pairs of true 3% wins (``--effect``), and the mean cost of rejected
proposals relative to the full budget; then the same A/A data judged by two rules common
in today's tools, for contrast.

    python benchmarks/gate_quality.py [--reps 2000] [--seed 1] [--only instance] [--same-instances]
        [--scenario CV:INSTANCE:RESTARTS[:LOTTERY] ...] [--max-pairs N] [--confirm-pairs N] [--effect 0.03]

Scenarios with engine instances (``instance``: the SD of each engine instance's own effect on its
side's measurements, fixed for its life, as measured on the vLLM CPU engine) run ``restarts``
sessions per side, each a fresh instance, and judge with the sessions as clusters; their A/A
calibration runs the same way (its between-session variance is the prior's). The confirmation runs
on a fresh pair of instances, as ``agentsearch evaluate`` does; ``--same-instances`` confirms on the
objective's instances instead (the behaviour before 2026-12-01, for comparison). ``--scenario`` runs
scenarios of your own instead of the built-in ones: ``0.021:0.005:4`` is a per-trial log SD of 0.021
(a per-pair SD of 0.03), an instance SD of 0.005 per side and engine, 4 sessions per side; a fourth field adds
the *lottery* attack: the candidate's code draws its own speed per engine instance (mean zero, that SD), which
the A/A calibration (baseline code on both sides) cannot see. Without ``--scenario`` the built-in rows end with
that attack at 1%, 2% and 4%, with 2 and with 5 sessions per side. ``--max-pairs`` and ``--confirm-pairs`` judge with
another pair budget and confirmation than the gate's defaults (the starter's objective: 30 and 4, with 5 sessions).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentsearch.calibration import _done, _fixed_design, analyze  # noqa: E402
from agentsearch.config import GateConfig, load_config_text  # noqa: E402
from agentsearch.gate_design import design_for  # noqa: E402
from agentsearch.report import session_table  # noqa: E402
from harness.interleave import run_interleaved  # noqa: E402
from harness.sequential import LOSE, OK, WIN, confirmation_design, decide_confirmation, decide_objective  # noqa: E402
from harness.statistics import NoisePrior  # noqa: E402
from harness.trials import CANDIDATE, TrialOutcome  # noqa: E402

CONFIG = load_config_text('[[workload]]\nname = "sim"\ncommand = "true"\nmetric = "v"\n')


@dataclass(frozen=True)
class Scenario:
    name: str
    cv: float
    outlier_rate: float = 0.0  # fraction of trials hit by a stall (x1.5..x3 slower)
    drift: float = 0.0  # relative change of every measurement over 100 trials
    loaded: bool = False  # every trial flagged foreign_load: the confirmation must be significant by itself
    instance: float = 0.0  # SD of an engine instance's own effect on its side's log-measurements (fixed for its life)
    restarts: int = 1  # engine sessions per side and evaluation
    # the attack: SD of an instance effect of the candidate's code alone (mean zero), unseen by the A/A calibration
    lottery: float = 0.0
    # the lottery from slowdowns alone (-|N(0, lottery)|): what a candidate can draw without any real speedup
    sabotage: bool = False


class Clock:
    """Trial counter shared by both sides: drift depends on when a trial runs."""

    def __init__(self) -> None:
        self.t = 0


class SimSession:
    def __init__(
        self, sc: Scenario, effect: float, side: str, clock: Clock, rng: np.random.Generator, proposal: bool = True
    ):
        self.sc, self.side, self.clock, self.rng = sc, side, clock, rng
        self.mu = math.log1p(effect) if side == CANDIDATE else 0.0
        if sc.instance:
            self.mu += rng.normal(0.0, sc.instance)  # this instance's luck: memory layout and the like
        if sc.lottery and proposal and side == CANDIDATE:
            draw = rng.normal(0.0, sc.lottery)  # the candidate's code draws its speed per engine instance
            self.mu += -abs(draw) if sc.sabotage else draw

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass

    def measure(self, seed: int) -> TrialOutcome:
        sc = self.sc
        v = 1000.0 * math.exp(self.mu + self.rng.normal(0.0, sc.cv))
        v *= 1.0 + sc.drift * self.clock.t / 100.0
        if sc.outlier_rate and self.rng.random() < sc.outlier_rate:
            v /= self.rng.uniform(1.5, 3.0)
        self.clock.t += 1
        return TrialOutcome(True, v, {"v": v}, 0.0)


def one(
    sc: Scenario,
    effect: float,
    gate: GateConfig,
    rng: np.random.Generator,
    calibrate_pairs: int,
    same_instances: bool = False,
) -> tuple[bool, int, str, bool]:
    """(merged, pairs used, outcome, sessions differ): ``merge``, ``not confirmed`` (won, then refused on fresh seeds),
    ``futility`` (stopped early as a loser) or ``inconclusive`` (the budget ran out); for a merge, whether the report's
    *Sessions* table would say its sessions (the objective's and the confirmation's) differ."""
    design = design_for(gate)
    prior = None
    if calibrate_pairs:
        clock = Clock()
        aa = lambda side, i: SimSession(sc, 0.0, side, clock, rng, proposal=False)  # noqa: E731  (baseline code on both sides)
        cal = run_interleaved("sim", aa, _fixed_design(calibrate_pairs), _done, lambda i: i, True, restarts=sc.restarts)
        noise = analyze("sim", cal.trials, cal.log_ratios, CONFIG, cal.sessions)
        prior = NoisePrior(noise.var, noise.df, noise.between_var)
    clock = Clock()
    made: dict[tuple[str, int], SimSession] = {}

    def session(side: str, i: int) -> SimSession:
        made[(side, i)] = SimSession(sc, effect, side, clock, rng)
        return made[(side, i)]

    run = run_interleaved(
        "sim", session, design, decide_objective, lambda i: i, True, prior=prior, restarts=sc.restarts
    )
    assert run.decision is not None
    if run.decision.action != WIN or gate.confirm_pairs == 0:
        won = run.decision.action == WIN
        return (
            won,
            run.pairs,
            "merge" if won else ("futility" if run.decision.action == LOSE else "inconclusive"),
            False,
        )
    # a fresh pair of instances, one session (agentsearch evaluate); --same-instances: the objective's, as before
    fresh = lambda side, i: SimSession(sc, effect, side, clock, rng)  # noqa: E731
    again = (
        (lambda side, i: made.get((side, i)) or fresh(side, i)) if same_instances else fresh
    )  # the pool starts a missing one
    conf = run_interleaved(
        "sim",
        again,
        confirmation_design(gate.confirm_pairs, sc.loaded),
        functools.partial(decide_confirmation, won=run.decision.estimate, strict=sc.loaded),
        lambda i: 10_000 + i,
        True,
        prior=prior,
        restarts=sc.restarts if same_instances else 1,
    )
    assert conf.decision is not None
    ok = conf.decision.action == OK
    # the report's Sessions table over the same trials (agentsearch.report.session_table)
    trials = [
        dataclasses.replace(t, phase=phase)
        for phase, r in (("objective", run), ("confirmation", conf))
        for t in r.trials
    ]
    table = session_table(trials, {"sim": True})
    return ok, run.pairs + conf.pairs, "merge" if ok else "not confirmed", ok and bool(table) and table[0]["differ"]


def custom_scenario(text: str) -> Scenario:
    """``CV:INSTANCE:RESTARTS`` (``--scenario``) as a Scenario; a malformed one stops with one line saying so."""
    try:
        cv, instance, restarts, *rest = text.split(":")
        if len(rest) > 1:
            raise ValueError(text)
        lottery = float(rest[0]) if rest else 0.0
        name = f"CV {float(cv):.1%} + instance {float(instance):.1%}, restarts {int(restarts)}" + (
            f", lottery {lottery:.1%}" if lottery else ""
        )
        sc = Scenario(name, float(cv), instance=float(instance), restarts=int(restarts), lottery=lottery)
    except ValueError:
        raise SystemExit(f"--scenario {text!r}: expected CV:INSTANCE:RESTARTS[:LOTTERY], e.g. 0.021:0.005:4") from None
    if sc.cv <= 0 or sc.instance < 0 or sc.restarts < 1 or sc.lottery < 0:
        raise SystemExit(f"--scenario {text!r}: CV must be > 0, INSTANCE and LOTTERY >= 0 and RESTARTS >= 1")
    return sc


def naive_rules(sc: Scenario, rng: np.random.Generator, reps: int, gate: GateConfig) -> tuple[float, float]:
    """A/A false merges of: mean of two runs beats baseline by min_effect; p < 0.10 on 5 pairs."""
    from scipy import stats

    two = ptest = 0
    for _ in range(reps):
        clock = Clock()
        a = SimSession(sc, 0.0, "baseline", clock, rng)
        b = SimSession(sc, 0.0, CANDIDATE, clock, rng)
        base = [a.measure(0).value for _ in range(2)]
        cand = [b.measure(0).value for _ in range(2)]
        two += np.mean(cand) > np.mean(base) * (1 + gate.min_effect)
        d = [math.log(b.measure(0).value / a.measure(0).value) for _ in range(5)]
        ptest += stats.ttest_1samp(d, 0.0, alternative="greater").pvalue < 0.10
    return two / reps, ptest / reps


def attack(args: argparse.Namespace, gate: GateConfig, rng: np.random.Generator) -> None:
    """The lottery: a no-op whose code draws its speed per engine instance (mean zero, SD ``lottery``). Its
    A/A calibration is the baseline's and never sees it; two sessions and a fresh confirmation instance
    that all drew high look like a real win. The gate's level holds only for candidates whose instances
    vary as the baseline's do."""
    rows = [
        Scenario(f"CV 2.3%, restarts {r}, lottery {sd:.0%}", 0.0226, restarts=r, lottery=sd)
        for r in (2, 5)
        for sd in (0.01, 0.02, 0.04)
    ]
    # the same draws with every speedup taken away: a candidate with no real speedup on any instance
    # can only slow some down
    rows += [
        Scenario(f"CV 2.3%, restarts 2, lottery of slowdowns {sd:.0%}", 0.0226, restarts=2, lottery=sd, sabotage=True)
        for sd in (0.02, 0.04)
    ]
    rows = [sc for sc in rows if args.only in sc.name]
    if not rows:
        return
    print(
        "\nattack, a per-instance lottery "
        f"(false merges of no-op candidates; the per-proposal level is {gate.proposal_alpha:.2%}):"
    )
    for sc in rows:
        runs = [one(sc, 0.0, gate, rng, args.calibrate_pairs, args.same_instances) for _ in range(args.reps)]
        merged = [differ for m, _, _, differ in runs if m]
        flagged = f"; the report's Sessions table says 'differ' for {np.mean(merged):.0%} of them" if merged else ""
        print(f"  {sc.name:48} false merges {len(merged) / len(runs):6.2%} ({len(merged)} of {len(runs)}{flagged})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=1200, help="A/A proposals per scenario (wins: reps/2)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--calibrate-pairs", type=int, default=30)
    ap.add_argument("--only", default="", help="run only the scenarios whose name contains this text")
    ap.add_argument(
        "--same-instances", action="store_true", help="confirm on the objective's engine instances (the old behaviour)"
    )
    ap.add_argument(
        "--scenario",
        action="append",
        default=[],
        metavar="CV:INSTANCE:RESTARTS[:LOTTERY]",
        help="a scenario of your own (repeatable; replaces the built-in ones): "
        "per-trial log SD, instance SD per side, sessions, "
        "and the candidate's own per-instance SD (the lottery attack)",
    )
    ap.add_argument("--max-pairs", type=int, help="the objective's pair budget (default: the gate's, 20)")
    ap.add_argument(
        "--confirm-pairs", type=int, help="pairs of the confirmation on fresh engines (default: the gate's, 6)"
    )
    ap.add_argument("--effect", type=float, default=0.03, help="the true speedup of the win proposals (default 0.03)")
    args = ap.parse_args()
    if not -1 < args.effect < 10:
        raise SystemExit(f"--effect: expected a speedup between -1 and 10 (0.03 = 3%), got {args.effect}")
    rng = np.random.default_rng(args.seed)
    given = (("max_pairs", args.max_pairs), ("confirm_pairs", args.confirm_pairs))
    try:
        gate = GateConfig(**{k: v for k, v in given if v is not None})
    except ValueError as exc:
        raise SystemExit(f"--max-pairs / --confirm-pairs: {str(exc).split('|')[0]}") from None
    t0 = time.perf_counter()
    print(
        f"gate defaults: episode alpha {gate.alpha}, budget {gate.episode_budget} proposals "
        f"-> per-proposal alpha {gate.proposal_alpha:.4f}; "
        f"min_effect {gate.min_effect:.0%}, pairs {gate.min_pairs}..{gate.max_pairs}, futility {gate.futility}"
    )
    print(
        f"A/A calibration: {args.calibrate_pairs} pairs per simulated proposal; "
        f"{args.reps} A/A and {args.reps // 2} win proposals per scenario\n"
    )
    scenarios = [
        Scenario("CV 1%", 0.01),
        Scenario("CV 2%", 0.02),
        Scenario("CV 5%", 0.05),
        Scenario("CV 2% + 2% stalls", 0.02, outlier_rate=0.02),
        Scenario("CV 2% + drift 10%/100 trials", 0.02, drift=0.10),
        Scenario("CV 5% + stalls + drift", 0.05, outlier_rate=0.02, drift=0.10),
        Scenario("CV 2%, under foreign load", 0.02, loaded=True),
        # the vLLM CPU engine, measured: per-pair SD ~0.045 within an engine pair, an engine-pair effect of SD ~0.016
        Scenario("CV 3% + instance 1.1%, restarts 2", 0.03, instance=0.011, restarts=2),
        Scenario("CV 3% + instance 1.1%, restarts 4", 0.03, instance=0.011, restarts=4),
        Scenario("CV 2% + instance 1.1%, restarts 4", 0.02, instance=0.011, restarts=4),
        Scenario("CV 2% + instance 1.1%, restarts 10", 0.02, instance=0.011, restarts=10),
    ]
    if args.scenario:
        scenarios = [custom_scenario(text) for text in args.scenario]
    scenarios = [sc for sc in scenarios if args.only in sc.name]
    full = gate.max_pairs + gate.confirm_pairs
    print(
        "cost = pairs used / pairs of a full evaluation "
        f"({gate.max_pairs} objective + {gate.confirm_pairs} confirmation = {full}); "
        f"'of budget' = / {gate.max_pairs} objective pairs alone\n"
    )
    pct = f"{args.effect * 100:g}%"
    detected = f"{pct} win detected"
    header = (
        f"{'scenario':32} {'A/A false merges':>17} {'A/A cost':>9} {'of budget':>10} {detected:>16} "
        f"{'pairs (wins)':>13} {'rejected cost':>14}"
    )
    print(header)
    print("-" * len(header))
    rows = []
    outcomes = []  # where the true wins went
    for sc in scenarios:
        aa = [one(sc, 0.0, gate, rng, args.calibrate_pairs, args.same_instances) for _ in range(args.reps)]
        wins = [
            one(sc, args.effect, gate, rng, args.calibrate_pairs, args.same_instances) for _ in range(args.reps // 2)
        ]
        fm = np.mean([m for m, _, _, _ in aa])
        aa_pairs = np.mean([n for m, n, _, _ in aa if not m])
        aa_cost = aa_pairs / full
        power = np.mean([m for m, _, _, _ in wins])
        win_pairs = (
            np.mean([n for m, n, _, _ in wins if m]) if any(m for m, _, _, _ in wins) else float("nan")
        )  # objective + confirmation
        rejected = [n for m, n, _, _ in aa if not m] + [n for m, n, _, _ in wins if not m]
        outcomes.append(
            (sc.name, collections.Counter(o for _, _, o, _ in wins), len(wins), [d for m, _, _, d in wins if m])
        )
        rej_cost = np.mean(rejected) / full
        rows.append((sc, fm, aa_cost, power, win_pairs, rej_cost))
        print(
            f"{sc.name:32} {fm:>17.2%} {aa_cost:>9.0%} {aa_pairs / gate.max_pairs:>10.0%} {power:>16.1%} "
            f"{win_pairs:>13.1f} {rej_cost:>14.0%}"
        )
    print(
        f"\nwhere the true {pct} wins went "
        "(merged / won but refused by the confirmation / stopped by futility / inconclusive at max_pairs):"
    )
    for name, c, n, differ in outcomes:
        flagged = f"  (Sessions 'differ' for {np.mean(differ):.1%} of the merges)" if differ else ""
        print(
            f"  {name:30} "
            + "  ".join(f"{k} {c[k] / n:6.1%}" for k in ("merge", "not confirmed", "futility", "inconclusive"))
            + flagged
        )
    basic = [
        sc
        for sc in scenarios
        if sc.restarts == 1 and not sc.instance and not sc.outlier_rate and not sc.drift and not sc.loaded
    ]
    if basic:
        print("\nfor contrast, A/A false merges of rules common today (same simulated noise):")
    for sc in basic:
        two, pt = naive_rules(sc, rng, args.reps, gate)
        print(f"  {sc.name:30} mean of two runs > +{gate.min_effect:.0%}: {two:6.1%}    p < 0.10 on 5 pairs: {pt:6.1%}")
    if not args.scenario:
        attack(args, gate, rng)
    print(
        "\n'pairs (wins)' counts objective + confirmation pairs; the objective never uses more than "
        f"{gate.max_pairs} pairs (max_pairs)."
    )
    main_row = next((r for r in rows if r[0].name == "CV 2%"), None)
    if main_row is not None:
        ok = all(r[1] <= 0.01 for r in rows) and main_row[3] >= 0.90 and gate.max_pairs <= 20 and main_row[5] <= 0.25
        print(
            "targets (false merges <= 1% everywhere; at CV 2%: power >= 90% with <= 20 objective pairs, "
            f"rejected cost <= 25% of a full evaluation): {'MET' if ok else 'NOT MET'}"
        )
    print(f"wall time {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

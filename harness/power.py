"""What the gate's own decisions find at a measured noise: simulated proposals through the real sequential code.

``statistics.min_detectable`` is the power of one t-test at the last look. The gate does more, and each step
costs power the formula does not see: it looks after every pair (the final look keeps 80% of the level), it
estimates each proposal's engine-session effect from the proposal's own sessions (never below the
calibration's: with two sessions that estimate has one degree of freedom and often widens the interval), a
first-session win must beat a margin, futility stops a true win now and then, a point estimate under half of
``min_effect`` is no win, and a win must hold on fresh engines (the confirmation). At a per-pair SD of 0.032
with two sessions of 10 pairs the formula promises 90% for a 3% win; the decisions merge about 70% (with five
sessions of 6 pairs, the starter's objective, about 87%: the session effect is then estimated on 4 degrees of
freedom).

This module runs simulated proposals through ``interleave.run_interleaved`` and the decisions of
``sequential`` with a given prior (the calibration's, as the gate uses it): each side's log-measurement is
normal with a per-trial SD, plus an effect per engine instance and side, fixed for the instance's life. The
smallest effect found with the wanted power is found by bisection; every effect size sees the same seeds of
noise (common random numbers), so the rate grows smoothly with the effect. Pure computation, no I/O.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from .interleave import run_interleaved
from .sequential import (
    OK,
    REGRESSED,
    WIN,
    SequentialDesign,
    confirmation_design,
    decide_confirmation,
    decide_guard,
    decide_objective,
)
from .statistics import NoisePrior
from .trials import CANDIDATE, TrialOutcome

POWER_REPS = 200  # simulated proposals per effect size (Monte Carlo SE of a 90% rate: 2.1 points)


@dataclass(frozen=True)
class Noise:
    """The measured noise a simulated proposal gets."""

    trial_sd: float  # SD of one trial's log-measurement (a pair's log-ratio: sqrt(2) x this)
    instance_sd: float = 0.0  # SD of an engine instance's own effect on its side's log-measurements
    restarts: int = 1  # engine sessions per side (the gate's `restarts`)
    alternate: bool = False  # one engine at a time, in rounds (placement `alternate`)
    confirm_restarts: int = 1  # the confirmation's sessions on fresh engines (two under placement `split`)

    def __post_init__(self) -> None:
        if not (self.trial_sd >= 0 and self.instance_sd >= 0 and self.restarts >= 1 and self.confirm_restarts >= 1):
            raise ValueError(f"bad noise: {self}")

    @classmethod
    def from_calibration(
        cls, within_sd: float, between_var: float, restarts: int, alternate: bool = False, confirm_restarts: int = 1
    ) -> Noise:
        """From a calibration's per-pair SD *within* an engine session and its between-session variance (of a pair's
        log-ratio, both sides' instances: each side's instance gets half of it)."""
        return cls(
            within_sd / math.sqrt(2), math.sqrt(max(between_var, 0.0) / 2), restarts, alternate, confirm_restarts
        )


class SimulatedSide:
    """One side's engine instance: log-normal measurements around its own level."""

    def __init__(self, level: float, trial_sd: float, rng: np.random.Generator):
        self.level, self.trial_sd, self.rng = level, trial_sd, rng

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass

    def measure(self, seed: int) -> TrialOutcome:
        v = 1000.0 * math.exp(self.level + self.rng.normal(0.0, self.trial_sd))
        return TrialOutcome(True, v, {"v": v}, 0.0)


def found(
    design: SequentialDesign,
    prior: NoisePrior | None,
    noise: Noise,
    effect: float,
    rng: np.random.Generator,
    confirm_pairs: int = 0,
    guard: bool = False,
) -> bool:
    """One simulated proposal. Objective: is a speedup ``effect`` (0.03 = 3%) merged (a win, then confirmed on one fresh
    pair of instances over ``confirm_pairs`` pairs when > 0)? ``guard``: is a slowdown ``effect`` flagged as a
    regression?"""
    shift = math.log1p(-effect) if guard else math.log1p(effect)

    def side(name: str, _restart: int) -> SimulatedSide:
        level = (shift if name == CANDIDATE else 0.0) + (
            rng.normal(0.0, noise.instance_sd) if noise.instance_sd else 0.0
        )
        return SimulatedSide(level, noise.trial_sd, rng)

    run = run_interleaved(
        "simulated",
        side,
        design,
        decide_guard if guard else decide_objective,
        lambda i: i,
        True,
        prior=prior,
        restarts=noise.restarts,
        alternate=noise.alternate,
    )
    assert run.decision is not None
    if guard:
        return run.decision.action == REGRESSED
    if run.decision.action != WIN:
        return False
    if confirm_pairs <= 0:
        return True
    conf = run_interleaved(
        "simulated",
        side,
        confirmation_design(confirm_pairs),
        functools.partial(decide_confirmation, won=run.decision.estimate),
        lambda i: 10_000 + i,
        True,
        prior=prior,
        restarts=noise.confirm_restarts,
        alternate=noise.alternate,
    )
    assert conf.decision is not None
    return conf.decision.action == OK


def rate(
    design: SequentialDesign,
    prior: NoisePrior | None,
    noise: Noise,
    effect: float,
    reps: int = POWER_REPS,
    seed: int = 0,
    confirm_pairs: int = 0,
    guard: bool = False,
) -> float:
    """Share of ``reps`` simulated proposals with ``effect`` that the gate finds (``found``); proposal i always draws
    its noise from seed (``seed``, i)."""
    if reps < 1:
        raise ValueError("need at least one simulated proposal")
    hits = sum(
        found(design, prior, noise, effect, np.random.default_rng([seed, i]), confirm_pairs, guard) for i in range(reps)
    )
    return hits / reps


def detectable(
    design: SequentialDesign,
    prior: NoisePrior | None,
    noise: Noise,
    power: float = 0.9,
    reps: int = POWER_REPS,
    seed: int = 0,
    confirm_pairs: int = 0,
    guard: bool = False,
    top: float | None = None,
    steps: int = 9,
) -> float | None:
    """The smallest effect (0.03 = 3%) the gate finds with ``power``, by bisection on a log scale between 0.1% and
    ``top`` (a speedup: 100%; a regression: 90%); None when even ``top`` falls short. Resolution: ``steps`` halvings
    of the log range (9: about 2% of the effect), the Monte Carlo error of ``reps`` proposals on top."""
    if not 0 < power < 1:
        raise ValueError("power must be between 0 and 1")
    top = top if top is not None else (0.9 if guard else 1.0)

    def ok(effect: float) -> bool:
        return rate(design, prior, noise, effect, reps, seed, confirm_pairs, guard) >= power

    lo, hi = math.log(0.001), math.log(top)
    if not ok(top):
        return None
    if ok(0.001):
        return 0.001
    for _ in range(steps):
        mid = (lo + hi) / 2
        if ok(math.exp(mid)):
            hi = mid
        else:
            lo = mid
    return math.exp(hi)

"""Group-sequential decisions on paired log-ratios: stop early for clear winners and losers.

Error control (documented in docs/design/gate.md):
- The false-merge level of one proposal, ``alpha`` (the episode's alpha divided over its
  proposal budget), is split over the *win looks* (``SequentialDesign.win_looks``): the interim ones
  share ``interim_share`` of it equally, the final look gets the rest. By the union bound the
  probability that a proposal without a real speedup is declared a win at any look is at most
  ``alpha``. The win looks are fixed before the first pair: the end of every engine session (where
  the session effect can be counted once more) when the pairs span several, and a geometric
  schedule from ``min_pairs`` within the first session. Every other look may only stop a loser
  (futility spends no alpha). Before 0.8 the interim share (0.2) was split over every pair's look
  (27 on the starter); now 0.3 over the win looks (6 on the starter): the benchmark's 3% power is
  the same, a clear win stops at a session's end with more of the level (docs/design/gate.md).
- Futility: at every look the lower boundary of Wald's SPRT of "no speedup" against
  "a speedup of ``futility_factor`` x ``min_effect``" (error rates ``alpha`` and
  ``futility``) is checked; crossing it stops the proposal as a loser. Futility stops only
  ever reject, so they cannot add false merges; they cost power, which the benchmark measures.
  The SPRT's variance of the mean counts the engine-session effect (se² = var/n + tau²/R, as the
  estimate's): a small true speedup measured on one unlucky engine pair is not "no speedup". While
  the pairs span one session of several and no calibration gives tau², tau² is unknown: then only
  a clear loser stops (significantly slower by at least the speedup the SPRT tests for); a no-op
  waits for the second session. Symmetrically, a win on the first session alone must be significant
  against that margin, not only against zero.
- A win also needs a point estimate of at least half of ``min_effect``: a significant but
  negligible speedup is not worth a merge.
- Reaching ``max_pairs`` without a win is inconclusive, and inconclusive is a rejection.
- A win is then confirmed on fresh input seeds (``decide_confirmation``): the speedup must
  point the same way again and must not be significantly smaller than the win's estimate
  (``REPLICATION_ALPHA``, a test of the two estimates' difference), or the proposal is rejected.
  A win measured mostly under foreign load must, in addition, be significant on the fresh
  seeds by itself (``LOADED_CONFIRM_ALPHA``, over at least ``LOADED_CONFIRM_PAIRS`` fresh pairs): under a
  changing foreign load trials are not exchangeable, and a false win can be consistent over a few pairs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from . import gate_defaults as D
from .statistics import (
    NoisePrior,
    PairedEstimate,
    by_cluster,
    paired_estimate,
    session_variance,
    student_t_sf,
    t_sf,
    winsorize,
)

GEOMETRIC = 1.5  # the win looks' growth within one session: 3, 5, 8, 12, 18, 27 pairs ...
CONTINUE = "continue"
WIN = "win"
LOSE = "lose"
INCONCLUSIVE = "inconclusive"
OK = "ok"
REGRESSED = "regressed"
NOT_CONFIRMED = "not-confirmed"


@dataclass(frozen=True)
class SequentialDesign:
    alpha: float
    min_effect: float = D.MIN_EFFECT
    futility: float = D.FUTILITY
    futility_factor: float = 1.5
    min_pairs: int = D.MIN_PAIRS
    look_every: int = D.LOOK_EVERY
    max_pairs: int = D.MAX_PAIRS
    interim_share: float = D.INTERIM_SHARE
    session_pairs: int = 0  # pairs per engine session when the pairs span several (0: one session)
    max_regression: float = D.MAX_REGRESSION
    regression_alpha: float = D.REGRESSION_ALPHA

    def __post_init__(self) -> None:
        if not (0 < self.alpha < 1) or self.min_pairs < 2 or self.max_pairs < self.min_pairs or self.look_every < 1:
            raise ValueError(f"invalid sequential design: {self}")

    def looks(self) -> list[int]:
        out = list(range(self.min_pairs, self.max_pairs, self.look_every))
        return out + [self.max_pairs]

    def win_looks(self) -> list[int]:
        """The looks at which a win may be declared, each spending a share of ``alpha``; fixed before the first pair.

        A geometric schedule from ``min_pairs`` (x1.5) within the first engine session, as a group-sequential design
        looks (a clean large win stops there, on the margin ``decide_objective`` asks while the session effect is
        unknown); then, when the pairs span several sessions, the first look at or after the end of every session (a
        win inside a later session has no more of the session effect counted than at its start). Always the last
        look."""
        looks = self.looks()
        several = 0 < self.session_pairs < self.max_pairs
        first = self.session_pairs if several else self.max_pairs
        marks, n = [], self.min_pairs
        while n < first:
            marks.append(n)
            n = max(n + 1, math.ceil(n * GEOMETRIC))
        if several:
            marks += range(self.session_pairs, self.max_pairs, self.session_pairs)
        chosen = {next((x for x in looks if x >= m), self.max_pairs) for m in marks}
        return sorted(chosen | {self.max_pairs})

    def level(self, n: int) -> float:
        """Significance level spent at the look after ``n`` pairs (0 at a look that may only stop a loser)."""
        looks = self.looks()
        if n not in looks:
            raise ValueError(f"{n} pairs is not a look of this design ({looks})")
        wins = self.win_looks()
        if len(wins) == 1:
            return self.alpha if n == self.max_pairs else 0.0
        if n == self.max_pairs:
            return self.alpha * (1 - self.interim_share)
        if n not in wins:
            return 0.0
        return self.alpha * self.interim_share / (len(wins) - 1)

    def next_look(self, n: int) -> int:
        for look in self.looks():
            if look > n:
                return look
        return self.max_pairs


@dataclass(frozen=True)
class Decision:
    action: str
    reason: str
    estimate: PairedEstimate
    level: float


def decide_objective(
    design: SequentialDesign, d: Sequence[float], prior: NoisePrior | None = None, clusters: Sequence[int] | None = None
) -> Decision:
    """Decision at a look for the objective workload: win, lose, continue, or inconclusive."""
    n = len(d)
    est = paired_estimate(d, prior, clusters=clusters)
    level = design.level(n)
    target = math.log1p(design.min_effect)
    p = est.p_better()
    _, _, known = session_variance(d, clusters, prior)
    margin = math.log1p(design.min_effect * design.futility_factor)
    if not known:
        # tau unknown (one session of several so far, no calibration): one engine pair's luck is not yet told
        # from the code's effect, so a win must beat the margin the SPRT tests for, not only zero
        p = t_sf(est.mean - margin, est.se, est.df)
    if p < level and est.mean >= target / 2:
        why = "" if known else f", by more than {math.expm1(margin):+.1%} on the first engine pair"
        return Decision(
            WIN, f"faster by {est.speedup - 1:+.2%} (p={p:.2g} < {level:.2g}{why}) after {n} pairs", est, level
        )
    slower = est.p_worse() < design.regression_alpha
    # tau unknown: stop only a clear loser, one significantly slower by at least the speedup futility tests for
    # (a true win would need a session effect of twice that size against it to look so)
    clear = est.upper(1 - design.regression_alpha) < math.exp(-margin)
    if (known or clear) and sprt_llr(design, d, prior, clusters) < math.log(design.futility / (1 - design.alpha)):
        why = "slower" if slower else "no worthwhile speedup"
        alt = design.min_effect * design.futility_factor
        return Decision(
            LOSE,
            f"{why}: speedup {est.speedup - 1:+.2%} after {n} of {design.max_pairs} pairs; stopped early: "
            f"the sequential futility test favours no speedup over {alt:+.1%} (it stops a real {alt:+.1%} this way "
            f"at most ~{design.futility:.0%} of the time)",
            est,
            level,
        )
    if n >= design.max_pairs:
        return Decision(
            INCONCLUSIVE,
            f"inconclusive after {n} pairs: speedup {est.speedup - 1:+.2%}, p={p:.2g} not below {level:.2g}",
            est,
            level,
        )
    return Decision(CONTINUE, "", est, level)


def sprt_llr(
    design: SequentialDesign, d: Sequence[float], prior: NoisePrior | None, clusters: Sequence[int] | None = None
) -> float:
    """Log-likelihood ratio of 'speedup = futility_factor x min_effect' against 'no speedup'.

    Normal model of the mean with variance var/n + tau²/R: the pairs' variance pooled with the
    calibration's (not the conservative maximum: here a larger variance would only delay the stop)
    and the engine-session effect (``session_variance``).
    """
    n = len(d)
    w, _ = winsorize(d, floor_scale=math.sqrt(prior.var) if prior else 0.0)
    x = np.asarray(w, dtype=float)
    var = float(x.var(ddof=1))
    if prior is not None:
        var = (prior.df * prior.var + (n - 1) * var) / (prior.df + n - 1)
    if var <= 0:
        var = 1e-12
    tau2, r, _ = session_variance(x.tolist(), clusters, prior)
    d1 = math.log1p(design.min_effect * design.futility_factor)
    return (d1 * float(x.mean()) - d1 * d1 / 2) / (var / n + tau2 / r)


def decide_guard(
    design: SequentialDesign, d: Sequence[float], prior: NoisePrior | None = None, clusters: Sequence[int] | None = None
) -> Decision:
    """Decision for a non-objective workload: it must not regress significantly."""
    n = len(d)
    est = paired_estimate(d, prior, clusters=clusters)
    p = est.p_worse()
    floor = 1 - design.max_regression
    # an interim look may only stop for a regression at a Bonferroni share of the level,
    # so that looking often does not inflate false regressions
    level = design.regression_alpha if n >= design.max_pairs else design.regression_alpha / len(design.looks())
    _, _, known = session_variance(d, clusters, prior)
    # one engine pair never carries a regression call alone: with one session of several so far and no calibration
    # of the session effect, an instance that runs ~10% slower for its whole life (seen here at concurrency 1)
    # cannot be told from the code's effect — the call waits for the next session, whose spread enters the error
    # ... and every engine session measured so far (of two pairs or more) must show it: a second session that runs
    # at par says the first one's instances were slow, whatever the pooled test says (its two pairs read as outliers)
    agree = clusters is None or all(sum(g) / len(g) < math.log(floor) for g in by_cluster(d, clusters) if len(g) >= 2)
    if p < level and est.speedup < floor and known and agree:
        return Decision(
            REGRESSED,
            f"regressed by {1 - est.speedup:.2%} (p={p:.2g} < {level:.2g}) after {n} pairs",
            est,
            level,
        )
    if est.lower(1 - design.regression_alpha) > floor or n >= design.max_pairs:
        return Decision(
            OK, f"no significant regression ({est.speedup - 1:+.2%} after {n} pairs)", est, design.regression_alpha
        )
    return Decision(CONTINUE, "", est, design.regression_alpha)


def decide_regression(
    design: SequentialDesign, d: Sequence[float], prior: NoisePrior | None = None, clusters: Sequence[int] | None = None
) -> Decision:
    """Does a guard's regression hold on fresh engines and seeds? (``guard_check_design``: several fresh sessions,
    ``clusters`` puts their spread in the error.) REGRESSED when, after every fresh pair, they are significantly below
    the floor by themselves (one-sided, at the design's ``regression_alpha``); OK otherwise: the first call was its
    engine instances' luck, not the code's.

    Before the last look (at the end of a fresh session, from the second on) it stops only one way: OK, when the fresh
    pairs so far measure no slowdown at all (their mean at or above zero). That can only turn a REGRESSED into an OK
    (never reject more), and a real regression reads as a speedup over two fresh sessions rarely
    (``benchmarks/guard_alarms.py`` measures what it costs: a false alarm's re-measure stops after half its pairs)."""
    est = paired_estimate(d, prior, clusters=clusters)
    floor = 1 - design.max_regression
    if len(d) < design.max_pairs:
        if est.mean >= 0:
            return Decision(
                OK,
                f"did not hold on fresh engines: {est.speedup - 1:+.2%} over {len(d)} pairs, no slowdown at all "
                "(stopped early)",
                est,
                design.regression_alpha,
            )
        return Decision(CONTINUE, "", est, design.regression_alpha)
    p = est.p_worse()
    if p < design.regression_alpha and est.speedup < floor:
        return Decision(
            REGRESSED,
            f"the regression held on fresh engines: {1 - est.speedup:.2%} slower (p={p:.2g}) over {len(d)} pairs",
            est,
            design.regression_alpha,
        )
    return Decision(
        OK,
        f"did not hold on fresh engines: {est.speedup - 1:+.2%} (p={p:.2g}) over {len(d)} pairs",
        est,
        design.regression_alpha,
    )


def confirmation_design(pairs: int, strict: bool = False) -> SequentialDesign:
    """A fixed-size run (one look) for the confirmation on fresh seeds; with ``strict`` (the win was measured mostly
    under foreign load, so the fresh pairs must be significant by themselves) at least ``LOADED_CONFIRM_PAIRS`` of
    them: a t-test on two pairs has one degree of freedom and needs t > 3.1 for p < 0.1, which a real +67% win
    whose two pairs read +99% and +40% missed."""
    if strict:
        pairs = max(pairs, D.LOADED_CONFIRM_PAIRS)
    return SequentialDesign(alpha=0.5, min_pairs=pairs, max_pairs=pairs, look_every=pairs)


def guard_check_design(
    pairs: int = D.GUARD_CHECK_PAIRS,
    max_regression: float = D.MAX_REGRESSION,
    regression_alpha: float = D.REGRESSION_ALPHA,
    sessions: int = 1,
) -> SequentialDesign:
    """The re-measure of a guard's regression on fresh engines and seeds (``decide_regression``): ``pairs``
    (``[gate] guard_check_pairs``, at least ``LOADED_CONFIRM_PAIRS``), run over ``sessions`` (``[gate]
    guard_check_sessions``) fresh engine sessions, against the gate's own floor (``max_regression``) at its level
    (``regression_alpha``): the first run called the regression against those. With two sessions or more it looks at
    the end of every session from the second on (where ``decide_regression`` may stop early for OK)."""
    design = dataclasses.replace(
        confirmation_design(pairs, strict=True), max_regression=max_regression, regression_alpha=regression_alpha
    )
    per = math.ceil(design.max_pairs / max(1, sessions))
    if sessions >= 3 and 2 * per < design.max_pairs:
        design = dataclasses.replace(design, min_pairs=2 * per, look_every=per)
    return design


def decide_confirmation(
    design: SequentialDesign,
    d: Sequence[float],
    prior: NoisePrior | None = None,
    clusters: Sequence[int] | None = None,
    *,
    won: PairedEstimate | None = None,
    strict: bool = False,
) -> Decision:
    """Does the win hold on fresh seeds? The confirmation run must measure a speedup too; with ``won``
    (the objective's estimate when it won), one not significantly below it; with ``strict`` (the win was
    measured mostly under foreign load), one significant by itself."""
    est = paired_estimate(d, prior, clusters=clusters)
    n = len(d)
    if est.mean <= 0:
        return Decision(NOT_CONFIRMED, f"did not hold on fresh seeds: {est.speedup - 1:+.2%} over {n} pairs", est, 0.0)
    if won is not None and est.mean < D.REPLICATION_SHARE * won.mean:
        # significantly below the win *and* by a margin that matters: a true +30% win measured at +28% on
        # fresh seeds under a changing load has a gap tight standard errors call significant, and replicates
        p = replication_p(won, est)
        if p < D.REPLICATION_ALPHA:
            return Decision(
                NOT_CONFIRMED,
                f"did not replicate on fresh seeds: {won.speedup - 1:+.2%} when it won, "
                f"{est.speedup - 1:+.2%} over {n} fresh pairs "
                f"(a gap this large by chance: p={p:.2g} < {D.REPLICATION_ALPHA:g})",
                est,
                D.REPLICATION_ALPHA,
            )
    if (
        strict
    ):  # on the fresh pairs' own variance: a calibration (measured on a quiet machine) must not lend them its df
        p = paired_estimate(d, prior, clusters=clusters, pool=False).p_better()
        if p >= D.LOADED_CONFIRM_ALPHA:
            return Decision(
                NOT_CONFIRMED,
                f"measured mostly under foreign load, the win must hold significantly on fresh seeds: "
                f"{est.speedup - 1:+.2%} over {n} "
                f"pairs, p={p:.2g} not below {D.LOADED_CONFIRM_ALPHA:g}",
                est,
                D.LOADED_CONFIRM_ALPHA,
            )
        return Decision(
            OK,
            f"confirmed on fresh seeds under foreign load: {est.speedup - 1:+.2%} over {n} pairs (p={p:.2g})",
            est,
            D.LOADED_CONFIRM_ALPHA,
        )
    return Decision(OK, f"confirmed on fresh seeds: {est.speedup - 1:+.2%} over {n} pairs", est, 0.0)


def replication_p(won: PairedEstimate, fresh: PairedEstimate) -> float:
    """One-sided p of 'the fresh seeds measure as much as the win' against 'less': Welch's t on the two
    log-speedup estimates (independent seeds, independent trials). The win's estimate is biased upwards
    by the sequential stop, which makes this test reject a true effect somewhat more often than its
    level (``benchmarks/gate_quality.py`` measures the power it costs)."""
    gap = won.mean - fresh.mean
    var_w, var_f = won.se**2, fresh.se**2
    se = math.sqrt(var_w + var_f)
    if se == 0:
        return 0.0 if gap > 0 else 1.0
    terms = (var_w**2 / won.df if won.df > 0 else 0.0) + (var_f**2 / fresh.df if fresh.df > 0 else 0.0)
    df = (var_w + var_f) ** 2 / terms if terms > 0 else 1.0
    return student_t_sf(gap / se, max(1.0, df))

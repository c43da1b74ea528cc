"""Stack checks: what the merges of a range add up to, with the gate's own statistics.

Every merge is judged against the baseline of its moment. ``check`` measures the baseline's tip against
the range's start with ``evaluate`` (interleaved pairs on fresh sides and seeds, the sequential test,
the guards) and sets the cumulative gain beside the product of the merges' own estimates:

- **delivers**: the tip is significantly faster than the start, and not significantly below the product;
- **under-delivers**: more than ``[gate] min_effect`` below the product, significantly (one-sided, on the log
  scale, at ``[gate] alpha``; each estimate's standard error is read off its 95% interval; a merge's estimate is
  its confirmation's, not inflated by the objective's early stop);
- **inconclusive**: anything else — an evaluation that failed, a number missing, a gain not significant.

With ``leave_one_out`` each merge is reverted on the tip in a scratch commit (pinned under
``refs/agentsearch/stack/``, never on a branch) and the tip is measured against it: the merge's
marginal contribution today. The scratch commit is the candidate and the tip the baseline, so one
warm tip serves all K comparisons (``WarmBaseline``): K + 1 measurements in all. A merge whose
contribution is not significantly above nothing is a **passenger**.

``bisect`` names the merge where a workload's regression entered: each step measures a commit of the
merge sequence against the start and reads that workload's pairs from every round that measured it. The tip
is *different* when its interval lies below 1 - ``min_effect``; a step inside the range is *different* or
*same* when its interval lies below or above the midpoint of the start's level and the tip's, *unknown* otherwise
(measured again on fresh seeds with the pairs pooled; still unknown, the search stops, saying so).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from history.records import EpisodeStarted, Merge, RecordError, Revert, Role, Verdict, WorkloadSummary
from history.records import Evaluation as EvaluationRecord
from history.records.stack import (
    BisectStep,
    Interference,
    Removal,
    StackBisect,
    StackCheck,
    StackMerge,
    failing,
    regressed,
    unresolved,
)

from .errors import AgentsearchError
from .evaluation import Evaluation, evaluate
from .progress import Say
from .records import append, read_entries
from .warm_baseline import WarmBaseline
from .workspace import git
from .workspace.workspace import Workspace, atomic_write

if TYPE_CHECKING:
    from .config import Config

R = TypeVar("R", StackCheck, StackBisect)
ROUNDS = frozenset(r.value for r in Role)  # the rounds a trial's phase may name (a word a later release adds is
# left out of the pooled pairs rather than guessed)
SCRATCH_REFS = "refs/agentsearch/stack/"
Z95 = 1.959963984540054
UNKNOWN_RETRIES = 3  # an unknown bisect step is measured again on fresh seeds, its pairs pooled, up to this many times
MIN_STEP_PAIRS = (
    6  # a bisect step decides on no fewer pairs (a few pairs under load give intervals too narrow to trust)
)


@dataclass(frozen=True)
class Range:
    since: str
    tip: str
    merges: tuple[StackMerge, ...]


def merge_range(ws: Workspace, since: str | None) -> Range:
    """The merges on the baseline between ``since`` (default: the baseline when the latest episode started;
    an episode id or any commit) and the tip, oldest first, the reverted ones left out."""
    entries = read_entries(ws)
    tip = ws.baseline_commit()
    starts = [(e.episode, e.record.baseline) for e in entries if isinstance(e.record, EpisodeStarted)]
    if since is None:
        if not starts:
            raise AgentsearchError("no episode has run here: name the range's start with --since REF")
        start = starts[-1][1]
    else:
        start = next((b for ep, b in starts if ep == since), None) or ws.resolve(since)
    if not git.is_ancestor(ws.repo_dir, start, tip):
        raise AgentsearchError(
            f"{since or start[:12]} is not an ancestor of the baseline's tip {tip[:12]}: a stack is measured "
            "from a commit main grew from"
        )
    # an episode's verdicts, and the evaluations a merge was made on outside one (`review-pr --merge`)
    verdicts = {
        e.proposal: e.record for e in entries if isinstance(e.record, (Verdict, EvaluationRecord)) and e.proposal
    }
    reverted = {e.record.merge for e in entries if isinstance(e.record, Revert)}
    merges = []
    for e in entries:
        m = e.record
        if not isinstance(m, Merge) or not m.ok or m.new in reverted or m.new == start:
            continue
        if not (git.is_ancestor(ws.repo_dir, start, m.new) and git.is_ancestor(ws.repo_dir, m.new, tip)):
            continue
        v = verdicts.get(e.proposal)
        # the confirmation's estimate where it ran: fresh seeds and a fixed number of pairs, so not inflated by the
        # objective's early stop (a sequential test that stops on a win overestimates it: the winner's curse)
        conf = v.confirmation if v else None
        speedup: float | None
        ci: list[float] | None
        if conf is not None and conf.speedup and conf.ci:
            source, speedup, ci = "confirmation", conf.speedup, list(conf.ci)
        else:
            stat = v.objective_summary if v else None
            speedup = (v.speedup if isinstance(v, Verdict) else stat.speedup if stat else None) if v else None
            source, ci = "objective", (list(stat.ci) if stat and stat.ci else None)
        title = (v.title if isinstance(v, Verdict) else v.extra.get("title")) if v else None
        merges.append(
            StackMerge(
                merge=m.new,
                proposal=e.proposal,
                title=title,
                speedup=speedup,
                ci=tuple(ci) if ci else None,
                source=source,
            )
        )
    if not merges:
        raise AgentsearchError(
            f"no merge on the baseline between {start[:12]} and its tip {tip[:12]}: nothing to check"
        )
    return Range(start, tip, tuple(merges))


def _log_se(speedup: float | None, ci: Any) -> tuple[float, float] | None:
    """(log speedup, its standard error from a 95% interval); None when a number is missing or not positive."""
    if speedup is None or not ci or len(ci) != 2 or not all(isinstance(x, (int, float)) for x in (speedup, *ci)):
        return None
    lo, hi = ci
    if min(speedup, lo, hi) <= 0 or not all(math.isfinite(x) for x in (speedup, lo, hi)):
        return None
    return math.log(speedup), (math.log(hi) - math.log(lo)) / (2 * Z95)


def kept(x: float, se: float) -> float:
    """A normal estimate ``x`` (log scale, standard error ``se``) that was kept only because it was above zero,
    corrected for that selection: ``x - se * phi(x/se) / Phi(x/se)``, the truncated normal's bias evaluated at the
    estimate (a plug-in correction). A confirmation passes only when it measures a speedup, so a merge's estimate near
    zero is biased up; the correction is at most 0.8 ``se`` (at ``x`` = 0) and nil for a clear win (0.004 ``se`` at
    3 ``se`` above zero). Inverting the truncated mean instead over-corrects (by ~0.8 ``se`` when the true effect is
    zero, down to ``x`` - 4 ``se`` for one that barely passed) and lost half the power against small real
    shortfalls in simulation (benchmarks/stack_quality.py)."""
    from harness.statistics import normal_cdf

    if se <= 0 or not math.isfinite(x) or not math.isfinite(se):
        return x
    a = x / se
    return x - se * math.exp(-0.5 * a * a) / math.sqrt(2 * math.pi) / max(normal_cdf(a), 1e-300)


def claimed(m: StackMerge, selection: bool = True) -> tuple[float, float] | None:
    """What a merge was merged on: (log speedup, its standard error), a confirmation's corrected for its pass
    condition (``kept``); None when a number or its interval is missing."""
    part = _log_se(m.speedup, m.ci)
    if part is None or not selection or m.source != "confirmation":
        return part
    return kept(*part), part[1]


def product(merges: tuple[StackMerge, ...], selection: bool = True) -> tuple[float | None, tuple[float, float] | None]:
    """The product of the merges' estimates and its 95% interval (independent estimates, log scale). With
    ``selection``, each confirmation's estimate is corrected for its pass condition (``kept``): a stack of merges that
    won by chance would otherwise be called short of a product their luck made."""
    parts = [claimed(m, selection) for m in merges]
    if any(p is None for p in parts):
        return None, None
    est = sum(p[0] for p in parts if p)
    se = math.sqrt(sum(p[1] ** 2 for p in parts if p))
    return math.exp(est), (math.exp(est - Z95 * se), math.exp(est + Z95 * se))


def shortfall_p(got: float | None, got_ci: Any, then: float | None, then_ci: Any, margin: float) -> float | None:
    """One-sided p that ``got`` falls short of ``then`` by more than ``margin`` (a fraction), on the log scale with
    both intervals' errors; None when a number or an interval is missing."""
    c, p = _log_se(got, got_ci), _log_se(then, then_ci)
    return None if c is None or p is None else _shortfall(c, p, margin)


def _shortfall(got: tuple[float, float], then: tuple[float, float], margin: float) -> float:
    from harness.statistics import normal_cdf

    return normal_cdf((got[0] - then[0] - math.log(1.0 - margin)) / math.hypot(got[1], then[1]))


def stack_verdict(
    cumulative: float | None, ci: Any, prod: float | None, prod_ci: Any, alpha: float, margin: float = 0.0
) -> tuple[str, tuple[str, ...]]:
    """under-delivers: the tip falls short of the product by more than ``margin`` (a fraction: the gate's
    min_effect, the smallest difference worth acting on), one-sided at ``alpha`` on the log scale."""
    if _log_se(cumulative, ci) is None:
        return "inconclusive", ("the cumulative gain has no number (the evaluation did not measure it)",)
    pv = shortfall_p(cumulative, ci, prod, prod_ci, margin)
    if pv is None:
        return "inconclusive", (
            "a merge of the range has no recorded estimate with an interval: no product to compare",
        )
    if pv < alpha:
        return "under-delivers", (
            f"the tip is {cumulative:.3f}x the start, more than {margin:.0%} below the product of the "
            f"merges' estimates {prod:.3f}x (one-sided p = {pv:.2g} < {alpha:g})",
        )
    if ci[0] <= 1.0:
        return "inconclusive", (
            f"the tip is {cumulative:.3f}x the start [{ci[0]:.3f}, {ci[1]:.3f}]: not a significant gain",
        )
    return "delivers", ()


def guard_reasons(
    guards: tuple[WorkloadSummary, ...], limit: float, missing: tuple[str, ...], stopped: str
) -> tuple[str, ...]:
    """A line for each guard the tip regressed against the start (held on fresh engines), naming the command that
    finds the merge where it entered; for each whose re-measure did not finish; and for the guards (``missing``) the
    evaluation never measured (``stopped``: why it stopped before them)."""
    lines = [
        f"guard {g.name} regressed against the start beyond the {limit:.0%} limit, and held on fresh engines: "
        f"{g.reason} — `agentsearch stack bisect --metric {g.name}` names the merge where it entered"
        for g in regressed(guards)
    ]
    lines += [
        f"guard {g.name}: a regression on the first engines ({g.reason}) whose re-measure on fresh engines did not "
        "finish: not known either way"
        for g in unresolved(guards)
    ]
    lines += [f"guard {g.name} was not judged at the tip ({g.decision}): {g.reason}" for g in failing(guards)]
    if missing:
        lines.append(
            f"guard{'s' if len(missing) > 1 else ''} {', '.join(missing)} not measured: the evaluation stopped before "
            f"{'them' if len(missing) > 1 else 'it'} ({stopped or 'no reason recorded'})"
        )
    return tuple(lines)


def _summary(ev: Evaluation | None, workload: str) -> WorkloadSummary | None:
    return ev.workloads.get(workload) if ev is not None else None


@dataclass(frozen=True)
class Progress:
    """What a journal holds: the run so far — a ``StackCheck`` whose removals and interference are the parts
    measured, or a ``StackBisect`` whose steps are the steps measured — its options, and whether it is the finished
    record about to be written (``final``)."""

    record: StackCheck | StackBisect
    leave_one_out: bool  # a check's leave-one-out (False for a bisection)
    seed: int | None  # the seed asked for (None: each evaluation drew its own)
    final: bool = False

    def problem(self) -> str | None:
        """What does not fit together in it (a hand-edited or damaged file), or None."""
        c = self.record
        if isinstance(c, StackBisect):
            line = [c.since, *c.merges]
            if self.leave_one_out:
                return "leave-one-out in a bisection"
            if any(not (0 <= st.index < len(line)) or st.commit != line[st.index] for st in c.steps):
                return "its steps are not commits of its range"
            if c.steps and c.steps[0].index != len(c.merges):
                return "its first step is not the tip"
            if any(st.outcome != "unknown" and (st.speedup is None or st.ci is None) for st in c.steps):
                return "a decided step without its estimate"
            return None
        merges = [m.merge for m in c.merges]
        if not self.leave_one_out and (c.removals or c.interference):
            return "leave-one-out parts in a check without leave-one-out"
        if [r.merge for r in c.removals] != merges[: len(c.removals)]:
            return "its removals are not the range's merges, in order"
        if c.interference:
            pointed = [sorted((a.merge, b.merge)) for a, b in pointed_pairs(c.merges, list(c.removals))]
            if (
                len(c.removals) != len(merges)
                or [sorted(j.merges) for j in c.interference] != pointed[: len(c.interference)]
            ):
                return "its joint removals are not the pairs its removals point to"
        return None


class Journal:
    """A stack check's or a bisection's progress, in the workspace's state: ``stack-progress.json`` (a check),
    ``stack-bisect-progress.json`` (a bisection), ``stack-progress-<episode>.json`` (an episode's own check). Written
    whole after every measured part (atomically), so that ``--resume`` (or the episode's ``--resume``) continues a
    killed run from its last measured part; the finished record is written to it before the history, so a kill
    between the two records the run once; cleared once the record is in the history."""

    VERSION = 1
    KINDS: dict[str, type[StackCheck] | type[StackBisect]] = {
        StackCheck.KIND: StackCheck,
        StackBisect.KIND: StackBisect,
    }

    def __init__(
        self, state: Path, episode: str | None = None, kind: type[StackCheck] | type[StackBisect] = StackCheck
    ) -> None:
        self.episode, self.kind = episode, kind.KIND
        self.what = "stack check" if kind is StackCheck else "bisection"  # in messages
        self.command = "agentsearch stack" if kind is StackCheck else "agentsearch stack bisect"  # what runs it
        name = "stack-progress" if kind is StackCheck else "stack-bisect-progress"
        self.path = state / (f"{name}.json" if episode is None else f"{name}-{episode}.json")

    def load(self) -> Progress | None:
        """The saved progress; None: nothing is unfinished. A file that is not one: one line (AgentsearchError)."""
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError, RecursionError) as exc:
            raise AgentsearchError(f"{self.path}: unreadable ({exc})") from None
        try:
            if not isinstance(data, dict) or type(data.get("version")) is not int or data["version"] != self.VERSION:
                raise RecordError(f"version {data.get('version') if isinstance(data, dict) else data!r}")
            if data.get("kind") != self.kind:
                raise RecordError(f"kind {data.get('kind')!r}, not {self.kind!r}")
            seed, loo, final = data["seed"], data["leave_one_out"], data["final"]
            if not (seed is None or type(seed) is int) or type(loo) is not bool or type(final) is not bool:
                raise RecordError("seed, leave_one_out or final of the wrong type")
            progress = Progress(self.KINDS[self.kind].from_json(data["record"], self.path.name), loo, seed, final)
        except (RecordError, KeyError, TypeError, ValueError, RecursionError) as exc:
            raise AgentsearchError(f"{self.path}: not a {self.what}'s progress ({exc})") from None
        if (why := progress.problem()) is not None:
            raise AgentsearchError(f"{self.path}: not a {self.what}'s progress ({why})")
        return progress

    def save(self, p: Progress) -> None:
        data = {"version": self.VERSION, "kind": p.record.KIND, "leave_one_out": p.leave_one_out, "seed": p.seed}
        try:
            atomic_write(self.path, json.dumps({**data, "final": p.final, "record": p.record.to_json()}))
        except OSError as exc:
            raise AgentsearchError(f"{self.path}: cannot keep the progress ({exc})") from None

    def clear(self) -> None:
        try:
            self.path.unlink(missing_ok=True)
        except OSError as exc:
            raise AgentsearchError(f"{self.path}: cannot remove it ({exc}); remove it by hand") from None


def _measure_tip(ws: Workspace, rng: Range, seed: int | None, say: Say) -> StackCheck:
    """The tip against the range's start: the check without its leave-one-out parts."""
    t0 = time.perf_counter()
    config = ws.config(rng.since)  # the config evaluate judges by: the baseline side's
    objective = config.objective.name
    ev = evaluate(ws, rng.tip, seed=seed, progress=say, baseline=rng.since)
    s = _summary(ev, objective)
    prod, prod_ci = product(rng.merges)
    verdict, reasons = stack_verdict(
        s.speedup if s else None, s.ci if s else None, prod, prod_ci, config.gate.alpha, config.gate.min_effect
    )
    if s is None or s.speedup is None:
        reasons = (*reasons, *(f"evaluation: {r}" for r in ev.verdict.reasons[:3]))
    # the guards, the tip against the start: merges each within the guard's limit can add up to more than it
    guards = tuple(w for w in ev.workloads.values() if w.role in (Role.GUARD, Role.GUARD_CHECK))
    measured = {g.name for g in guards if g.role == Role.GUARD}
    unmeasured = tuple(w.name for w in config.workloads if w.name != objective and w.name not in measured)
    reasons = (
        *reasons,
        *guard_reasons(guards, config.gate.max_regression, unmeasured, next(iter(ev.verdict.reasons), "")),
    )
    return StackCheck(
        since=rng.since,
        tip=rng.tip,
        objective=objective,
        merges=rng.merges,
        verdict=verdict,
        reasons=reasons,
        seed=ev.seed,
        cumulative=s.speedup if s else None,
        ci=tuple(s.ci) if s and s.ci else None,
        product=prod,
        product_ci=prod_ci,
        pairs=s.pairs if s else 0,
        seconds=round(time.perf_counter() - t0, 3),
        guards=guards,
        unmeasured=unmeasured,
    )


@dataclass(frozen=True)
class _CheckRun:
    """A stack check under way: the tip's measurement (with the parts measured before a resume), its range, its
    options, where its progress is kept, and when its first run started (``t0``: the time of every run that measured
    it counts)."""

    partial: StackCheck
    rng: Range
    leave_one_out: bool
    seed: int | None
    journal: Journal | None
    t0: float

    def keep(self, removals: list[Removal], joint: list[Interference]) -> None:
        """The parts measured so far, to the journal (if any)."""
        if self.journal is not None:
            now = round(time.perf_counter() - self.t0, 3)
            self.journal.save(
                Progress(
                    dataclasses.replace(self.partial, removals=tuple(removals), interference=tuple(joint), seconds=now),
                    self.leave_one_out,
                    self.seed,
                )
            )


def check(
    ws: Workspace,
    since: str | None = None,
    *,
    seed: int | None = None,
    leave_one_out: bool = False,
    progress: Say | None = None,
    write: Callable[[StackCheck], None] | None = None,
    journal: Journal | None = None,
) -> StackCheck:
    """Measure the tip against the range's start (and, asked, each merge's marginal contribution); record it
    (``write``: how, where the caller holds the history open — an episode; default: append to it).

    ``journal``: keep the progress there after every measured part, and continue the check it holds (its range, its
    options), if any. A stand-alone journal that does not fit (the tip moved, a damaged file) is the run's error; an
    episode's is dropped and the tip measured afresh. Cleared once the check is recorded."""
    say = progress or (lambda stage, detail: None)
    saved = _resumable(ws, journal, say) if journal is not None else None
    to_history: Callable[[StackCheck], None] = write or (lambda r: append(ws, r, None, None))
    if saved is not None and journal is not None and isinstance(saved.record, StackCheck) and saved.final:
        return _recorded(ws, journal, saved.record, to_history)
    run = _begin(ws, since, seed, leave_one_out, journal, saved, say)
    partial, rng = run.partial, run.rng
    config = ws.config(rng.since)
    reasons = partial.reasons
    removals: list[Removal] = list(partial.removals)
    joint: list[Interference] = list(partial.interference)
    if run.leave_one_out:
        removals, joint = _leave_one_out(ws, run, config, say)
        removals = [
            _shrank(r, m, config.gate.alpha, config.gate.min_effect) for r, m in zip(removals, rng.merges, strict=True)
        ]
        reasons = (*reasons, *_lost_reasons(removals, rng.merges, partial.verdict))
    elif partial.verdict == "under-delivers":
        reasons = (
            *reasons,
            "`agentsearch stack --leave-one-out` measures what each merge adds today: the ones far below their "
            "estimates are where the gain was lost",
        )
    record = dataclasses.replace(
        partial,
        reasons=reasons,
        removals=tuple(removals),
        interference=tuple(joint),
        seconds=round(time.perf_counter() - run.t0, 3),
    )
    return _finish(journal, record, to_history, run.leave_one_out, run.seed)


def _begin(
    ws: Workspace,
    since: str | None,
    seed: int | None,
    leave_one_out: bool,
    journal: Journal | None,
    saved: Progress | None,
    say: Say,
) -> _CheckRun:
    """The check resumed from the journal's ``saved`` progress (its range and options, as measured), or begun: the
    tip measured against the range's start, and kept in the journal."""
    if saved is not None:
        assert isinstance(saved.record, StackCheck)  # the journal's kind
        partial, leave_one_out, seed = saved.record, saved.leave_one_out, saved.seed
        rng = Range(partial.since, partial.tip, partial.merges)  # as measured: the estimates the parts were judged by
        say(
            "stack",
            f"resuming the check of {rng.tip[:12]} against {rng.since[:12]}: the tip measured, "
            f"{len(partial.removals)} of {len(rng.merges) if leave_one_out else 0} removal(s) and "
            f"{len(partial.interference)} joint removal(s) done",
        )
    else:
        rng = merge_range(ws, since)
        say("stack", f"the tip {rng.tip[:12]} against {rng.since[:12]}: {len(rng.merges)} merge(s)")
        partial = _measure_tip(ws, rng, seed, say)
        if journal is not None:
            journal.save(Progress(partial, leave_one_out, seed))
    t0 = time.perf_counter() - partial.seconds  # the time of every run that measured this check
    return _CheckRun(partial, rng, leave_one_out, seed, journal, t0)


def _leave_one_out(ws: Workspace, run: _CheckRun, config: Config, say: Say) -> tuple[list[Removal], list[Interference]]:
    """Each merge reverted on the tip, then the pairs the single removals point to reverted together, against one
    warm tip; the parts measured before a resume kept, each new part kept in the journal as it is measured."""
    rng, objective, seed = run.rng, run.partial.objective, run.seed
    removals: list[Removal] = list(run.partial.removals)
    joint: list[Interference] = list(run.partial.interference)
    warm = WarmBaseline(ws, "stack", reuse=max(1, 2 * len(rng.merges)))
    try:
        for i, m in enumerate(rng.merges[len(removals) :], len(removals) + 1):
            say(
                "stack",
                f"leave-one-out {i}/{len(rng.merges)}: the tip without {m.merge[:12]} ({m.title or m.proposal})",
            )
            removals.append(
                _remove(ws, rng.tip, m, objective, seed, warm, say, config.gate.min_effect, config.stack.removal_pairs)
            )
            run.keep(removals, joint)
        for a, b in pointed_pairs(rng.merges, removals)[len(joint) :]:
            say("stack", f"interference: the tip without both {a.merge[:12]} and {b.merge[:12]}")
            joint.append(
                _remove_pair(
                    ws,
                    rng.tip,
                    a,
                    b,
                    objective,
                    seed,
                    warm,
                    config.gate.alpha,
                    say,
                    {r.merge: r for r in removals},
                    config.stack.removal_pairs,
                )
            )
            run.keep(removals, joint)
    finally:
        warm.retire()
    return removals, joint


def _lost_reasons(removals: list[Removal], merges: tuple[StackMerge, ...], verdict: str) -> tuple[str, ...]:
    """The reason naming the merges that add significantly less at the tip than they were merged on (none: ())."""
    if not any(r.shrank for r in removals):
        return ()
    return (
        "adds significantly less at the tip than it was merged on: "
        + ", ".join(
            f"{r.merge[:12]} (today {r.marginal:.3f}x, merged on {m.speedup:.3f}x)"
            for r, m in zip(removals, merges, strict=True)
            if r.shrank and r.marginal is not None and m.speedup is not None
        )
        + (
            " — where the stack's gain was lost"
            if verdict == "under-delivers"
            else " — a later merge took its gain over, or it no longer pays at the tip"
        ),
    )


def _resumable(ws: Workspace, journal: Journal, say: Say) -> Progress | None:
    """The journal's run if it still fits the baseline (its tip, its commits); an episode's that does not is
    dropped (None), a stand-alone one is the run's error (one line naming --fresh)."""
    try:
        saved = journal.load()
        if saved is None:
            return None
        r = saved.record
        now = merge_range(ws, r.since)
        if now.tip != r.tip:
            raise AgentsearchError(
                f"the unfinished {journal.what} measured {r.tip[:12]}; main is now at {now.tip[:12]}"
            )
        have = [m.merge for m in r.merges] if isinstance(r, StackCheck) else list(r.merges)
        want = [m.merge for m in now.merges] if isinstance(r, StackCheck) else first_parent_line(ws, now)
        if have != want:
            raise AgentsearchError(
                f"the unfinished {journal.what}'s commits are not those between {r.since[:12]} and the tip today"
            )
        return saved
    except AgentsearchError as exc:
        if journal.episode is None:
            raise AgentsearchError(f"{exc}: start afresh with `{journal.command} --fresh`") from None
        say("stack", f"the saved progress is dropped ({exc}): measuring afresh")
        journal.clear()
        return None


def _recorded(ws: Workspace, journal: Journal, record: R, write: Callable[[R], None]) -> R:
    """A finished run whose journal outlived it (killed between the journal's write and the history's): written
    unless the history already holds exactly it (a stand-alone run; an episode knows its own), the journal cleared."""
    want = record.to_json()
    if journal.episode is not None or not any(
        isinstance(e.record, type(record)) and e.record.to_json() == want for e in read_entries(ws)
    ):
        write(record)
    journal.clear()
    return record


def _finish(journal: Journal | None, done: R, write: Callable[[R], None], leave_one_out: bool, seed: int | None) -> R:
    """Record a finished run: to the journal first (a kill before the history's write records it once), then the
    history, then the journal cleared."""
    if journal is not None:
        journal.save(Progress(done, leave_one_out, seed, final=True))
    write(done)
    if journal is not None:
        journal.clear()
    return done


def scratch_without(ws: Workspace, tip: str, *merges: str) -> str:
    """A commit: ``tip`` with ``merges`` reverted (the newest first), pinned under refs/agentsearch/stack/ (no
    branch moves). Raises AgentsearchError when a revert does not apply cleanly."""
    path = ws.worktrees / f"stack-{'-'.join(m[:8] for m in merges)}"
    git.remove_worktree(ws.repo_dir, path)
    git.add_worktree(ws.repo_dir, path, tip)
    sha = tip
    try:
        for merge in merges:
            try:
                sha = git.revert_merge(
                    ws.repo_dir, path, merge, f"agentsearch stack: {sha[:12]} without {merge[:12]}\n"
                )
            except AgentsearchError as exc:
                raise AgentsearchError(
                    f"{merge[:12]} no longer reverts cleanly on {sha[:12]} ({str(exc).splitlines()[0][:200]})"
                ) from None
    finally:
        git.remove_worktree(ws.repo_dir, path)
    git.run_git("update-ref", f"{SCRATCH_REFS}{sha}", sha, cwd=ws.repo_dir)
    return sha


def pointed_pairs(merges: tuple[StackMerge, ...], removals: list[Removal]) -> list[tuple[StackMerge, StackMerge]]:
    """The pairs the single removals point to: a passenger with each other merge that was measured (its gain may
    live on in that merge, or the two cancel). Linear in the merges for a given number of passengers."""
    measured = {r.merge for r in removals if r.marginal is not None}
    passengers = [r.merge for r in removals if r.decision == "passenger"]
    order = {m.merge: i for i, m in enumerate(merges)}
    pairs: list[tuple[StackMerge, StackMerge]] = []
    seen: set[frozenset[str]] = set()
    for p in passengers:
        for m in merges:
            key = frozenset((p, m.merge))
            if m.merge != p and m.merge in measured and key not in seen:
                seen.add(key)
                a, b = sorted((p, m.merge), key=order.__getitem__)
                pairs.append((merges[order[a]], merges[order[b]]))
    return pairs


def _marginal(ev: Evaluation, objective: str) -> tuple[float, tuple[float, float], int] | None:
    """The tip's speedup over the scratch commit (the candidate side), its interval and pairs; None: not measured."""
    s = _summary(ev, objective)
    if s is None or s.speedup is None or s.ci is None or _log_se(s.speedup, s.ci) is None:
        return None
    return 1.0 / s.speedup, (1.0 / s.ci[1], 1.0 / s.ci[0]), s.pairs


def _remove(
    ws: Workspace,
    tip: str,
    m: StackMerge,
    objective: str,
    seed: int | None,
    warm: WarmBaseline,
    say: Say,
    margin: float = 0.02,
    min_pairs: int | None = None,
) -> Removal:
    try:
        scratch = scratch_without(ws, tip, m.merge)
    except AgentsearchError as exc:
        return Removal(merge=m.merge, decision="does-not-revert", reason=str(exc))
    # the scratch commit is the candidate, the tip the baseline: the tip's side stays warm for the next removal
    ev = evaluate(ws, scratch, seed=seed, progress=say, baseline=tip, warm=warm, min_pairs=min_pairs)
    got = _marginal(ev, objective)
    if got is None:
        why = "; ".join(ev.verdict.reasons[:2]) or "no number"
        return Removal(merge=m.merge, decision="unknown", reason=f"not measured: {why}", scratch=scratch)
    marginal, ci, pairs = got
    if ci[0] > 1.0:
        decision, reason = "contributes", f"the tip is {marginal:.3f}x the tip without it [{ci[0]:.3f}, {ci[1]:.3f}]"
    elif ci[1] < 1.0 - margin:  # worse by more than the smallest effect worth acting on (a passenger's 0.99x is noise)
        # not a passenger: either the merge costs speed at today's tip, or code in the stack runs differently on
        # one side of this measurement (red team: merged code that knew the side framed an honest merge) — for a person
        decision, reason = (
            "harmful",
            (
                f"the tip is {marginal:.3f}x the tip without it [{ci[0]:.3f}, {ci[1]:.3f}]: significantly "
                "slower with it — it costs speed today, or code in the stack behaves differently when "
                "measured; re-check (review --recheck) before reverting anything"
            ),
        )
    else:
        decision, reason = (
            "passenger",
            (
                f"the tip is {marginal:.3f}x the tip without it [{ci[0]:.3f}, {ci[1]:.3f}]: "
                "not significantly above nothing"
            ),
        )
    return Removal(
        merge=m.merge, decision=decision, reason=reason, scratch=scratch, marginal=marginal, ci=ci, pairs=pairs
    )


def _shrank(r: Removal, m: StackMerge, alpha: float, margin: float) -> Removal:
    """The removal, marked where the merge adds significantly less today than it was merged on (by more than
    ``margin``, one-sided at ``alpha``, log scale, both intervals' errors): where a stack's gain was lost."""
    got, then = _log_se(r.marginal, r.ci), claimed(m)
    if got is None or then is None:
        return dataclasses.replace(r, shrank=None)
    return dataclasses.replace(r, shrank=_shortfall(got, then, margin) < alpha)


def _remove_pair(
    ws: Workspace,
    tip: str,
    a: StackMerge,
    b: StackMerge,
    objective: str,
    seed: int | None,
    warm: WarmBaseline,
    alpha: float,
    say: Say,
    singles: dict[str, Removal] | None = None,
    min_pairs: int | None = None,
) -> Interference:
    from harness.statistics import normal_cdf

    pair = (a.merge, b.merge)
    try:
        scratch = scratch_without(ws, tip, b.merge, a.merge)  # the newer one first
    except AgentsearchError as exc:
        return Interference(merges=pair, interfere=False, reason=f"not tested: {exc}")
    ev = evaluate(ws, scratch, seed=seed, progress=say, baseline=tip, warm=warm, min_pairs=min_pairs)
    got = _marginal(ev, objective)
    one = singles or {}
    ra, rb = one.get(a.merge), one.get(b.merge)
    if got is None or ra is None or rb is None:
        why = "; ".join(ev.verdict.reasons[:2]) or "no number"
        return Interference(merges=pair, interfere=False, reason=f"not measured: {why}", scratch=scratch)
    joint, ci, pairs = got
    parts = [_log_se(joint, ci), _log_se(ra.marginal, ra.ci), _log_se(rb.marginal, rb.ci)]
    if any(x is None for x in parts):
        return Interference(
            merges=pair,
            interfere=False,
            reason="not measured: a single removal has no interval",
            scratch=scratch,
            joint=joint,
            ci=ci,
            pairs=pairs,
        )
    (lj, sj), (la, sa), (lb, sb) = parts  # type: ignore[misc]
    z = (lj - la - lb) / math.sqrt(sj**2 + sa**2 + sb**2)
    pv = 2 * normal_cdf(-abs(z))
    expected = math.exp(la + lb)
    interfere = pv < alpha
    how = (
        "together they carry more than apart: one holds the other's gain"
        if lj > la + lb
        else "together they carry less than apart: they partly cancel"
    )
    reason = (
        f"without both: the tip is {joint:.3f}x; the single removals multiply to {expected:.3f}x (p = {pv:.2g})"
        + (f" — {how}" if interfere else "")
    )
    return Interference(
        merges=pair,
        interfere=interfere,
        reason=reason,
        scratch=scratch,
        joint=joint,
        ci=ci,
        expected=expected,
        p_value=pv,
        pairs=pairs,
    )


def workload_pairs(ev: Evaluation, workload: str, higher_is_better: bool, offset: int) -> tuple[list[float], list[int]]:
    """The paired log-ratios (positive: the candidate better) of every round of ``ev`` that measured ``workload``
    (objective or guard pairs, the confirmation's, a guard's re-measurement), with each pair's engine session
    (``offset`` keeps the sessions of separate evaluations apart)."""
    from harness.statistics import log_ratios
    from harness.trials import BASELINE, CANDIDATE

    sides: dict[tuple[str, int, int], dict[str, float]] = {}
    for t in ev.trials:
        if t.workload == workload and t.ok and t.value is not None and t.phase in ROUNDS:  # a round it judged
            sides.setdefault((t.phase, t.session, t.pair), {})[t.side] = t.value
    keys = sorted(k for k, v in sides.items() if BASELINE in v and CANDIDATE in v)
    d = log_ratios([sides[k][BASELINE] for k in keys], [sides[k][CANDIDATE] for k in keys], higher_is_better)
    sessions = sorted({(k[0], k[1]) for k in keys})
    return d, [offset + sessions.index((k[0], k[1])) for k in keys]


def _step(
    ws: Workspace,
    commit: str,
    index: int,
    since: str,
    workload: str,
    seed: int | None,
    say: Say,
    margin: float,
    alpha: float,
    tip: float | None = None,
) -> BisectStep:
    """One step: ``commit`` against the start on ``workload``, from the pairs of every round that measured it; an
    unknown outcome is measured again on fresh seeds and the pairs pooled (up to UNKNOWN_RETRIES times).

    At the tip (``tip`` None): different when the workload's interval lies below 1 - ``margin`` (worse by more
    than the smallest effect worth acting on), same when it lies above. Inside the range (``tip``: the tip's
    estimate): different / same when the interval lies below / above the midpoint of the start's level and the
    tip's (log scale): nearer the tip / the start. Unknown: neither."""
    from harness.statistics import paired_estimate, student_t_ppf

    higher = next(w.higher_is_better for w in ws.config(since).workloads if w.name == workload)
    d: list[float] = []
    clusters: list[int] = []
    step_seed, reasons = seed, []
    for attempt in range(1 + UNKNOWN_RETRIES):
        ev = evaluate(ws, commit, seed=None if step_seed is None else step_seed + attempt, progress=say, baseline=since)
        step_seed = ev.seed if step_seed is None else step_seed
        more, cl = workload_pairs(ev, workload, higher, offset=1000 * attempt)
        d, clusters = d + more, clusters + cl
        if len(d) < 2:
            reasons.append("; ".join(ev.verdict.reasons[:2]) or f"{workload} was not measured")
            continue
        if len(d) < MIN_STEP_PAIRS:
            reasons.append(f"{workload}: {len(d)} pairs so far")
            say("bisect", f"{workload}: {len(d)} pairs so far, measuring again on fresh seeds")
            continue
        est = paired_estimate(d, clusters=clusters)
        half = student_t_ppf(1 - alpha / 2, est.df) * est.se
        lo, hi = math.exp(est.mean - half), math.exp(est.mean + half)
        text = f"{workload} {est.speedup:.3f}x the start [{lo:.3f}, {hi:.3f}] over {est.n} pairs"
        below, above = (1.0 - margin, 1.0 - margin) if tip is None else (math.sqrt(tip), math.sqrt(tip))
        if hi < below:
            why = (
                f"significantly worse, by more than {margin:.0%}"
                if tip is None
                else f"nearer the tip's {tip:.3f}x than the start's level"
            )
            return BisectStep(
                commit=commit,
                index=index,
                outcome="different",
                reason=f"{text}: {why}",
                seed=ev.seed,
                speedup=est.speedup,
                ci=(lo, hi),
                pairs=est.n,
            )
        if lo >= above:
            why = (
                f"no regression of {margin:.0%} or more"
                if tip is None
                else f"nearer the start's level than the tip's {tip:.3f}x"
            )
            return BisectStep(
                commit=commit,
                index=index,
                outcome="same",
                reason=f"{text}: {why}",
                seed=ev.seed,
                speedup=est.speedup,
                ci=(lo, hi),
                pairs=est.n,
            )
        reasons.append(text)
        say("bisect", f"{text}: unknown, measuring again on fresh seeds")
    return BisectStep(
        commit=commit,
        index=index,
        outcome="unknown",
        reason=f"unknown after {len(d)} pairs: {reasons[-1]}",
        seed=step_seed or 0,
        pairs=len(d),
    )


def bisect(
    ws: Workspace,
    workload: str | None = None,
    since: str | None = None,
    *,
    seed: int | None = None,
    progress: Say | None = None,
    journal: Journal | None = None,
) -> StackBisect:
    """Name the merge of the range where ``workload`` (default: the objective) got significantly worse than at
    the range's start; record the search with each step's evidence.

    ``journal``: keep the steps there as they are measured, and continue the bisection it holds (its range,
    workload and seed): the search replays the saved steps, then measures on."""
    say = progress or (lambda stage, detail: None)
    saved = _resumable(ws, journal, say) if journal is not None else None

    def to_history(r: StackBisect) -> None:
        append(ws, r, None, r.proposal)

    if saved is not None and journal is not None and isinstance(saved.record, StackBisect) and saved.final:
        return _recorded(ws, journal, saved.record, to_history)
    replay: tuple[BisectStep, ...] = ()
    if saved is not None:
        assert isinstance(saved.record, StackBisect)  # the journal's kind
        since, workload, seed, replay = saved.record.since, saved.record.workload, saved.seed, saved.record.steps
    t0 = time.perf_counter() - (saved.record.seconds if saved is not None else 0.0)
    rng = merge_range(ws, since)
    config = ws.config(rng.since)
    names = [w.name for w in config.workloads]
    workload = workload or config.objective.name
    if workload not in names:
        raise AgentsearchError(f"--metric {workload!r} is not a workload of this target ({', '.join(names)})")
    search = _Bisection(ws, rng, config, workload, seed, replay, journal, t0, say)
    if replay:
        say("bisect", f"resuming the bisection of {workload}: {len(replay)} step(s) measured")
    culprit, reason = _search(search)
    if len(search.steps) < len(replay):  # a search that took fewer steps than were kept: not this search's progress
        raise AgentsearchError(
            f"the saved bisection has {len(replay)} steps, the search took {len(search.steps)}: start afresh with "
            "`agentsearch stack bisect --fresh`"
        )
    return _finish(journal, search.record(culprit, reason), to_history, False, seed)


class _Bisection:
    """A bisection under way: its range's first-parent line, who made each commit, the steps measured (those a journal
    kept replayed first, as measured), and its record."""

    def __init__(
        self,
        ws: Workspace,
        rng: Range,
        config: Config,
        workload: str,
        seed: int | None,
        replay: tuple[BisectStep, ...],
        journal: Journal | None,
        t0: float,
        say: Say,
    ):
        self.ws, self.rng, self.config, self.workload, self.seed = ws, rng, config, workload, seed
        self.replay, self.journal, self.t0, self.say = replay, journal, t0, say
        self.line = first_parent_line(ws, rng)
        self.commits = [rng.since] + self.line  # commits[i]: the baseline after its i-th commit in the range
        self.made_by = {
            e.record.new: e.proposal for e in read_entries(ws) if isinstance(e.record, Merge) and e.record.ok
        }
        self.undone = {e.record.new: e.record.merge for e in read_entries(ws) if isinstance(e.record, Revert)}
        self.steps: list[BisectStep] = []
        self.attempts = 0
        # each step's error split over the steps a search can take (the tip, then ceil(log2 K) halvings): Bonferroni
        self.step_alpha = config.gate.alpha / (1 + math.ceil(math.log2(max(2, len(rng.merges)))))

    def record(self, culprit: str | None, reason: str) -> StackBisect:
        return StackBisect(
            since=self.rng.since,
            tip=self.rng.tip,
            workload=self.workload,
            merges=tuple(self.line),
            steps=tuple(self.steps),
            culprit=culprit,
            proposal=self.made_by.get(culprit or ""),
            reason=reason,
            seconds=round(time.perf_counter() - self.t0, 3),
        )

    def measure(self, i: int) -> BisectStep:
        """The step after commit ``i``: the saved one while the search retraces a resumed one, else measured (and
        kept in the journal)."""
        self.attempts += 1
        steps, replay = self.steps, self.replay
        if len(steps) < len(replay):  # the search is the same up to where it was killed: its steps as measured
            if replay[len(steps)].index != i:
                raise AgentsearchError(
                    f"the saved bisection's step {len(steps) + 1} measured commit {replay[len(steps)].index}, the "
                    f"search asks for commit {i}: start afresh with `agentsearch stack bisect --fresh`"
                )
            steps.append(replay[len(steps)])
            return steps[-1]
        self.say(
            "bisect", f"step {len(steps) + 1}: after commit {i} of {len(self.commits) - 1} ({self.commits[i][:12]})"
        )
        st = _step(
            self.ws,
            self.commits[i],
            i,
            self.rng.since,
            self.workload,
            None if self.seed is None else self.seed + 10 * self.attempts,
            self.say,
            self.config.gate.min_effect,
            self.step_alpha,
            steps[0].speedup if steps else None,
        )
        steps.append(st)
        if self.journal is not None:
            self.journal.save(Progress(self.record(None, "unfinished"), False, self.seed))
        return st

    def blame(self, hi: int) -> str:
        """Why commit ``hi`` is the culprit, naming what made it."""
        culprit = self.commits[hi]
        what = (
            f"the merge of {self.made_by[culprit]}"
            if culprit in self.made_by
            else f"the revert of {self.undone[culprit][:12]}"
            if culprit in self.undone
            else "a commit agentsearch did not make"
        )
        return (
            f"{self.workload} regressed at commit {hi} of {len(self.commits) - 1} on the baseline ({culprit[:12]}: "
            f"{what})"
        )


def _search(b: _Bisection) -> tuple[str | None, str]:
    """(the culprit or None, why): the tip first; a regression there is bisected, halving the commits between the
    start (or the last revert in the range) and the tip, until one commit is left or a step stays unknown."""
    commits, workload = b.commits, b.workload
    lo, hi = 0, len(commits) - 1
    last = b.measure(hi)
    if last.outcome == "same":
        return None, f"{workload} is not significantly worse at the tip than at the start: nothing to bisect"
    if last.outcome == "unknown":
        return None, f"the tip could not be told apart from the start on {workload} ({last.reason})"
    # a revert in the range may have undone an earlier regression: start from the last one (the line is not
    # monotone across it), so the search finds where the regression the tip shows entered
    reverts = [i for i, c in enumerate(commits) if c in b.undone and 0 < i < hi]
    if reverts:
        st = b.measure(reverts[-1])
        if st.outcome == "same":
            lo = reverts[-1]
        elif st.outcome == "different":
            hi = reverts[-1]
        else:
            return None, f"the step after the revert {commits[reverts[-1]][:12]} stayed unknown ({st.reason})"
    while hi - lo > 1:
        mid = (lo + hi) // 2
        st = b.measure(mid)
        if st.outcome == "different":
            hi = mid
        elif st.outcome == "same":
            lo = mid
        else:
            return None, (
                f"the step after commit {mid} stayed unknown ({st.reason}); the regression entered between commit "
                f"{lo + 1} ({commits[lo + 1][:12]}) and commit {hi} ({commits[hi][:12]})"
            )
    return commits[hi], b.blame(hi)


def first_parent_line(ws: Workspace, rng: Range) -> list[str]:
    """Every commit of the baseline's first-parent line in the range, oldest first, reverts included (a merge
    reverted later in the range left its code in the commits between: bisecting the merges alone blamed an innocent
    one — red team)."""
    return git.run_git("rev-list", "--first-parent", "--reverse", f"{rng.since}..{rng.tip}", cwd=ws.repo_dir).split()

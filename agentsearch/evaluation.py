"""Evaluate one candidate commit against the baseline: everything the gate needs, in order.

based-on-baseline -> protected paths (before anything runs) -> sandbox and build of both sides ->
then ``PIPELINE``, one short step per check, each from the shared context (``_Ctx``) to its recorded
check: functional tests -> micro stage (kernel proposals) -> objective workload (interleaved pairs,
sequential test) -> coverage -> guard workloads (no significant regression) -> confirmation ->
plausibility bound -> distribution checks; then the gate. Every failure becomes a failed check with
its reason; nothing raises past this module except bugs and run errors (``preflight``): a failed
static preflight, or a baseline side that failed and fails alone too.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics as pystats
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness import coverage, environment
from harness.engine_pool import EnginePool
from harness.gate_defaults import CPU_SHARE_OF_WIN, LOADED_SHARE
from harness.interleave import WorkloadRun, run_interleaved
from harness.logprobs import LogprobError
from harness.processes import Parkable
from harness.quiet import FOREIGN_LOAD
from harness.seeds import confirmation_seeds, coverage_seed, guard_check_seeds, new_master, pair_seeds
from harness.sequential import (
    OK,
    REGRESSED,
    WIN,
    SequentialDesign,
    confirmation_design,
    decide_confirmation,
    decide_guard,
    decide_objective,
    decide_regression,
    guard_check_design,
)
from harness.trials import BASELINE, CANDIDATE, MEASUREMENT_ERROR, TrialRecord, child_env, run_child, tail
from history.records import (
    CheckName,
    CoverageReport,
    FailureKind,
    Judgement,
    Role,
    Timing,
    WorkloadSummary,
    decision_failure,
)
from history.records import Evaluation as EvaluationRecord

from . import calibration, containment, micro, preflight
from . import sides as sides_mod
from .config import Config, WorkloadConfig
from .errors import AgentsearchError, RunError
from .gate import Check, Status, judge
from .gate_design import design_for, workload_design
from .headline import unit as metric_unit
from .progress import Say
from .sides import Sides, is_resolver
from .verify import ReferenceFailed, run_verify
from .warm_baseline import WarmBaseline, is_baseline_engine
from .workloads import (
    blames_candidate,
    confirmation_restarts,
    guard_check_sessions,
    measure_options,
    placement_for,
    session_factory,
)
from .workspace import Workspace

EVALUATION_SCHEMA = 1
OnTrial = Callable[[TrialRecord], None]


@dataclass(frozen=True)
class Evaluation:
    ref: str
    baseline: str
    candidate: str
    seed: int
    verdict: Judgement
    workloads: dict[str, WorkloadSummary]
    confirmation: WorkloadSummary | None
    trials: tuple[TrialRecord, ...]
    config_fingerprint: str
    environment: dict[str, str]
    wall_s: float
    engine_wait_s: float = 0.0  # wall time spent waiting for engines to start and stop
    distribution: Any = None  # VerifyResult when [verify] ran
    coverage: CoverageReport | None = None  # when the coverage pass ran
    alpha: float | None = None  # the false-merge level this evaluation spent
    micro: Any = None  # micro.MicroResult: the op-level stage of a kernel proposal
    baseline_side: str = (
        "fresh"  # "warm": the baseline's worktree (and engines) came from the episode's previous evaluation
    )
    baseline_engines_reused: int = 0  # baseline engines kept warm from the previous evaluation (0: all started fresh)
    engine_starts: int | None = None  # engines this evaluation started (every phase; a kept baseline's are not counted)
    schema_version: int = EVALUATION_SCHEMA

    def timing(self) -> Timing:
        """Wall time split: engine start-up/shutdown, measurement, distribution checks, orchestration overhead."""
        measurement = sum(t.wall_s for t in self.trials)
        verify = self.distribution.wall_s if self.distribution else 0.0
        overhead = max(0.0, self.wall_s - measurement - self.engine_wait_s - verify)
        return Timing(
            wall_s=round(self.wall_s, 3),
            engine_s=round(self.engine_wait_s, 3),
            verify_s=round(verify, 3),
            measurement_s=round(measurement, 3),
            overhead_s=round(overhead, 3),
            overhead_pct=round(100 * overhead / self.wall_s, 2) if self.wall_s else 0.0,
            engine_starts=self.engine_starts,
        )

    def record(self, objective: str, **extra: Any) -> EvaluationRecord:
        """The ``evaluation`` record of this evaluation (``objective``: the judged config's objective workload)."""
        return EvaluationRecord.of({**self.to_json(), "objective": objective, **extra})

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            **self.verdict.to_json(),
            "ref": self.ref,
            "baseline": self.baseline,
            "candidate": self.candidate,
            "seed": self.seed,
            "alpha": self.alpha,
            "workloads": {k: v.to_json() for k, v in self.workloads.items()},
            "confirmation": self.confirmation.to_json() if self.confirmation else None,
            "distribution": self.distribution.to_json() if self.distribution else None,
            "coverage": self.coverage.to_json() if self.coverage else None,
            "micro": self.micro.to_json() if self.micro else None,
            "config_fingerprint": self.config_fingerprint,
            "environment": self.environment,
            "wall_s": round(self.wall_s, 3),
            "timing": self.timing().to_json(),
            "baseline_side": self.baseline_side,
            "baseline_engines_reused": self.baseline_engines_reused,
            "trials": [dataclasses.asdict(t) for t in self.trials],
        }


def summarize(
    run: WorkloadRun, role: Role, w: WorkloadConfig, design: SequentialDesign, calibrated: bool
) -> WorkloadSummary:
    dec = run.decision
    est = dec.estimate if dec else None
    base, cand = run.values(BASELINE), run.values(CANDIDATE)
    decision = "failed" if run.failure else (dec.action if dec else "not-run")
    reason = run.failure or (dec.reason if dec else "")
    if est is not None:
        p = est.p_better() if role == Role.OBJECTIVE else est.p_worse()
    return WorkloadSummary(
        name=w.name,
        role=role,
        pairs=run.pairs,
        max_pairs=design.max_pairs,
        decision=decision,
        reason=reason,
        speedup=est.speedup if est else None,
        ci=est.ci() if est else None,
        p_value=p if est else None,
        baseline_median=pystats.median(base) if base else None,
        candidate_median=pystats.median(cand) if cand else None,
        winsorized=est.winsorized if est else 0,
        calibrated=calibrated,
        metric=w.metric,
        unit=metric_unit(w.metric, w.unit),
        foreign_load=sum(1 for t in run.trials if t.metrics.get("foreign_load")),
        trial_s=round(pystats.median(t.wall_s for t in run.trials if t.ok), 3) if base else None,
        higher_is_better=w.higher_is_better,
    )


@dataclass
class _State:
    checks: list[Check] = field(default_factory=list)
    summaries: dict[str, WorkloadSummary] = field(default_factory=dict)
    confirmation: WorkloadSummary | None = None
    engine_wait_s: float = 0.0
    distribution: Any = None
    trials: list[TrialRecord] = field(default_factory=list)
    coverage: CoverageReport | None = None  # when the coverage pass ran
    micro: Any = None  # micro.MicroResult when the micro stage ran (kernel proposals)
    on_trial: OnTrial | None = None
    # (workload or None for the build, reason): the baseline side failed; confirmed alone afterwards
    baseline_failure: tuple[str | None, str] | None = None
    baseline_side: str = "fresh"  # "warm": kept from the previous evaluation
    baseline_engines_reused: int = 0  # warm baseline engines this evaluation got from the previous one

    def record(self, t: TrialRecord) -> None:
        self.trials.append(t)
        if self.on_trial is not None:
            self.on_trial(t)

    def add(self, name: CheckName, status: Status, detail: str = "", failure: FailureKind | None = None) -> None:
        self.checks.append(Check(name, status, detail, failure))


def evaluate(
    ws: Workspace,
    ref: str,
    *,
    seed: int | None = None,
    alpha: float | None = None,
    progress: Say | None = None,
    keep_worktrees: bool = False,
    on_trial: OnTrial | None = None,
    baseline: str | None = None,
    warm: WarmBaseline | None = None,
    min_pairs: int | None = None,
) -> Evaluation:
    """Measure ``ref`` against the current baseline (or the commit ``baseline``) and judge it. Never merges.

    ``warm``: the episode's kept baseline side (``agentsearch.warm_baseline``): reused when it is still
    this baseline under the same config and environment, and kept again after a clean evaluation.
    ``min_pairs``: the objective's sequential test looks first after this many pairs (at most its ``max_pairs``),
    for an estimate whose interval is used afterwards (a stack check's leave-one-out), not only its decision."""
    say = progress or (lambda stage, detail: None)
    base = ws.resolve(baseline) if baseline else ws.baseline_commit()
    config = ws.config(base)
    cand = ws.resolve(ref)
    preflight.require(ws, config, base, say)  # seconds (the environment probe is cached): a set-up error is the run's
    t0, starts = time.perf_counter(), Parkable.starts
    # 63 bits: the pair seeds a worker sees must not give away the master (and with it the confirmation seeds)
    master = seed if seed is not None else new_master()
    env = environment.record()  # the fingerprinted facts and this run's conditions (clocks, load)
    earlier: tuple[str | None, str] | None = None  # the first attempt's baseline failure, when it was measured again
    for attempt in range(2):
        st = _State(on_trial=on_trial)
        _run_checks(
            ws,
            config,
            base,
            cand,
            master,
            alpha,
            st,
            say,
            keep_worktrees,
            # a second attempt starts every engine fresh: the first one's may be what failed
            warm if warm is not None and warm.enabled and attempt == 0 else None,
            min_pairs,
        )
        if st.baseline_failure is None:
            break
        # the baseline's or the candidate's doing? the baseline alone says first (raises BaselineBroken)
        workload, failure = st.baseline_failure
        preflight.confirm_baseline(ws, config, base, workload, failure, say)
        if attempt == 0:
            # a baseline that passes alone failed beside the candidate once: a machine under load can do that to an
            # honest pair (a trial that timed out, a killed engine), so it is never the candidate's rejection on one
            # sighting: everything is measured again on fresh engines
            earlier = st.baseline_failure
            say(
                "baseline alone",
                "the baseline passes alone: measuring the candidate again on fresh engines "
                f"(the baseline failed beside it: {tail(failure, 1)})",
            )
            continue
        # twice, on fresh engines, beside this candidate, and never alone: the candidate disturbs the other side
        i = max(i for i, c in enumerate(st.checks) if c.status == Status.FAIL)
        st.checks[i] = dataclasses.replace(
            st.checks[i],
            detail=st.checks[i].detail
            + " (the baseline failed beside this candidate twice, the second time on fresh engines, and passes alone:"
            " the failure came with this candidate)",
        )
    if earlier is not None:
        first_where = earlier[0] or "build"
        st.add(
            CheckName.BASELINE_ALONE,
            Status.PASS,
            f"the baseline's {first_where} failed beside the candidate ({tail(earlier[1], 1)}) and passed alone: "
            "everything was measured again on fresh engines",
        )
    verdict = judge(st.checks)
    return Evaluation(
        ref=ref,
        baseline=base,
        candidate=cand,
        seed=master,
        verdict=verdict,
        workloads=st.summaries,
        confirmation=st.confirmation,
        trials=tuple(st.trials),
        config_fingerprint=config.fingerprint(),
        environment=env,
        wall_s=time.perf_counter() - t0,
        engine_wait_s=st.engine_wait_s,
        distribution=st.distribution,
        coverage=st.coverage,
        alpha=alpha if alpha is not None else config.gate.proposal_alpha,
        micro=st.micro,
        baseline_side=st.baseline_side,
        baseline_engines_reused=st.baseline_engines_reused,
        engine_starts=Parkable.starts - starts,
    )


def _run_checks(
    ws: Workspace,
    config: Config,
    base: str,
    cand: str,
    master: int,
    alpha: float | None,
    st: _State,
    say: Say,
    keep: bool,
    warm: WarmBaseline | None = None,
    min_pairs: int | None = None,
) -> None:
    """The checks before the sides exist (based-on-baseline), while they are made (protected paths,
    sandbox, build), then ``PIPELINE`` in order until a step stops it. With ``warm``, the baseline side
    (worktree, sandbox, engines) comes from the previous evaluation when it still fits, and is kept
    for the next after a clean one."""
    from .workspace import git

    if not git.is_ancestor(ws.repo_dir, base, cand):
        st.add(
            CheckName.BASED_ON_BASELINE,
            Status.FAIL,
            f"{cand[:12]} is not based on the current baseline {base[:12]}; rebase it onto {config.target.baseline}",
        )
        return
    st.add(CheckName.BASED_ON_BASELINE, Status.PASS, f"contains {base[:12]}")
    box = containment.decide(config)
    key = f"{config.fingerprint()}/{environment.fingerprint()}/{box.status}"
    kept = warm.lend(base, key) if warm is not None and not keep else None
    tag = warm.tag if warm is not None and not keep else f"eval-{cand[:10]}-{master % 100000:05d}"
    pool = EnginePool()
    try:
        with sides_mod.sides(ws, config, {BASELINE: base, CANDIDATE: cand}, tag, box, keep=keep, kept=kept) as sd:
            if kept is not None:
                pool.adopt(kept.engines)
                engines = [k for k in kept.engines if not is_resolver(k)]  # a kept resolving worker is no engine
                st.baseline_side, st.baseline_engines_reused, kept.engines = "warm", len(engines), {}
                say(
                    "build", f"baseline side warm from the previous evaluation ({st.baseline_engines_reused} engine(s))"
                )
            try:
                _build_and_run(
                    _Ctx(
                        ws,
                        config,
                        base,
                        cand,
                        master,
                        alpha,
                        st,
                        say,
                        sd,
                        pool,
                        git.changed_lines(ws.repo_dir, base, cand),
                        _at_least(design_for(config.gate, alpha), min_pairs),
                        calibration.load(ws),
                        warm=warm is not None and not keep,
                    ),
                    box,
                )
            except BaseException:
                pool.close()
                raise
            if warm is not None and not keep and _may_keep(sd, st):
                warm.take_back(sd.baseline_side(key), pool)
                sd.keep_baseline = True
            else:
                pool.close()
    except sides_mod.ProtectedPathError as exc:
        st.add(CheckName.PROTECTED_PATHS, Status.FAIL, str(exc))
        if kept is not None and warm is not None:  # refused before anything ran: the kept side is as it was
            warm.kept = kept
    finally:
        pool.close()
        st.engine_wait_s += pool.wait_s


def _build_and_run(ctx: _Ctx, box: Any) -> None:
    """Build both sides in their sandboxes, then run the pipeline's steps until one stops it."""
    st, sd = ctx.st, ctx.sd
    st.add(CheckName.PROTECTED_PATHS, Status.PASS, "no protected path touched")
    if box.status == "fail":
        st.add(CheckName.SANDBOX, Status.FAIL, box.detail)
        return
    ctx.say("build", "preparing worktrees")
    try:
        sd.build()
    except sides_mod.BuildError as exc:
        st.add(CheckName.BUILD, Status.FAIL, str(exc))
        if exc.side == BASELINE:
            st.baseline_failure = (None, str(exc))
        return
    st.add(CheckName.BUILD, Status.PASS, "both sides installed" + (", each in its own sandbox" if box.use else ""))
    st.add(CheckName.SANDBOX, Status(box.status), box.detail)
    for _name, step in PIPELINE:
        if not step(ctx):
            return


def _at_least(design: SequentialDesign, min_pairs: int | None) -> SequentialDesign:
    """``design`` with its first look after ``min_pairs`` pairs (never past its ``max_pairs``)."""
    if min_pairs is None or min_pairs <= design.min_pairs:
        return design
    return dataclasses.replace(design, min_pairs=min(min_pairs, design.max_pairs))


def _may_keep(sd: Sides, st: _State) -> bool:
    """Whether the baseline side may serve the next evaluation: built, nothing failed on it, and its
    worktree exactly as built."""
    if st.baseline_failure is not None or BASELINE not in sd.snapshots:
        return False
    return not sides_mod.describe_change(sd.snapshots[BASELINE], sides_mod.snapshot(sd.worktrees[BASELINE]))


@dataclass
class _Ctx:
    """What every step of the pipeline sees: the evaluation's inputs, its state, the two sides and the
    warm engines (one pool for the objective, guard and confirmation rounds)."""

    ws: Workspace
    config: Config
    base: str
    cand: str
    master: int
    alpha: float | None
    st: _State
    say: Say
    sd: Sides
    pool: EnginePool
    changed: dict[str, set[int]]  # the candidate's changed lines per file (the coverage pass)
    design: SequentialDesign
    cal: Any  # calibration.load(ws): the target's noise calibration, if any
    objective_run: WorkloadRun | None = None  # the objective's run, once it won
    warm: bool = False  # the baseline's engines may be kept for the next evaluation


CONFIRMATION_SESSION = 1000  # the confirmation's engines: restart indices from here, used by no other round
GUARD_CHECK_SESSION = 2000  # a guard regression's re-measurement: fresh engines again, used by no other round
GUARD_CHECK = Role.GUARD_CHECK  # the role of that re-measurement
UNCONFIRMED = (
    "unconfirmed"  # a guard's regression that did not hold on fresh engines (recorded as such, never a lesson)
)
_CHECK_OF = {
    Role.OBJECTIVE: CheckName.OBJECTIVE,
    Role.GUARD: CheckName.GUARD_WORKLOADS,
    Role.CONFIRMATION: CheckName.CONFIRMATION,
    GUARD_CHECK: CheckName.GUARD_WORKLOADS,
}
_DECIDE_OF = {
    Role.OBJECTIVE: decide_objective,
    Role.GUARD: decide_guard,
    Role.CONFIRMATION: decide_confirmation,
    GUARD_CHECK: decide_regression,
}


def _run_workload(
    ctx: _Ctx, w: WorkloadConfig, role: Role, decide: Callable[..., Any] | None = None, strict: bool = False
) -> WorkloadRun | None:
    """Measure ``w`` in ``role`` (interleaved pairs, the sequential test); its trials recorded, its
    summary kept. None when it could not run (the failed check is recorded). ``strict``: a confirmation
    that must be significant by itself (the win was measured under foreign load), on enough pairs for that."""
    config, st, say = ctx.config, ctx.st, ctx.say
    try:
        floor = calibration.outputs_floor_for(ctx.cal, config, w)  # the rounding this engine showed when calibrated
        factory = session_factory(config, w, ctx.sd, ctx.pool, outputs_floor=floor)
        options = measure_options(config, w)  # placement, warm-up, the quiet probe
    except AgentsearchError as exc:  # the set-up (e.g. the model, the placement): not the candidate's doing
        st.add(_CHECK_OF[role], Status.FAIL, str(exc), FailureKind.SETUP_ERROR)
        st.baseline_failure = (w.name, str(exc))
        return None
    if role == GUARD_CHECK:
        # a guard's regression, measured again on fresh engines and seeds before it may reject (regressions are
        # confirmed like wins): enough pairs to be significant by themselves, over several fresh sessions (one more
        # pair of engine instances can be as far apart as the regression)
        gate = config.gate
        sessions = guard_check_sessions(config)
        wdesign = guard_check_design(gate.guard_check_pairs, gate.max_regression, gate.regression_alpha, sessions)
        factory = factory.at(GUARD_CHECK_SESSION)  # its settle() kept: waiting outputs are judged after the last pair
        options = {**options, "restarts": sessions}
    elif role == Role.CONFIRMATION:
        wdesign = confirmation_design(config.gate.confirm_pairs, strict)
        # on fresh engines (restart indices no other round uses; the candidate's objective engines are retired
        # first, these after it): a win that was one engine instance's luck (an A/A measured about +3% on one
        # pair of engines here) must hold on another, not only on fresh seeds of the same instances. One
        # session; two under split placement, so that the sides swap devices as in every other round
        factory = factory.at(CONFIRMATION_SESSION)
        options = {**options, "restarts": confirmation_restarts(config)}
    else:
        wdesign = workload_design(ctx.design, w)
    seeds = (
        confirmation_seeds if role == Role.CONFIRMATION else guard_check_seeds if role == GUARD_CHECK else pair_seeds
    )(ctx.master, w.name)

    emitted = 0

    def emit(r: WorkloadRun) -> None:
        nonlocal emitted
        for t in r.trials[emitted:]:
            st.record(dataclasses.replace(t, phase=role))
        emitted = len(r.trials)

    def on_pair(r: WorkloadRun) -> None:
        emit(r)
        est = math.exp(sum(r.log_ratios) / len(r.log_ratios)) - 1
        say(f"{w.name} ({role})", f"pair {r.pairs}/{wdesign.max_pairs}, running estimate {est:+.2%}")

    prior = calibration.prior_for(ctx.cal, config, w)
    try:
        r = run_interleaved(
            w.name,
            factory,
            wdesign,
            decide or _DECIDE_OF[role],
            seeds,
            w.higher_is_better,
            prior=prior,
            on_pair=on_pair,
            **options,
        )
    except (OSError, ValueError, RuntimeError) as exc:  # fail closed: an error is a rejection
        st.add(
            _CHECK_OF[role],
            Status.FAIL,
            f"{w.name}: measurement error: {type(exc).__name__}: {exc}",
            FailureKind.MEASUREMENT_ERROR,
        )
        return None
    emit(r)
    if r.remeasured:
        say(
            f"{w.name} ({role})",
            f"{r.remeasured} of the baseline's trials measured again: the load generator fell behind its schedule",
        )
    summary = summarize(r, role, w, wdesign, prior is not None)
    if role == Role.CONFIRMATION:
        st.confirmation = summary
    elif role == GUARD_CHECK:
        st.summaries[f"{w.name} (fresh engines)"] = summary
    else:
        st.summaries[w.name] = summary
    return r


def _judged(ctx: _Ctx, r: WorkloadRun | None, check: CheckName, name: str, wanted: str) -> bool:
    """Record a failed check (no run, a failed trial, the wrong decision); True if it may go on."""
    st = ctx.st
    if r is None:
        return False
    if r.failure:
        last = r.trials[-1] if r.trials else None
        if r.failure_kind == MEASUREMENT_ERROR and last is not None and last.side == BASELINE:
            # the instrument failed while the candidate's engine was parked: nothing the candidate did
            again = f"; {r.remeasured} measured again before it" if r.remeasured else ""
            raise RunError(f"{name}: {r.failure} (on the baseline's trial{again}: the run's error, nothing was judged)")
        st.add(check, Status.FAIL, r.failure, FailureKind(r.failure_kind or FailureKind.CRASH))
        if last is not None and not last.ok and last.side == BASELINE and not blames_candidate(last.error):
            st.baseline_failure = (name, r.failure)
        return False
    assert r.decision is not None
    if r.decision.action != wanted:
        summary = st.confirmation if check == CheckName.CONFIRMATION else st.summaries.get(name)
        st.add(
            check,
            Status.FAIL,
            f"{name}: {r.decision.reason}{_under_load(r)}",
            decision_failure(r.decision.action, summary.ci if summary else None),
        )
        return False
    return True


# ---------------------------------------------------------------------------------------- the steps
def _objective(ctx: _Ctx) -> bool:
    """The objective workload must win (interleaved pairs, the sequential test)."""
    w = ctx.config.objective
    r = _run_workload(ctx, w, Role.OBJECTIVE)
    if not _judged(ctx, r, CheckName.OBJECTIVE, w.name, WIN):
        return False
    assert r is not None and r.decision is not None
    ctx.st.add(CheckName.OBJECTIVE, Status.PASS, f"{w.name}: {r.decision.reason}{_under_load(r)}")
    ctx.objective_run = r
    ctx.pool.park_all()  # the warm engines wait stopped while the coverage pass runs
    return True


def _guards(ctx: _Ctx) -> bool:
    """Every other workload must not regress significantly. Each is measured once first (guards that share an engine
    share its warm instances); a regression is then measured again on fresh engines (``_guard_check``), after every
    guard's first run: a re-measure retires the candidate's engines, which a later guard would otherwise start again."""
    notes: dict[str, str] = {}
    regressed: list[tuple[WorkloadConfig, WorkloadRun]] = []
    for w in ctx.config.workloads:
        if w.name == ctx.config.objective.name:
            continue
        g = _run_workload(ctx, w, Role.GUARD)
        if g is not None and not g.failure and g.decision is not None and g.decision.action == REGRESSED:
            regressed.append((w, g))
            notes[w.name] = ""
            continue
        if not _judged(ctx, g, CheckName.GUARD_WORKLOADS, w.name, OK):
            return False
        assert g is not None and g.decision is not None
        notes[w.name] = f"{w.name}: {g.decision.reason}"
    for w, g in regressed:
        note = _guard_check(ctx, w, g)
        if note is None:
            return False
        notes[w.name] = note
    ctx.st.add(CheckName.GUARD_WORKLOADS, Status.PASS, "; ".join(notes.values()) or "no other workloads")
    return True


def _guard_check(ctx: _Ctx, w: WorkloadConfig, g: WorkloadRun) -> str | None:
    """A guard's regression (``g``), confirmed like a win: measured again on fresh engines and seeds; only a regression
    that holds there rejects (None: the failed check is recorded). Else the note for the passed check."""
    assert g.decision is not None
    ctx.say(f"{w.name} (guard)", f"{g.decision.reason}: measuring again on fresh engines")
    # memory for the fresh sessions (under shared placement every session's engines stay up, frozen, until
    # they are retired): the candidate's engines so far go
    if not _retire(ctx, [k for k in ctx.pool.engines if not is_baseline_engine(k)], CheckName.GUARD_WORKLOADS):
        return None
    before = set(ctx.pool.engines)
    again = _run_workload(ctx, w, GUARD_CHECK)
    # nor are the re-measure's kept: memory stays bounded, and a later re-measure (this proposal's next guard,
    # the next proposal's with a kept baseline) starts fresh engines instead of reusing these
    if not _retire(ctx, [k for k in ctx.pool.engines if k not in before], CheckName.GUARD_WORKLOADS):
        return None
    if again is None or again.failure or again.decision is None or again.decision.action == REGRESSED:
        if not _judged(ctx, again, CheckName.GUARD_WORKLOADS, w.name, OK):
            failed = ctx.st.checks[-1]
            ctx.st.checks[-1] = dataclasses.replace(
                failed, detail=f"{failed.detail} (first run: {g.decision.reason}){_trade(ctx, w)}"
            )
            return None
    summary = ctx.st.summaries[w.name]
    ctx.st.summaries[w.name] = dataclasses.replace(
        summary, decision=UNCONFIRMED, reason=f"{summary.reason}; not confirmed on fresh engines"
    )
    assert again is not None and again.decision is not None
    return f"{w.name}: {g.decision.reason} on the first engines, but {again.decision.reason} — not a regression"


def _trade(ctx: _Ctx, guard: WorkloadConfig) -> str:
    """The trade a rejected guard names: what the objective gained for what the guard lost ('' when unknown)."""
    obj = ctx.config.objective
    won, lost = ctx.st.summaries.get(obj.name), ctx.st.summaries.get(f"{guard.name} (fresh engines)")
    if won is None or lost is None or won.speedup is None or lost.speedup is None:
        return ""
    return (
        f"; the candidate trades {guard.name} ({guard.metric}) {1 - lost.speedup:.1%} worse for "
        f"{obj.name} ({obj.metric}) {won.speedup - 1:+.1%}, beyond the guard's limit"
    )


def _confirmation(ctx: _Ctx) -> bool:
    """The objective's win holds on fresh seeds and a fresh pair of engines (``[gate] confirm_pairs``)."""
    w = ctx.config.objective
    if ctx.config.gate.confirm_pairs == 0:
        ctx.st.add(CheckName.CONFIRMATION, Status.SKIPPED, "disabled by [gate] confirm_pairs = 0")
        return True
    won = ctx.objective_run
    assert won is not None and won.decision is not None
    # mostly measured under foreign load: the win must be significant again on the fresh seeds
    strict = loaded_share(won) > LOADED_SHARE
    # the candidate's engines are done (guards ran before): memory for the fresh pair
    if not _retire(ctx, [k for k in ctx.pool.engines if not is_baseline_engine(k)]):
        return False
    before = set(ctx.pool.engines)
    c = _run_workload(
        ctx,
        w,
        Role.CONFIRMATION,
        functools.partial(decide_confirmation, won=won.decision.estimate, strict=strict),
        strict,
    )
    # the confirmation's engines are not kept (a kept baseline keeps the objective's: memory stays bounded)
    if not _retire(ctx, [k for k in ctx.pool.engines if k not in before]):
        return False
    if not _judged(ctx, c, CheckName.CONFIRMATION, w.name, OK):
        return False
    assert c is not None and c.decision is not None
    contended = strict or pinned_contention(won) > LOADED_SHARE
    share = _cpu_share(won, c) if contended and not _on_gpu(ctx.config) else ""
    if share:
        ctx.st.add(CheckName.CONFIRMATION, Status.FAIL, f"{w.name}: {share}", FailureKind.NOT_CONFIRMED)
        return False
    ctx.st.add(CheckName.CONFIRMATION, Status.PASS, f"{w.name}: {c.decision.reason}")
    return True


def cpu_saving(runs: list[WorkloadRun]) -> tuple[float, float, int] | None:
    """Over the complete pairs of ``runs`` whose trials both counted their CPU time (``cpu_s`` of a pinned engine):
    the mean log-ratio of the candidate's wall win (baseline's round trip over the candidate's) and of its CPU time
    saved (baseline's ``cpu_s`` over the candidate's), and the number of pairs. None when no pair has both."""
    walls, cpus = [], []
    for r in runs:
        by_pair: dict[tuple[int, int], dict[str, TrialRecord]] = {}
        for t in r.trials:
            if t.ok and t.pair >= 0:
                by_pair.setdefault((t.session, t.pair), {})[t.side] = t
        for pair in by_pair.values():
            b, c = pair.get(BASELINE), pair.get(CANDIDATE)
            if b is None or c is None or not all(_cpu_of(t) for t in (b, c)) or min(b.wall_s, c.wall_s) <= 0:
                continue
            walls.append(math.log(b.wall_s / c.wall_s))
            cpus.append(math.log(_cpu_of(b) / _cpu_of(c)))
    return (sum(walls) / len(walls), sum(cpus) / len(cpus), len(walls)) if walls else None


def pinned_contention(r: WorkloadRun) -> float:
    """The share of ``r``'s pairs with a timed trial during which a runnable process of the engine waited for a CPU
    more than ``FOREIGN_LOAD`` of the time (``cpu_wait_s``, the engine cgroup's pressure stall): contention on the
    engine's own CPUs, which the machine-wide probe misses when it is under a quarter of the machine (one busy
    process on an engine's one CPU is half a core of two). A sleeping engine waits for nothing. 0 when the trials
    did not count it."""
    pairs: dict[tuple[int, int], bool] = {}
    for t in r.trials:
        wait = t.metrics.get("cpu_wait_s")
        if t.pair < 0 or not t.ok or t.wall_s <= 0 or isinstance(wait, bool) or not isinstance(wait, (int, float)):
            continue
        key = (t.session, t.pair)
        pairs[key] = pairs.get(key, False) or wait / t.wall_s > FOREIGN_LOAD
    return sum(pairs.values()) / len(pairs) if pairs else 0.0


def _cpu_of(t: TrialRecord) -> float:
    """The trial's CPU time (seconds) when its engine was pinned and counted it, else 0."""
    cpu, pinned = t.metrics.get("cpu_s"), t.metrics.get("cpus_pinned")
    if isinstance(cpu, bool) or not isinstance(cpu, (int, float)) or not isinstance(pinned, int) or pinned <= 0:
        return 0.0
    return float(cpu) if math.isfinite(cpu) and cpu > 0 else 0.0


def _cpu_share(won: WorkloadRun, confirmed: WorkloadRun) -> str:
    """Why a win measured mostly under foreign load (on the machine or on the engine's pinned CPUs) is a larger share
    of a contended CPU rather than less work ('' when
    it is not, or the trials did not count their CPU time): its wall time fell and its CPU time per trial did not
    fall with it (``CPU_SHARE_OF_WIN``). Both sides ran the same requests, so the same work costs the same CPU time
    whatever the load; a candidate that splits it over more runnable processes gets more of a CPU others use too
    (tests/redteam/test_engine_cheats.py). A win of less waiting is real, and shows on a quiet machine."""
    saving = cpu_saving([won, confirmed])
    if saving is None:
        return ""
    wall, cpu, n = saving
    if wall <= 0 or cpu >= CPU_SHARE_OF_WIN * wall:
        return ""
    return (
        f"measured mostly under contention, the win is not less work: over {n} pairs the candidate's wall time per "
        f"trial {math.exp(-wall) - 1:+.1%}, its CPU time {math.exp(-cpu) - 1:+.1%} (the same requests on both "
        f"sides): a larger share of a CPU other processes use too, not a faster candidate; measure it again on a quiet "
        f"machine"
    )


def _retire(ctx: _Ctx, keys: list[str], check: CheckName = CheckName.CONFIRMATION) -> bool:
    """Shut the engines ``keys`` down now (all of them, even if one fails); a failure is ``check``'s measurement
    error (fail closed), not a traceback."""
    failed = ""
    try:
        ctx.pool.retire_many(keys)  # together: each clean shutdown is mostly waiting
    except (OSError, RuntimeError) as exc:
        failed = f"{type(exc).__name__}: {exc}"
    if failed:
        ctx.st.add(
            check,
            Status.FAIL,
            f"could not shut an engine down: {failed}",
            FailureKind.MEASUREMENT_ERROR,
        )
    return not failed


def _plausibility(ctx: _Ctx) -> bool:
    """A speedup beyond ``[gate] plausibility`` is held for a person (REVIEW), never merged."""
    assert ctx.objective_run is not None and ctx.objective_run.decision is not None
    speedup, bound = ctx.objective_run.decision.estimate.speedup, ctx.config.gate.plausibility
    if speedup > bound:
        ctx.st.add(
            CheckName.PLAUSIBILITY,
            Status.REVIEW,
            f"speedup {speedup:.1f}x exceeds the plausibility bound {bound:g}x: held for manual review",
        )
    else:
        ctx.st.add(CheckName.PLAUSIBILITY, Status.PASS, f"{speedup:.3f}x within {bound:g}x")
    return True


def _distribution(ctx: _Ctx) -> bool:
    """The distribution checks (``agentsearch.verify``), last: they run for survivors only."""
    st = ctx.st
    if ctx.config.verify is None:
        st.add(CheckName.DISTRIBUTION, Status.SKIPPED, "target has no [verify] section (opted out)")
        return True
    # nothing is measured after this: the distribution checks' engines get the memory (a parked GPU engine
    # keeps its); on a CPU the baseline's engines may wait, parked, for the next evaluation
    if ctx.warm and not _on_gpu(ctx.config):
        ctx.pool.adopt(ctx.pool.release(is_baseline_engine))
    else:
        ctx.pool.close()
    try:
        res = run_verify(ctx.ws, ctx.config, ctx.sd, ctx.say)
    except ReferenceFailed as exc:  # the stock reference, not the candidate: never held against the proposal
        st.add(CheckName.DISTRIBUTION, Status.FAIL, f"logprob collection failed: {exc}", FailureKind.INTERNAL_ERROR)
        return False
    except LogprobError as exc:
        st.add(CheckName.DISTRIBUTION, Status.FAIL, f"logprob collection failed: {exc}")
        return False
    except AgentsearchError as exc:  # e.g. an unreadable corpus
        st.add(CheckName.DISTRIBUTION, Status.FAIL, str(exc))
        return False
    st.distribution = res
    moved = ctx.sd.check()
    if moved:
        st.add(CheckName.DISTRIBUTION, Status.FAIL, moved, FailureKind.WORKTREE_CHANGED)
        return False
    if res.verdict != "pass":
        st.add(
            CheckName.DISTRIBUTION,
            Status.FAIL,
            "; ".join(res.reasons[:4]) + (f" (+{len(res.reasons) - 4} more)" if len(res.reasons) > 4 else ""),
            FailureKind.MAIN_DIVERGES if res.blame == "main" else None,
        )
        return False
    kl = max((v.get("kl_max") or 0.0) for s_ in res.sets.values() for v in s_.values())
    paths = list(res.sets.get("public") or {})
    named = ", ".join(paths[:-1]) + f" and {paths[-1]}" if len(paths) > 1 else "".join(paths)
    draws = f"; draw test {res.draws['status']}" if res.draws else ""
    ref = res.reference
    against = (
        f"; within the drift budget of the reference {ref.commit[:10]} at " + ", ".join(r.label for r in ref.regimes)
        if ref
        else ""
    )
    st.add(
        CheckName.DISTRIBUTION,
        Status.PASS,
        f"{res.mode}: public {res.public_size} + holdout {res.holdout_size} prompts, "
        f"{named} within tolerance (max KL {kl:.2g}){draws}{against}",
    )
    return True


def _on_gpu(config: Config) -> bool:
    try:
        return bool(placement_for(config).devices)
    except AgentsearchError:  # the measurement resolved it already; an error here keeps nothing warm
        return True


def loaded_share(r: WorkloadRun) -> float:
    """The share of ``r``'s pairs with a timed trial the quiet-machine probe flagged ``foreign_load`` (0
    when none ran). A pair counts when either side's trial was flagged: a load on one side only biases
    the pair's difference as much as a load on both (more), so one side loaded throughout counts fully."""
    pairs: dict[int, bool] = {}
    for t in r.trials:
        if t.pair >= 0:
            pairs[t.pair] = pairs.get(t.pair, False) or bool(t.metrics.get("foreign_load"))
    return sum(pairs.values()) / len(pairs) if pairs else 0.0


def _under_load(r: WorkloadRun) -> str:
    """' (N of M trials under foreign load)' when the quiet-machine probe flagged any (harness.quiet)."""
    timed = [t for t in r.trials if t.pair >= 0]
    n = sum(1 for t in timed if t.metrics.get("foreign_load"))
    return f" ({n} of {len(timed)} trials under foreign load)" if n else ""


def _coverage_check(ctx: _Ctx) -> bool:
    """Untimed pass: one traced candidate trial of the objective; did the changed Python lines run?"""
    config, w, sd, master, st, say, changed = (
        ctx.config,
        ctx.config.objective,
        ctx.sd,
        ctx.master,
        ctx.st,
        ctx.say,
        ctx.changed,
    )
    if not config.gate.coverage:
        st.add(CheckName.COVERAGE, Status.SKIPPED, "disabled by [gate] coverage = false")
        return True
    try:
        watch = coverage.watch_list(sd.worktrees[CANDIDATE], changed)
    except (ValueError, OSError) as exc:
        st.add(CheckName.COVERAGE, Status.FAIL, f"coverage pass: {exc}")
        return False
    if not watch:
        st.add(CheckName.COVERAGE, Status.SKIPPED, "no changed executable Python lines (not a Python patch)")
        return True
    say("coverage", f"tracing {sum(map(len, watch.values()))} changed lines in one untimed candidate trial")
    hits_dir = sd.out(CANDIDATE) / "coverage-run" / "hits"
    traced = dataclasses.replace(w, env={**w.env, **coverage.tracing_env(watch, sd.inputs / "coverage", hits_dir)})
    own = EnginePool()  # the traced engine is not reused: close it right after
    try:
        session = session_factory(config, traced, sd, own, out="coverage-run")(CANDIDATE, 0)
        session.start()
        try:
            outcome = session.measure(coverage_seed(master, w.name))
        finally:
            session.close()
            own.close()
            st.engine_wait_s += own.wait_s
    except (AgentsearchError, OSError, RuntimeError, ValueError) as exc:
        st.add(CheckName.COVERAGE, Status.FAIL, f"coverage pass failed: {type(exc).__name__}: {exc}")
        return False
    if not outcome.ok:
        st.add(CheckName.COVERAGE, Status.FAIL, f"coverage pass: the traced candidate trial failed: {outcome.error}")
        return False
    try:
        hits = coverage.read_hits(sd.out(CANDIDATE), hits_dir)
    except (ValueError, OSError) as exc:
        st.add(CheckName.COVERAGE, Status.FAIL, f"coverage pass: unreadable hits: {exc}")
        return False
    rep = coverage.report(sd.worktrees[CANDIDATE], watch, hits)
    st.coverage = rep
    if rep.ran == 0:
        st.add(
            CheckName.COVERAGE,
            Status.FAIL,
            f"none of the {rep.changed} changed executable lines ran during {w.name}: "
            f"the measured difference cannot come from this change ({rep.summary()})",
            FailureKind.NO_EFFECT,
        )
        return False
    st.add(CheckName.COVERAGE, Status.PASS, rep.summary())
    return True


def _micro_stage(ctx: _Ctx) -> bool:
    """A kernel proposal's op-level checks (``agentsearch.micro``) before any engine starts; True: go on."""
    config, st = ctx.config, ctx.st
    targets = micro.scope(ctx.ws.repo_dir, ctx.base, ctx.cand)
    if not targets:
        return True
    alpha = ctx.alpha if ctx.alpha is not None else config.gate.proposal_alpha
    check, result = micro.run(config, ctx.sd, targets, ctx.master, alpha, ctx.say, record=st.record)
    st.micro = result
    st.checks.append(check)
    return check.status != Status.FAIL


def _takes_effect(ctx: _Ctx) -> bool:
    """A change of serving.json alone: resolved on both sides before any engine (``agentsearch.takes_effect``); a
    change vLLM ignores or does anyway is rejected in seconds. True: go on."""
    from . import takes_effect

    w = ctx.config.objective
    # in an episode the baseline's resolving worker is kept with its side: the next serving-only change resolves warm
    status, detail, failure = takes_effect.check(
        ctx.ws.repo_dir,
        ctx.config,
        ctx.base,
        ctx.cand,
        ctx.sd,
        min(w.startup_timeout_s, 300.0),
        ctx.pool if ctx.warm else None,
    )
    ctx.st.add(CheckName.TAKES_EFFECT, status, detail, failure)
    if status != Status.SKIPPED:
        ctx.say("takes-effect", detail)
    return status != Status.FAIL


def _functional_tests(ctx: _Ctx) -> bool:
    """The target's own tests on the candidate, before anything is measured (``functional_tests``)."""
    cmd = ctx.config.target.test
    if not cmd:
        ctx.st.add(CheckName.FUNCTIONAL_TESTS, Status.SKIPPED, "the target declares no [target] test command")
        return True
    ctx.say("functional-tests", cmd)
    status, detail, failure, _output = functional_tests(ctx.config, ctx.sd)
    ctx.st.add(CheckName.FUNCTIONAL_TESTS, status, detail, failure)
    return status == Status.PASS


def functional_tests(config: Config, sd: Sides) -> tuple[Status, str, FailureKind | None, str]:
    """The target's ``[target] test`` command on the candidate side: in a disposable copy of its built
    worktree, in a sandbox of its own (``Sides.disposable_copy``), so nothing the tests do — a file, a time,
    a mode — prepares state for the timed trials, which measure the worktree as built. Also the agent
    workbench's ``test`` tool. (status, detail, failure kind, the tail of its stdout and stderr)."""
    cmd = config.target.test
    assert cmd
    try:
        with sd.disposable_copy(CANDIDATE, "tests") as worktree:
            env = child_env(dict(config.target.env), worktree, None, sd.out(CANDIDATE) / "test-out")
            rc, out, err, wall = run_child(cmd, worktree, env, config.target.test_timeout_s, shell=True)
    except OSError as exc:  # what the candidate's build left there could not be copied: fail closed
        return Status.FAIL, f"could not copy the built worktree for the tests: {exc}", None, ""
    output = (out[-8000:] + ("\n--- stderr ---\n" + err[-8000:] if err.strip() else "")).strip()
    if rc is None:
        return Status.FAIL, f"`{cmd}` timed out after {config.target.test_timeout_s:g} s", FailureKind.TIMEOUT, output
    if rc != 0:
        return Status.FAIL, f"`{cmd}` exited with status {rc}: {tail(err, 1) or 'no stderr'}", None, output
    moved = sd.check()
    if moved:  # the measured worktrees were not mounted where the tests ran: nothing may have moved them
        return Status.FAIL, moved, FailureKind.WORKTREE_CHANGED, output
    return Status.PASS, f"`{cmd}` passed in {wall:.1f} s", None, output


Step = Callable[[_Ctx], bool]  # adds its check(s) to ctx.st; False: the evaluation stops here

# the evaluation after the build, in the gate's order (history.records.GATE_ORDER; micro is a kernel
# proposal's extra stage): each step records its check and says whether the next may run
PIPELINE: tuple[tuple[CheckName, Step], ...] = (
    (CheckName.FUNCTIONAL_TESTS, _functional_tests),
    (CheckName.MICRO, _micro_stage),
    (CheckName.TAKES_EFFECT, _takes_effect),
    (CheckName.OBJECTIVE, _objective),
    (CheckName.COVERAGE, _coverage_check),
    (CheckName.GUARD_WORKLOADS, _guards),
    (CheckName.CONFIRMATION, _confirmation),
    (CheckName.PLAUSIBILITY, _plausibility),
    (CheckName.DISTRIBUTION, _distribution),
)

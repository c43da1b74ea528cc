"""Evaluate one candidate commit against the baseline: everything the gate needs, in order.

based-on-baseline -> protected paths (before anything runs) -> build/install both sides ->
objective workload (interleaved pairs, sequential test) -> guard workloads (no significant
regression) -> plausibility bound -> distribution checks -> gate. Every failure becomes a
failed check with its reason; nothing raises past this module except bugs and run errors
(``preflight``): a failed static preflight, or a baseline side that failed and fails alone too.
"""

from __future__ import annotations

import dataclasses
import math
import statistics as pystats
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from harness import coverage, environment
from harness.seeds import confirmation_seeds, coverage_seed, new_master, pair_seeds
from harness.interleave import WorkloadRun, run_interleaved
from harness.sequential import LOSE, OK, REGRESSED, WIN, SequentialDesign, confirmation_design, decide_confirmation, decide_guard, decide_objective
from harness.statistics import NoisePrior
from harness.trials import BASELINE, CANDIDATE, TrialRecord, child_env, run_child, tail
from history.records import FailureKind, decision_failure

from . import calibration, containment, micro, preflight
from . import sides as sides_mod
from .sides import Sides
from .config import Config, GateConfig, WorkloadConfig
from .errors import AgentsearchError
from .gate import Check, Status, Verdict, judge
from .headline import unit as metric_unit
from harness.engine_session import EnginePool

from harness.logprobs import LogprobError

from .verify import run_verify
from .workloads import blames_candidate, measure_options, session_factory
from .workspace import Workspace

EVALUATION_SCHEMA = 1
Progress = Callable[[str, str], None]
OnTrial = Callable[[TrialRecord], None]


def design_for(gate: GateConfig, alpha: float | None = None) -> SequentialDesign:
    return SequentialDesign(
        alpha=gate.proposal_alpha if alpha is None else alpha,
        min_effect=gate.min_effect,
        futility=gate.futility,
        min_pairs=gate.min_pairs,
        look_every=gate.look_every,
        max_pairs=gate.max_pairs,
        max_regression=gate.max_regression,
        regression_alpha=gate.regression_alpha,
    )


@dataclass(frozen=True)
class WorkloadSummary:
    name: str
    role: str  # objective | guard | confirmation
    pairs: int
    max_pairs: int
    decision: str
    reason: str
    speedup: float | None
    ci: tuple[float, float] | None
    p_value: float | None
    baseline_median: float | None
    candidate_median: float | None
    winsorized: int
    calibrated: bool
    metric: str = ""  # the measured metric (its name and unit for headlines and tables)
    unit: str = ""
    foreign_load: int = 0  # timed trials taken while processes outside the comparison used the machine (harness.quiet)
    trial_s: float | None = None  # median duration of one timed trial

    @property
    def early_stop(self) -> bool:
        return self.role != "confirmation" and self.decision in (WIN, LOSE, REGRESSED) and self.pairs < self.max_pairs

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["ci"] = list(self.ci) if self.ci else None
        d["early_stop"] = self.early_stop
        return d


@dataclass(frozen=True)
class Evaluation:
    ref: str
    baseline: str
    candidate: str
    seed: int
    verdict: Verdict
    workloads: dict[str, WorkloadSummary]
    confirmation: WorkloadSummary | None
    trials: tuple[TrialRecord, ...]
    config_fingerprint: str
    environment: dict[str, str]
    wall_s: float
    engine_wait_s: float = 0.0  # wall time spent waiting for engines to start and stop
    distribution: Any = None  # VerifyResult when [verify] ran
    coverage: Any = None  # CoverageReport when the coverage pass ran
    alpha: float | None = None  # the false-merge level this evaluation spent
    micro: Any = None  # micro.MicroResult: the op-level stage of a kernel proposal
    schema_version: int = EVALUATION_SCHEMA

    def timing(self) -> dict[str, float]:
        """Wall time split: engine start-up/shutdown, measurement, orchestration overhead."""
        measurement = sum(t.wall_s for t in self.trials)
        verify = self.distribution.wall_s if self.distribution else 0.0
        overhead = max(0.0, self.wall_s - measurement - self.engine_wait_s - verify)
        return {
            "wall_s": round(self.wall_s, 3), "engine_s": round(self.engine_wait_s, 3), "verify_s": round(verify, 3),
            "measurement_s": round(measurement, 3), "overhead_s": round(overhead, 3),
            "overhead_pct": round(100 * overhead / self.wall_s, 2) if self.wall_s else 0.0,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "verdict": self.verdict.verdict,
            "reasons": list(self.verdict.reasons),
            "ref": self.ref,
            "baseline": self.baseline,
            "candidate": self.candidate,
            "seed": self.seed,
            "alpha": self.alpha,
            "workloads": {k: v.to_json() for k, v in self.workloads.items()},
            "confirmation": self.confirmation.to_json() if self.confirmation else None,
            "distribution": self.distribution.to_json() if self.distribution else None,
            "coverage": dataclasses.asdict(self.coverage) if self.coverage else None,
            "micro": self.micro.to_json() if self.micro else None,
            "checks": [c.to_json() for c in self.verdict.checks],
            "failed_check": self.verdict.failed_check, "failure": self.verdict.failure.value if self.verdict.failure else None,
            "config_fingerprint": self.config_fingerprint,
            "environment": self.environment,
            "wall_s": round(self.wall_s, 3),
            "timing": self.timing(),
            "trials": [dataclasses.asdict(t) for t in self.trials],
        }


def summarize(run: WorkloadRun, role: str, w: WorkloadConfig, design: SequentialDesign, calibrated: bool) -> WorkloadSummary:
    dec = run.decision
    est = dec.estimate if dec else None
    base, cand = run.values(BASELINE), run.values(CANDIDATE)
    decision = "failed" if run.failure else (dec.action if dec else "not-run")
    reason = run.failure or (dec.reason if dec else "")
    if est is not None:
        p = est.p_better() if role == "objective" else est.p_worse()
    return WorkloadSummary(
        name=w.name, role=role, pairs=run.pairs, max_pairs=design.max_pairs, decision=decision, reason=reason,
        speedup=est.speedup if est else None, ci=est.ci() if est else None,
        p_value=p if est else None,
        baseline_median=pystats.median(base) if base else None,
        candidate_median=pystats.median(cand) if cand else None,
        winsorized=est.winsorized if est else 0, calibrated=calibrated,
        metric=w.metric, unit=metric_unit(w.metric, w.unit),
        foreign_load=sum(1 for t in run.trials if t.metrics.get("foreign_load")),
        trial_s=round(pystats.median(t.wall_s for t in run.trials if t.ok), 3) if base else None,
    )


@dataclass
class _State:
    checks: list[Check] = field(default_factory=list)
    summaries: dict[str, WorkloadSummary] = field(default_factory=dict)
    confirmation: WorkloadSummary | None = None
    engine_wait_s: float = 0.0
    distribution: Any = None
    trials: list[TrialRecord] = field(default_factory=list)
    coverage: Any = None  # CoverageReport when the coverage pass ran
    micro: Any = None  # micro.MicroResult when the micro stage ran (kernel proposals)
    on_trial: OnTrial | None = None
    # (workload or None for the build, reason): the baseline side failed; confirmed alone afterwards
    baseline_failure: tuple[str | None, str] | None = None

    def record(self, t: TrialRecord) -> None:
        self.trials.append(t)
        if self.on_trial is not None:
            self.on_trial(t)

    def add(self, name: str, status: Status, detail: str = "", failure: FailureKind | None = None) -> None:
        self.checks.append(Check(name, status, detail, failure))


def evaluate(
    ws: Workspace,
    ref: str,
    *,
    seed: int | None = None,
    alpha: float | None = None,
    progress: Progress | None = None,
    keep_worktrees: bool = False,
    on_trial: OnTrial | None = None,
    baseline: str | None = None,
) -> Evaluation:
    """Measure ``ref`` against the current baseline (or the commit ``baseline``) and judge it. Never merges."""
    say = progress or (lambda stage, detail: None)
    base = ws.resolve(baseline) if baseline else ws.baseline_commit()
    config = ws.config(base)
    cand = ws.resolve(ref)
    preflight.require(ws, config, base, say)  # seconds (the environment probe is cached): a set-up error is the run's
    t0 = time.perf_counter()
    # 63 bits: the pair seeds a worker sees must not give away the master (and with it the confirmation seeds)
    master = seed if seed is not None else new_master()
    st = _State(on_trial=on_trial)
    env = environment.record()  # the fingerprinted facts and this run's conditions (clocks, load)
    try:
        _run_checks(ws, config, base, cand, master, alpha, st, say, keep_worktrees)
    except KeyboardInterrupt:
        raise
    if st.baseline_failure is not None:  # the baseline's or the candidate's doing? the baseline alone says
        workload, failure = st.baseline_failure
        preflight.confirm_baseline(ws, config, base, workload, failure, say)  # raises BaselineBroken
        i = max(i for i, c in enumerate(st.checks) if c.status == Status.FAIL)
        st.checks[i] = dataclasses.replace(st.checks[i], detail=st.checks[i].detail + " (the baseline alone passes: the failure came with this candidate)")
    verdict = judge(st.checks)
    return Evaluation(
        ref=ref, baseline=base, candidate=cand, seed=master, verdict=verdict, workloads=st.summaries,
        confirmation=st.confirmation,
        trials=tuple(st.trials), config_fingerprint=config.fingerprint(), environment=env,
        wall_s=time.perf_counter() - t0, engine_wait_s=st.engine_wait_s, distribution=st.distribution, coverage=st.coverage,
        alpha=alpha if alpha is not None else config.gate.proposal_alpha, micro=st.micro,
    )


def _run_checks(ws: Workspace, config: Config, base: str, cand: str, master: int, alpha: float | None, st: _State, say: Progress, keep: bool) -> None:
    from .workspace import git

    if not git.is_ancestor(ws.repo_dir, base, cand):
        st.add("based-on-baseline", Status.FAIL, f"{cand[:12]} is not based on the current baseline {base[:12]}; rebase it onto {config.target.baseline}")
        return
    st.add("based-on-baseline", Status.PASS, f"contains {base[:12]}")
    box = containment.decide(config)
    tag = f"eval-{cand[:10]}-{master % 100000:05d}"
    try:
        with sides_mod.sides(ws, config, {BASELINE: base, CANDIDATE: cand}, tag, box, keep=keep) as sd:
            st.add("protected-paths", Status.PASS, "no protected path touched")
            if box.status == "fail":
                st.add("sandbox", Status.FAIL, box.detail)
                return
            say("build", "preparing worktrees")
            try:
                sd.build()
            except sides_mod.BuildError as exc:
                st.add("build", Status.FAIL, str(exc))
                if exc.side == BASELINE:
                    st.baseline_failure = (None, str(exc))
                return
            st.add("build", Status.PASS, "both sides installed" + (", each in its own sandbox" if box.use else ""))
            st.add("sandbox", Status(box.status), box.detail)
            changed = git.changed_lines(ws.repo_dir, base, cand)
            if not _functional_tests(config, sd, st, say):
                return
            if not _micro_stage(ws, config, base, cand, sd, master, alpha, st, say):
                return
            _measure(ws, config, sd, master, alpha, st, say, changed)
    except sides_mod.ProtectedPathError as exc:
        st.add("protected-paths", Status.FAIL, str(exc))


def _measure(ws: Workspace, config: Config, sd: Sides, master: int, alpha: float | None, st: _State, say: Progress,
             changed: dict[str, set[int]]) -> None:
    pool = EnginePool()
    try:
        _measure_with(ws, config, sd, master, alpha, st, say, pool, changed)
    finally:
        pool.close()
        st.engine_wait_s += pool.wait_s


def _measure_with(ws: Workspace, config: Config, sd: Sides, master: int, alpha: float | None, st: _State, say: Progress,
                  pool: EnginePool, changed: dict[str, set[int]]) -> None:
    design = design_for(config.gate, alpha)
    objective = config.objective
    cal = calibration.load(ws)

    def prior_for(w: WorkloadConfig) -> NoisePrior | None:
        return calibration.prior_for(cal, config, w)

    check_of = {"objective": "objective", "guard": "guard-workloads", "confirmation": "confirmation"}
    decide_of = {"objective": decide_objective, "guard": decide_guard, "confirmation": decide_confirmation}

    def run(w: WorkloadConfig, role: str) -> WorkloadRun | None:
        try:
            factory = session_factory(config, w, sd, pool)
            options = measure_options(config, w)  # placement, warm-up, the quiet probe
        except AgentsearchError as exc:  # the set-up (e.g. the model, the placement): not the candidate's doing
            st.add(check_of[role], Status.FAIL, str(exc), FailureKind.SETUP_ERROR)
            st.baseline_failure = (w.name, str(exc))
            return None
        decide = decide_of[role]
        if role == "confirmation":
            wdesign = confirmation_design(config.gate.confirm_pairs)
        elif w.max_pairs is not None:
            wdesign = dataclasses.replace(design, max_pairs=w.max_pairs, min_pairs=min(design.min_pairs, w.max_pairs))
        else:
            wdesign = design
        seeds = confirmation_seeds(master, w.name) if role == "confirmation" else pair_seeds(master, w.name)

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

        prior = prior_for(w)
        try:
            r = run_interleaved(
                w.name, factory, wdesign, decide, seeds, w.higher_is_better,
                prior=prior, on_pair=on_pair, **options,
            )
        except (OSError, ValueError, RuntimeError) as exc:  # fail closed: an error is a rejection
            st.add(check_of[role], Status.FAIL, f"{w.name}: measurement error: {type(exc).__name__}: {exc}", FailureKind.MEASUREMENT_ERROR)
            return None
        emit(r)
        summary = summarize(r, role, w, wdesign, prior is not None)
        if role == "confirmation":
            st.confirmation = summary
        else:
            st.summaries[w.name] = summary
        return r

    def judged(r: WorkloadRun | None, check: str, name: str, wanted: str) -> bool:
        """Record a failed check (no run, a failed trial, the wrong decision); True if it may go on."""
        if r is None:
            return False
        if r.failure:
            st.add(check, Status.FAIL, r.failure, FailureKind(r.failure_kind or FailureKind.CRASH))
            last = r.trials[-1] if r.trials else None
            if last is not None and not last.ok and last.side == BASELINE and not blames_candidate(last.error):
                st.baseline_failure = (name, r.failure)
            return False
        assert r.decision is not None
        if r.decision.action != wanted:
            summary = st.confirmation if check == "confirmation" else st.summaries.get(name)
            st.add(check, Status.FAIL, f"{name}: {r.decision.reason}{_under_load(r)}", decision_failure(r.decision.action, summary.ci if summary else None))
            return False
        return True

    r = run(objective, "objective")
    if not judged(r, "objective", objective.name, WIN):
        return
    assert r is not None and r.decision is not None
    st.add("objective", Status.PASS, f"{objective.name}: {r.decision.reason}{_under_load(r)}")
    pool.park_all()  # the warm engines wait stopped while the coverage pass runs
    if not _coverage_check(config, objective, sd, master, st, say, changed):
        return

    guard_notes = []
    for w in config.workloads:
        if w.name == objective.name:
            continue
        g = run(w, "guard")
        if not judged(g, "guard-workloads", w.name, OK):
            return
        assert g is not None and g.decision is not None
        guard_notes.append(f"{w.name}: {g.decision.reason}")
    st.add("guard-workloads", Status.PASS, "; ".join(guard_notes) or "no other workloads")

    if config.gate.confirm_pairs == 0:
        st.add("confirmation", Status.SKIPPED, "disabled by [gate] confirm_pairs = 0")
    else:
        c = run(objective, "confirmation")
        if not judged(c, "confirmation", objective.name, OK):
            return
        assert c is not None and c.decision is not None
        st.add("confirmation", Status.PASS, f"{objective.name}: {c.decision.reason}")

    speedup = r.decision.estimate.speedup
    if speedup > config.gate.plausibility:
        st.add("plausibility", Status.REVIEW, f"speedup {speedup:.1f}x exceeds the plausibility bound {config.gate.plausibility:g}x: held for manual review")
    else:
        st.add("plausibility", Status.PASS, f"{speedup:.3f}x within {config.gate.plausibility:g}x")

    if config.verify is None:
        st.add("distribution", Status.SKIPPED, "target has no [verify] section (opted out)")
        return
    pool.close()  # nothing is measured after this: the distribution checks' engines get the memory (a parked GPU engine keeps its)
    try:
        res = run_verify(ws, config, sd, say)
    except LogprobError as exc:
        st.add("distribution", Status.FAIL, f"logprob collection failed: {exc}")
        return
    except AgentsearchError as exc:  # e.g. an unreadable corpus
        st.add("distribution", Status.FAIL, str(exc))
        return
    st.distribution = res
    moved = sd.check()
    if moved:
        st.add("distribution", Status.FAIL, moved, FailureKind.WORKTREE_CHANGED)
        return
    if res.verdict != "pass":
        st.add("distribution", Status.FAIL, "; ".join(res.reasons[:4]) + (f" (+{len(res.reasons) - 4} more)" if len(res.reasons) > 4 else ""))
    else:
        kl = max((v.get("kl_max") or 0.0) for s_ in res.sets.values() for v in s_.values())
        paths = list((res.sets.get("public") or {}))
        named = ", ".join(paths[:-1]) + f" and {paths[-1]}" if len(paths) > 1 else "".join(paths)
        draws = f"; draw test {res.draws['status']}" if res.draws else ""
        st.add("distribution", Status.PASS, f"{res.mode}: public {res.public_size} + holdout {res.holdout_size} prompts, "
                                            f"{named} within tolerance (max KL {kl:.2g}){draws}")


def _under_load(r: WorkloadRun) -> str:
    """' (N of M trials under foreign load)' when the quiet-machine probe flagged any (harness.quiet)."""
    timed = [t for t in r.trials if t.pair >= 0]
    n = sum(1 for t in timed if t.metrics.get("foreign_load"))
    return f" ({n} of {len(timed)} trials under foreign load)" if n else ""


def _coverage_check(config: Config, w: WorkloadConfig, sd: Sides, master: int, st: _State,
                    say: Progress, changed: dict[str, set[int]]) -> bool:
    """Untimed pass: one traced candidate trial of the objective; did the changed Python lines run?"""
    if not config.gate.coverage:
        st.add("coverage", Status.SKIPPED, "disabled by [gate] coverage = false")
        return True
    try:
        watch = coverage.watch_list(sd.worktrees[CANDIDATE], changed)
    except (ValueError, OSError) as exc:
        st.add("coverage", Status.FAIL, f"coverage pass: {exc}")
        return False
    if not watch:
        st.add("coverage", Status.SKIPPED, "no changed executable Python lines (not a Python patch)")
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
        st.add("coverage", Status.FAIL, f"coverage pass failed: {type(exc).__name__}: {exc}")
        return False
    if not outcome.ok:
        st.add("coverage", Status.FAIL, f"coverage pass: the traced candidate trial failed: {outcome.error}")
        return False
    try:
        hits = coverage.read_hits(sd.out(CANDIDATE), hits_dir)
    except (ValueError, OSError) as exc:
        st.add("coverage", Status.FAIL, f"coverage pass: unreadable hits: {exc}")
        return False
    rep = coverage.report(sd.worktrees[CANDIDATE], watch, hits)
    st.coverage = rep
    if rep.ran == 0:
        st.add("coverage", Status.FAIL, f"none of the {rep.changed} changed executable lines ran during {w.name}: "
                                        f"the measured difference cannot come from this change ({rep.summary()})", FailureKind.NO_EFFECT)
        return False
    st.add("coverage", Status.PASS, rep.summary())
    return True


def _micro_stage(ws: Workspace, config: Config, base: str, cand: str, sd: Sides, master: int, alpha: float | None,
                 st: _State, say: Progress) -> bool:
    """A kernel proposal's op-level checks (``agentsearch.micro``) before any engine starts; True: go on."""
    targets = micro.scope(ws.repo_dir, base, cand)
    if not targets:
        return True
    check, result = micro.run(config, sd, targets, master, alpha if alpha is not None else config.gate.proposal_alpha, say, record=st.record)
    st.micro = result
    st.checks.append(check)
    return check.status != Status.FAIL


def _functional_tests(config: Config, sd: Sides, st: _State, say: Progress) -> bool:
    """The target's own tests on the candidate (in its sandbox), before anything is measured.

    Whatever the tests leave in the worktree is undone before measuring (a run must not prepare
    state for the timed trials); a leftover that cannot be undone rejects."""
    cmd = config.target.test
    if not cmd:
        st.add("functional-tests", Status.SKIPPED, "the target declares no [target] test command")
        return True
    say("functional-tests", cmd)
    worktree = sd.worktrees[CANDIDATE]
    env = child_env(dict(config.target.env), worktree, None, sd.out(CANDIDATE) / "test-out")
    rc, _out, err, wall = run_child(cmd, worktree, env, config.target.test_timeout_s, shell=True)
    left = sd.restore(CANDIDATE)
    if rc is None:
        st.add("functional-tests", Status.FAIL, f"`{cmd}` timed out after {config.target.test_timeout_s:g} s", FailureKind.TIMEOUT)
        return False
    if rc != 0:
        st.add("functional-tests", Status.FAIL, f"`{cmd}` exited with status {rc}: {tail(err, 1) or 'no stderr'}")
        return False
    if left or sd.check():
        st.add("functional-tests", Status.FAIL, f"the tests left changes in a worktree that could not be undone: {left or sd.check()}",
               FailureKind.WORKTREE_CHANGED)
        return False
    st.add("functional-tests", Status.PASS, f"`{cmd}` passed in {wall:.1f} s")
    return True

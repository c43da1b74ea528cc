"""A/A calibration: the baseline against itself, to know each workload's noise.

The result is stored in the state directory and used by the gate as a noise prior — only
when the config fingerprint and the environment fingerprint still match (otherwise it is
ignored and the report says the evaluation ran uncalibrated).
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics as pystats
import time
from dataclasses import asdict, dataclass
from typing import Any

from harness import environment, machine_noise, power, seeds
from harness.engine_pool import EnginePool
from harness.gate_defaults import CALIBRATION_PAIRS, MACHINE_PROBE_S
from harness.interleave import pairs_per_session, run_interleaved
from harness.outputs_rule import Floor
from harness.sequential import OK, Decision, SequentialDesign
from harness.statistics import (
    NoisePrior,
    between_variance,
    cv,
    drift,
    min_detectable,
    noise_prior,
    outliers,
    paired_estimate,
    pairs_for_power,
    within_variance,
)
from harness.trials import BASELINE, CANDIDATE

from .config import Config, WorkloadConfig
from .errors import AgentsearchError
from .gate_design import design_for, workload_design
from .progress import Say
from .sides import built_sides
from .workloads import confirmation_restarts, engine_cpus, measure_options, placement_for, restarts_for, session_factory
from .workspace.workspace import Workspace, atomic_write

CALIBRATION_SCHEMA = 1
FILE = "calibration.json"


@dataclass(frozen=True)
class WorkloadNoise:
    workload: str
    pairs: int
    cv: float
    sd_log_ratio: float
    var: float
    df: int
    drift_per_100: float
    drift_p: float
    outliers: int
    order_effect: float
    aa_speedup: float
    aa_ci: tuple[float, float]
    pairs_needed: int
    sessions: int = 1
    between_var: float = 0.0
    per_session: int = 0  # pairs per engine session in the gate's design (0: one session; tau2 not counted)
    budget_pairs: int = 0  # [gate] max_pairs (or the workload's)
    detectable: float | None = None  # smallest speedup (a guard: regression) found with 90% power within budget_pairs
    # the same, through the gate's own decisions (harness.power: sequential looks, each proposal's session effect,
    # the confirmation), simulated at this noise; None: not simulated (older calibrations) or not within 100%
    detectable_gate: float | None = None
    within_var: float | None = (
        None  # variance of pair log-ratios within an engine session (var: across them, sessions' spread included)
    )
    guard: bool = False  # a guard workload (judged for regressions), not the objective
    trial_s: float | None = None  # median duration of one timed trial
    load_avg: float | None = None  # mean 1-minute load average over the trials
    foreign_trials: int = 0  # trials flagged: other processes used the machine meanwhile
    placement: str = ""
    slices: int = 1  # parts per side of a pair (1: whole trials)
    machine_floor_sd: float | None = None  # the machine's own per-pair SD at this alternation (harness.machine_noise)
    machine_speed_sd: float | None = None  # SD of the machine's log-speed over windows of one part
    machine_floor_pairs: int = 0  # disjoint pairs behind the floor
    # the timed outputs rule's rounding floor on this engine (harness.outputs_rule): the reference's largest margin
    # change between two batch orders and between its decode and its prefill, in nats; the tie it gives; the dtype
    # the engine reported; or why it was not measured (a workload whose engine cannot score)
    outputs_floor: float | None = None
    outputs_tie: float | None = None
    outputs_dtype: str = ""
    outputs_positions: int = 0
    outputs_note: str = ""


@dataclass(frozen=True)
class Calibration:
    baseline: str
    config_fingerprint: str
    environment_fingerprint: str
    created: float
    workloads: dict[str, WorkloadNoise]
    schema_version: int = CALIBRATION_SCHEMA
    machine_probe: str = ""  # where and how long the machine's speed was probed, or why it was not

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        return d


def _fixed_design(n: int) -> SequentialDesign:
    return SequentialDesign(alpha=0.05, min_pairs=n, max_pairs=n, look_every=n)


def _done(
    design: SequentialDesign, d: list[float], prior: NoisePrior | None, clusters: list[int] | None = None
) -> Decision:
    return Decision(OK, "calibration complete", paired_estimate(d), 0.0)


def analyze(
    name: str,
    run_trials: list,
    d: list[float],
    config: Config,
    sessions: list[int] | None = None,
    placement: str = "",
    alternate: bool = False,
) -> WorkloadNoise:
    """One workload's A/A noise; ``alternate``: the gate measures it in alternate rounds (``measure_options``)."""
    values = [t.value for t in sorted(run_trials, key=lambda t: (t.pair, t.position))]
    base_values = [t.value for t in run_trials if t.side == BASELINE]
    cand_values = [t.value for t in run_trials if t.side == CANDIDATE]
    prior = noise_prior(d)
    est = paired_estimate(
        d, clusters=sessions if sessions and len(set(sessions)) > 1 else None
    )  # sessions: engine restarts / rounds
    ab = [x for i, x in enumerate(d) if i % 2 == 0]
    ba = [x for i, x in enumerate(d) if i % 2 == 1]
    order_effect = (pystats.mean(ab) - pystats.mean(ba)) / 2 if ab and ba else 0.0
    dr = drift(values)
    level = config.gate.proposal_alpha * 0.8  # the final look's share (harness.sequential)
    sd = prior.var**0.5
    tau2, r = between_variance(d, sessions) if sessions else (0.0, 1)
    within = (
        within_variance(d, sessions) if sessions and r > 1 else prior.var
    )  # the same pairs as tau2: together they make up d's spread
    w = config.workload(name) if name in {x.name for x in config.workloads} else None
    budget = (w.max_pairs if w is not None and w.max_pairs else None) or config.gate.max_pairs
    guard = w is not None and w.name != config.objective.name
    # a guard is judged by the one-sided regression test at regression_alpha: its smallest detectable regression
    detect_level = config.gate.regression_alpha if guard else level
    # the gate's engine sessions (restarts; alternate rounds): a session's effect on the mean (tau2) counts once per
    # session
    restarts = restarts_for(w) if w is not None else 1
    per_session = pairs_per_session(budget, restarts, alternate) if alternate or restarts > 1 else 0
    walls = [t.wall_s for t in run_trials if t.ok]
    parts = [int(t.metrics["slices"]) for t in run_trials if t.ok and isinstance(t.metrics.get("slices"), int)]
    loads = [t.metrics["load_avg_1m"] for t in run_trials if isinstance(t.metrics.get("load_avg_1m"), (int, float))]
    return WorkloadNoise(
        workload=name,
        pairs=len(d),
        cv=pystats.mean([cv(base_values), cv(cand_values)]),
        sd_log_ratio=sd,
        var=prior.var,
        df=prior.df,
        drift_per_100=dr.slope_per_100,
        drift_p=dr.p_value,
        outliers=outliers(d),
        order_effect=order_effect,
        aa_speedup=est.speedup,
        aa_ci=est.ci(),
        pairs_needed=pairs_for_power(
            sd, config.gate.min_effect, level, 0.9, df_prior=prior.df, between_var=tau2, per_session=per_session
        ),
        sessions=r,
        between_var=tau2,
        within_var=within,
        budget_pairs=budget,
        guard=guard,
        per_session=per_session,
        detectable=min_detectable(sd, budget, detect_level, 0.9, prior.df, between_var=tau2, per_session=per_session),
        trial_s=pystats.median(walls) if walls else None,
        load_avg=round(pystats.mean(loads), 2) if loads else None,
        foreign_trials=sum(1 for t in run_trials if t.metrics.get("foreign_load")),
        placement=placement,
        slices=int(pystats.median(parts)) if parts else 1,
    )


def simulation_noise(noise: WorkloadNoise, config: Config, w: WorkloadConfig, alternate: bool = False) -> power.Noise:
    """The noise ``harness.power`` simulates ``w`` at: a trial's SD within a session (the calibration's ``var`` counts
    the sessions' spread too, which the instances add again), each instance's effect, and the gate's sessions and
    placement for the workload and its confirmation (``agentsearch.evaluation``: one session, two under split)."""
    within = noise.within_var if noise.within_var is not None else noise.var
    return power.Noise.from_calibration(
        math.sqrt(within), noise.between_var, restarts_for(w), alternate, confirmation_restarts(config)
    )


def with_gate_power(
    noise: WorkloadNoise, config: Config, w: WorkloadConfig, alternate: bool = False, reps: int = power.POWER_REPS
) -> WorkloadNoise:
    """``noise`` with the smallest effect the gate's own decisions find with 90% power at this noise
    (``harness.power.detectable``): the objective's speedup, merged after its confirmation; a guard's regression.
    Simulated with this calibration as the prior, the workload's pair budget, sessions and placement."""
    prior = NoisePrior(var=noise.var, df=noise.df, between_var=noise.between_var)
    design = workload_design(design_for(config.gate), w)
    sim = simulation_noise(noise, config, w, alternate)
    found = power.detectable(
        design, prior, sim, 0.9, reps, confirm_pairs=0 if noise.guard else config.gate.confirm_pairs, guard=noise.guard
    )
    return dataclasses.replace(noise, detectable_gate=found)


def with_machine_floor(noise: WorkloadNoise, series: list[float], cpus: frozenset[int] | None) -> WorkloadNoise:
    """``noise`` with the machine's floor for its alternation (its parts as long as its trials' parts), from a
    ``machine_noise.speed_series``; unchanged when the series is too short for its pairs."""
    if noise.trial_s is None or noise.trial_s <= 0:
        return noise
    floor = machine_noise.pair_floor(series, noise.trial_s / noise.slices, noise.slices, sorted(cpus or ()))
    if floor is None:
        return noise
    return dataclasses.replace(
        noise, machine_floor_sd=floor.pair_sd, machine_speed_sd=floor.speed_sd, machine_floor_pairs=floor.pairs
    )


def with_outputs_floor(noise: WorkloadNoise, floor: Floor | str) -> WorkloadNoise:
    """``noise`` with the outputs rule's measured rounding floor (or why it was not measured)."""
    if isinstance(floor, str):
        return dataclasses.replace(noise, outputs_note=floor)
    return dataclasses.replace(
        noise,
        outputs_floor=floor.measured,
        outputs_tie=floor.tie,
        outputs_dtype=floor.dtype,
        outputs_positions=floor.positions,
    )


def calibrate(
    ws: Workspace, pairs: int = CALIBRATION_PAIRS, progress: Say | None = None, machine_probe_s: float = MACHINE_PROBE_S
) -> Calibration:
    """A/A of every workload; then, for warm-engine workloads and ``machine_probe_s`` > 0, the machine's own speed
    noise on the engines' CPUs (engines closed): the per-pair SD no engine can go below here."""
    say = progress or (lambda s, d: None)
    config = ws.config()
    base = ws.baseline_commit()
    master = seeds.new_master(31)
    tag = f"calibrate-{master % 100000:05d}"
    results: dict[str, WorkloadNoise] = {}
    pool = EnginePool()

    try:
        # A/A: both sides are the baseline, each in its own worktree and sandbox
        with built_sides(ws, config, {BASELINE: base, CANDIDATE: base}, tag, "calibration") as sd:
            try:
                for w in config.workloads:
                    factory = session_factory(config, w, sd, pool)
                    options = measure_options(config, w)
                    run = run_interleaved(
                        w.name,
                        factory,
                        _fixed_design(pairs),
                        _done,
                        seeds.pair_seeds(master, w.name),
                        w.higher_is_better,
                        **options,
                        on_pair=lambda r: say(w.name, f"A/A pair {r.pairs}/{pairs}"),  # noqa: B023 - called within the iteration
                    )
                    if run.failure:
                        raise AgentsearchError(f"calibration of {w.name!r} failed: {run.failure}")
                    results[w.name] = analyze(
                        w.name,
                        run.trials,
                        run.log_ratios,
                        config,
                        run.sessions,
                        placement_for(config).describe() if w.spec.engine else "",
                        options["alternate"],
                    )
                    if w.spec.engine and not w.spec.serving:
                        say(w.name, "the outputs rule's rounding floor: the baseline's answers scored twice")
                        results[w.name] = with_outputs_floor(
                            results[w.name], factory.rounding_floor(seeds.pair_seeds(master, w.name)(pairs))
                        )
            finally:
                pool.close()
    finally:
        pool.close()
    results, probe = _machine_floors(config, results, machine_probe_s, say)
    for w in config.workloads:  # engines closed: the simulation has the CPUs to itself
        say(w.name, "simulating the gate's decisions at this noise: the smallest effect they find")
        results[w.name] = with_gate_power(results[w.name], config, w, measure_options(config, w)["alternate"])
    cal = Calibration(
        baseline=base,
        config_fingerprint=config.fingerprint(),
        environment_fingerprint=environment.fingerprint(),
        created=time.time(),
        workloads=results,
        machine_probe=probe,
    )
    atomic_write(ws.state / FILE, json.dumps(cal.to_json(), indent=1))
    return cal


def _machine_floors(
    config: Config, results: dict[str, WorkloadNoise], seconds: float, say: Say
) -> tuple[dict[str, WorkloadNoise], str]:
    """The warm-engine workloads' results with their machine floors, one probe per set of engine CPUs; and what
    was probed. A probe that fails leaves the floors out (it judges nothing) and says why."""
    warm = [w for w in config.workloads if w.spec.engine and w.name in results]
    if seconds <= 0 or not warm:
        return results, "not probed" if seconds <= 0 else "not probed (no warm-engine workload)"
    place = placement_for(config)
    out, notes = dict(results), []
    by_cpus: dict[frozenset[int] | None, list[WorkloadConfig]] = {}
    for w in warm:
        by_cpus.setdefault(engine_cpus(config, w, place), []).append(w)
    for cpus, ws_ in by_cpus.items():
        where = f"CPUs {','.join(map(str, sorted(cpus)))}" if cpus else "unpinned"
        say("machine", f"probing the machine's own speed noise ({seconds:g} s, {where})")
        try:
            series = machine_noise.speed_series(sorted(cpus) if cpus else None, seconds)
            for w in ws_:
                out[w.name] = with_machine_floor(out[w.name], series, cpus)
        except Exception as exc:  # the probe judges nothing: whatever goes wrong leaves the floors out, with the reason
            notes.append(f"{where}: {exc}")
            continue
        short = [
            f"{w.name} ({out[w.name].trial_s:.1f} s per side)"
            for w in ws_
            if out[w.name].machine_floor_sd is None and out[w.name].trial_s is not None
        ]
        notes.append(
            f"{seconds:g} s of a pure-CPU loop, {where}"
            + (
                f"; too short for 3 pairs of {', '.join(short)}: run with --machine-probe "
                f"{math.ceil(7 * max(out[w.name].trial_s or 0 for w in ws_))}"
                if short
                else ""
            )
        )
    return out, "; ".join(notes)


def load(ws: Workspace) -> Calibration | None:
    path = ws.state / FILE
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        if data.get("schema_version") != CALIBRATION_SCHEMA:
            return None
        workloads = {}
        known = {f.name for f in dataclasses.fields(WorkloadNoise)}
        for k, v in data["workloads"].items():
            v["aa_ci"] = tuple(v["aa_ci"])
            workloads[k] = WorkloadNoise(
                **{f: x for f, x in v.items() if f in known}
            )  # a newer version's extra fields: ignored
        return Calibration(
            baseline=data["baseline"],
            config_fingerprint=data["config_fingerprint"],
            environment_fingerprint=data["environment_fingerprint"],
            created=data["created"],
            workloads=workloads,
            machine_probe=data.get("machine_probe", ""),  # absent before the probe existed: a calibration without it
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise AgentsearchError(
            f"{path}: corrupt calibration ({exc}); delete it and run `agentsearch calibrate` again"
        ) from None


def outputs_floor_for(cal: Calibration | None, config: Config, w: WorkloadConfig) -> float | None:
    """The outputs rule's calibrated rounding floor for ``w`` if the calibration still describes this setup."""
    if cal is None or cal.config_fingerprint != config.fingerprint():
        return None
    if cal.environment_fingerprint != environment.fingerprint():
        return None
    noise = cal.workloads.get(w.name)
    return None if noise is None else noise.outputs_floor


def prior_for(cal: Calibration | None, config: Config, w: WorkloadConfig) -> NoisePrior | None:
    """The calibrated noise for ``w`` if the calibration still describes this setup."""
    if cal is None or cal.config_fingerprint != config.fingerprint():
        return None
    if cal.environment_fingerprint != environment.fingerprint():
        return None
    noise = cal.workloads.get(w.name)
    if noise is None or noise.df < 1:
        return None
    return NoisePrior(var=noise.var, df=noise.df, between_var=noise.between_var)

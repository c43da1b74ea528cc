"""Interleaved, paired measurement of baseline and candidate with sequential looks.

Pairs alternate their order — AB, BA, AB, ... (the trial sequence is ABBA ABBA) — and both
sides of a pair get the same input seed. A side is measured through a ``Session``: for a
command workload every measurement is a fresh child process; a warm-engine workload keeps
one process per side alive across many pairs and restarts both sides ``restarts`` times (the
second level of replication). Sessions are always closed, also on errors and Ctrl-C.
A failed trial ends the workload at once with its reason. One exception: the baseline's trial on which the
instrument was disturbed (``TrialOutcome.disturbed``: a load generator that fell behind its schedule under the
machine's other load) is measured again, at most ``MAX_REMEASURED`` times per workload; the disturbed attempt is
recorded as a failed trial. The candidate's never is: a candidate that can disturb the instrument during its own
trial could otherwise throw away the trials it lost.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from .quiet import Probe
from .sequential import CONTINUE, Decision, SequentialDesign
from .statistics import NoisePrior
from .trials import (
    BASELINE,
    CANDIDATE,
    CHANGED_OUTPUTS,
    CRASH,
    CommandSpec,
    TrialOutcome,
    TrialRecord,
    run_command_trial,
)

# per workload run, how many of the baseline's disturbed trials are measured again (a third is the run's error)
MAX_REMEASURED = 2


class Session(Protocol):
    def start(self) -> None: ...

    def measure(self, seed: int) -> TrialOutcome: ...

    def close(self) -> None: ...


class CommandSession:
    """A 'session' of a command workload: every measurement is its own child process."""

    def __init__(self, spec: CommandSpec, out_dir: Path):
        self.spec = spec
        self.out_dir = out_dir

    def start(self) -> None:
        pass

    def measure(self, seed: int) -> TrialOutcome:
        return run_command_trial(self.spec, seed, self.out_dir)

    def close(self) -> None:
        pass


SessionFactory = Callable[[str, int], Session]  # (side, restart index) -> Session
Decide = Callable[..., Decision]  # (design, log_ratios, prior, clusters=...) -> Decision


@dataclass
class WorkloadRun:
    """Everything measured for one workload in one evaluation."""

    workload: str
    trials: list[TrialRecord] = field(default_factory=list)
    log_ratios: list[float] = field(default_factory=list)
    sessions: list[int] = field(default_factory=list)  # engine session of each pair
    decision: Decision | None = None
    failure: str | None = None
    failure_kind: str = ""  # one of harness.trials.TRIAL_FAILURES when failure is set
    remeasured: int = 0  # the baseline's disturbed trials measured again (each recorded as a failed trial)

    @property
    def pairs(self) -> int:
        return len(self.log_ratios)

    def values(self, side: str) -> list[float]:
        return [t.value for t in self.trials if t.side == side and t.ok and t.value is not None]


def trial_failure(side: str, workload: str, pair: int, seed: int, outcome: TrialOutcome) -> str:
    """Why a run stopped at a failed trial. The outputs check compares the sides when a pair's second trial ends, so
    its failure is the pair's, not that side's: it names no side (it read "baseline trial failed" when the baseline
    happened to run second, for a candidate whose greedy tokens differed)."""
    where = f"({workload}, pair {pair}, seed {seed})"
    if outcome.failure == CHANGED_OUTPUTS:
        return f"the sides' outputs differ {where}: {outcome.error}"
    return f"{side} trial failed {where}: {outcome.error}"


def order_of(pair: int) -> str:
    return "AB" if pair % 2 == 0 else "BA"


def run_interleaved(
    workload: str,
    factory: SessionFactory,
    design: SequentialDesign,
    decide: Decide,
    seed_of: Callable[[int], int],
    higher_is_better: bool,
    prior: NoisePrior | None = None,
    restarts: int = 1,
    on_pair: Callable[[WorkloadRun], None] | None = None,
    warmup: int = 0,
    alternate: bool = False,
    probe: Callable[[], Probe] | None = None,
    slices: int = 1,
) -> WorkloadRun:
    """Measure pairs until the sequential decision stops (or a trial fails).

    ``warmup``: unmeasured rounds at the start of every session (seeds ``seed_of(-1)``, ``seed_of(-2)``,
    ...: never a pair's). ``alternate``: one session at a time (``harness.placement``), see
    ``_alternating``. ``probe``: a quiet-machine probe around every timed trial (``harness.quiet``).
    ``slices``: split every pair's two trials into up to this many parts, measured alternately (``_measure_pair``;
    sessions that cannot split a trial, and ``alternate``, measure whole trials)."""
    run = WorkloadRun(workload)
    # the win looks at the session ends (``SequentialDesign.win_looks``): the schedule is known before the first pair
    per_session = pairs_per_session(design.max_pairs, restarts, alternate)
    if not design.session_pairs and (alternate or restarts > 1):
        design = dataclasses.replace(design, session_pairs=per_session)
    if alternate:
        _alternating(run, factory, design, decide, seed_of, higher_is_better, prior, restarts, on_pair, warmup, probe)
    else:
        _shared(
            run, factory, design, decide, seed_of, higher_is_better, prior, restarts, on_pair, warmup, probe, slices
        )
    _settle(run, factory)  # not on the way out of an exception: nothing more is started then
    return run


def _settle(run: WorkloadRun, factory: SessionFactory) -> None:
    """What the factory left to judge once the sessions are over (``settle()``, when it has one: the outputs of pairs
    completed while the baseline's engine was not up to score them); its refusal fails the run."""
    settle = getattr(factory, "settle", None)
    if settle is None:
        return
    why = settle()
    if why and not run.failure:
        run.failure = f"the sides' outputs differ ({run.workload}, judged after the last pair): {why}"
        run.failure_kind = CHANGED_OUTPUTS


def _shared(
    run: WorkloadRun,
    factory: SessionFactory,
    design: SequentialDesign,
    decide: Decide,
    seed_of: Callable[[int], int],
    higher_is_better: bool,
    prior: NoisePrior | None,
    restarts: int,
    on_pair: Callable[[WorkloadRun], None] | None,
    warmup: int,
    probe: Callable[[], Probe] | None,
    slices: int,
) -> None:
    """Both sides' sessions up together, pairs measured in ABBA order (``run_interleaved``)."""
    workload = run.workload
    per_session = pairs_per_session(design.max_pairs, restarts)
    sessions: dict[str, Session] = {}
    current = -1
    try:
        pair = 0
        while True:
            look = design.next_look(pair)
            while pair < look:
                idx = pair // per_session
                if idx != current:
                    _close_all(sessions)
                    current = idx
                    for side in (BASELINE, CANDIDATE):
                        sessions[side] = factory(side, idx)
                        sessions[side].start()
                    t_boot = time.perf_counter()
                    warm_order = _warm_up_order(sessions) if warmup else (BASELINE, CANDIDATE)
                    count_wait = getattr(sessions[warm_order[0]], "add_wait", None)
                    if count_wait is not None:  # the engines' start-up, as when the first warm-up waited for it
                        count_wait(time.perf_counter() - t_boot)
                    for side in warm_order:
                        if not _warm_up(run, sessions[side], side, idx, seed_of, warmup):
                            return
                seed = seed_of(pair)
                order = order_of(pair)
                sides = (BASELINE, CANDIDATE) if order == "AB" else (CANDIDATE, BASELINE)
                got = _measure_pair(sessions, sides, seed, probe, slices)
                while _again(run, got.get(BASELINE)):
                    position = sides.index(BASELINE)
                    run.trials.append(_record(workload, BASELINE, seed, pair, position, order, idx, got[BASELINE]))
                    if got.get(CANDIDATE) is not None and got[CANDIDATE].ok:
                        got[BASELINE] = _timed(sessions[BASELINE], seed, probe)  # the candidate's trial stands
                    else:
                        got = _measure_pair(sessions, sides, seed, probe, slices)
                for position, side in enumerate(sides):
                    if side not in got:
                        continue
                    outcome = got[side]
                    run.trials.append(_record(workload, side, seed, pair, position, order, idx, outcome))
                    if not outcome.ok:
                        run.failure = trial_failure(side, workload, pair + 1, seed, outcome)
                        run.failure_kind = outcome.failure or CRASH
                        return
                _pair_done(run, got, higher_is_better, idx)
                pair += 1
                if on_pair:
                    on_pair(run)
            # sessions count when there are several, or when a calibration measured their effect (then one session
            # carries all of it)
            counted = restarts > 1 or (prior is not None and prior.between_var > 0)
            decision = decide(design, run.log_ratios, prior, clusters=run.sessions if counted else None)
            run.decision = decision
            if decision.action != CONTINUE:
                return
    finally:
        _close_all(sessions)


def alternate_rounds(restarts: int) -> int:
    """Rounds of an alternating run: at least two (A B | B A), so a drift between sessions cancels."""
    return max(2, restarts)


def pairs_per_session(max_pairs: int, restarts: int, alternate: bool = False) -> int:
    """Pairs each engine session (``alternate``: each round) holds: the pair budget split evenly over them."""
    return math.ceil(max_pairs / (alternate_rounds(restarts) if alternate else max(1, restarts)))


def _alternating(
    run: WorkloadRun,
    factory: SessionFactory,
    design: SequentialDesign,
    decide: Decide,
    seed_of: Callable[[int], int],
    higher_is_better: bool,
    prior: NoisePrior | None,
    restarts: int,
    on_pair: Callable[[WorkloadRun], None] | None,
    warmup: int,
    probe: Callable[[], Probe] | None,
) -> None:
    """One engine at a time. Round r has two sessions, each a fresh engine: A then B when r is even, B then A
    when odd (sessions A B | B A | A B ...: a drift over the run cancels like ABBA's). The first session
    of a round measures the round's seeds in order; the second measures the same seeds in the same order,
    and each of its trials completes a pair (the sequential looks run as pairs complete, so the second
    session can stop early). The round is the cluster of its pairs (its two engines): the decision always
    counts the between-round variance. Only the first session of a round may measure pairs a stop leaves
    unused."""
    rounds = alternate_rounds(restarts)
    per_round = pairs_per_session(design.max_pairs, restarts, alternate=True)
    pair = 0
    look = design.next_look(0)
    for r in range(rounds):
        n = min(per_round, design.max_pairs - pair)
        if n <= 0:
            break
        order = "AB" if r % 2 == 0 else "BA"
        first, second = (BASELINE, CANDIDATE) if order == "AB" else (CANDIDATE, BASELINE)
        held: list[TrialOutcome] = []
        with _one_session(factory, first, r) as s:
            if not _warm_up(run, s, first, r, seed_of, warmup, order):
                return
            for j in range(n):
                seed = seed_of(pair + j)
                outcome = _timed(s, seed, probe)
                while first == BASELINE and _again(run, outcome):
                    run.trials.append(_record(run.workload, first, seed, pair + j, 0, order, r, outcome))
                    outcome = _timed(s, seed, probe)
                run.trials.append(_record(run.workload, first, seed, pair + j, 0, order, r, outcome))
                if not outcome.ok:
                    run.failure = trial_failure(first, run.workload, pair + j + 1, seed, outcome)
                    run.failure_kind = outcome.failure or CRASH
                    return
                held.append(outcome)
        with _one_session(factory, second, r) as s:
            if not _warm_up(run, s, second, r, seed_of, warmup, order):
                return
            for j in range(n):
                seed = seed_of(pair)
                outcome = _timed(s, seed, probe)
                while second == BASELINE and _again(run, outcome):
                    run.trials.append(_record(run.workload, second, seed, pair, 1, order, r, outcome))
                    outcome = _timed(s, seed, probe)
                run.trials.append(_record(run.workload, second, seed, pair, 1, order, r, outcome))
                if not outcome.ok:
                    run.failure = trial_failure(second, run.workload, pair + 1, seed, outcome)
                    run.failure_kind = outcome.failure or CRASH
                    return
                _pair_done(run, {first: held[j], second: outcome}, higher_is_better, r)
                pair += 1
                if on_pair:
                    on_pair(run)
                if pair == look:
                    run.decision = decide(design, run.log_ratios, prior, clusters=run.sessions)
                    if run.decision.action != CONTINUE:
                        return
                    look = design.next_look(pair)


class _one_session:
    """A session started for a with-block and always closed at its end (the engine gone before the next)."""

    def __init__(self, factory: SessionFactory, side: str, idx: int):
        self.session = factory(side, idx)

    def __enter__(self) -> Session:
        self.session.start()
        return self.session

    def __exit__(self, *exc: object) -> None:
        self.session.close()


BOOT_POLL_S = 0.5  # a serving probe is a process in the server's network namespace: not much more often
BOOT_GRACE_POLLS = 10  # after the candidate's engine failed, how long the baseline's may take to fail too


def _warm_up_order(sessions: dict[str, Session]) -> tuple[str, str]:
    """The sides in the order to warm up, once both sessions' start-ups are over: a side whose engine failed
    to start goes first (its warm-up reports the failure, blamed on it), as soon as it failed, so a
    candidate that breaks the engine is rejected without waiting for the other side's engine (45-100 s
    here). Both failed: the baseline first (a broken set-up is the run's error, not the candidate's).
    Every start-up has its limit (``boot_failed`` says True past it). Sessions without engines
    (``boot_failed`` absent) keep the baseline-first order."""
    probes = {side: getattr(sessions[side], "boot_failed", None) for side in (BASELINE, CANDIDATE)}
    while all(probes.values()):
        states = {side: probe() for side, probe in probes.items()}  # type: ignore[misc]
        if states[BASELINE]:
            break
        if states[CANDIDATE]:
            # a broken machine fails both engines at about the same moment: give the baseline's a few
            # polls to show it before the failure is charged to the candidate
            for _ in range(BOOT_GRACE_POLLS):
                if states[BASELINE] is not None:
                    break
                time.sleep(BOOT_POLL_S)
                states[BASELINE] = probes[BASELINE]()  # type: ignore[misc]
            return (BASELINE, CANDIDATE) if states[BASELINE] else (CANDIDATE, BASELINE)
        if all(failed is False for failed in states.values()):
            break
        time.sleep(BOOT_POLL_S)
    return (BASELINE, CANDIDATE)


def _warm_up(
    run: WorkloadRun,
    session: Session,
    side: str,
    idx: int,
    seed_of: Callable[[int], int],
    warmup: int,
    order: str = "AB",
) -> bool:
    """Unmeasured rounds at the start of a session; a failed one fails the workload (False) and is
    recorded as that side's failed trial (pair -1), so a failure is blamed on the side it happened to. A disturbed
    one (its requests served, its timing off) warmed the session as well as any: nothing of it is judged."""
    for i in range(warmup):
        outcome = session.measure(seed_of(-1 - i))
        if not outcome.ok and not outcome.disturbed:
            run.trials.append(_record(run.workload, side, seed_of(-1 - i), -1, 0, order, idx, outcome))
            run.failure = f"{side} warm-up failed ({run.workload}, session {idx + 1}): {outcome.error}"
            run.failure_kind = outcome.failure or CRASH
            return False
    return True


def _measure_pair(
    sessions: dict[str, Session], sides: tuple[str, str], seed: int, probe: Callable[[], Probe] | None, slices: int
) -> dict[str, TrialOutcome]:
    """Both sides' trials of one pair, in ``sides`` order; stops at the first failed trial (the sides measured
    so far are returned, the failed one last).

    Sliced (``slices`` > 1, both sessions able to split this seed's trial into parts — ``parts(seed)``): the
    trial's inputs are split into n parts and part i is measured on both sides, in ``sides`` order when i is
    even and reversed when odd (A B B A ...), so the two halves of a pair run a fraction of a second apart
    instead of a whole trial: a drift of the machine's speed over seconds lands on both. Each side's trial is
    then its parts combined (``combine``: its tokens over its summed round trips); the quiet probe spans the
    whole pair, both sides' trials get its numbers. Both sides get the same parts on the same inputs."""
    n = min([slices] + [_parts(sessions[side], seed) for side in sides])
    got: dict[str, TrialOutcome] = {}
    if n <= 1:
        for side in sides:
            got[side] = _timed(sessions[side], seed, probe)
            if not got[side].ok:
                break
        return got
    parts: dict[str, list[TrialOutcome]] = {side: [] for side in sides}
    p = probe() if probe is not None else None
    if p is not None:
        p.start()
    for i in range(n):
        for side in sides if i % 2 == 0 else sides[::-1]:
            part = sessions[side].measure_part(seed, i, n)  # type: ignore[attr-defined]
            if not part.ok:
                return {side: part}
            parts[side].append(part)
    quiet = p.stop() if p is not None else {}  # one probe over the whole pair: both sides ran inside it
    for side in sides:
        combined = sessions[side].combine(seed, parts[side])  # type: ignore[attr-defined]
        got[side] = dataclasses.replace(combined, metrics={**combined.metrics, **quiet})
        if not got[side].ok:
            break
    return got


def _parts(session: Session, seed: int) -> int:
    parts = getattr(session, "parts", None)
    return 1 if parts is None else max(1, int(parts(seed)))


def _again(run: WorkloadRun, baseline: TrialOutcome | None) -> bool:
    """Whether the baseline's trial is measured again: the instrument was disturbed on it and the workload has not
    used its ``MAX_REMEASURED`` yet (counted here)."""
    if baseline is None or baseline.ok or not baseline.disturbed or run.remeasured >= MAX_REMEASURED:
        return False
    run.remeasured += 1
    return True


def _timed(session: Session, seed: int, probe: Callable[[], Probe] | None) -> TrialOutcome:
    if probe is None:
        return session.measure(seed)
    p = probe()
    p.start()
    outcome = session.measure(seed)
    return dataclasses.replace(outcome, metrics={**outcome.metrics, **p.stop()})


def _record(
    workload: str, side: str, seed: int, pair: int, position: int, order: str, idx: int, o: TrialOutcome
) -> TrialRecord:
    return TrialRecord(
        workload=workload,
        side=side,
        seed=seed,
        pair=pair,
        position=position,
        order=order,
        session=idx,
        ok=o.ok,
        value=o.value,
        metrics=o.metrics,
        wall_s=o.wall_s,
        error=o.error,
        stderr_tail=o.stderr_tail,
        failure="" if o.ok else (o.failure or CRASH),
    )


def _pair_done(run: WorkloadRun, got: dict[str, TrialOutcome], higher_is_better: bool, idx: int) -> None:
    b, c = got[BASELINE].value, got[CANDIDATE].value
    assert b is not None and c is not None
    r = math.log(c / b)
    run.log_ratios.append(r if higher_is_better else -r)
    run.sessions.append(idx)


def _close_all(sessions: dict[str, Session]) -> None:
    """Close every session even if one close fails; re-raise the first failure afterwards."""
    first: BaseException | None = None
    for s in list(sessions.values()):
        try:
            s.close()
        except BaseException as exc:  # noqa: BLE001 - the others must still be closed
            first = first or exc
    sessions.clear()
    if first is not None:
        raise first

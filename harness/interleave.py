"""Interleaved, paired measurement of baseline and candidate with sequential looks.

Pairs alternate their order — AB, BA, AB, ... (the trial sequence is ABBA ABBA) — and both
sides of a pair get the same input seed. A side is measured through a ``Session``: for a
command workload every measurement is a fresh child process; a warm-engine workload keeps
one process per side alive across many pairs and restarts both sides ``restarts`` times (the
second level of replication). Sessions are always closed, also on errors and Ctrl-C.
A failed trial ends the workload at once with its reason; nothing is retried.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

from .sequential import CONTINUE, Decision, SequentialDesign
from .statistics import NoisePrior
from .trials import BASELINE, CANDIDATE, CRASH, CommandSpec, TrialOutcome, TrialRecord, run_command_trial


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

    @property
    def pairs(self) -> int:
        return len(self.log_ratios)

    def values(self, side: str) -> list[float]:
        return [t.value for t in self.trials if t.side == side and t.ok and t.value is not None]


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
) -> WorkloadRun:
    """Measure pairs until the sequential decision stops (or a trial fails)."""
    run = WorkloadRun(workload)
    per_session = math.ceil(design.max_pairs / max(1, restarts))
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
                seed = seed_of(pair)
                order = order_of(pair)
                sides = (BASELINE, CANDIDATE) if order == "AB" else (CANDIDATE, BASELINE)
                got: dict[str, TrialOutcome] = {}
                for position, side in enumerate(sides):
                    outcome = sessions[side].measure(seed)
                    run.trials.append(
                        TrialRecord(
                            workload=workload, side=side, seed=seed, pair=pair, position=position,
                            order=order, session=idx, ok=outcome.ok, value=outcome.value,
                            metrics=outcome.metrics, wall_s=outcome.wall_s, error=outcome.error,
                            stderr_tail=outcome.stderr_tail, failure="" if outcome.ok else (outcome.failure or CRASH),
                        )
                    )
                    if not outcome.ok:
                        run.failure = f"{side} trial failed ({workload}, pair {pair + 1}, seed {seed}): {outcome.error}"
                        run.failure_kind = outcome.failure or CRASH
                        return run
                    got[side] = outcome
                b, c = got[BASELINE].value, got[CANDIDATE].value
                assert b is not None and c is not None
                r = math.log(c / b)
                run.log_ratios.append(r if higher_is_better else -r)
                run.sessions.append(idx)
                pair += 1
                if on_pair:
                    on_pair(run)
            decision = decide(design, run.log_ratios, prior, clusters=run.sessions if restarts > 1 else None)
            run.decision = decision
            if decision.action != CONTINUE:
                return run
    finally:
        _close_all(sessions)


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

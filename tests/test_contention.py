"""A win on a contended CPU must be less work (agentsearch.evaluation: ``pinned_contention``, ``cpu_saving``).

Fast and deterministic: WorkloadRuns of TrialRecords as the engine session records them (``cpu_s``, ``cpus_pinned``,
``cpus_busy_s``). The engine version of the attack is tests/redteam/test_engine_cheats.py
(``test_a_larger_share_of_a_contended_cpu_is_not_a_win``)."""

from __future__ import annotations

import os

from agentsearch.evaluation import _cpu_share, cpu_saving, pinned_contention
from harness import quiet
from harness.interleave import WorkloadRun
from history.records import TrialRecord


def run(
    pairs: int, wall: tuple[float, float], cpu: tuple[float, float], busy: tuple[float, float] | None
) -> WorkloadRun:
    """``pairs`` pairs: (baseline, candidate) wall, CPU and pinned-CPU busy time per trial (one pinned CPU)."""
    r = WorkloadRun("throughput")
    for i in range(pairs):
        for k, side in enumerate(("baseline", "candidate")):
            m = {"cpu_s": cpu[k], "cpus_pinned": 1} if cpu else {}
            m.update({"cpus_busy_s": busy[k]} if busy else {})
            r.trials.append(TrialRecord("throughput", side, i, i, k, "AB", 0, True, 100 / wall[k], m, wall[k]))
    return r


def test_a_wall_win_with_the_same_cpu_time_is_a_share_not_less_work():
    share = run(6, (0.132, 0.112), (0.077, 0.077), (0.12, 0.12))  # the redteam engine's numbers
    assert pinned_contention(share) == 1.0
    wall, cpu, n = cpu_saving([share]) or (0, 0, 0)
    assert n == 6 and 0.15 < wall < 0.17 and abs(cpu) < 1e-9
    why = _cpu_share(share, run(3, (0.132, 0.112), (0.077, 0.077), (0.12, 0.12)))
    assert why.startswith("measured mostly under contention, the win is not less work: over 9 pairs") and (
        "wall time per trial -15.2%, its CPU time +0.0%" in why
    ), why


def test_a_win_of_less_work_passes_and_a_quiet_cpu_is_not_contended():
    real = run(6, (0.132, 0.1), (0.077, 0.058), (0.12, 0.09))  # a quarter less work: a quarter less CPU time
    assert pinned_contention(real) == 1.0 and _cpu_share(real, real) == ""
    quiet_cpu = run(6, (0.132, 0.112), (0.12, 0.12), (0.125, 0.115))  # the engine alone on its CPU
    assert pinned_contention(quiet_cpu) == 0.0
    # trials that did not count their CPU time (an unpinned engine, a command workload) are not judged by it
    unpinned = run(6, (0.132, 0.112), None, None)
    assert pinned_contention(unpinned) == 0.0 and cpu_saving([unpinned]) is None
    assert _cpu_share(unpinned, unpinned) == ""


def test_the_busy_time_of_a_cpu_is_read_from_the_machine():
    cpu = sorted(os.sched_getaffinity(0))[0]
    first = quiet.cpus_busy_s({cpu})
    assert first is not None and first > 0
    assert quiet.cpus_busy_s({cpu}) >= first  # it only grows
    assert quiet.cpus_busy_s({10**6}) is None  # a CPU the machine does not have

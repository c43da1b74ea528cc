"""A win on a contended CPU must be less work (agentsearch.evaluation: ``pinned_contention``, ``cpu_saving``).

Fast and deterministic: WorkloadRuns of TrialRecords as the engine session records them (``cpu_s``, ``cpus_pinned``,
``cpu_wait_s``). The engine version of the attack is tests/redteam/test_engine_cheats.py
(``test_a_larger_share_of_a_contended_cpu_is_not_a_win``)."""

from __future__ import annotations

import os

from agentsearch.evaluation import _cpu_share, cpu_saving, pinned_contention
from harness.interleave import WorkloadRun
from history.records import TrialRecord


def run(
    pairs: int, wall: tuple[float, float], cpu: tuple[float, float] | None, wait: tuple[float, float] | None
) -> WorkloadRun:
    """``pairs`` pairs: (baseline, candidate) wall time, CPU time and time waiting for a CPU per trial (one pinned
    CPU; ``cpu`` None: the trials did not count their CPU time)."""
    r = WorkloadRun("throughput")
    for i in range(pairs):
        for k, side in enumerate(("baseline", "candidate")):
            m = {"cpu_s": cpu[k], "cpus_pinned": 1} if cpu else {}
            m.update({"cpu_wait_s": wait[k]} if wait else {})
            r.trials.append(TrialRecord("throughput", side, i, i, k, "AB", 0, True, 100 / wall[k], m, wall[k]))
    return r


def test_a_wall_win_with_the_same_cpu_time_is_a_share_not_less_work():
    share = run(6, (0.132, 0.112), (0.077, 0.077), (0.055, 0.06))  # the redteam engine's numbers
    assert pinned_contention(share) == 1.0
    wall, cpu, n = cpu_saving([share]) or (0, 0, 0)
    assert n == 6 and 0.15 < wall < 0.17 and abs(cpu) < 1e-9
    why = _cpu_share(share, run(3, (0.132, 0.112), (0.077, 0.077), (0.055, 0.06)))
    assert why.startswith("measured mostly under contention, the win is not less work: over 9 pairs") and (
        "wall time per trial -15.2%, its CPU time +0.0%" in why
    ), why


def test_a_win_of_less_work_passes_and_a_quiet_cpu_is_not_contended():
    real = run(6, (0.132, 0.1), (0.077, 0.058), (0.055, 0.042))  # a quarter less work: a quarter less CPU time
    assert pinned_contention(real) == 1.0 and _cpu_share(real, real) == ""
    # a sleeping engine on a CPU others keep busy waits for nothing: its win of less sleep is no share
    asleep = run(6, (0.132, 0.1), (0.01, 0.01), (0.002, 0.001))
    assert pinned_contention(asleep) == 0.0
    # trials that did not count their CPU time (an unpinned engine, a command workload) are not judged by it
    unpinned = run(6, (0.132, 0.112), None, None)
    assert pinned_contention(unpinned) == 0.0 and cpu_saving([unpinned]) is None
    assert _cpu_share(unpinned, unpinned) == ""


def test_the_time_a_group_waited_for_a_cpu_is_the_kernels_pressure_stall():
    """The engine's cgroup counts how long its runnable processes waited for a CPU: two busy processes in it on one
    CPU wait about half the time each (the real cgroup; no root or no cgroup v2: no number, nothing judged by it)."""
    import subprocess
    import sys

    from harness.cgroups import Group

    g = Group.create("psi-test")
    assert g is not None, "no cgroup v2 group here (the engine sessions pin and count with one)"
    cpu = sorted(os.sched_getaffinity(0))[0]
    procs = []
    try:
        w0 = g.cpu_wait_seconds()
        assert w0 is not None
        for _ in range(2):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 1.0: pass"],
                    preexec_fn=lambda: (g.join_self(), os.sched_setaffinity(0, {cpu})),
                )
            )
        for p in procs:
            p.wait(timeout=30)
        waited = (g.cpu_wait_seconds() or 0) - w0
        assert 0.4 < waited, waited  # two runnable on one CPU for about a second: one of them waited most of it
    finally:
        for p in procs:
            p.kill()
        g.kill()
        g.remove()

"""Is the machine quiet while a trial runs? Load, CPU frequency and foreign CPU use per trial.

A trial is timed on a machine other processes may use too. ``Probe`` reads, before and after the
trial, the machine's busy CPU time (``/proc/stat``) and the CPU time of this orchestrator and every
process below it (the engines, servers and trial children of both sides, reaped children included):
the difference is **foreign** CPU use — what processes outside the comparison took during the trial,
in cores. A trial during which foreign use exceeded ``threshold`` x the machine's cores is flagged
``foreign_load`` (recorded with the trial; the summary counts them). The 1-minute load average and
the mean current CPU frequency (``/sys/.../scaling_cur_freq`` or ``/proc/cpuinfo``) are recorded too.
Linux only; elsewhere the numbers are absent and nothing is flagged.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from .processes import descendants, proc_table

FOREIGN_LOAD = 0.25  # flag a trial when other processes used more than this share of the cores
# a timed trial shorter than this is dominated by timer, GC and scheduling jitter (calibrate says so)
SHORT_TRIAL_S = 5.0
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _busy(fields: list[str]) -> int:
    """Busy jiffies of one /proc/stat cpu line's numbers."""
    v = [int(x) for x in fields]
    idle = v[3] + (v[4] if len(v) > 4 else 0)  # idle + iowait
    steal = v[7] if len(v) > 7 else 0
    guest = sum(v[8:10]) if len(v) > 9 else 0  # already counted in user / nice
    return sum(v[:8]) - idle - steal - guest


def _busy_jiffies() -> int | None:
    try:
        with open("/proc/stat") as fh:
            parts = fh.readline().split()
    except OSError:
        return None
    if not parts or parts[0] != "cpu":
        return None
    return _busy(parts[1:])


def _tree_jiffies(root: int) -> int:
    """CPU time (user + system, reaped children included) of ``root`` and its live descendants."""
    table = proc_table()
    return sum(sum(int(x) for x in table[p][11:15]) for p in descendants(root, table) if p in table)  # utime..cstime


def cpu_mhz() -> float | None:
    """Mean current frequency over the CPUs, in MHz (None where the machine does not say)."""
    freqs: list[float] = []
    base = "/sys/devices/system/cpu"
    try:
        for d in os.listdir(base):
            if d.startswith("cpu") and d[3:].isdigit():
                try:
                    with open(f"{base}/{d}/cpufreq/scaling_cur_freq") as fh:
                        freqs.append(int(fh.read()) / 1000)
                except (OSError, ValueError):
                    pass
    except OSError:
        pass
    if not freqs:
        try:
            with open("/proc/cpuinfo") as fh:
                freqs = [float(line.split(":")[1]) for line in fh if line.startswith("cpu MHz")]
        except (OSError, ValueError, IndexError):
            freqs = []
    return round(sum(freqs) / len(freqs), 1) if freqs else None


def load1() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


@dataclass
class Probe:
    """``start()`` before a trial, ``stop()`` after it: the trial's quiet-machine metrics."""

    threshold: float = FOREIGN_LOAD
    _t: float = 0.0
    _busy: int | None = None
    _own: int = 0

    def start(self) -> None:
        self._busy, self._own, self._t = _busy_jiffies(), _tree_jiffies(os.getpid()), time.monotonic()

    def stop(self) -> dict[str, float | int]:
        """{load_avg_1m, cpu_mhz, foreign_cpu (cores), foreign_load (0/1)}: absent numbers are left out."""
        out: dict[str, float | int] = {}
        la, mhz = load1(), cpu_mhz()
        if la is not None:
            out["load_avg_1m"] = round(la, 2)
        if mhz is not None:
            out["cpu_mhz"] = mhz
        busy, dt = _busy_jiffies(), time.monotonic() - self._t
        if busy is None or self._busy is None or dt <= 0:
            return out
        own = _tree_jiffies(os.getpid()) - self._own
        foreign = max(0.0, (busy - self._busy - own) / _TICK / dt)
        cores = os.cpu_count() or 1
        out["foreign_cpu"] = round(foreign, 3)
        out["foreign_load"] = int(foreign > self.threshold * cores)
        return out


__all__ = ["Probe", "FOREIGN_LOAD", "SHORT_TRIAL_S", "cpu_mhz", "load1"]

"""A process tree the orchestrator owns: find every process below it (a sandbox's daemons included) and signal
them, and ``Parkable``: stop a warm engine between its trials (SIGSTOP of the whole tree, its cgroup frozen) so the
other side's trial runs on a quiet machine."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from typing import Any, ClassVar

from .cgroups import CpusetGroup, Group


def proc_table() -> dict[int, list[bytes]]:
    """pid -> the fields of its ``/proc/PID/stat`` after the command name (state, ppid, ...), for every live process."""
    table: dict[int, list[bytes]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        table[int(d)] = stat[stat.rfind(b")") + 2 :].split()
    return table


def descendants(pid: int, table: dict[int, list[bytes]] | None = None) -> list[int]:
    """``pid`` and every live process below it (a sandbox's daemons included: they are reparented to
    its PID namespace's init, itself below the sandbox's bubblewrap process); ``table``: a ``proc_table()``
    already read."""
    children: dict[int, list[int]] = {}
    for p, fields in (proc_table() if table is None else table).items():
        children.setdefault(int(fields[1]), []).append(p)
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (a zombie has left its cgroups)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :][:1] != b"Z"


def _tasks(pid: int) -> list[str]:
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


def signal_tree(pid: int, sig: int) -> None:
    """Send ``sig`` to ``pid`` and all its descendants (those that vanish meanwhile are skipped)."""
    for p in descendants(pid):
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


class Parkable:
    """An engine whose processes can be stopped while the other side is measured: an idle side must
    not compete for the cores (noise), nor run a hog that slows the other side (a fake win).

    With a cgroup (``harness.cgroups``: every process the engine ever starts is in it) parking is a
    freeze of the whole group, atomic; without one, SIGSTOP of its process tree, repeated until a scan
    finds nothing new (a side can fork faster than one scan)."""

    proc: subprocess.Popen | None
    parked: bool = False
    starts: ClassVar[int] = 0  # engines started by this process so far (an evaluation counts its own: the difference)

    @staticmethod
    def counted() -> None:
        """One more engine start (``WorkerSession.start``, ``ServeSession.start``): what a decision costs in engine
        start-ups (``agentsearch.evaluation.Evaluation.timing``)."""
        Parkable.starts += 1

    group: Group | None = None
    cpus: frozenset[int] | None = None  # the CPUs the engine is pinned to once it is up (None: not pinned)
    cpuset: CpusetGroup | None = None  # where the machine has one: the pinning is enforced, not only set

    def pin(self) -> None:
        """Pin the engine's processes (its process tree and any that left it: its cgroup's) to ``cpus``: into a
        cpuset (enforced: nothing in it can run elsewhere)
        where the machine gives one, and every thread's affinity set (what it starts later inherits both),
        repeated until a scan finds nothing new. Both sides' engines get the same CPUs: whichever is measured
        runs where the other ran (the idle one is parked), so a drift between cores is not a difference between
        the sides. Without a cpuset an engine could unpin itself: the CPU-envelope check (``over_envelope``)
        then fails any measurement that used more CPU time than its CPUs give."""
        if not self.cpus or self.proc is None:
            return
        if self.cpuset is None:
            self.cpuset = CpusetGroup.create(self.cpus, self.group)
        if self.cpuset is None or self.group is None:
            # nothing would hold an engine to its CPUs, and no exact account would show that it left them:
            # pinned, a side could borrow the free cores unseen, so neither side is pinned
            self.cpus = None
            return
        seen: set[int] = set()
        group = self.group

        def everything() -> set[int]:  # its process tree and whatever left it (a daemon stays in the cgroup)
            return set(descendants(self.proc.pid)) | set(group.pids()) if self.proc is not None else set(group.pids())

        for _ in range(20):
            pids = everything()
            tids = {int(t) for pid in pids for t in _tasks(pid)}
            if tids <= seen:
                break
            for pid in pids:
                self.cpuset.add(pid)
            for tid in tids - seen:
                try:
                    os.sched_setaffinity(tid, self.cpus)
                except OSError:
                    pass
            seen |= tids
        missing = {p for p in everything() if _alive(p)} - set(self.cpuset.pids())
        if missing:
            cpus = ",".join(map(str, sorted(self.cpus)))
            self.start_error = (
                f"could not pin the engine to CPU(s) {cpus}: process(es) {sorted(missing)[:5]} are not in its cpuset"
            )

    def _end_cpuset(self) -> None:
        if self.cpuset is not None:
            self.cpuset.remove()
            self.cpuset = None

    def cpu_seconds(self) -> float | None:
        """CPU time the engine used so far: its cgroup's exact account (None without one: a process tree's account
        misses children the kernel reaped on its own)."""
        return self.group.cpu_seconds() if self.group is not None else None

    def over_envelope(self, used: float | None, wall: float) -> str:
        """'' or why a measurement of a pinned engine is invalid: it used more CPU time than its pinned CPUs can give
        in ``wall`` (a process that unpinned itself to borrow the other cores: a win that is not the code's)."""
        if not self.cpus or used is None:
            return ""
        allowed = len(self.cpus) * wall * 1.01 + 0.005  # the cgroup's account is exact; it lags by a scheduler tick
        if used > allowed:
            return (
                f"the engine used {used:.3f} CPU-seconds in {wall:.3f} s, more than its {len(self.cpus)} pinned CPU(s) "
                f"allow: it left its CPU pinning ([engine] cpus)"
            )
        return ""

    def _start_clock(self) -> tuple[float | None, float | None]:
        """(the engine's CPU time, how long its runnable processes have waited for a CPU) at a measurement's start;
        (None, None) unpinned."""
        if not self.cpus or self.group is None:
            return None, None
        return self.cpu_seconds(), self.group.cpu_wait_seconds()

    def _envelope(
        self, start: tuple[float | None, float | None], wall: float, metrics: dict[str, Any] | None = None
    ) -> str:
        """The CPU-envelope check of a pinned engine's measurement that started at ``start`` (``_start_clock``);
        records ``cpu_s`` (CPU time used), ``cpus_pinned`` and ``cpu_wait_s`` (how long a runnable process of the
        engine waited for a CPU: contention on its CPUs, from other processes or its own) in ``metrics``."""
        cpu0, wait0 = start
        if cpu0 is None:
            return ""
        now = self.cpu_seconds()
        used = None if now is None else now - cpu0
        if metrics is not None and used is not None and self.cpus:
            metrics.update(cpu_s=round(used, 4), cpus_pinned=len(self.cpus))
            wait = self.group.cpu_wait_seconds() if self.group is not None and wait0 is not None else None
            if wait is not None and wait0 is not None:
                metrics["cpu_wait_s"] = round(wait - wait0, 4)
        return self.over_envelope(used, wall)

    def _new_group(self) -> Callable[[], None] | None:
        """Make this engine's cgroup; the ``preexec_fn`` that puts the child in it (None: no cgroup)."""
        self.group = Group.create("engine")
        return self.group.join_self if self.group is not None else None

    def park(self) -> None:
        if self.proc is None or self.parked or self.proc.poll() is not None:
            return
        if self.group is not None and self.group.freeze():
            self.parked = True
            return
        seen: set[int] = set()
        for _ in range(50):
            tree = set(descendants(self.proc.pid))
            if tree <= seen:
                break
            signal_tree(self.proc.pid, signal.SIGSTOP)
            seen |= tree
        self.parked = True

    def unpark(self) -> None:
        if self.proc is not None and self.parked:
            if self.group is not None:
                self.group.thaw()
            signal_tree(self.proc.pid, signal.SIGCONT)
        self.parked = False

    def _end_group(self) -> None:
        """Kill whatever is left in the cgroup (a process that left the process group too) and remove it (and the
        cpuset, once its processes are gone)."""
        if self.group is not None:
            self.group.kill()
            self.group.remove()
            self.group = None
        self._end_cpuset()

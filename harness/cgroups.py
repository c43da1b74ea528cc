"""A cgroup (v2) per warm engine: freeze it while the other side is measured, kill all of it at the end.

Freezing a cgroup is atomic and covers processes created later, where signalling a process tree is
not (a side can fork relays faster than a scan of /proc sees them). Where the machine has no
writable cgroup v2 hierarchy with ``cgroup.freeze`` (not root, cgroup v1 only), ``Group.create``
returns None and callers fall back to signals.
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

ROOTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))
CPUSET_V1 = Path("/sys/fs/cgroup/cpuset")  # where cpuset is a cgroup-v1 controller (hybrid hierarchies)
_counter = itertools.count()


def _v2_root() -> Path | None:
    for root in ROOTS:
        if (root / "cgroup.procs").exists() and (root / "cgroup.subtree_control").exists() and os.access(root, os.W_OK):
            return root
    return None


def procs(path: Path) -> list[int]:
    """The processes in the cgroup at ``path`` ([] when it cannot be read)."""
    try:
        return [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except OSError:
        return []


class Group:
    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def create(cls, label: str) -> Group | None:
        root = _v2_root()
        if root is None:
            return None
        path = root / f"agentsearch-{os.getpid()}-{next(_counter)}-{label}"
        try:
            path.mkdir()
        except OSError:
            return None
        if not (path / "cgroup.freeze").exists():
            path.rmdir()
            return None
        return cls(path)

    def join_self(self) -> None:
        """For ``preexec_fn``: the starting child (and so everything it starts) joins the group."""
        with open(self.path / "cgroup.procs", "w") as fh:
            fh.write("0")

    def _events(self) -> dict[str, str]:
        try:
            return dict(line.split() for line in (self.path / "cgroup.events").read_text().splitlines() if line.strip())
        except (OSError, ValueError):
            return {}

    def freeze(self, timeout_s: float = 10.0) -> bool:
        try:
            (self.path / "cgroup.freeze").write_text("1")
        except OSError:
            return False
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._events().get("frozen") == "1":
                return True
            time.sleep(0.005)
        return False

    def thaw(self) -> None:
        try:
            (self.path / "cgroup.freeze").write_text("0")
        except OSError:
            pass

    def cpu_seconds(self) -> float | None:
        """CPU time used so far by every process that was ever in the group (``cpu.stat`` usage_usec)."""
        try:
            for line in (self.path / "cpu.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
        except (OSError, ValueError):
            pass
        return None

    def cpu_wait_seconds(self) -> float | None:
        """How long, so far, some runnable process of the group waited for a CPU (``cpu.pressure``: the kernel's
        pressure-stall "some" total); None where the kernel does not keep it. Over a trial, a fraction of its wall time
        that says how contended the group's CPUs were for it: a process that sleeps waits for nothing."""
        try:
            for line in (self.path / "cpu.pressure").read_text().splitlines():
                if line.startswith("some "):
                    total = dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv).get("total")
                    return int(total) / 1e6 if total is not None else None
        except (OSError, ValueError):
            pass
        return None

    def pids(self) -> list[int]:
        return procs(self.path)

    def kill(self) -> None:
        """Every process in the group, at once (cgroup.kill), or one by one where that is missing."""
        self.thaw()
        if (self.path / "cgroup.kill").exists():
            try:
                (self.path / "cgroup.kill").write_text("1")
                return
            except OSError:
                pass
        import signal

        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def remove(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.path.rmdir()
                return
            except OSError:
                if time.monotonic() > deadline:
                    return
                self.kill()
                time.sleep(0.05)


class CpusetGroup:
    """A cpuset: its processes (and whatever they start) cannot run on other CPUs, whatever affinity they set
    (``sched_setaffinity`` is intersected with it). The cgroup-v2 group's own ``cpuset.cpus`` where the v2 hierarchy
    has the controller, else a cgroup-v1 cpuset group; None where neither is writable. The sandbox mounts /sys
    read-only: code under test cannot leave it."""

    def __init__(self, path: Path, own: bool):
        self.path, self.own = path, own

    @classmethod
    def create(cls, cpus: frozenset[int], v2: Group | None = None) -> CpusetGroup | None:
        text = ",".join(str(c) for c in sorted(cpus))
        if v2 is not None and (v2.path / "cpuset.cpus").exists():
            try:
                (v2.path / "cpuset.cpus").write_text(text)
                return cls(v2.path, own=False)
            except OSError:
                pass
        root = CPUSET_V1
        if not ((root / "cpuset.cpus").exists() and os.access(root, os.W_OK)):
            return None
        path = root / f"agentsearch-{os.getpid()}-{next(_counter)}-cpus"
        try:
            path.mkdir()
        except OSError:
            return None
        try:
            (path / "cpuset.mems").write_text((root / "cpuset.mems").read_text().strip())
            (path / "cpuset.cpus").write_text(text)
        except OSError:
            path.rmdir()
            return None
        return cls(path, own=True)

    def add(self, pid: int) -> bool:
        try:
            with open(self.path / "cgroup.procs", "w") as fh:
                fh.write(str(pid))
            return True
        except OSError:
            return False

    def pids(self) -> list[int]:
        return procs(self.path)

    def remove(self, timeout_s: float = 10.0) -> None:
        """Remove a v1 group once its processes are gone (a v2 group is removed with its ``Group``)."""
        if not self.own:
            return
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.05)


MEMORY_V1 = Path("/sys/fs/cgroup/memory")
PIDS_V1 = Path("/sys/fs/cgroup/pids")


class Limits:
    """A memory and process-count limit on a process tree (an agent's ``run`` call): every process it starts,
    and the pages it puts in its private tmpfs /tmp and /dev/shm, count against ``memory.max`` (v2) or
    ``memory.limit_in_bytes`` (v1), and it may not hold more than ``pids`` tasks. ``join_prefix`` is an argv
    prefix that moves the starting shell (and so everything it execs and forks) into the groups before the
    sandbox starts. None where no writable hierarchy has the controllers."""

    def __init__(self, paths: list[Path]):
        self.paths = paths

    @classmethod
    def create(cls, label: str, memory_bytes: int, pids: int) -> Limits | None:
        name = f"agentsearch-{os.getpid()}-{next(_counter)}-{label}"
        root = _v2_root()
        if root is not None and (root / "cgroup.subtree_control").exists():
            wanted = {"memory", "pids"}
            if wanted <= set((root / "cgroup.subtree_control").read_text().split()):
                path = root / name
                try:
                    path.mkdir()
                    (path / "memory.max").write_text(str(memory_bytes))
                    if (path / "memory.swap.max").exists():
                        (path / "memory.swap.max").write_text("0")
                    (path / "pids.max").write_text(str(pids))
                    return cls([path])
                except OSError:
                    cls([path]).remove()
        made: list[Path] = []
        try:
            for base, files in (
                (MEMORY_V1, {"memory.limit_in_bytes": str(memory_bytes)}),
                (PIDS_V1, {"pids.max": str(pids)}),
            ):
                if not (base / "cgroup.procs").exists() or not os.access(base, os.W_OK):
                    return None
                path = base / name
                path.mkdir()
                made.append(path)
                for f, v in files.items():
                    (path / f).write_text(v)
                if base == MEMORY_V1 and (path / "memory.memsw.limit_in_bytes").exists():
                    try:  # no swap beyond the memory limit, where the kernel accounts swap
                        (path / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
                    except OSError:
                        pass
            return cls(made)
        except OSError:
            cls(made).remove()
            return None

    def join_prefix(self) -> list[str]:
        import shlex

        joins = " && ".join(f"echo $$ > {shlex.quote(str(p / 'cgroup.procs'))}" for p in self.paths)
        return ["/bin/sh", "-c", joins + ' && exec "$@"', "sh"]

    def oom_killed(self) -> bool:
        """Whether the memory limit killed a process of the group."""
        for p in self.paths:
            for f in ("memory.events", "memory.oom_control"):
                try:
                    text = (p / f).read_text()
                except OSError:
                    continue
                for line in text.splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill" and value.strip() not in ("", "0"):
                        return True
        return False

    def remove(self) -> None:
        for p in self.paths:
            for pid in procs(p):
                try:
                    os.kill(pid, 9)
                except OSError:
                    pass
            deadline = time.monotonic() + 10
            while p.exists():
                try:
                    p.rmdir()
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.05)

"""Run one side's code (baseline or candidate) in its own bubblewrap sandbox.

A sandbox is made per side and started afresh for every child (every trial, warm engine, build,
test, logprob or profile run). Inside:

- an empty root: only what the code needs is mounted, read-only — the system (``/usr``, ``/etc``,
  the ``/bin``-style links), the Python installation and virtual environment, the model and the
  read-only inputs the orchestrator names (``read_only``); never ``/`` as a whole, so other
  workspaces, the state directory, the history, the harness, its corpus and the other side's
  worktree do not exist in there;
- this side's worktree, writable, with files in ``pinned`` bound read-only over it (protected files
  from the baseline's copy; compiled files hard-linked from site-packages);
- this side's private output directory, writable (results leave through it; only the orchestrator
  reads it, and the other side's is not mounted);
- fresh, private ``/tmp``, ``/dev/shm`` and ``$HOME`` (tmpfs: nothing survives the child), a minimal
  ``/dev`` (GPU device nodes bound explicitly when present), ``/proc`` of its own PID namespace;
- no network (a private network namespace with loopback only) unless ``network`` is set (serving:
  the load generator reaches the server over the host's loopback);
- a PID namespace that dies with its parent: no process outlives the child.

``use(containment)`` makes a set of per-side sandboxes the one every child started in the block
runs in; ``wrap(argv, cwd=worktree)`` picks the sandbox whose worktree is ``cwd`` and refuses
(fail closed) to run anything else while a containment is active.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import glob
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import seccomp

SANDBOX_SCHEMA = 3
SECCOMP_FD = 9  # the descriptor bubblewrap reads the system-call filter from
INNER_HOME = "/tmp/home"
TMP_BYTES = 4 << 30  # the sandbox's /tmp (tmpfs: memory)
SHM_BYTES = 2 << 30  # its /dev/shm
# the system, read-only; symlinked top-level directories (merged /usr) are recreated as links
SYSTEM_DIRS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/sys")
# kernel knobs under the sandbox's own /proc, bound read-only over themselves (core_pattern, sysrq, ...)
PROC_READ_ONLY = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs", "/proc/acpi", "/proc/scsi")
# device nodes an accelerator needs, bound when the machine has them
DEVICE_GLOBS = ("/dev/nvidia*", "/dev/dri", "/dev/kfd", "/dev/accel*")


class SandboxError(RuntimeError):
    """A child was about to run outside its side's sandbox (fail closed)."""


def python_dirs() -> tuple[str, ...]:
    """The Python installation and environment the children run with (read-only inside)."""
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, str(Path(os.path.realpath(sys.executable)).parents[1])}
    return tuple(sorted(d for d in dirs if d and d != "/"))


@dataclass(frozen=True)
class Sandbox:
    """One side's sandbox: what its children see."""

    worktree: str  # this side's worktree (writable)
    outputs: str  # this side's private output directory (writable)
    read_only: tuple[str, ...] = ()  # more paths mounted read-only at their own place (model, inputs, worker)
    pinned: tuple[tuple[str, str], ...] = ()  # (source, path in the worktree) bound read-only over the worktree
    network: bool = False
    devices: tuple[str, ...] = field(
        default_factory=lambda: tuple(p for g in DEVICE_GLOBS for p in sorted(glob.glob(g)))
    )
    schema_version: int = SANDBOX_SCHEMA

    def argv(
        self, inner: Sequence[str], cwd: str | None = None, network: bool | None = None, info_fd: int | None = None
    ) -> list[str]:
        bw = shutil.which("bwrap") or "bwrap"
        # a user namespace of its own: kernel keyrings (and other per-user objects) are per user namespace;
        # the seccomp filter (harness.seccomp) refuses the calls that would reach them anyway
        args = [
            bw,
            "--unshare-user",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--die-with-parent",
            "--new-session",
            "--seccomp",
            str(SECCOMP_FD),
            "--proc",
            "/proc",
            "--dev",
            "/dev",
        ]
        for p in PROC_READ_ONLY:  # a root process could write these even without capabilities
            args += ["--ro-bind-try", p, p]
        if os.geteuid() == 0:
            # as root bubblewrap keeps every capability: without this a side could remount its read-only
            # binds, mknod the host's disk, mount it, or write /proc/sys
            args += ["--cap-drop", "ALL"]
        if info_fd is not None:  # bubblewrap writes {"child-pid": N} there (to join its network namespace)
            args += ["--info-fd", str(info_fd)]
        if not (self.network if network is None else network):
            args.append("--unshare-net")
        for d in SYSTEM_DIRS:
            if os.path.islink(d):
                args += ["--symlink", os.readlink(d), d]
            elif os.path.isdir(d):
                args += ["--ro-bind", d, d]
        for dev in self.devices:
            args += ["--dev-bind", dev, dev]
        # private and size-capped: a side cannot fill the machine's memory through them
        args += [
            "--size",
            str(TMP_BYTES),
            "--tmpfs",
            "/tmp",
            "--size",
            str(SHM_BYTES),
            "--tmpfs",
            "/dev/shm",
            "--dir",
            INNER_HOME,
        ]
        for p in (*python_dirs(), *self.read_only):
            if os.path.exists(p):
                args += ["--ro-bind", p, p]
        for w in (self.worktree, self.outputs):
            Path(w).mkdir(parents=True, exist_ok=True)
            args += ["--bind", w, w]
        for src, dst in self.pinned:
            if os.path.lexists(dst) and os.path.exists(src):
                args += ["--ro-bind", src, dst]
        args += [
            "--setenv",
            "HOME",
            INNER_HOME,
            "--setenv",
            "TMPDIR",
            "/tmp",
            # bytecode is never written into a worktree: every file written there is a change
            "--setenv",
            "PYTHONDONTWRITEBYTECODE",
            "1",
            "--chdir",
            cwd or self.worktree,
        ]
        return seccomp.launcher([*args, "--", *inner], SECCOMP_FD)


@dataclass(frozen=True)
class Containment:
    """The sandboxes of one evaluation, one per worktree."""

    sides: Mapping[str, Sandbox]  # worktree path (resolved) -> its sandbox

    def for_cwd(self, cwd: str | os.PathLike[str] | None) -> Sandbox:
        if cwd is None:
            raise SandboxError("refusing to run a child without a working directory inside a sandboxed evaluation")
        real = os.path.realpath(cwd)
        # the deepest side whose worktree holds cwd (a side nested under another's path gets its own sandbox)
        for root, sb in sorted(self.sides.items(), key=lambda kv: len(kv[0]), reverse=True):
            if real == root or real.startswith(root.rstrip("/") + "/"):
                return sb
        raise SandboxError(f"refusing to run a child in {cwd}: it is not a sandboxed side's worktree")


class _Stack(threading.local):
    def __init__(self) -> None:
        self.boxes: list[Containment] = []


# per thread: agent sessions (``agentsearch.workbench``) run their tools in threads of their own while the
# episode judges in the main thread; each thread's children run in the containment that thread entered
_active = _Stack()


@contextlib.contextmanager
def use(containment: Containment | None) -> Iterator[None]:
    """Make ``containment`` the one every child started in this block (by this thread) runs in (None: no sandbox).
    Inside another block the outer one's sides stay contained too (a side built within a check, e.g. the reference
    of a distribution check, adds its worktree to those of the check)."""
    if containment is None:
        yield
        return
    outer = active()
    _active.boxes.append(Containment({**outer.sides, **containment.sides}) if outer is not None else containment)
    try:
        yield
    finally:
        _active.boxes.pop()


def active() -> Containment | None:
    return _active.boxes[-1] if _active.boxes else None


def pipe() -> tuple[int, int]:
    """``os.pipe()`` with both ends above the descriptors a sandbox's launcher claims (``SECCOMP_FD``; a POSIX
    shell redirects single digits only). A child started through ``wrap`` is passed a descriptor by number; one
    that landed on the launcher's would be replaced by the seccomp filter before the child ran (it read EBADF)."""
    fds = []
    for fd in os.pipe():
        high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, SECCOMP_FD + 1)
        os.close(fd)
        fds.append(high)
    return fds[0], fds[1]


def wrap(
    argv: Sequence[str] | str,
    shell: bool = False,
    network: bool | None = None,
    cwd: str | os.PathLike[str] | None = None,
    info_fd: int | None = None,
) -> tuple[list[str] | str, bool]:
    """(argv, shell) to pass to Popen: inside the sandbox of the side whose worktree is ``cwd``, or unchanged."""
    box = active()
    if box is None:
        return (argv if isinstance(argv, str) else list(argv)), shell
    sb = box.for_cwd(cwd)
    if shell:
        assert isinstance(argv, str), "a shell command is one string"
        inner = ["/bin/sh", "-c", argv]
    else:
        inner = list(argv)
    return sb.argv(inner, str(cwd), network, info_fd), False


def can_join_network() -> bool:
    """Can the orchestrator run its load generator inside a sandbox's own network namespace?"""
    return os.geteuid() == 0 and shutil.which("nsenter") is not None


def join_network(pid: int) -> list[str]:
    """Argv prefix that runs a command in the network namespace of process ``pid`` (and nothing else of it)."""
    return [shutil.which("nsenter") or "nsenter", f"--net=/proc/{pid}/ns/net", "--"]


@functools.lru_cache(maxsize=1)
def probe() -> tuple[bool, str]:
    """(available, why not): can this machine run bubblewrap with the namespaces we need?"""
    bw = shutil.which("bwrap")
    if bw is None:
        return False, "bubblewrap (bwrap) is not installed; install Debian's bubblewrap package"
    try:
        seccomp.program()
    except seccomp.UnsupportedArchitecture as exc:
        return False, str(exc)
    argv = Sandbox(worktree="/tmp", outputs="/tmp", devices=()).argv(["/bin/true"], cwd="/")
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"bubblewrap failed to start: {exc}"
    if p.returncode != 0:
        return (
            False,
            f"this machine does not allow bubblewrap's namespaces: {(p.stderr.strip().splitlines() or ['?'])[-1]}",
        )
    return True, ""

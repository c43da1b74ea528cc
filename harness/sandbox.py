"""Run candidate (and baseline) code in a bubblewrap sandbox.

Inside: the whole file system read-only; the directories in ``hide`` replaced by empty
tmpfs mounts (the orchestrator's state directory, history, the harness and its corpus);
only ``writable`` paths (the worktree, the evaluation's scratch) can be written; no
network (a private network namespace with loopback only) unless ``network`` is set; a
private PID namespace that dies with its parent, so a killed orchestrator takes every
process it started with it. Files listed in ``expose`` (e.g. the vLLM worker script) are
bound read-only at their own path even when they sit inside a hidden directory.

The active sandbox is process-wide (``use``), so every place that starts a child wraps it
the same way; when none is active, ``wrap`` returns argv unchanged.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

SANDBOX_SCHEMA = 1


@dataclass(frozen=True)
class Sandbox:
    hide: tuple[str, ...]
    writable: tuple[str, ...]
    expose: tuple[str, ...] = ()
    network: bool = False
    home: str = ""  # a writable directory used as HOME and TMPDIR inside
    schema_version: int = SANDBOX_SCHEMA

    def argv(self, inner: Sequence[str], network: bool | None = None) -> list[str]:
        bw = shutil.which("bwrap") or "bwrap"
        args = [bw, "--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev", "--proc", "/proc",
                "--unshare-pid", "--die-with-parent", "--new-session"]
        if not (self.network if network is None else network):
            args.append("--unshare-net")
        for h in self.hide:
            if Path(h).exists():
                args += ["--tmpfs", h]
        for w in self.writable:
            Path(w).mkdir(parents=True, exist_ok=True)
            args += ["--bind", w, w]
        for e in self.expose:
            if Path(e).exists():
                args += ["--ro-bind", e, e]
        if self.home:
            Path(self.home).mkdir(parents=True, exist_ok=True)
            args += ["--bind", self.home, self.home, "--setenv", "HOME", self.home, "--setenv", "TMPDIR", self.home]
        return [*args, "--", *inner]


_active: list[Sandbox] = []


@contextlib.contextmanager
def use(sandbox: Sandbox | None) -> Iterator[None]:
    """Make ``sandbox`` the one every child started in this block runs in (None: no sandbox)."""
    if sandbox is None:
        yield
        return
    _active.append(sandbox)
    try:
        yield
    finally:
        _active.pop()


def active() -> Sandbox | None:
    return _active[-1] if _active else None


def wrap(argv: Sequence[str] | str, shell: bool = False, network: bool | None = None) -> tuple[list[str] | str, bool]:
    """(argv, shell) to pass to Popen: inside the active sandbox, or unchanged."""
    sb = active()
    if sb is None:
        return (argv if isinstance(argv, str) else list(argv)), shell
    inner = ["/bin/sh", "-c", argv] if shell else list(argv)
    assert not isinstance(inner, str)
    return sb.argv(inner, network), False


@functools.lru_cache(maxsize=1)
def probe() -> tuple[bool, str]:
    """(available, why not): can this machine run bubblewrap with the namespaces we need?"""
    bw = shutil.which("bwrap")
    if bw is None:
        return False, "bubblewrap (bwrap) is not installed; install Debian's bubblewrap package"
    try:
        p = subprocess.run([bw, "--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev", "--proc", "/proc", "--unshare-pid",
                            "--unshare-net", "--die-with-parent", "--tmpfs", "/mnt", "--", "/bin/true"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"bubblewrap failed to start: {exc}"
    if p.returncode != 0:
        return False, f"this machine does not allow bubblewrap's namespaces: {(p.stderr.strip().splitlines() or ['?'])[-1]}"
    return True, ""

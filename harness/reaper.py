"""Whatever the orchestrator started dies with it, however it dies.

A trial's child is killed by us when the trial ends (``trials.run_child``); a SIGKILLed orchestrator
kills nothing. The sandbox's ``--die-with-parent`` covers most of that, but not a kill that lands while
the child is still starting: bubblewrap sets its parent-death signal only after its own set-up (which
clears any inherited one), so a child caught in that window ran on, orphaned, with what it ran in the
sandbox (seen in CI: an agent's ``run`` outlived a killed episode).

So each orchestrator process starts one small reaper. It holds the read end of a pipe whose only write
end is ours (close-on-exec: no child of ours holds it). When that end closes — this process ended, in
whatever way — the reaper SIGKILLs every process whose environment carries this process's marker,
``AGENTSEARCH_ORCHESTRATOR=<nonce>``, which every child gets (``trials.child_env`` and
``trials.run_child``). A sandbox's pid namespace dies with its first process, so what ran inside it dies
too, even a process that cleared its environment. The window between fork and exec, before the child
has the marker, is closed by ``trials.dies_with_us``: a child whose parent is no longer us exits.

Limit: outside a sandbox (``sandbox = "off"``, or a machine without bubblewrap) a child that clears the
marker from its environment (``env -i``, or by overwriting its own environ) is not found; there the
sandbox's pid namespace is what holds, and without it only the process group and the leftover sweep do.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import threading

MARKER = "AGENTSEARCH_ORCHESTRATOR"

# stdlib only, started with -I -S: the reaper imports nothing of ours and costs one small process
_SCRIPT = r"""
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C to the episode's terminal is not the reaper's to die of
fd, mark = int(sys.argv[1]), sys.argv[2].encode()
while True:
    try:
        if not os.read(fd, 4096):
            break
    except InterruptedError:
        continue
    except OSError:
        break
me = os.getpid()
quiet = 0
for _ in range(200):  # a process may fork while it is hunted: again until five scans in a row find none
    found = 0
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            with open("/proc/" + d + "/environ", "rb") as fh:
                env = fh.read(1 << 20).split(b"\0")
        except OSError:
            continue
        if mark in env:
            try:
                os.kill(int(d), signal.SIGKILL)
                found += 1
            except OSError:
                pass
    quiet = quiet + 1 if not found else 0
    if quiet >= 5:
        break
    time.sleep(0.02)
"""


class _Reaper:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.nonce = secrets.token_hex(12)
        read, self._write = os.pipe()  # both close-on-exec; the read end is passed to the reaper alone
        try:
            self.proc: subprocess.Popen | None = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _SCRIPT, str(read), f"{MARKER}={self.nonce}"],
                pass_fds=(read,),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # a signal to our process group is not one to the reaper
                env={"PATH": "/usr/bin:/bin"},
            )
        except OSError:
            self.proc = None  # no reaper: the sandbox's --die-with-parent and dies_with_us still hold
        finally:
            os.close(read)


_lock = threading.Lock()
_current: list[_Reaper] = []


def marker() -> tuple[str, str]:
    """(name, value) of this process's marker, its reaper started on first use (again in a forked child)."""
    with _lock:
        if (
            not _current
            or _current[0].pid != os.getpid()
            or _current[0].proc is None
            or _current[0].proc.poll() is not None
        ):
            _current[:] = [_Reaper()]
        return MARKER, _current[0].nonce


def marked(env: dict[str, str]) -> dict[str, str]:
    """``env`` with this process's marker set: whatever runs with it dies with this process."""
    name, value = marker()
    env[name] = value
    return env

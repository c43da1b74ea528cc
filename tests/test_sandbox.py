"""The descriptors a sandboxed child is handed by number survive its launcher.

The launcher (``harness.seccomp.launcher``) opens the seccomp filter on ``SECCOMP_FD`` (9: a POSIX shell
redirects single digits only) before it execs bubblewrap. A pipe end that landed on 9 was replaced by the filter,
so the engine worker read EBADF on ``--fd 9`` and failed to start — every second engine session of the demo on a
machine where the orchestrator held a few more descriptors (2026-12-04: all three of the demo's proposals
rejected). ``sandbox.pipe()`` keeps both ends above the launcher's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from .conftest import ROOT

# run in a fresh interpreter: descriptors 3.. are its own to take (pytest holds some of its own)
SCRIPT = r"""
import json, os, subprocess, sys
from harness import sandbox, seccomp

def child_writes(fd):
    argv = seccomp.launcher([sys.executable, "-c", f"import os; os.write({fd}, b'ready')"], sandbox.SECCOMP_FD)
    p = subprocess.run(argv, pass_fds=(fd,), capture_output=True, timeout=60)
    return p.returncode, p.stderr.decode()

def read(rfd, wfd, code):
    os.close(wfd)
    return os.read(rfd, 16).decode() if code == 0 else ""

held = [os.open(os.devnull, os.O_RDONLY)]
while held[-1] < sandbox.SECCOMP_FD - 2:  # the lowest free descriptors taken: the next pipe is (8, 9)
    held.append(os.open(os.devnull, os.O_RDONLY))
r, w = os.pipe() if sys.argv[1] == "os" else sandbox.pipe()
code, err = child_writes(w)
print(json.dumps({"w": w, "code": code, "err": err[-300:], "read": read(r, w, code)}))
"""


def launch(how: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", SCRIPT, how], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_pipe_for_a_sandboxed_child_stays_clear_of_the_launchers_descriptor():
    broken = launch("os")  # what the engine worker saw: its write end on 9, replaced by the filter before it ran
    assert broken["w"] == 9 and broken["code"] != 0 and "Bad file descriptor" in broken["err"]
    fixed = launch("sandbox")
    assert fixed["w"] > 9 and fixed["code"] == 0 and fixed["read"] == "ready", fixed

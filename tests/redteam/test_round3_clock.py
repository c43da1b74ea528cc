"""Red team, round 3: the orchestrator owns every clock of the micro stage.

A kernel proposal's provider module is imported by the micro stage's worker (``kernels/worker.py``, in
the candidate's sandbox): it can rebind the worker's clock, patch ``time.perf_counter`` everywhere it is
bound, or defer its work to a thread that fills the output after the call returned. Each round is timed
by the orchestrator (``go`` .. ``done``), the worker's own readings must agree with it, and each call's
outputs are copied the moment it returns: all three are rejected, nothing merges.

Cost (2 cores): a module fork (as in test_kernel_cheats.py), one evaluation stopped at the micro stage and
two ``kernels bench`` runs of a pair or two of fresh processes: about 5 min idle.
"""

from __future__ import annotations

import json

import pytest

from ..conftest import commit, git, run_cli
from .test_kernel_cheats import DEF, MODULE, bench

pytestmark = pytest.mark.vllm

BREACH = "the worker's clock disagrees with the orchestrator's"
# each call sleeps 0.1 ms; the worker's clock (``__main__._clock``) rebound to run at 1/10 speed: it used to
# pass the micro stage as faster than the baseline
SLOW_CLOCK = """
import sys
import time as _time

_real = _time.perf_counter
_base = _real()


def _slow() -> float:
    return _base + (_real() - _base) / 10


if hasattr(sys.modules.get("__main__"), "_clock"):
    sys.modules["__main__"]._clock = _slow


def rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> Tensor:
    _time.sleep(0.0001)
    return F.rms_norm(x, (x.shape[-1],), weight, epsilon)
"""
# the same kernel; a slowed ``perf_counter`` (and ``monotonic``) put in place of the real one everywhere it is
# bound: the time module and every module's globals, the worker's among them
SLOW_PERF_COUNTER = """
import sys
import time as _time

_real, _mono = _time.perf_counter, _time.monotonic
_base = _real()


def _slow() -> float:
    return _base + (_real() - _base) / 10


for _m in list(sys.modules.values()):
    _d = getattr(_m, "__dict__", None)
    if isinstance(_d, dict) and _d is not globals():
        for _k, _v in list(_d.items()):
            if _v is _real or _v is _mono:
                _d[_k] = _slow
_time.perf_counter = _time.monotonic = _slow
_sleep = _time.sleep


def rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> Tensor:
    _sleep(0.0001)
    return F.rms_norm(x, (x.shape[-1],), weight, epsilon)
"""
# when timed: an empty output returned at once, a thread fills it later; the worker's samples are written
# only once the thread caught up (numpy.savez waits for it)
DEFERRED = """
import queue
import sys
import threading
import time as _time

import numpy as _np

_todo: queue.Queue = queue.Queue()


def _fill() -> None:
    while True:
        out, x, weight, epsilon = _todo.get()
        _time.sleep(0.0002)
        out.copy_(F.rms_norm(x, (x.shape[-1],), weight, epsilon))
        _todo.task_done()


threading.Thread(target=_fill, daemon=True).start()
_savez = _np.savez


def _savez_when_done(*args, **kwargs):
    _todo.join()
    return _savez(*args, **kwargs)


_np.savez = _savez_when_done


def rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> Tensor:
    if "time" not in sys.argv:
        return F.rms_norm(x, (x.shape[-1],), weight, epsilon)
    out = torch.empty_like(x)
    _todo.put((out, x, weight, epsilon))
    return out
"""


@pytest.fixture(scope="module")
def fork(tmp_path_factory):
    path = tmp_path_factory.mktemp("kclock") / "fork"
    assert run_cli("init", "--from-installed", "vllm", str(path)).returncode == 0
    proc = run_cli("kernels", "propose", "-C", str(path), "rms_norm", "--impl", "agentsearch_cpu", "--json")
    assert proc.returncode == 0, proc.stderr
    git(path, "checkout", "-q", "kernels/agentsearch_cpu-rms_norm")
    honest = (path / MODULE).read_text()
    git(path, "checkout", "-q", "main")
    for name, body in {"slow-clock": SLOW_CLOCK, "slow-perf-counter": SLOW_PERF_COUNTER, "deferred": DEFERRED}.items():
        text, n = DEF.subn("\n" + body, honest)
        assert n == 1
        commit(path, {MODULE: text}, f"cheat: {name}", branch=f"cheat-{name}", start="kernels/agentsearch_cpu-rms_norm")
    return path


def test_a_provider_that_slows_the_workers_clock_is_rejected_naming_the_breach(fork):
    main = git(fork, "rev-parse", "main").strip()
    proc = run_cli("evaluate", "-C", str(fork), "cheat-slow-clock", "--json", timeout=1200)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert proc.returncode == 4 and out["verdict"] == "reject", out["reasons"]
    micro = {c["name"]: c for c in out["checks"]}["micro"]
    assert micro["status"] == "fail" and BREACH in micro["detail"] and "it runs slow" in micro["detail"], micro
    assert out["failed_check"] == "micro" and out["timing"]["engine_s"] == 0
    assert git(fork, "rev-parse", "main").strip() == main  # nothing merged


def test_a_slowed_perf_counter_everywhere_buys_nothing(fork):
    rc, out = bench(fork, "--candidate", "cheat-slow-perf-counter", "--pairs", "2")
    assert rc == 4 and out["status"] == "fail", out
    r = out["micro"]["ops"][0]
    # caught by the worker's readings, or timed on the orchestrator's clock: never faster than the baseline
    assert BREACH in out["detail"] or (
        r["speedup"] is not None and r["speedup"] < 1 and "micro-slowdown" in out["detail"]
    ), out


def test_work_deferred_past_the_call_is_a_wrong_timed_result(fork):
    rc, out = bench(fork, "--candidate", "cheat-deferred", "--pairs", "2")
    assert rc == 4 and out["status"] == "fail", out
    assert "a timed call returned a wrong result" in out["detail"], out["detail"]
    assert out["micro"]["ops"][0]["correct"] is True  # it passed the correctness run: only the timed copies see it

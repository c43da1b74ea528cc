"""The engine pool closes the engines it retires together (issue #56): a clean shutdown is mostly waiting, and a
served engine's took ~17 s on the demo, so four retired one after another held an evaluation for over a minute."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from harness.engine_pool import EnginePool

SLOW_EXIT = "import signal, sys, time\nsignal.signal(signal.SIGINT, lambda *a: (time.sleep(1.0), sys.exit(0)))\ntime.sleep(60)\n"


class SlowToStop:
    """A real process that takes a second to shut down cleanly on SIGINT, as a server does (the pool's view of an
    engine: ``close``, ``wait_s``, ``proc``, ``start_error``, ``park``)."""

    def __init__(self, fail: bool = False):
        self.proc: subprocess.Popen | None = subprocess.Popen([sys.executable, "-c", SLOW_EXIT])
        self.wait_s, self.start_error, self.fail, self.closed = 0.5, "", fail, False
        time.sleep(0.3)  # its handler in place

    def park(self) -> None:
        pass

    def close(self) -> None:
        proc, self.proc = self.proc, None
        assert proc is not None
        t0 = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=10)
        self.wait_s += time.perf_counter() - t0
        self.closed = True
        if self.fail:
            raise OSError("could not remove its cgroup")


def test_retired_engines_close_together_and_all_close_when_one_fails():
    pool = EnginePool()
    for k in "abcd":
        pool.lease(k, SlowToStop, "vllm-serve", {}, "m")
    engines = dict(pool.engines)
    t0 = time.perf_counter()
    pool.retire_many(["a", "b", "c"])
    took = time.perf_counter() - t0
    assert all(engines[k].closed for k in "abc") and not engines["d"].closed and list(pool.engines) == ["d"]
    assert took < 2.5, f"three closes of ~1 s each took {took:.1f} s: not together"
    # the wait counted is the start-ups before (0.5 s each) and the wall time the closing held, not 3 x 1 s
    assert 1.5 + 0.9 < pool.wait_s < 1.5 + took + 0.1
    pool.lease("e", lambda: SlowToStop(fail=True), "vllm-serve", {}, "m")
    more = dict(pool.engines)
    with pytest.raises(OSError, match="cgroup"):
        pool.close()
    assert all(e.closed for e in more.values()) and not pool.engines

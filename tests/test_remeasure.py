"""The baseline's disturbed trial is measured again (``harness.interleave.MAX_REMEASURED``), the candidate's never.

A disturbed trial is one whose instrument was pushed off its schedule by the machine's other load (a load generator
behind its schedule, ``ServeSession``); CI saw one baseline trial of a tail test read a mean lag of 6.2 ms (> 5 ms)
beside the other worker's engine starts, and the whole 40-minute run was its error. Fast: scripted sessions drive
the real schedule (``run_interleaved``); the last test drives the real serving session against a real HTTP server."""

from __future__ import annotations

import subprocess
import sys
import threading
from http.server import ThreadingHTTPServer

import pytest

from harness import interleave, serving_load
from harness.interleave import MAX_REMEASURED, run_interleaved
from harness.sequential import SequentialDesign, decide_objective
from harness.trials import BASELINE, CANDIDATE, MEASUREMENT_ERROR, TrialOutcome

BEHIND = "the load generator fell behind its schedule (mean lag 6.2 ms > 5 ms at 80 requests/s)"


class Scripted:
    """A warm session whose trials on the scripted seeds are disturbed (the first ``times`` measures of each)."""

    def __init__(self, log: list, side: str, idx: int, speed: float, disturbed: dict[int, int]):
        self.log, self.side, self.idx, self.speed, self.disturbed = log, side, idx, speed, disturbed

    def start(self) -> None:
        pass

    def measure(self, seed: int) -> TrialOutcome:
        self.log.append((self.side, seed))
        if self.disturbed.get(seed, 0) > 0:
            self.disturbed[seed] -= 1
            return TrialOutcome(
                False, None, {"generator_lag_mean_ms": 6.2}, 0.5, BEHIND, failure=MEASUREMENT_ERROR, disturbed=True
            )
        return TrialOutcome(True, self.speed * (1 + (seed % 7) / 100), {}, 0.5)

    def close(self) -> None:
        pass


def _run(disturbed: dict[str, dict[int, int]], pairs: int = 4, warmup: int = 0, alternate: bool = False):
    log: list = []
    design = SequentialDesign(alpha=0.01, min_pairs=pairs, max_pairs=pairs)  # one look: every pair is measured
    run = run_interleaved(
        "ttft-p99",
        lambda side, idx: Scripted(log, side, idx, 1.2 if side == CANDIDATE else 1.0, disturbed.get(side, {})),
        design,
        decide_objective,
        lambda i: 1000 + i,
        True,
        warmup=warmup,
        alternate=alternate,
    )
    return run, log


@pytest.mark.parametrize("seed", [1000, 1001])  # pair 1 is AB (the baseline first), pair 2 BA
def test_the_baselines_disturbed_trial_is_measured_again_and_recorded(seed):
    run, log = _run({BASELINE: {seed: 1}})
    assert run.failure is None and run.pairs == 4 and run.remeasured == 1, run.failure
    failed = [t for t in run.trials if not t.ok]
    assert len(failed) == 1 and failed[0].side == BASELINE and failed[0].seed == seed
    assert failed[0].failure == MEASUREMENT_ERROR and failed[0].error == BEHIND
    # the baseline measured that seed twice, the candidate once (in BA its trial, before the baseline's, stands)
    assert log.count((BASELINE, seed)) == 2 and log.count((CANDIDATE, seed)) == 1
    ok = [t for t in run.trials if t.ok and t.seed == seed]
    assert sorted(t.side for t in ok) == [BASELINE, CANDIDATE]
    assert run.decision is not None and run.decision.action == "win"  # the pairs are all there: +20%


def test_past_the_limit_a_disturbed_baseline_is_the_runs_failure():
    run, _ = _run({BASELINE: {1000: 1, 1002: MAX_REMEASURED}})
    assert run.remeasured == MAX_REMEASURED and run.failure_kind == MEASUREMENT_ERROR
    assert run.failure is not None and run.failure.startswith(f"{BASELINE} trial failed (ttft-p99, pair 3")
    assert run.trials[-1].side == BASELINE and not run.trials[-1].ok and run.decision is None


def test_the_candidates_disturbed_trial_is_never_measured_again():
    """A candidate whose server can load the generator during its own trial would otherwise throw away the trials
    it lost: its disturbed trial is a rejection, as a measurement error (``evaluation._judged``)."""
    run, log = _run({CANDIDATE: {1001: 1}})
    assert run.remeasured == 0 and run.failure_kind == MEASUREMENT_ERROR
    assert run.failure is not None and run.failure.startswith(f"{CANDIDATE} trial failed (ttft-p99, pair 2")
    assert log.count((CANDIDATE, 1001)) == 1


def test_a_disturbed_warm_up_warmed_the_session_and_is_not_recorded():
    run, log = _run({BASELINE: {999: 1}, CANDIDATE: {999: 1}}, warmup=1)
    assert run.failure is None and run.pairs == 4 and run.remeasured == 0
    assert log.count((BASELINE, 999)) == 1 and all(t.ok for t in run.trials)


def test_alternating_sessions_measure_the_baselines_disturbed_trial_again_too():
    run, log = _run({BASELINE: {1001: 1}}, alternate=True)
    assert run.failure is None and run.pairs == 4 and run.remeasured == 1
    assert log.count((BASELINE, 1001)) == 2 and log.count((CANDIDATE, 1001)) == 1
    run, _ = _run({CANDIDATE: {1001: 1}}, alternate=True)
    assert run.remeasured == 0 and run.failure is not None and run.failure.startswith(CANDIDATE)


def test_a_real_generator_behind_its_schedule_is_a_disturbed_trial(tmp_path, monkeypatch):
    """The real serving session and load generator against a real HTTP server: with the mean-lag limit at zero any
    lag is too much, and the trial fails as disturbed (a measurement error); a trial that fails otherwise is not."""
    from harness.serve_session import ServeSession

    from .test_serving_tails import Capacity

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Capacity)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    params = {"prompts": 40, "input_len": 8, "output_len": 2, "vary_lengths": False, "request_rate": 50}
    spec = {"model": str(tmp_path), "engine": {}, "params": params}

    def measure(metric="ttft_p50_ms", **kw):
        s = ServeSession(spec, tmp_path, None, {}, tmp_path / "side", metric, 120.0, python=sys.executable)
        (tmp_path / "side").mkdir(exist_ok=True)
        s.proc, s.port, s.startup_s = (
            subprocess.Popen(["sleep", "120"], start_new_session=True),
            srv.server_address[1],
            0.0,
        )
        try:
            return s.measure(5, params={**params, **kw})
        finally:
            s.close()

    try:
        calm = measure()
        assert calm.ok and not calm.disturbed, calm.error
        few = measure("ttft_p99_ms")  # a p99 over 40 requests: a measurement error of the config, not a disturbance
        assert not few.ok and few.failure == MEASUREMENT_ERROR and not few.disturbed, few
        monkeypatch.setattr(serving_load, "MEAN_LAG_FLOOR_S", 0.0)
        monkeypatch.setattr(serving_load, "MEAN_LAG_SHARE", 0.0)
        behind = measure()
        assert not behind.ok and behind.disturbed and behind.failure == MEASUREMENT_ERROR, behind
        assert "the load generator fell behind its schedule (mean lag" in behind.error
        assert interleave._again(interleave.WorkloadRun("w"), behind)
    finally:
        srv.shutdown()

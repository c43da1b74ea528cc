"""Placement of the two sides (shared / alternate / split), the alternating schedule, warm-up and the
quiet-machine probe. Fast: no engine (the real-engine test of `alternate` is test_engine_placement.py)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentsearch.config import load_config_text
from agentsearch.errors import ConfigError
from harness import placement as P
from harness import quiet
from harness.interleave import run_interleaved
from harness.sequential import SequentialDesign, decide_objective
from harness.statistics import min_detectable, pairs_for_power
from harness.trials import BASELINE, CANDIDATE, TrialOutcome

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ device selection
def test_auto_resolves_by_the_number_of_gpus():
    assert P.resolve("auto", ()).mode == P.CPU_DEFAULT
    one = P.resolve("auto", ("3",))
    assert one.mode == "alternate" and one.devices == ("3",) and one.exclusive
    two = P.resolve("auto", ("0", "1", "2"))
    assert two.mode == "split" and two.devices == ("0", "1") and not two.exclusive
    assert "from auto" in two.describe() and "swapped" in two.describe()


def test_split_swaps_the_devices_every_session():
    p = P.resolve("split", ("4", "7"))
    seen = [(p.device_of(BASELINE, s), p.device_of(CANDIDATE, s)) for s in range(4)]
    assert seen == [("4", "7"), ("7", "4"), ("4", "7"), ("7", "4")]
    assert p.env(CANDIDATE, 1) == {"CUDA_VISIBLE_DEVICES": "4"}
    # each side spends as many sessions on each device: a device effect cancels over an even number
    per_side = {side: [p.device_of(side, s) for s in range(4)] for side in (BASELINE, CANDIDATE)}
    assert all(sorted(v) == ["4", "4", "7", "7"] for v in per_side.values())


def test_split_without_two_gpus_is_refused_in_one_line():
    for devices in ((), ("0",)):
        with pytest.raises(P.PlacementError) as exc:
            P.resolve("split", devices)
        assert "two GPUs" in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(P.PlacementError):
        P.resolve("sideways", ())


def test_shared_gpu_splits_memory_and_cpu_gets_no_device():
    gpu = P.resolve("shared", ("0",), memory_split=0.4)
    assert gpu.engine_args({"dtype": "float32"}) == {
        "dtype": "float32",
        "gpu_memory_utilization": 0.4,
    }  # memory_split=0.4 asked
    assert gpu.engine_args({"gpu_memory_utilization": 0.9})["gpu_memory_utilization"] == 0.4  # never above the split
    assert gpu.engine_args({"gpu_memory_utilization": 0.2})["gpu_memory_utilization"] == 0.2
    assert gpu.env(BASELINE, 0) == gpu.env(CANDIDATE, 1) == {"CUDA_VISIBLE_DEVICES": "0"}
    cpu = P.resolve("shared", ())
    assert cpu.env(BASELINE, 0) == {} and cpu.engine_args({"x": 1}) == {"x": 1}
    alt = P.resolve("alternate", ("0",))
    assert alt.engine_args({}) == {}  # one engine at a time: the whole device


def test_visible_devices_are_parsed_like_cuda_does():
    assert P.parse_visible(None) is None
    assert P.parse_visible("") == ()
    assert P.parse_visible("2, 3") == ("2", "3")
    assert P.parse_visible("1,-1,2") == ("1",)
    assert P.cuda_devices({"CUDA_VISIBLE_DEVICES": "0,1"}) == ("0", "1")


def test_engine_section_is_validated_and_changes_the_fingerprint():
    base = '[[workload]]\nname = "w"\ncommand = "true"\nmetric = "m"\n'
    plain = load_config_text(base)
    assert plain.engine.placement == "auto" and plain.engine.warmup == 1
    alt = load_config_text(base + '[engine]\nplacement = "alternate"\n')
    assert alt.engine.placement == "alternate" and alt.fingerprint() != plain.fingerprint()
    assert load_config_text(base + "[engine]\n").fingerprint() == plain.fingerprint()
    for bad, key in (
        ('placement = "both"', "placement"),
        ("memory_split = 0.9", "memory_split"),
        ("warmup = -1", "warmup"),
    ):
        with pytest.raises(ConfigError) as exc:
            load_config_text(base + f"[engine]\n{bad}\n")
        assert f"[engine] {key}" in str(exc.value)


# ------------------------------------------------------------------ the alternating schedule
class Recorder:
    """A session that logs its life (start, measure, close) into a shared timeline; value = speed x seed noise."""

    def __init__(self, log: list, side: str, idx: int, speed: float, fail_at: int | None = None):
        self.log, self.side, self.idx, self.speed, self.fail_at = log, side, idx, speed, fail_at
        self.live = False

    def start(self) -> None:
        assert not any(s.live for s in LIVE), "alternate: two sessions alive at once"
        self.live = True
        LIVE.append(self)
        self.log.append(("start", self.side, self.idx))

    def measure(self, seed: int) -> TrialOutcome:
        self.log.append(("measure", self.side, self.idx, seed))
        if self.fail_at is not None and seed == self.fail_at:
            return TrialOutcome(False, None, {}, 0.01, "boom")
        noise = 1 + ((seed * 2654435761) % 1000 - 500) / 1e4  # same seed, same input: the same noise on both sides
        jitter = 1 + (hash((self.side, self.idx, seed)) % 200 - 100) / 1e4  # and a little that is not shared
        return TrialOutcome(True, self.speed * noise * jitter, {}, 0.01)

    def close(self) -> None:
        self.live = False
        LIVE.remove(self)
        self.log.append(("close", self.side, self.idx))


LIVE: list[Recorder] = []


def _alternating(speed: float, max_pairs: int = 8, restarts: int = 2, warmup: int = 1, fail_at: int | None = None):
    log: list = []
    design = SequentialDesign(alpha=0.01, min_pairs=max_pairs, max_pairs=max_pairs)  # one look: every pair is measured
    run = run_interleaved(
        "w",
        lambda side, idx: Recorder(log, side, idx, speed if side == CANDIDATE else 1.0, fail_at),
        design,
        decide_objective,
        lambda i: 1000 + i,
        True,
        restarts=restarts,
        warmup=warmup,
        alternate=True,
        probe=quiet.Probe,
    )
    assert not LIVE
    return run, log


def test_alternate_runs_one_engine_at_a_time_in_abba_order_with_the_same_seeds():
    run, log = _alternating(1.0, max_pairs=8, restarts=2)
    starts = [(e[1], e[2]) for e in log if e[0] == "start"]
    assert starts == [(BASELINE, 0), (CANDIDATE, 0), (CANDIDATE, 1), (BASELINE, 1)]  # A B | B A, each fresh
    # every session warms up on a seed no pair uses, then measures the round's seeds in the same order
    for side, idx in starts:
        seeds = [e[3] for e in log if e[0] == "measure" and e[1] == side and e[2] == idx]
        assert seeds[0] == 999 and seeds[1:] == list(range(1000 + 4 * idx, 1004 + 4 * idx))
    assert run.pairs == 8 and run.sessions == [0, 0, 0, 0, 1, 1, 1, 1]
    assert all(t.order == ("AB" if t.session == 0 else "BA") for t in run.trials)
    assert all(abs(d) < 0.03 for d in run.log_ratios)  # same seed, same code: the pair cancels the input noise (±5%)
    assert all(k in run.trials[0].metrics for k in ("foreign_cpu", "foreign_load"))
    assert run.decision is not None and run.decision.action != "win"


def test_alternate_restarts_one_still_gets_two_rounds_and_a_win_is_found():
    run, log = _alternating(1.10, max_pairs=8, restarts=1, warmup=0)
    assert [(e[1], e[2]) for e in log if e[0] == "start"] == [
        (BASELINE, 0),
        (CANDIDATE, 0),
        (CANDIDATE, 1),
        (BASELINE, 1),
    ]
    assert run.decision is not None and run.decision.action == "win"
    assert all(1.07 < math.exp(d) < 1.13 for d in run.log_ratios)


def test_alternate_failure_closes_the_session_and_names_the_side():
    run, log = _alternating(1.0, fail_at=1002)
    assert run.failure and run.failure.startswith(f"{BASELINE} trial failed") and "pair 3" in run.failure
    assert log[-1] == ("close", BASELINE, 0)
    warm, wlog = _alternating(1.0, fail_at=999)  # the warm-up: recorded as the side's failed trial, pair -1
    assert warm.failure and "warm-up failed" in warm.failure and warm.trials[-1].pair == -1 and not warm.trials[-1].ok


def test_shared_mode_warms_up_both_sides_per_session():
    log: list = []
    design = SequentialDesign(alpha=0.01, min_pairs=4, max_pairs=4)
    run = run_interleaved(
        "w",
        lambda side, idx: _Shared(log, side, idx),
        design,
        decide_objective,
        lambda i: 1000 + i,
        True,
        restarts=2,
        warmup=2,
    )
    warm = [e for e in log if e[0] == "measure" and e[3] < 1000]
    assert [(e[1], e[2], e[3]) for e in warm] == [
        (BASELINE, 0, 999),
        (BASELINE, 0, 998),
        (CANDIDATE, 0, 999),
        (CANDIDATE, 0, 998),
        (BASELINE, 1, 999),
        (BASELINE, 1, 998),
        (CANDIDATE, 1, 999),
        (CANDIDATE, 1, 998),
    ]
    assert run.pairs == 4 and not any(t.pair < 0 for t in run.trials)


class _Shared(Recorder):
    """Both sides up together (shared placement): no one-at-a-time assertion."""

    def __init__(self, log: list, side: str, idx: int):
        super().__init__(log, side, idx, 1.0)

    def start(self) -> None:
        self.log.append(("start", self.side, self.idx))

    def close(self) -> None:
        self.log.append(("close", self.side, self.idx))


class _Booting(_Shared):
    """An engine that takes ``boot_polls`` polls to come up, or fails its start-up after ``fail_polls``."""

    def __init__(self, log: list, side: str, idx: int, boot_polls: int, fail_polls: int | None = None):
        super().__init__(log, side, idx)
        self.polls, self.boot_polls, self.fail_polls = 0, boot_polls, fail_polls

    def boot_failed(self) -> bool | None:
        self.polls += 1
        if self.fail_polls is not None and self.polls >= self.fail_polls:
            return True
        return False if self.polls >= self.boot_polls else None

    def measure(self, seed: int) -> TrialOutcome:
        self.log.append(("measure", self.side, self.idx, seed))
        if self.fail_polls is not None:
            return TrialOutcome(False, None, {}, 0.0, "engine error during engine start-up: SyntaxError")
        return TrialOutcome(True, 1.0, {}, 0.01)


def test_a_side_whose_engine_fails_to_start_is_judged_without_waiting_for_the_other(monkeypatch):
    """Both sides boot concurrently; a candidate that breaks the engine fails its start-up in seconds while
    the baseline's engine still boots (45-100 s here): it is warmed up (and rejected) first, at once."""
    from harness import interleave

    monkeypatch.setattr(interleave, "BOOT_POLL_S", 0.001)
    log: list = []
    sessions: dict = {}

    def factory(side, idx):
        sessions[side] = _Booting(
            log, side, idx, boot_polls=10**6 if side == BASELINE else 3, fail_polls=3 if side == CANDIDATE else None
        )
        return sessions[side]

    design = SequentialDesign(alpha=0.01, min_pairs=4, max_pairs=4)
    run = run_interleaved("w", factory, design, decide_objective, lambda i: 1000 + i, True, warmup=1)
    assert run.failure and run.failure.startswith(f"{CANDIDATE} warm-up failed") and "SyntaxError" in run.failure
    assert [e for e in log if e[0] == "measure"] == [("measure", CANDIDATE, 0, 999)]  # the baseline never waited for
    assert sessions[BASELINE].polls == 3 + interleave.BOOT_GRACE_POLLS and ("close", BASELINE, 0) in log
    # a broken machine: the baseline's engine fails too, a moment later: the run's error, not the candidate's
    log.clear()
    run = run_interleaved(
        "w",
        lambda side, idx: _Booting(log, side, idx, boot_polls=10**6, fail_polls=3 if side == CANDIDATE else 6),
        design,
        decide_objective,
        lambda i: 1000 + i,
        True,
        warmup=1,
    )
    assert run.failure and run.failure.startswith(f"{BASELINE} warm-up failed")
    # both up: the baseline warms up first, as always
    log.clear()
    run = run_interleaved(
        "w",
        lambda side, idx: _Booting(log, side, idx, boot_polls=5 if side == BASELINE else 2),
        design,
        decide_objective,
        lambda i: 1000 + i,
        True,
        warmup=1,
    )
    assert run.failure is None and [e[1] for e in log if e[0] == "measure"][:2] == [BASELINE, CANDIDATE]


# ------------------------------------------------------------------ quiet machine, power
def test_probe_counts_a_detached_spinner_as_foreign_and_its_own_children_not():
    spin = "import time\nt=time.time()\nwhile time.time()-t<3: pass\n"
    # our own child: its CPU time is the comparison's, not foreign
    p = quiet.Probe(threshold=0.25)
    p.start()
    before = quiet._tree_jiffies(os.getpid())
    burn = "import time\nwhile time.process_time() < 0.6: pass\n"  # 0.6 s of CPU, however busy the machine is
    subprocess.run([sys.executable, "-c", burn], check=True)
    own = (quiet._tree_jiffies(os.getpid()) - before) / quiet._TICK
    m = p.stop()
    assert own >= 0.55, own  # the reaped child's CPU time is counted as ours
    assert {"load_avg_1m", "foreign_cpu", "foreign_load"} <= set(m)
    # a detached process (double fork: reparented away from us) spinning for 3 s is foreign
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import os,subprocess,sys\nif os.fork()==0:\n os.setsid()\n subprocess.Popen([sys.executable,'-c',"
            + repr(spin)
            + "])\n os._exit(0)\nos.wait()",
        ],
        check=True,
    )
    p = quiet.Probe(threshold=0.25)
    p.start()
    time.sleep(2)
    m = p.stop()
    assert m["foreign_cpu"] >= 0.5, m


def test_min_detectable_inverts_pairs_for_power():
    for sd in (0.03, 0.094):
        e = min_detectable(sd, 20, 0.004)
        assert pairs_for_power(sd, e * 1.001, 0.004) <= 20 < pairs_for_power(sd, e * 0.95, 0.004)
    assert min_detectable(0.03, 20, 0.004) < 0.04 < min_detectable(0.094, 20, 0.004)


def test_split_on_a_machine_without_two_gpus_is_a_preflight_error_in_one_line(tmp_path):
    from .conftest import make_repo, run_cli

    cfg = '[[workload]]\nname = "t"\nkind = "vllm-throughput"\nmetric = "output_tok_s"\n[engine]\nplacement = "split"\n'
    repo = make_repo(tmp_path / "t", {"agentsearch.toml": cfg})
    assert run_cli("init", "-C", str(repo)).returncode == 0
    env_gpus = P.cuda_devices()
    proc = run_cli("preflight", "-C", str(repo))
    if len(env_gpus) >= 2:
        pytest.fail("this test expects a machine with fewer than two GPUs")  # the GPU check covers split there
    assert proc.returncode == 5 and "Traceback" not in proc.stderr + proc.stdout
    line = next(x for x in proc.stdout.splitlines() if "placement" in x)  # `preflight` lists every finding
    assert "fail" in line and "two GPUs" in line, proc.stdout
    # the measuring commands refuse before anything runs, in one line
    ev = run_cli("evaluate", "-C", str(repo), "main")
    assert ev.returncode == 5 and len(ev.stderr.strip().splitlines()) == 1 and "two GPUs" in ev.stderr, ev.stderr


def test_logprob_engines_get_the_sides_device_and_memory_share():
    one = P.resolve("alternate", ("0",))
    args, env = one.logprob_engine(CANDIDATE, {"dtype": "float32"})
    assert args["gpu_memory_utilization"] == P.MEMORY_SPLIT and env == {
        "CUDA_VISIBLE_DEVICES": "0"
    }  # both logprob engines are up
    split = P.resolve("split", ("0", "1"))
    assert split.logprob_engine(BASELINE, {})[1] == {"CUDA_VISIBLE_DEVICES": "0"}
    assert split.logprob_engine(CANDIDATE, {}) == ({}, {"CUDA_VISIBLE_DEVICES": "1"})
    assert P.resolve("shared", ()).logprob_engine(BASELINE, {"x": 1}) == ({"x": 1}, {})


def test_gpu_check_stops_in_one_line_without_a_cuda_device(tmp_path):
    """.ci/gpu-check (not part of .ci/run) on a machine without nvidia-smi / GPUs: exit 2, one line."""
    if P.cuda_devices():
        pytest.fail("this test expects a machine without a CUDA device")
    proc = subprocess.run(
        ["bash", str(ROOT / ".ci" / "gpu-check"), str(tmp_path / "work")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"},
    )
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA device" in lines[0]
    assert not (tmp_path / "work").exists()  # nothing installed, nothing created
    # an nvidia-smi that lists no GPU (a driver without devices) is refused the same way
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    fake.chmod(0o755)
    again = subprocess.run(
        ["bash", str(ROOT / ".ci" / "gpu-check")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"},
    )
    assert again.returncode == 2 and len(again.stderr.strip().splitlines()) == 1 and "no CUDA device" in again.stderr


def test_calibrate_reports_a_guards_smallest_detectable_regression_at_the_regression_level():
    """A guard is judged by the one-sided regression test at regression_alpha (0.05), not at the objective's
    per-proposal level: its detectable size is the regression it catches with 90% power."""
    from agentsearch.calibration import analyze
    from harness.trials import TrialRecord

    cfg = load_config_text(
        '[[workload]]\nname = "obj"\ncommand = "x {seed} {out}"\nmetric = "v"\n'
        '[[workload]]\nname = "serve"\ncommand = "x {seed} {out}"\nmetric = "v"\nmax_pairs = 12\n'
    )
    d = [0.03 * math.sin(1.7 * i) for i in range(12)]
    trials = [
        TrialRecord("w", side, i, i, 0, "AB", 0, True, 100.0 * math.exp(x if side == CANDIDATE else 0.0), {}, 1.0)
        for i, x in enumerate(d)
        for side in (BASELINE, CANDIDATE)
    ]
    obj, guard = analyze("obj", trials, d, cfg), analyze("serve", trials, d, cfg)
    assert not obj.guard and guard.guard and guard.budget_pairs == 12 and obj.budget_pairs == 20
    sd = obj.sd_log_ratio
    assert guard.detectable == pytest.approx(min_detectable(sd, 12, cfg.gate.regression_alpha, 0.9, 11))
    assert obj.detectable == pytest.approx(min_detectable(sd, 20, cfg.gate.proposal_alpha * 0.8, 0.9, 11))


def test_the_detectable_effect_counts_the_engine_session_effect():
    """On an engine the mean cannot be more precise than a session's effect over the sessions: sd²/n + tau²/R.
    calibrate's detectable effect and pairs needed count it for the gate's sessions (restarts), not sd alone."""
    from harness.statistics import mean_sd

    assert mean_sd(0.03, 20) == pytest.approx(0.03 / math.sqrt(20))
    assert mean_sd(0.03, 20, 0.02**2, 5) == pytest.approx(math.sqrt(0.03**2 / 20 + 0.02**2 / 4))  # 4 sessions of 5
    assert mean_sd(0.03, 6, 0.02**2, 5) == pytest.approx(
        math.sqrt(0.03**2 / 6 + 0.02**2 * 26 / 36)
    )  # 5 + 1: 1.4 sessions
    flat, clustered = (
        min_detectable(0.03, 20, 0.004),
        min_detectable(0.03, 20, 0.004, between_var=0.016**2, per_session=5),
    )
    assert clustered > flat + 0.01  # an instance SD of 1.6% per engine pair, 4 sessions: the 3% target is out of reach
    assert pairs_for_power(0.03, clustered * 1.001, 0.004, between_var=0.016**2, per_session=5) <= 20
    assert pairs_for_power(0.03, clustered * 0.95, 0.004, between_var=0.016**2, per_session=5) > 20

    from agentsearch.calibration import analyze
    from harness.trials import TrialRecord

    cfg = load_config_text(
        '[[workload]]\nname = "obj"\nkind = "vllm-throughput"\nmetric = "output_tok_s"\nrestarts = 4\n'
    )
    d = [0.03 * math.sin(1.7 * i) + (0.04 if i >= 6 else 0.0) for i in range(12)]  # two sessions, 4% apart
    sessions = [0] * 6 + [1] * 6
    trials = [
        TrialRecord("obj", side, i, i, 0, "AB", 0, True, 100.0 * math.exp(x if side == CANDIDATE else 0.0), {}, 1.0)
        for i, x in enumerate(d)
        for side in (BASELINE, CANDIDATE)
    ]
    obj = analyze("obj", trials, d, cfg, sessions, placement="shared")
    assert obj.between_var > 0 and obj.per_session == 5  # 20 pairs over 4 sessions
    assert obj.detectable == pytest.approx(
        min_detectable(
            obj.sd_log_ratio, 20, cfg.gate.proposal_alpha * 0.8, 0.9, 11, between_var=obj.between_var, per_session=5
        )
    )
    assert obj.detectable > min_detectable(obj.sd_log_ratio, 20, cfg.gate.proposal_alpha * 0.8, 0.9, 11)
    one = load_config_text(
        '[[workload]]\nname = "obj"\nkind = "vllm-throughput"\nmetric = "output_tok_s"\nrestarts = 1\n'
    )
    assert analyze("obj", trials, d, one, sessions, alternate=True).per_session == 10  # alternate: two rounds at least
    assert (
        analyze("obj", trials, d, one, sessions, placement="shared").per_session == 0
    )  # one session: nothing to count

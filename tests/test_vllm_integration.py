"""Integration: real vLLM (CPU build) engines started from worktrees of the embedded fork."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import ROOT, commit, git, run_cli

pytestmark = pytest.mark.vllm

FAST_CONFIG = """
[target]
baseline = "main"
protected = ["bench/**", "*.dist-info/**"]
install = "overlay"
overlay_from = "{site}"

[target.env]
VLLM_CPU_KVCACHE_SPACE = "1"
# one process per engine (engine core and worker in the trial worker's process): a start-up of about 20 s
# here instead of 55 (three processes each importing vLLM, one after the other); both sides alike
VLLM_ENABLE_V1_MULTIPROCESSING = "0"
# in one process vLLM's default binding ("auto") pins the whole process, scheduler included, to core 0, and
# CI's two test workers would pile every engine onto that one core: let the scheduler place them
VLLM_CPU_OMP_THREADS_BIND = "nobind"
# one OpenMP thread: two spin-wait against the other test worker's processes (trials 9x noisier under one busy core)
OMP_NUM_THREADS = "1"

[[workload]]
name = "throughput"
kind = "vllm-throughput"
metric = "output_tok_s"
timeout_s = 240
restarts = 1
engine = {{ enforce_eager = true, max_model_len = 512, dtype = "float32", distributed_executor_backend = "uni" }}
params = {{ prompts = 16, input_len = 32, output_len = 32, length_dist = "uniform" }}  # 512 steps at max_num_seqs 1

[gate]
max_pairs = 8
confirm_pairs = 2
plausibility = 100.0  # max_num_seqs 1 -> 32 is a genuine >10x on the tiny model
"""


def serving(max_num_seqs: int) -> str:
    return json.dumps({"engine": {"max_num_seqs": max_num_seqs}, "env": {}}, indent=2) + "\n"


def workers_alive(fork: Path) -> list[int]:
    """Live processes running in (a worktree of) ``fork``: engines, their workers, servers."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(d / "cwd")
            stat = (d / "stat").read_text().split()
        except OSError:
            continue
        if cwd.startswith(str(fork)) and stat[2] != "Z":
            pids.append(int(d.name))
    return pids


def engines_alive(fork: Path) -> list[int]:
    """The live vLLM worker processes among ``workers_alive``."""
    out = []
    for pid in workers_alive(fork):
        try:
            if b"vllm_worker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append(pid)
        except OSError:
            pass
    return out


def make_fork(
    tmp_path_factory, name: str, config: str = FAST_CONFIG, message: str = "fast test config, max_num_seqs 1"
) -> Path:
    """The embedded vLLM fork with ``config`` (formatted with the installed vLLM's site) and max_num_seqs 1."""
    path = tmp_path_factory.mktemp(name) / "fork"
    proc = run_cli("init", "--from-installed", "vllm", str(path))
    assert proc.returncode == 0, proc.stderr
    site = next(
        line.split('"')[1]
        for line in (path / "agentsearch.toml").read_text().splitlines()
        if line.startswith("overlay_from")
    )
    commit(path, {"agentsearch.toml": config.format(site=site), "serving.json": serving(1)}, message)
    return path


@pytest.fixture(scope="module")
def fork(tmp_path_factory):
    return make_fork(tmp_path_factory, "vllm")


def test_tiny_model_is_built_offline_deterministically(tmp_path):
    """A fresh build is byte-identical to the cached one (built by another process, usually earlier:
    the engine tests use it; built here when it is not there yet)."""
    a = tmp_path / "a"
    proc = run_cli("model", "tiny", str(a))
    assert proc.returncode == 0, proc.stderr
    cached = run_cli("model", "tiny")
    assert cached.returncode == 0, cached.stderr
    b = Path(cached.stdout.strip().splitlines()[-1])
    assert b.is_dir() and b != a, cached.stdout
    cfg = json.loads((a / "config.json").read_text())
    assert cfg["vocab_size"] >= 16384 and cfg["model_type"] == "llama"
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert (a / "tokenizer.json").read_text() == (b / "tokenizer.json").read_text()


def test_preflight_passes_on_the_real_environment_without_an_engine(fork):
    """The import probe on the real vLLM, in the baseline's sandbox; no engine starts. Cached per
    environment: after an evaluation of this environment it costs a CLI start, else ~30 s once."""
    proc = run_cli("preflight", "-C", str(fork), "--json", timeout=600)
    out = json.loads(proc.stdout)
    env = {c["name"]: c for c in out["checks"]}["environment"]
    assert proc.returncode == 0 and out["ok"], out
    assert env["status"] == "ok" and "vllm 0." in env["detail"] and "torch 2." in env["detail"], env
    assert not workers_alive(fork)


def test_branch_that_breaks_vllm_is_rejected_with_the_engine_error(fork):
    path = fork / "vllm" / "sampling_params.py"
    text = path.read_text()
    commit(fork, {"vllm/sampling_params.py": text + "\ndef broken(:\n"}, "break vllm", branch="broken")
    git(fork, "checkout", "-q", "--", ".")
    proc = run_cli("evaluate", "-C", str(fork), "broken", "--json", timeout=900)
    out = json.loads(proc.stdout)
    assert proc.returncode == 4 and out["verdict"] == "reject"
    reason = " ".join(out["reasons"])
    # the first candidate session fails at its warm-up (or, without warm-up rounds, its first trial)
    assert "SyntaxError" in reason and ("candidate trial failed" in reason or "candidate warm-up failed" in reason), (
        reason
    )
    assert not workers_alive(fork)


# appended to the fork's vllm/entrypoints/llm.py: plain generation requests (no logprobs: not a
# verification) decode one token and pad the rest — the right token counts, a fraction of the work
FAST_WHEN_NOT_VERIFIED = """

_agentsearch_orig_generate = LLM.generate


def _agentsearch_cheat_generate(self, prompts, sampling_params=None, *args, **kwargs):
    sps = sampling_params if isinstance(sampling_params, list) else None
    if sps and all(sp.logprobs is None and sp.prompt_logprobs is None for sp in sps):
        wanted = [sp.max_tokens for sp in sps]
        short = []
        for sp in sps:
            c = sp.clone()
            c.max_tokens = 1
            short.append(c)
        res = _agentsearch_orig_generate(self, prompts, short, *args, **kwargs)
        for r, n in zip(res, wanted):
            r.outputs[0].token_ids = list(r.outputs[0].token_ids) + [0] * (n - 1)
        return res
    return _agentsearch_orig_generate(self, prompts, sampling_params, *args, **kwargs)


LLM.generate = _agentsearch_cheat_generate
"""


def test_fast_only_when_not_verified_is_caught_in_the_act(fork):
    """Red team: a candidate that skips work in timed runs only; its timed outputs differ from the baseline's."""
    path = fork / "vllm" / "entrypoints" / "llm.py"
    commit(
        fork,
        {"vllm/entrypoints/llm.py": path.read_text() + FAST_WHEN_NOT_VERIFIED},
        "decode less when not verified",
        branch="cheat",
    )
    git(fork, "checkout", "-q", "--", ".")
    proc = run_cli("evaluate", "-C", str(fork), "cheat", "--json", timeout=900)
    out = json.loads(proc.stdout)
    assert proc.returncode == 4 and out["verdict"] == "reject", out["reasons"]
    reason = " ".join(out["reasons"])
    assert "outputs check: the tokens generated for the same requests" in reason, reason
    # judged as a distribution on the real engine: the baseline's worker scored the padded answer (teacher forcing)
    assert "beyond the tie" in reason and "could not score" not in reason, reason
    assert not workers_alive(fork)


def test_ctrl_c_leaves_no_engine_behind(fork):
    commit(fork, {"serving.json": serving(8)}, "max_num_seqs 8", branch="seqs8")
    env = dict(os.environ)
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentsearch.cli", "evaluate", "-C", str(fork), "seqs8"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a run started in the background (`cmd &`, nohup) inherits SIGINT ignored, and
        # Python then never raises KeyboardInterrupt: give the child Ctrl-C as on a terminal
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.time() + 300
        while time.time() < deadline and not engines_alive(fork):  # an engine, not the git of the checkout
            time.sleep(0.5)
        assert engines_alive(fork), "no engine started"
        time.sleep(3)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "interrupted" in err
    deadline = time.time() + 20  # killed processes of a few GB take a moment to exit on a loaded machine
    while workers_alive(fork) and time.time() < deadline:
        time.sleep(0.5)
    assert not workers_alive(fork)
    assert git(fork, "status", "--porcelain") == ""


def test_profile_ranks_where_the_time_goes_and_records_it(fork):
    # a branch with the batch limit raised: the baseline's max_num_seqs 1 makes the profiled round 10x longer
    commit(fork, {"serving.json": serving(32)}, "max_num_seqs 32, to profile", branch="profiled")
    proc = run_cli("profile", "-C", str(fork), "profiled", "--json", timeout=900)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    phases = {r["name"]: r for r in data["by_phase"]}
    assert phases["model forward"]["seconds"] > 0 and "scheduling" in phases
    assert data["by_op"] and all(r["seconds"] >= 0 for r in data["by_op"])
    assert any(r["name"].startswith("vllm") for r in data["by_module"])
    assert data["top"][0]["share_pct"] > 0 and data["device"] == "cpu"
    from agentsearch.workspace import Workspace
    from history import HistoryLog

    ws = Workspace.open(fork)
    assert [e for e in HistoryLog(ws.state / "history.jsonl").entries() if e.kind == "profile"]


def test_a_kept_baseline_engine_is_reused_and_one_that_died_is_replaced_not_blamed_on_the_next_candidate(fork):
    """The kept baseline across rejections on the real engine (reuse 3): the second evaluation measures the
    baseline on the first one's parked engine (the same instance: the start-up time every trial records is the
    same); then the parked engine dies (killed here) and the third evaluation reuses the kept worktree, starts a
    fresh baseline engine and judges its candidate as usual; every candidate starts fresh. The episode's use of
    [engine] baseline_reuse (at most 2 evaluations per instance) is tests/test_warm_baseline.py, on the toy fork."""
    from agentsearch.evaluation import evaluate
    from agentsearch.warm_baseline import WarmBaseline
    from agentsearch.workspace import Workspace
    from benchmarks.engine_gate import SCHEDULER, with_sleep

    source = git(fork, "show", f"main:{SCHEDULER}")
    for i, ms in enumerate((6.0, 5.0, 4.0), 1):  # 512 scheduler steps per trial: each one a clear loser
        commit(fork, {SCHEDULER: with_sleep(source, ms)}, f"sleep {ms} ms per step", branch=f"dead/{i}")
    git(fork, "checkout", "-q", "--", ".")
    ws = Workspace.open(fork)
    warm = WarmBaseline(ws, "test", reuse=3)

    def startups(ev, side):
        return {t.metrics["engine_startup_s"] for t in ev.trials if t.side == side and t.ok}

    try:
        first = evaluate(ws, "dead/1", seed=11, warm=warm)
        assert first.verdict.verdict == "reject" and first.baseline_side == "fresh", first.verdict.reasons
        second = evaluate(ws, "dead/2", seed=12, warm=warm)
        assert (second.baseline_side, second.baseline_engines_reused) == ("warm", 1), second.verdict.reasons
        assert second.verdict.verdict == "reject", second.verdict.reasons
        assert len(startups(first, "baseline")) == 1 and startups(first, "baseline") == startups(second, "baseline")
        assert startups(first, "candidate") != startups(second, "candidate")
        assert warm.kept is not None and len(warm.kept.engines) == 1
        (engine,) = warm.kept.engines.values()
        engine.unpark()
        engine.proc.kill()
        engine.proc.wait(timeout=30)
        third = evaluate(ws, "dead/3", seed=13, warm=warm)
        assert (third.baseline_side, third.baseline_engines_reused) == ("warm", 0)
        assert third.verdict.verdict == "reject" and third.verdict.failed_check == "objective", third.verdict.reasons
        base = startups(third, "baseline")
        assert len(base) == 1 and base != startups(first, "baseline")
    finally:
        warm.retire()
    assert not workers_alive(fork)
    assert len(git(fork, "worktree", "list").splitlines()) == 1
    assert not list((ws.state / "tmp").glob("warm-*"))

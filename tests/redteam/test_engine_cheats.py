"""Red team: cheats inside the engine a built-in vLLM workload measures.

The code under test on a vLLM target is the worktree's ``vllm`` package: the harness's warm worker
imports it (PYTHONPATH = the worktree) and runs the measurement inside its process. A proposal can
therefore replace anything in there. These tests use a target whose ``vllm`` is a small package
with the same API (``LLM.generate`` doing sleep-timed "work" and deterministic greedy tokens), so
the real worker, protocol, sandbox and gate are exercised in seconds; the same attack on the real
engine is in tests/test_vllm_integration.py (fast only when not verified).
"""

from __future__ import annotations

import re
import statistics

import pytest

from agentsearch.workspace import Workspace
from benchmarks.toy_engine import (
    CONFIG,
    CPU_VLLM,
    DAEMON,
    LATENCY,
    THROUGHPUT,
    TOY_INPUTS,
    TOY_VLLM,
    Hog,
    evaluate,
    target,
)

from ..conftest import commit, make_repo, run_cli

pytestmark = pytest.mark.timeout(300)


def test_honest_engine_speedup_merges_with_matching_outputs(tmp_path):
    """The control: a real (sleep-timed) 30% speedup passes the outputs and clock checks."""
    repo = target(tmp_path)
    commit(repo, {"cost.txt": "0.0006\n"}, "less work per token", branch="faster")
    rc, out = evaluate(repo, "faster")
    assert rc == 0 and out["verdict"] == "merge", out["reasons"]
    assert 1.15 < out["workloads"]["throughput"]["speedup"] < 1.5
    for t in out["trials"]:
        m = t["metrics"]
        assert m["output_tokens"] == 16 * 16 and abs(m["worker_elapsed_s"] - m["elapsed_s"]) < 0.25 * m["elapsed_s"]


SLOW_CLOCK = '''
_real = time.perf_counter
_t0 = _real()
time.perf_counter = lambda: _t0 + (_real() - _t0) * 0.5  # the worker's stopwatch now runs at half speed
'''


def test_a_patched_clock_does_not_decide_the_number(tmp_path):
    repo = target(tmp_path)
    main = Workspace.open(repo).baseline_commit()
    commit(repo, {"vllm/__init__.py": TOY_VLLM + SLOW_CLOCK}, "patch the timer", branch="clock")
    rc, out = evaluate(repo, "clock")
    assert rc == 4 and out["verdict"] == "reject", out["reasons"]
    cand = [t for t in out["trials"] if t["side"] == "candidate" and t["ok"]]
    assert cand and all(
        t["metrics"]["worker_elapsed_s"] < 0.6 * t["metrics"]["elapsed_s"] for t in cand
    )  # the cheat was active
    assert abs(out["workloads"]["throughput"]["speedup"] - 1.0) < 0.1  # and changed nothing
    assert Workspace.open(repo).baseline_commit() == main


@pytest.mark.parametrize("objective", ["latency_mean_s", "latency_p50_s"])
def test_latency_is_timed_by_the_orchestrator(tmp_path, objective):
    """A slowed (or skewed) stopwatch in the worker decides nothing: each batch is a round trip timed outside."""
    repo = target(tmp_path, {**LATENCY, "metric": objective})
    commit(repo, {"vllm/__init__.py": TOY_VLLM + SLOW_CLOCK.replace("0.5", "0.65")}, "patch the timer", branch="clock")
    rc, out = evaluate(repo, "clock")
    assert rc == 4 and out["verdict"] == "reject", out["reasons"]
    assert abs(out["workloads"]["latency"]["speedup"] - 1.0) < 0.1, out["workloads"]["latency"]


SOMETIMES_LAZY = '''
_gen, _n = LLM.generate, [0]


def _generate(self, prompts, sampling_params=None, use_tqdm=False):
    _n[0] += 1
    if _n[0] % 4:  # three batches in four answer at once; one does the work
        sps = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        return [_Result(list(p["prompt_token_ids"]), [0] * sp.max_tokens) for p, sp in zip(prompts, sps)]
    return _gen(self, prompts, sampling_params, use_tqdm)


LLM.generate = _generate
'''


def test_every_timed_latency_batch_is_checked(tmp_path):
    repo = target(tmp_path, LATENCY)
    commit(repo, {"vllm/__init__.py": TOY_VLLM + SOMETIMES_LAZY}, "lazy most of the time", branch="lazy")
    rc, out = evaluate(repo, "lazy")
    assert rc == 4
    assert any("outputs check: the tokens generated for the same requests" in r for r in out["reasons"]), out["reasons"]


PAD_THE_TAIL = '''
_gen = LLM.generate


def _generate(self, prompts, sampling_params=None, use_tqdm=False):
    sps = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
    res = []
    for p, sp in zip(prompts, sps):
        real = max(1, int(sp.max_tokens * 0.92))  # 92% of each answer computed, the rest padded for free
        short = SamplingParams(max_tokens=real)
        r = _gen(self, [p], [short], use_tqdm)[0]
        r.outputs[0].token_ids = list(r.outputs[0].token_ids) + [0] * (sp.max_tokens - real)
        res.append(r)
    return res


LLM.generate = _generate
'''


def test_the_outputs_check_has_no_slack_to_spend(tmp_path):
    """Generating most of every answer and padding the tail: every request differs, so it is caught."""
    repo = target(tmp_path)
    commit(repo, {"vllm/__init__.py": TOY_VLLM + PAD_THE_TAIL}, "pad the tail", branch="pad")
    rc, out = evaluate(repo, "pad")
    assert rc == 4
    assert any("outputs check" in r for r in out["reasons"]), out["reasons"]


SKIP_WORK = '''
_generate = LLM.generate


def _lazy(self, prompts, sampling_params=None, use_tqdm=False):
    sps = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
    return [_Result(list(p["prompt_token_ids"]), [0] * sp.max_tokens) for p, sp in zip(prompts, sps)]


LLM.generate = _lazy  # the right number of tokens, none of the work
'''


def test_skipping_the_work_is_caught_by_the_outputs_check(tmp_path):
    repo = target(tmp_path)
    commit(repo, {"vllm/__init__.py": TOY_VLLM + SKIP_WORK}, "skip the work", branch="lazy")
    rc, out = evaluate(repo, "lazy")
    assert rc == 4
    assert any("outputs check: the tokens generated for the same requests" in r for r in out["reasons"]), out["reasons"]


def test_a_changed_decoding_default_is_caught(tmp_path):
    """Sampling defaults / max_tokens changed to do less work: fewer tokens than asked for."""
    repo = target(tmp_path)
    cheat = TOY_VLLM.replace(
        "self.max_tokens, self.temperature = max_tokens, temperature",
        "self.max_tokens, self.temperature = max(1, max_tokens // 2), temperature",
    )
    commit(repo, {"vllm/__init__.py": cheat}, "stop early", branch="short")
    rc, out = evaluate(repo, "short")
    assert rc == 4 and out["verdict"] == "reject"
    assert any("generated" in r or "outputs check" in r for r in out["reasons"]), out["reasons"]


# the candidate's engine starts hogs that burn both cores exactly while it is idle, i.e. while the
# baseline is being measured; its own rounds run on a quiet machine
IDLE_HOG = '''
import multiprocessing as _mp

_idle = _mp.Value("b", 1)


def _hog(flag):
    while True:
        if flag.value:
            for _ in range(200000):
                pass
        else:
            time.sleep(0.001)


for _ in range(2):
    _mp.Process(target=_hog, args=(_idle,), daemon=True).start()
_real_generate = LLM.generate


def _generate(self, *a, **k):
    _idle.value = 0
    try:
        return _real_generate(self, *a, **k)
    finally:
        _idle.value = 1


LLM.generate = _generate
'''


def test_an_idle_side_cannot_slow_the_other_side_down(tmp_path):
    """The idle side's engine is parked (stopped) while the other side is measured."""
    repo = make_repo(
        tmp_path / "fork",
        {
            "agentsearch.toml": CONFIG.format(**THROUGHPUT),
            "vllm/__init__.py": CPU_VLLM,
            "vllm/inputs.py": TOY_INPUTS,
            "cost.txt": "0.0008\n",
        },
    )
    assert run_cli("init", "-C", str(repo)).returncode == 0
    main = Workspace.open(repo).baseline_commit()
    commit(repo, {"vllm/__init__.py": CPU_VLLM + IDLE_HOG}, "hog the cores while idle", branch="hog")
    rc, out = evaluate(repo, "hog")
    assert rc == 4 and out["verdict"] == "reject", out["reasons"]
    assert out["workloads"]["throughput"]["speedup"] < 1.3, (
        out["workloads"]["throughput"],
        out["reasons"],
    )  # unparked: ~2x
    assert Workspace.open(repo).baseline_commit() == main


# the candidate's engine unpins itself and splits its CPU-bound work over every core of the machine
UNPIN = '''
def _generate(self, prompts, sampling_params=None, use_tqdm=False):
    os.sched_setaffinity(0, set(range(os.cpu_count())))
    sps = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
    work = [int(self.cost * 2.5e7 * sp.max_tokens) for sp in sps]
    half = len(work) // 2
    pid = os.fork()
    if pid == 0:
        for n in work[half:]:
            for _ in range(n):
                pass
        os._exit(0)
    for n in work[:half]:
        for _ in range(n):
            pass
    os.waitpid(pid, 0)
    return [_Result(list(p["prompt_token_ids"]), greedy(list(p["prompt_token_ids"]), sp.max_tokens)) for p, sp in zip(prompts, sps)]


LLM.generate = _generate
'''


def test_an_engine_that_leaves_its_cpu_pinning_is_caught(tmp_path):
    """[engine] cpus pins both sides' engines to the same CPU; a candidate that unpins itself to borrow the other
    core (twice the CPU: a "win" that is not its code's) cannot (a cpuset holds it: its second process shares
    the CPU) or fails its measurement (it used more CPU time than its pinned CPU gives). Unpinned, the same
    branch measures about 1.3x faster on an idle machine (not asserted: it depends on the other core being free)."""
    repo = target(tmp_path, engine='cpus = "1"', vllm=CPU_VLLM)
    commit(repo, {"vllm/__init__.py": CPU_VLLM + UNPIN}, "use every core", branch="unpinned")
    rc, out = evaluate(repo, "unpinned")
    assert rc == 4 and out["verdict"] == "reject", out["reasons"]
    caught = any("candidate" in r and "left its CPU pinning" in r for r in out["reasons"])
    # or its second process, held in the cpuset, took a larger share of a CPU foreign load contended for (the
    # confirmation's CPU-time account: test_a_larger_share_of_a_contended_cpu_is_not_a_win)
    shared = any("the win is not less work" in r for r in out["reasons"])
    # else not significantly faster than +10% (unpinned: ~1.3x; a full CI run under foreign load read a pinned cheat
    # at 1.11x)
    assert caught or shared or out["workloads"]["throughput"]["ci"][0] < 1.1, (
        out["reasons"],
        out["workloads"]["throughput"],
    )
    assert not any(t["side"] == "baseline" and not t["ok"] for t in out["trials"])  # the honest side stays within it
    pinned = [t["metrics"] for t in out["trials"] if t["ok"] and "cpus_pinned" in t["metrics"]]
    assert pinned and all(m["cpus_pinned"] == 1 and m["cpu_s"] <= m["elapsed_s"] * 1.01 + 0.005 for m in pinned)


def test_a_daemon_that_left_the_engines_process_tree_is_pinned_too(tmp_path):
    """Like the unpinned engine above, through a daemon started before the engine was pinned and no longer among
    its descendants: it is in the engine's cgroup, so it is pinned with it and its CPU time is the engine's (before
    the pinning covered the cgroup, it ran on the other core and only the CPU-time check caught it)."""
    # without the sandbox (whose PID namespace would adopt the daemon: still in the tree) it really leaves the tree
    repo = target(tmp_path, engine='cpus = "1"', vllm=CPU_VLLM, gate='sandbox = "off"')
    commit(repo, {"vllm/__init__.py": CPU_VLLM + DAEMON}, "a daemon on the other core", branch="daemon")
    rc, out = evaluate(repo, "daemon")
    # never merged. Not always a reject: under foreign load on the pinned CPU the candidate's two runnable processes
    # (engine and daemon) get a larger share of it than the baseline's one (the kernel shares a CPU per task), so one
    # CI run read +21% [+15.8, +26.5] and held it for review (sandbox off); on a quiet CPU the share is the same
    # (about 1.0x). A gain of contention, not of the escape: docs/roadmap.md
    assert rc == 4 and out["verdict"] in ("reject", "review"), out["reasons"]
    # the daemon shared the engine's CPU (it is in the cpuset) and its CPU time was the engine's (the cgroup's
    # account): every candidate measurement pinned, within what one CPU gives
    mine = [t for t in out["trials"] if t["side"] == "candidate"]
    assert mine and all(
        t["ok"] and t["metrics"]["cpus_pinned"] == 1 and t["metrics"]["cpu_s"] <= t["wall_s"] * 1.01 + 0.005
        for t in mine
    ), mine
    base = [t for t in out["trials"] if t["side"] == "baseline"]
    assert base and all(t["ok"] for t in base)
    # and all of it: the same work on both sides, so the same CPU time whatever the load (a daemon whose CPU time went
    # uncounted would leave the candidate about half the baseline's: half its work is the daemon's)
    cpu = {
        side: statistics.median(t["metrics"]["cpu_s"] for t in ts if t["pair"] >= 0)
        for side, ts in (("b", base), ("c", mine))
    }
    assert 0.8 < cpu["c"] / cpu["b"] < 1.25, cpu


def test_a_larger_share_of_a_contended_cpu_is_not_a_win(tmp_path):
    """The daemon above, inside the sandbox (its PID namespace keeps it in the engine's tree): the same work split over
    two runnable processes gets more of a CPU that another process uses too than the baseline's one (measured +17%
    under this busy loop, 1.00x on a quiet CPU). Measured mostly under foreign load, the win must be less work: its CPU
    time per trial did not fall, so the confirmation fails. The control, a real cut of the CPU work under the same
    load, merges."""
    repo = target(tmp_path, engine='cpus = "1"', vllm=CPU_VLLM)
    commit(repo, {"vllm/__init__.py": CPU_VLLM + DAEMON}, "two runnable processes", branch="share")
    commit(repo, {"cost.txt": "0.0006\n"}, "less work per token", branch="faster")
    with Hog():
        rc, out = evaluate(repo, "share")
        rc_fast, fast = evaluate(repo, "faster")
    assert rc == 4 and out["verdict"] == "reject", out["reasons"]
    # when its objective won (the share is often enough for it: +14% to +18% here), the confirmation rejects it: the
    # CPU-time account ("measured mostly under contention, the win is not less work"), or, under the other CI worker's
    # load too, the fresh pairs were not significant by themselves (+6.9% once); otherwise the objective itself was
    # inconclusive (+3% to +10% beside other tests). tests/test_contention.py holds the account's rule
    won = any(c["name"] == "objective" and c["status"] == "pass" for c in out["checks"])
    # (under heavier load still, the replication test may refuse it first: rejected all the same)
    assert not won or any(
        r.startswith("confirmation: throughput: measured mostly under") or "did not replicate on fresh seeds" in r
        for r in out["reasons"]
    ), (
        out["reasons"],
        out["workloads"]["throughput"],
    )
    # the engines' CPU was contended: their processes waited for it on most pairs (the probe of the whole machine
    # flags fewer: one busy process on one CPU of two is under its threshold at times)
    timed = [t for t in out["trials"] if t["ok"] and t["pair"] >= 0]
    contended = [t for t in timed if t["metrics"]["cpu_wait_s"] / t["wall_s"] > 0.25]
    assert len(contended) > len(timed) / 2, [(t["metrics"], t["wall_s"]) for t in timed]
    # the control: the CPU-time account ("the win is not less work") never refuses a real cut of the work. It merges;
    # or, under the other CI worker's load too (the hog's share swinging from pair to pair), its 4 fresh pairs are a
    # win that the gate's rules for noisy confirmations do not take: too far below a lucky first estimate (+46.7%
    # when it won, +18.1% fresh), or not significant by themselves (+21.0%, p = 0.11). Each seen once in CI.
    assert not any("the win is not less work" in r for r in fast["reasons"]), fast["reasons"]
    if fast["verdict"] != "merge":
        fresh = [
            re.search(r"([+-]\d+\.\d+)% over \d+ fresh pairs|on fresh seeds: ([+-]\d+\.\d+)% over \d+ pairs", r)
            for r in fast["reasons"]
        ]
        assert rc_fast == 4 and fresh and all(m and float(m.group(1) or m.group(2)) > 0 for m in fresh), fast["reasons"]
    assert 1.1 < fast["workloads"]["throughput"]["speedup"] < 2.0, fast["workloads"]["throughput"]  # 1.15-1.6 quiet


# the candidate patches the harness's own worker (it runs in the candidate's process): it reports a tripled
# throughput and no elapsed time, so that a clock-based recomputation would have nothing to go on
FORGED_NUMBERS = '''
import sys as _sys

_worker = _sys.modules.get("__main__")
if _worker is not None and hasattr(_worker, "Engine"):
    _real_throughput = _worker.Engine.throughput

    def _throughput(self, seed, p):
        m = _real_throughput(self, seed, p)
        m.pop("elapsed_s", None)
        m["output_tok_s"] *= 3
        m["output_tokens"] *= 3
        m["cpu_s"], m["cpus_pinned"], m["cpu_wait_s"] = 0.0, 64, 123.0  # and no contention to speak of
        return m

    _worker.Engine.throughput = _throughput
'''


@pytest.mark.parametrize("slices", [8, 1])
def test_a_worker_that_forges_its_numbers_is_measured_on_the_orchestrators_clock(tmp_path, slices):
    """Whole trials and sliced ones: every throughput number is recomputed from the outputs and the round trip
    on the orchestrator's clock, whatever keys the worker sends or leaves out."""
    repo = target(tmp_path, engine=f"slices = {slices}")
    commit(repo, {"vllm/__init__.py": TOY_VLLM + FORGED_NUMBERS}, "report better numbers", branch="forged")
    rc, out = evaluate(repo, "forged")
    assert rc == 4 and out["verdict"] == "reject", out["reasons"]
    assert out["workloads"]["throughput"]["speedup"] < 1.15, out["workloads"]["throughput"]
    for t in out["trials"]:
        if t["ok"] and t["pair"] >= 0:
            assert t["metrics"]["output_tokens"] == 16 * 16 and t["metrics"].get("cpus_pinned") != 64
            assert t["metrics"].get("cpu_wait_s") != 123.0
            assert (t["metrics"].get("slices") == slices) if slices > 1 else ("slices" not in t["metrics"])

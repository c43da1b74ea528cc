"""Placement `alternate` on the real vLLM CPU fork: one engine at a time, sessions A B | B A, fresh engines.

Cost: one fork (about 12 s) and one evaluation with 10 engine starts one after the other (4 rounds x 2
sides, enforce_eager, tiny model, one process each, and the confirmation's fresh pair) plus warm-up rounds and 20
timed rounds: about 4-5 minutes on the 2-core machine (more under load). It is also the suite's test that a config
change is measured with the right sign and confirmed on fresh engines (tests/test_vllm_integration.py no longer
runs a second such evaluation). Listed in tests/conftest.py SLOW_FIRST so it runs beside
test_vllm_integration.py on the other worker."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from .conftest import ROOT, commit
from .test_vllm_integration import FAST_CONFIG, engines_alive, make_fork, serving, workers_alive


def engine_workers(fork) -> set[str]:
    """One key per live engine. Each engine runs in a cgroup of its own (``harness.cgroups``), so the key
    is the cgroup of its worker processes: a process vLLM forks (between fork and exec it carries the
    worker's command line) belongs to the same engine. Without cgroups, the worker's pid (the sandbox's
    bubblewrap processes carry the worker's command line too, and are not counted)."""
    out = set()
    for pid in engines_alive(fork):
        try:
            argv0 = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[0]
            groups = open(f"/proc/{pid}/cgroup").read().splitlines()
        except OSError:
            continue
        if argv0.endswith(b"bwrap"):
            continue
        mine = [line.split(":", 2)[2] for line in groups if line.startswith("0::") and "agentsearch-" in line]
        out.add(mine[0] if mine else str(pid))
    return out


pytestmark = pytest.mark.vllm

# the level is alpha 0.05 for this one proposal (episode_budget 1): what is tested here is the placement (one
# engine at a time, the A B | B A | A B order, a large effect found). The round is the cluster: with 2 rounds
# (1 degree of freedom) the between-round variance of a loaded CI machine left p = 0.03 at +650% once and
# p = 0.26 at +141% another time (7 of 8 trials under foreign load); 3 rounds (2 degrees of freedom) left p = 0.095 at
# +170% (11 of 12 trials under foreign load, CI of 2026-12-07); 4 rounds give 3
ALTERNATE = (
    FAST_CONFIG.replace(
        "max_pairs = 8\nconfirm_pairs = 2", "max_pairs = 8\nmin_pairs = 8\nconfirm_pairs = 2\nepisode_budget = 1"
    ).replace("restarts = 1\n", "restarts = 4\n")
    + """
[engine]
placement = "alternate"
warmup = 1
"""
)


@pytest.fixture(scope="module")
def fork(tmp_path_factory):
    assert (
        "placement = \"alternate\"" in ALTERNATE and "min_pairs = 8" in ALTERNATE and "episode_budget = 1" in ALTERNATE
    )
    assert "restarts = 4" in ALTERNATE
    return make_fork(tmp_path_factory, "vllm-alt", ALTERNATE, "alternate placement, max_num_seqs 1")


def test_alternate_runs_one_engine_at_a_time_and_finds_the_real_effect(fork):
    commit(fork, {"serving.json": serving(32)}, "max_num_seqs 32", branch="seqs32")
    most, stop = [0], threading.Event()

    def watch() -> None:  # the real process table, twice a second: never two engines at once
        while not stop.is_set():
            most[0] = max(most[0], len(engine_workers(fork)))
            time.sleep(0.5)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "agentsearch.cli", "evaluate", "-C", str(fork), "seqs32", "--json"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=1500,
        )
    finally:
        stop.set()
        t.join()
    out = json.loads(proc.stdout)
    assert proc.returncode == 0, out["reasons"]
    w = out["workloads"]["throughput"]
    # a config change measured with the right sign: max_num_seqs 1 -> 32 on 16 prompts is a clear win
    assert out["verdict"] == "merge" and w["speedup"] > 1.5 and w["ci"][0] > 1.0 and w["p_value"] < 0.05, w
    # a change of serving.json alone was resolved on both sides before any engine: it takes effect (issue #58)
    (effect,) = [c for c in out["checks"] if c["name"] == "takes-effect"]
    assert effect["status"] == "pass" and "scheduler_config.max_num_seqs: 1 -> 32" in effect["detail"], effect
    assert most[0] == 1, f"{most[0]} engines were alive at once"
    trials = [t for t in out["trials"] if t["phase"] == "objective"]
    # A B | B A | A B | B A: round 0 measures the baseline's session first, round 1 the candidate's; the same seeds on both sides
    first = {s: {t["side"] for t in trials if t["session"] == s and t["position"] == 0} for s in range(4)}
    assert first == {0: {"baseline"}, 1: {"candidate"}, 2: {"baseline"}, 3: {"candidate"}}
    for s in range(4):
        seeds = {
            side: [t["seed"] for t in trials if t["session"] == s and t["side"] == side]
            for side in ("baseline", "candidate")
        }
        assert seeds["baseline"] == seeds["candidate"] and len(seeds["baseline"]) == 2
    # every engine was started afresh (one start-up per session and side) and every trial says how quiet the machine was
    startup = {(t["side"], t["session"]): t["metrics"]["engine_startup_s"] for t in trials}
    assert len(startup) == 8 and startup["candidate", 0] != startup["candidate", 1]  # B B: two engines, not one kept
    assert all({"load_avg_1m", "foreign_cpu", "foreign_load"} <= set(t["metrics"]) for t in trials)
    assert out["environment"]["packages"] and "load_avg_1m" in out["environment"]
    # the win was confirmed on a fresh pair of engines (an engine instance's luck must not confirm itself): the
    # start-up time every trial records differs between the objective's and the confirmation's engines
    for side in ("baseline", "candidate"):
        started = {
            ph: {
                t["metrics"]["engine_startup_s"]
                for t in out["trials"]
                if t["side"] == side and t["ok"] and t["phase"] == ph
            }
            for ph in ("objective", "confirmation")
        }
        assert (
            started["objective"] and started["confirmation"] and not started["objective"] & started["confirmation"]
        ), started
    assert all(t["metrics"]["engine_startup_s"] > 0 for t in out["trials"] if t["side"] == "candidate" and t["ok"])
    assert out["timing"]["engine_s"] > 0 and out["timing"]["measurement_s"] > 0
    assert not workers_alive(fork)

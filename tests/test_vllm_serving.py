"""The serving workload on the real vLLM CPU fork: a warm ``vllm serve`` per side measured by a warm load
generator (the baseline's ``vllm bench serve``, imported once per server, not once per trial).

Cost: one fork (about 12 s) and one evaluation: two servers booting side by side (about 1-2 minutes
here) and up to 6 pairs of 16-request serving trials, then two fresh servers for 2 confirmation pairs. Listed in tests/conftest.py SLOW_FIRST."""

from __future__ import annotations

import json

import pytest

from .conftest import commit, run_cli
from .test_vllm_integration import FAST_CONFIG, make_fork, serving

pytestmark = pytest.mark.vllm

SERVE_CONFIG = FAST_CONFIG.split("[[workload]]")[0] + """[[workload]]
name = "serve"
kind = "vllm-serve"
metric = "output_tok_s"
timeout_s = 240
restarts = 1
engine = {{ enforce_eager = true, max_model_len = 512, dtype = "float32", distributed_executor_backend = "uni" }}
params = {{ prompts = 16, input_len = 32, output_len = 32, max_concurrency = 8 }}

[gate]
max_pairs = 6
confirm_pairs = 2
episode_budget = 1
plausibility = 100.0
"""


@pytest.fixture(scope="module")
def fork(tmp_path_factory):
    return make_fork(tmp_path_factory, "vllm-serve", SERVE_CONFIG, "serving objective, max_num_seqs 1")


def test_a_serving_change_is_measured_by_one_warm_load_generator_per_server(fork):
    commit(fork, {"serving.json": serving(8)}, "max_num_seqs 8", branch="seqs8")
    proc = run_cli("evaluate", "-C", str(fork), "seqs8", "--json", timeout=1200)
    assert proc.stdout, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert proc.returncode == 0 and out["verdict"] == "merge", out["reasons"]
    w = out["workloads"]["serve"]
    assert w["speedup"] > 1.5 and w["ci"][0] > 1.0  # 8 concurrent requests batched instead of one at a time
    trials = [t for t in out["trials"] if t["ok"]]
    assert len(trials) >= 2 * (3 + 2)
    # the outputs check ran on every pair: the greedy texts of the same requests agree between the servers
    agreed = [t["metrics"]["outputs_agreement"] for t in trials if "outputs_agreement" in t["metrics"]]
    assert len(agreed) >= 3 + 2 and min(agreed) >= 0.99, agreed
    for side in ("baseline", "candidate"):
        mine = [t for t in trials if t["side"] == side]
        for phase in ("objective", "confirmation"):  # the confirmation runs on a fresh pair of servers
            # one load generator per server served every trial of the side (and the unrecorded warm-up round
            # before them), in order: vLLM was imported once per server, not once per trial
            served = [t["metrics"]["generator_trial"] for t in mine if t["phase"] == phase]
            assert served and served == sorted(set(served)) and served[0] >= 2 and served[-1] >= len(served) + 1, (side, phase, served)
        for t in mine:  # the benchmark's own clock fits in the orchestrator's round trip
            assert 0 < t["metrics"]["duration_s"] <= t["wall_s"]
            assert t["metrics"]["output_tok_s"] > 0 and t["metrics"]["ttft_p50_ms"] > 0
            # [engine] cpus auto (OMP_NUM_THREADS 1, two CPUs): each server pinned to the last CPU by a cpuset, its
            # CPU time within what one CPU gives over the trial (the load generator, the harness's, is not pinned)
            m = t["metrics"]
            assert m["cpus_pinned"] == 1 and 0 < m["cpu_s"] <= t["wall_s"] * 1.01 + 0.005, m

"""The serving workload on the real vLLM CPU fork: a warm ``vllm serve`` per side measured by a warm load
generator (the baseline's ``vllm bench serve``, imported once per server, not once per trial).

Cost: one fork (about 12 s) and one evaluation: two servers booting side by side (about 1-2 minutes
here) and up to 6 pairs of 16-request serving trials, then two fresh servers for 2 confirmation pairs. Listed in tests/conftest.py SLOW_FIRST."""

from __future__ import annotations

import json
import statistics

import pytest

from .conftest import commit, run_cli
from .test_vllm_integration import FAST_CONFIG, make_fork, serving

pytestmark = pytest.mark.vllm

SERVE_CONFIG = (
    FAST_CONFIG.split("[[workload]]")[0]
    + """[[workload]]
name = "serve"
kind = "vllm-serve"
metric = "output_tok_s"
timeout_s = 240
restarts = 1
engine = {{ enforce_eager = true, max_model_len = 512, dtype = "float32", distributed_executor_backend = "uni" }}
params = {{ prompts = 16, max_concurrency = 8, trace = "bench/trace.jsonl" }}

[gate]
max_pairs = 6
confirm_pairs = 2
episode_budget = 1
plausibility = 100.0
"""
)


@pytest.fixture(scope="module")
def fork(tmp_path_factory):
    path = make_fork(tmp_path_factory, "vllm-serve", SERVE_CONFIG, "serving objective, max_num_seqs 1")
    commit(path, {"bench/trace.jsonl": TRACE}, "a trace of request lengths")
    return path


# the serving objective's request lengths: a trace (read from the baseline's worktree), 24 to 40 tokens in, 32 out
TRACE = "".join(json.dumps({"input_len": 24 + i % 17, "output_len": 32}) + "\n" for i in range(64))


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
    # as token ids (vLLM's return_token_ids): a differing answer is scored, not refused for its bits
    assert {t["metrics"]["outputs_kind"] for t in trials} == {"tokens"}
    for side in ("baseline", "candidate"):
        mine = [t for t in trials if t["side"] == side]
        for phase in ("objective", "confirmation"):  # the confirmation runs on a fresh pair of servers
            # one load generator per server served every trial of the side (and the unrecorded warm-up round
            # before them), in order: vLLM was imported once per server, not once per trial
            served = [t["metrics"]["generator_trial"] for t in mine if t["phase"] == phase]
            assert served and served == sorted(set(served)) and served[0] >= 2 and served[-1] >= len(served) + 1, (
                side,
                phase,
                served,
            )
        for t in mine:  # the benchmark's own clock fits in the orchestrator's round trip
            assert 0 < t["metrics"]["duration_s"] <= t["wall_s"]
            assert t["metrics"]["output_tok_s"] > 0 and t["metrics"]["ttft_p50_ms"] > 0
            assert (
                16 * 24 <= t["metrics"]["input_tokens"] <= 16 * 41 and t["metrics"]["requests"] == 16
            )  # the trace's lengths
            # [engine] cpus auto (OMP_NUM_THREADS 1, two CPUs): each server pinned to the last CPU by a cpuset, its
            # CPU time within what one CPU gives over the trial (the load generator, the harness's, is not pinned)
            m = t["metrics"]
            assert m["cpus_pinned"] == 1 and 0 < m["cpu_s"] <= t["wall_s"] * 1.01 + 0.005, m


# #41: a tail-only regression, on the target of benchmarks/serving_guard_engine.py: a toy command objective (the
# candidate makes it 1.5x faster) so that the guards run; both guards judge the same warm servers under the same
# open-loop load (Poisson, 80 requests/s): a median guard over 200 requests and a p99 guard over 1,000 (the fewest a
# p99 may be judged over).


def test_a_tail_only_regression_is_caught_by_the_p99_guard_and_not_by_the_median(tmp_path_factory):
    import sys

    from benchmarks.serving_guard_engine import CONFIG, SERVING_PY, SPEED, plant
    from harness.serving_load import LAG_FLOOR_S

    path = tmp_path_factory.mktemp("vllm-tail") / "fork"
    assert run_cli("init", "--from-installed", "vllm", str(path)).returncode == 0
    site = next(
        line.split('"')[1]
        for line in (path / "agentsearch.toml").read_text().splitlines()
        if line.startswith("overlay_from")
    )
    commit(
        path,
        {
            # [engine] cpus = "none": the servers float over both CPUs. Pinned to the last CPU ("auto"), they shared it
            # with the other CI worker's engines, fell behind 80 requests/s (the baseline's median TTFT 30 ms to 1 s
            # from trial to trial) and the p99 guard saw no significant regression for a 1 s tail
            # the guard's re-measure on fresh engines as it was before 2026-12-06 (4 pairs, one session): 12 pairs of
            # 1,000-request trials over 3 sessions would add about 4 minutes to CI; the default is tested on a toy
            # target (tests/test_evaluate.py) and measured on the engine (benchmarks/guard_aa_engine.py)
            "agentsearch.toml": CONFIG.format(site=site, python=sys.executable).replace(
                "coverage = false\n", "coverage = false\nguard_check_pairs = 4\nguard_check_sessions = 1\n"
            )
            + '\n[engine]\ncpus = "none"\n',
            "speed.py": SPEED,
            "f.txt": "1.0",
            "serving.json": serving(8),
        },
        "tail guards: a toy objective, max_num_seqs 8",
    )
    fork = path
    # one request in about 50 (by its prompt) waits a second before it is served; the others do not. A second, not the
    # benchmark's 150 ms: beside another engine test on the other CI worker the baseline's own p99 reached the
    # hundreds of milliseconds and a 150 ms tail was inside it (CI merged it once)
    commit(
        fork,
        {"f.txt": "1.5", SERVING_PY: plant((fork / SERVING_PY).read_text(), 1000)},
        "faster, and a slow tail",
        branch="tail",
    )

    def behind_only(reasons: list[str]) -> bool:
        """Rejected only because a trial's load generator fell behind its schedule on this machine (the instrument's
        failure, never re-run on a candidate's trial) before the p99 guard's first call."""
        return (
            bool(reasons)
            and all("the load generator fell behind its schedule" in r for r in reasons)
            and not any("(first run: regressed by" in r for r in reasons)
        )

    def behind_on_the_baseline(stderr: str) -> bool:
        """The run's error: a baseline trial's load generator fell behind its schedule, after its re-measures."""
        last = (stderr.strip().splitlines() or [""])[-1]
        return "baseline trial failed" in last and "the load generator fell behind its schedule" in last

    # A full CI run once rejected on the first run's candidate trial this way (p99 lag 175 ms > 100 ms beside the other
    # worker's engine test), before any guard judged: the verdict is right (fail-closed) but says nothing about the
    # guard, so that one outcome is measured once more on fresh engines and seeds
    for attempt in range(2):
        proc = run_cli("evaluate", "-C", str(fork), "tail", "--json", timeout=1500)
        # the same instrument failure on a baseline trial is the run's error, not a verdict (nothing judged, no JSON):
        # measured once more too (seen once in CI, a guard re-measure's baseline trial at p99 lag 119 ms > 100 ms)
        if not proc.stdout and attempt == 0 and behind_on_the_baseline(proc.stderr):
            print(f"attempt 1: {proc.stderr.strip().splitlines()[-1]}")
            continue
        assert proc.stdout, proc.stderr[-3000:]
        out = json.loads(proc.stdout)
        assert out["verdict"] == "reject", (out["reasons"], out["workloads"])
        if not behind_only(out["reasons"]):
            break
        print(f"attempt {attempt + 1}: {out['reasons'][0]}")
    # the p99 guard names the tail, confirmed on fresh engines
    held = [
        r for r in out["reasons"] if r.startswith("guard-workloads: ttft-p99: the regression held on fresh engines")
    ]
    # or, measured again on fresh engines, a candidate trial's load generator fell behind its schedule: a rejection
    # too (the instrument is never re-run on the candidate's trial), after the guard's first run saw the regression.
    # One full CI run with more tests beside it than CI has ended so
    behind = [
        r
        for r in out["reasons"]
        if r.startswith("guard-workloads: candidate trial failed (ttft-p99")
        and "the load generator fell behind its schedule" in r
        and "(first run: regressed by" in r
    ]
    assert (held and "the candidate trades ttft-p99 (ttft_p99_ms)" in held[0] and "for speed (x) +" in held[0]) or (
        behind
    ), out["reasons"]
    w = out["workloads"]
    assert w["ttft-p99"]["decision"] == "regressed" and w["ttft-p99"]["speedup"] < 0.8, w["ttft-p99"]
    # the median guard judged the same change and saw no regression: it passed (its estimate is noise around no change:
    # a held request leaves the others a lighter batch, and one run here read the median +27% faster over 3 pairs,
    # another beside two engine tests +34% over 6). Beside the other CI worker's engines its first run once read a
    # regression that the re-measure on fresh engines did not confirm ("unconfirmed"): that is the guard's design, and
    # it rejects nothing; what the median guard must never do is hold a regression of its own
    assert w["ttft-p50"]["decision"] in ("ok", "unconfirmed"), w["ttft-p50"]
    assert not any(r.startswith("guard-workloads: ttft-p50: the regression held") for r in out["reasons"]), out[
        "reasons"
    ]
    trials = [t for t in out["trials"] if t["ok"] and t["workload"] == "ttft-p99"]
    for t in trials:  # each p99 trial: 1,000 measured requests, sent on schedule
        m = t["metrics"]
        # sent on schedule by the harness's own rule (a trial over it fails): CI saw p99 lags up to 75 ms beside the
        # other worker's engine starts, 1-3 ms alone
        assert m["requests"] == 1000 and 0 <= m["generator_lag_p99_ms"] < 1000 * LAG_FLOOR_S, m
        assert m["ttft_p50_ms"] < m["ttft_p99_ms"]
    base = [t["metrics"] for t in trials if t["side"] == "baseline"]
    cand = [t["metrics"] for t in trials if t["side"] == "candidate"]
    # the tail, trial by trial: the held second in the candidate's p99 (a baseline trial under foreign load can reach a
    # second too, so the medians are compared, not every trial)
    assert statistics.median(c["ttft_p99_ms"] for c in cand) > statistics.median(b["ttft_p99_ms"] for b in base) + 500
    # the report says what each serving metric measures
    report = run_cli("report", "-C", str(fork), "tail", timeout=120)
    assert report.returncode == 0, report.stderr[-2000:]
    assert (
        "- `ttft_p99_ms`: 99th percentile (Harrell-Davis) of time to first token, per request: from the request's send"
        in report.stdout
    )

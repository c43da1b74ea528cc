"""Serving metrics, load plans and SLO config (#41): definitions, the Harrell-Davis quantile, the open-loop plan,
and the one-line refusals before anything is measured. The engine runs are in tests/test_vllm_serving.py."""

from __future__ import annotations

import math
import random
import statistics

import numpy as np
import pytest
from scipy.stats.mstats import hdquantiles

from agentsearch.config import load_config_text
from agentsearch.errors import ConfigError
from harness import lengths, serving_load, tails
from harness.serve_session import served_requests
from harness.workers import vllm_worker

from .conftest import make_repo, run_cli

SERVE = """
[target]
baseline = "main"

[[workload]]
name = "serve"
kind = "vllm-serve"
metric = "{metric}"
higher_is_better = {hib}
params = {params}
{extra}
"""


def config(metric="output_tok_s", params="{ prompts = 32 }", extra="", hib=None):
    if hib is None:
        hib = "false" if tails.quantile_metric(metric) else "true"
    return load_config_text(SERVE.format(metric=metric, params=params, extra=extra, hib=hib))


def test_harrell_davis_is_scipys_and_smoother_than_the_sample_quantile_at_the_tail():
    rng = np.random.default_rng(7)
    for n in (2, 10, 71, 1000):
        x = rng.lognormal(size=n)
        for q in (0.5, 0.9, 0.99):
            assert tails.harrell_davis(x, q) == pytest.approx(float(hdquantiles(x, [q])[0]), rel=1e-9)
    assert tails.harrell_davis([3.0], 0.99) == 3.0 and math.isnan(tails.harrell_davis([], 0.5))
    # at n = 71 a p99 is the maximum, whichever estimator: one stalled request moves it all the way (why a p99 is
    # judged over at least 1,000 requests) ...
    x = rng.lognormal(size=71)
    stalled = np.append(np.sort(x)[:-1], 100 * x.max())
    assert np.percentile(stalled, 99) / np.percentile(x, 99) > 30 and tails.harrell_davis(stalled, 0.99) / tails.harrell_davis(x, 0.99) > 30
    # ... at n = 1,000 it moves the Harrell-Davis p99 by under 1%
    x = rng.lognormal(size=1000)
    stalled = np.append(np.sort(x)[:-1], 100 * x.max())
    assert tails.harrell_davis(stalled, 0.99) / tails.harrell_davis(x, 0.99) < 1.01


def test_each_metric_is_what_its_definition_says():
    # two requests: sent at 0 and 1 s; 4 output tokens each; chunks after TTFT at fixed gaps
    a = tails.RequestTiming(sent=0.0, ttft=0.100, e2e=0.400, gaps=(0.1, 0.1, 0.1), output_tokens=4, input_tokens=8)
    b = tails.RequestTiming(sent=1.0, ttft=0.300, e2e=1.200, gaps=(0.1, 0.7, 0.1), output_tokens=4, input_tokens=8)
    m = tails.serving_metrics([a, b], ("ttft_p90_ms", "itl_p50_ms"), {"ttft": 200.0, "tpot": 250.0})
    assert m["duration_s"] == pytest.approx(2.2)  # first send to last chunk
    assert m["requests_s"] == pytest.approx(2 / 2.2) and m["output_tok_s"] == pytest.approx(8 / 2.2)
    assert m["total_tok_s"] == pytest.approx(24 / 2.2)
    assert a.tpot == pytest.approx(0.1) and b.tpot == pytest.approx(0.3)  # (E2E - TTFT) / (tokens - 1)
    assert m["ttft_p50_ms"] == pytest.approx(tails.harrell_davis([100.0, 300.0], 0.5))
    assert m["ttft_p90_ms"] == pytest.approx(tails.harrell_davis([100.0, 300.0], 0.9))
    # ITL is per chunk: six gaps pooled, not two per-request averages
    assert m["itl_p50_ms"] == pytest.approx(tails.harrell_davis([100, 100, 100, 100, 700, 100], 0.5))
    assert m["e2e_p99_ms"] == pytest.approx(tails.harrell_davis([400.0, 1200.0], 0.99))
    # goodput: a meets TTFT <= 200 ms and TPOT <= 250 ms, b misses both
    assert m["goodput_req_s"] == pytest.approx(1 / 2.2) and m["slo_attainment"] == 0.5
    for name in ("ttft_p99_ms", "tpot_p50_ms", "itl_p99.9_ms", "e2e_p90_ms", "output_tok_s", "goodput_req_s"):
        assert tails.definition(name), name
    assert "per chunk" in tails.definition("itl_p99_ms") and "Harrell-Davis" in tails.definition("ttft_p99_ms")


def test_min_requests_for_a_quantile():
    assert tails.min_requests(0.99) == 1000 and tails.min_requests(0.9) == 100 and tails.min_requests(0.5) == 20
    assert tails.min_requests(0.999) == 10_000


def test_the_plans_lengths_are_the_sandboxed_workers():
    for dist in lengths.DISTS:
        for mean in (4, 32, 100):
            a = lengths.draw(random.Random(5), 200, mean, dist)
            b = vllm_worker.lengths(random.Random(5), 200, mean, dist)
            assert a == b, dist


def test_a_plan_is_the_same_on_both_sides_and_keeps_its_rate_and_burstiness():
    p = {"prompts": 2000, "input_len": 16, "output_len": 8, "request_rate": 50, "warmup": 5}
    one, two = serving_load.plan(p, 11, 1000), serving_load.plan(p, 11, 1000)
    assert one == two and one != serving_load.plan(p, 12, 1000)
    assert len(one.prompts) == 2005 and one.measured == 2000 and one.warmup == 5 and len(one.arrivals or ()) == 2000
    assert all(len(x) == 16 for x in one.prompts) and set(one.output_lens) == {8} and one.max_concurrency is None
    gaps = np.diff(one.arrivals)
    assert 1 / gaps.mean() == pytest.approx(50, rel=0.08)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.1)  # Poisson: exponential gaps, CV 1
    bursty = np.diff(serving_load.plan({**p, "burstiness": 0.25}, 11, 1000).arrivals)
    assert bursty.std() / bursty.mean() == pytest.approx(2.0, rel=0.15)  # gamma shape k: CV 1/sqrt(k)
    closed = serving_load.plan({"prompts": 8}, 1, 1000)
    assert closed.arrivals is None and closed.max_concurrency == serving_load.DEFAULT_CONCURRENCY
    assert math.isinf(closed.max_lag_s) and one.max_lag_s == pytest.approx(0.010)
    # lengths from the pair's profile, clipped to the context
    z = serving_load.plan({"prompts": 500, "input_len": 300, "output_len": 300, "length_dist": "zipf"}, 3, 1000, max_model_len=512)
    assert max(len(x) for x in z.prompts) <= 256 and all(len(x) + o <= 512 for x, o in zip(z.prompts, z.output_lens))
    assert statistics.pstdev(z.output_lens) > 0


@pytest.mark.parametrize("kwargs, says", [
    ({"metric": "ttft_p99_ms", "params": "{ prompts = 200 }"}, "ttft_p99_ms needs trials of at least 1000 requests (prompts = 200)"),
    ({"metric": "ttft_p999_ms"}, "a serving workload has no metric 'ttft_p999_ms'"),
    ({"metric": "queue_p99_ms"}, "no metric 'queue_p99_ms'"),
    ({"metric": "ttft_p99_ms", "params": "{ prompts = 2000 }", "hib": "true"}, "lower is better; set higher_is_better = false"),
    ({"metric": "output_tok_s", "hib": "false"}, "higher is better; set higher_is_better = true"),
    ({"params": "{ prompts = 32, request_rate = 5000 }"}, "request_rate must be \"inf\" or a number of requests per second in (0, 500]"),
    ({"params": "{ prompts = 32, request_rate = 10, burstiness = 0 }"}, "burstiness must be a number in [0.05, 100]"),
    ({"params": "{ prompts = 32, arrival = \"poisson\" }"}, "unknown serving param 'arrival'"),
    ({"params": "{ prompts = 0 }"}, "prompts must be an integer in [1, 20000]"),
    ({"metric": "itl_p99_ms", "params": "{ prompts = 10, output_len = 8 }"}, "itl_p99_ms needs at least 1000 token gaps per trial (70 here)"),
    ({"metric": "goodput_req_s"}, "metric goodput_req_s counts requests that meet the SLOs; add [[slo]] tables"),
    ({"metric": "goodput_req_s", "extra": "[[slo]]\nmetric = \"itl_ms\"\nmax_ms = 50"}, "[[slo]] #1 metric: expected one of ttft_ms, tpot_ms, e2e_ms"),
    ({"metric": "goodput_req_s", "extra": "[[slo]]\nmetric = \"ttft_ms\"\nmax_ms = -1"}, "max_ms: expected a positive number of milliseconds"),
    ({"metric": "goodput_req_s", "extra": "[[slo]]\nmetric = \"ttft_ms\"\nmax_ms = 5\n[[slo]]\nmetric = \"ttft_ms\"\nmax_ms = 9"},
     "[[slo]] metric: two limits for 'ttft_ms'"),
])
def test_bad_serving_config_is_one_line(kwargs, says):
    with pytest.raises(ConfigError) as exc:
        config(**kwargs)
    msg = str(exc.value)
    assert says in msg and "\n" not in msg, msg


def test_good_serving_config_and_its_slos():
    c = config("goodput_req_s", "{ prompts = 64, request_rate = 20 }", "[[slo]]\nmetric = \"ttft_ms\"\nmax_ms = 500\n"
               "[[slo]]\nmetric = \"tpot_ms\"\nmax_ms = 50")
    assert c.slo_limits() == {"ttft": 500.0, "tpot": 50.0}
    assert c.fingerprint() != config("goodput_req_s", "{ prompts = 64, request_rate = 20 }",
                                     "[[slo]]\nmetric = \"ttft_ms\"\nmax_ms = 400").fingerprint()
    assert config("ttft_p99_ms", "{ prompts = 1000, request_rate = 50 }").workloads[0].metric == "ttft_p99_ms"


def test_bad_slo_config_is_refused_before_anything_is_measured(tmp_path):
    repo = make_repo(tmp_path / "t", {"agentsearch.toml": SERVE.format(metric="ttft_p99_ms", hib="false", params="{ prompts = 100 }", extra=""),
                                      "x.py": "x = 1\n"})
    init = run_cli("init", "-C", str(repo), timeout=60)
    proc = run_cli("evaluate", "-C", str(repo), "main", timeout=60) if init.returncode == 0 else init
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "ttft_p99_ms needs trials of at least 1000 requests" in lines[0], proc.stderr


def _row(**kw):
    r = {"ok": True, "error": "", "sent": 0, "lag": 100, "queue": 0, "ttft": 10_000, "e2e": 40_000, "gaps": [10_000, 10_000, 10_000],
         "output_tokens": 4, "input_tokens": 16, "outputs": [1, 2]}
    r.update(kw)
    return r


def test_the_generators_report_is_checked_not_trusted():
    load = serving_load.plan({"prompts": 2, "input_len": 16, "output_len": 4}, 1, 1000)
    timings, outputs, why = served_requests({"requests": [_row(), _row(sent=5)]}, load)
    assert not why and len(timings) == 2 and outputs == ((1, 2), (1, 2)) and timings[1].sent == pytest.approx(5e-6)
    for rows, says in [
        ([_row()], "no per-request results for its 2 requests"),
        ([_row(), _row(ok=False, error="boom")], "1 of 2 requests failed: boom"),
        ([_row(), _row(output_tokens=9, gaps=[1] * 8)], "a number of output tokens other than the one requested"),
        ([_row(), _row(ttft=50_000)], "inconsistent timings"),
        ([_row(), _row(gaps=[30_000, 30_000, 30_000])], "inconsistent timings"),
        ([_row(), _row(ttft=True)], "malformed"),
        ([_row(), _row(gaps=[-1, 1, 1])], "malformed"),
    ]:
        assert served_requests({"requests": rows}, load)[2].startswith(says) or says in served_requests({"requests": rows}, load)[2], says

"""Serving metrics, load plans and SLO config (#41): definitions, the Harrell-Davis quantile, the open-loop plan,
and the one-line refusals before anything is measured. The engine runs are in tests/test_vllm_serving.py."""

from __future__ import annotations

import json
import math
import random
import statistics
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

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
    assert (
        np.percentile(stalled, 99) / np.percentile(x, 99) > 30
        and tails.harrell_davis(stalled, 0.99) / tails.harrell_davis(x, 0.99) > 30
    )
    # ... at n = 1,000 it moves the Harrell-Davis p99 by under 1%
    x = rng.lognormal(size=1000)
    stalled = np.append(np.sort(x)[:-1], 100 * x.max())
    assert tails.harrell_davis(stalled, 0.99) / tails.harrell_davis(x, 0.99) < 1.01


def test_each_metric_is_what_its_definition_says():
    # two requests: sent at 0 and 1 s; 4 output tokens each; chunks after TTFT at fixed gaps
    a = tails.RequestTiming(sent=0.0, ttft=0.100, e2e=0.400, gaps=(0.1, 0.1, 0.1), output_tokens=4, input_tokens=8)
    b = tails.RequestTiming(sent=1.0, ttft=0.300, e2e=1.200, gaps=(0.1, 0.7, 0.1), output_tokens=4, input_tokens=8)
    m = tails.serving_metrics(
        [a, b], ("ttft_p90_ms", "itl_p50_ms"), [tails.Slo("ttft", 200.0), tails.Slo("tpot", 250.0, 0.99)]
    )
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
    assert (
        math.isinf(closed.max_lag_s)
        and one.max_lag_s == pytest.approx(0.100)
        and one.max_mean_lag_s == pytest.approx(0.020)
    )
    # lengths from the pair's profile, clipped to the context
    z = serving_load.plan(
        {"prompts": 500, "input_len": 300, "output_len": 300, "length_dist": "zipf"}, 3, 1000, max_model_len=512
    )
    assert max(len(x) for x in z.prompts) <= 256 and all(
        len(x) + o <= 512 for x, o in zip(z.prompts, z.output_lens, strict=True)
    )
    assert statistics.pstdev(z.output_lens) > 0


@pytest.mark.parametrize(
    "kwargs, says",
    [
        (
            {"metric": "ttft_p99_ms", "params": "{ prompts = 200 }"},
            "ttft_p99_ms needs trials of at least 1000 requests (prompts = 200)",
        ),
        ({"metric": "ttft_p999_ms"}, "a serving workload has no metric 'ttft_p999_ms'"),
        ({"metric": "queue_p99_ms"}, "no metric 'queue_p99_ms'"),
        (
            {"metric": "ttft_p99_ms", "params": "{ prompts = 2000 }", "hib": "true"},
            "lower is better; set higher_is_better = false",
        ),
        ({"metric": "output_tok_s", "hib": "false"}, "higher is better; set higher_is_better = true"),
        (
            {"params": "{ prompts = 32, request_rate = 5000 }"},
            "request_rate must be \"inf\" or a number of requests per second in (0, 500]",
        ),
        (
            {"params": "{ prompts = 32, request_rate = 10, burstiness = 0 }"},
            "burstiness must be a number in [0.05, 100]",
        ),
        ({"params": "{ prompts = 32, arrival = \"poisson\" }"}, "unknown serving param 'arrival'"),
        ({"params": "{ prompts = 0 }"}, "prompts must be an integer in [1, 20000]"),
        (
            {"metric": "itl_p99_ms", "params": "{ prompts = 10, output_len = 8 }"},
            "itl_p99_ms needs at least 1000 token gaps per trial (70 here)",
        ),
        ({"metric": "goodput_req_s"}, "metric goodput_req_s counts requests that meet the SLOs; add [[slo]] tables"),
        (
            {"metric": "goodput_req_s", "extra": "[[slo]]\nmetric = \"itl_ms\"\nmax_ms = 50"},
            "[[slo]] #1 metric: expected one of ttft_ms, tpot_ms, e2e_ms",
        ),
        (
            {"metric": "goodput_req_s", "extra": "[[slo]]\nmetric = \"ttft_ms\"\nmax_ms = -1"},
            "max_ms: expected a positive number of milliseconds",
        ),
        (
            {
                "metric": "goodput_req_s",
                "extra": "[[slo]]\nmetric = \"ttft_ms\"\nmax_ms = 5\n[[slo]]\nmetric = \"ttft_ms\"\nmax_ms = 9",
            },
            "[[slo]] metric: two limits for 'ttft_ms'",
        ),
    ],
)
def test_bad_serving_config_is_one_line(kwargs, says):
    with pytest.raises(ConfigError) as exc:
        config(**kwargs)
    msg = str(exc.value)
    assert says in msg and "\n" not in msg, msg


def test_good_serving_config_and_its_slos():
    c = config(
        "goodput_req_s",
        "{ prompts = 64, request_rate = 20 }",
        "[[slo]]\nmetric = \"ttft_ms\"\nmax_ms = 500\n[[slo]]\nmetric = \"tpot_ms\"\nmax_ms = 50",
    )
    assert [(x.base, x.max_ms, x.q) for x in (s.slo() for s in c.slos)] == [("ttft", 500.0, None), ("tpot", 50.0, None)]
    assert (
        c.fingerprint()
        != config(
            "goodput_req_s", "{ prompts = 64, request_rate = 20 }", "[[slo]]\nmetric = \"ttft_ms\"\nmax_ms = 400"
        ).fingerprint()
    )
    assert config("ttft_p99_ms", "{ prompts = 1000, request_rate = 50 }").workloads[0].metric == "ttft_p99_ms"


def test_bad_slo_config_is_refused_before_anything_is_measured(tmp_path):
    repo = make_repo(
        tmp_path / "t",
        {
            "agentsearch.toml": SERVE.format(metric="ttft_p99_ms", hib="false", params="{ prompts = 100 }", extra=""),
            "x.py": "x = 1\n",
        },
    )
    init = run_cli("init", "-C", str(repo), timeout=60)
    proc = run_cli("evaluate", "-C", str(repo), "main", timeout=60) if init.returncode == 0 else init
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "ttft_p99_ms needs trials of at least 1000 requests" in lines[0], proc.stderr


def _row(**kw):
    r = {
        "ok": True,
        "error": "",
        "sent": 0,
        "lag": 100,
        "queue": 0,
        "ttft": 10_000,
        "e2e": 40_000,
        "gaps": [10_000, 10_000, 10_000],
        "output_tokens": 4,
        "input_tokens": 16,
        "outputs": [1, 2],
    }
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
        assert (
            served_requests({"requests": rows}, load)[2].startswith(says)
            or says in served_requests({"requests": rows}, load)[2]
        ), says


def test_the_rate_search_brackets_the_threshold_and_says_when_it_is_out_of_range():
    seen = []

    def holds(rate):
        seen.append(rate)
        return rate <= 37.0

    found = serving_load.search_rate(holds, 5.0, 200.0, 5)  # shift 0.5: plain bisection
    lo, hi, probes = found.low, found.high, found.probes
    assert (
        lo <= 37.0 < hi and hi / lo == pytest.approx(40 ** (1 / 32)) and found.rate == pytest.approx(math.sqrt(lo * hi))
    )
    assert len(probes) == 2 + 5 and probes[0] == (5.0, True) and probes[1] == (200.0, False) and not found.censored
    # another pair's grid: the first split moves with the shift, the bracket still holds the threshold
    other = serving_load.search_rate(holds, 5.0, 200.0, 5, shift=0.9)
    assert other.low <= 37.0 < other.high and other.probes[2][0] != probes[2][0]
    with pytest.raises(serving_load.SearchOutOfRange, match="do not hold even at rate_min = 50"):
        serving_load.search_rate(holds, 50.0, 200.0, 3)
    # the SLOs still hold at rate_max: censored there (a lower bound), not an error
    capped = serving_load.search_rate(holds, 5.0, 30.0, 3)
    assert capped.censored and capped.rate == 30.0 and len(capped.probes) == 2
    # interpolation on log-log scales: a quantile growing as the square of the rate crosses its limit exactly
    slo = tails.Slo("ttft", 30.0, 0.9)
    q = lambda r: {"ttft_p90_ms": 30.0 * (r / 37.0) ** 2}  # noqa: E731
    assert serving_load.interpolate(30.0, 45.0, q(30.0), q(45.0), [slo]) == pytest.approx(37.0)
    assert serving_load.interpolate(30.0, 45.0, q(30.0), {"ttft_p90_ms": None}, [slo]) is None
    assert serving_load.probe_seed(7, 0) == serving_load.probe_seed(7, 0) != serving_load.probe_seed(7, 1)


SLO_P90 = "[[slo]]\nmetric = \"ttft_ms\"\nmax_ms = 30\np = 90"


@pytest.mark.parametrize(
    "params, extra, says",
    [
        (
            "{ prompts = 200, rate_max = 100 }",
            "[[slo]]\nmetric = \"ttft_ms\"\nmax_ms = 30",
            "give an [[slo]] a percentile",
        ),
        ("{ prompts = 200, rate_max = 100, request_rate = 5 }", SLO_P90, "drop request_rate"),
        ("{ prompts = 200, rate_min = 100, rate_max = 50 }", SLO_P90, "needs rate_min < rate_max"),
        ("{ prompts = 200 }", SLO_P90, "needs rate_min < rate_max"),
        (
            "{ prompts = 50, rate_max = 100 }",
            SLO_P90,
            "the [[slo]] ttft p90 <= 30 ms needs probes of at least 100 requests (prompts = 50)",
        ),
        ("{ prompts = 200, rate_max = 100, search_steps = 20 }", SLO_P90, "search_steps must be an integer in [1, 8]"),
    ],
)
def test_bad_rate_at_slo_config_is_one_line(params, extra, says):
    with pytest.raises(ConfigError) as exc:
        config("rate_at_slo_req_s", params, extra)
    assert says in str(exc.value) and "\n" not in str(exc.value), str(exc.value)
    with pytest.raises(ConfigError, match="rate_max is a param of rate_at_slo_req_s only"):
        config("output_tok_s", "{ prompts = 32, rate_max = 10 }")
    with pytest.raises(ConfigError, match="expected a percentile strictly between 0 and 100"):
        config("goodput_req_s", "{ prompts = 32 }", "[[slo]]\nmetric = \"ttft_ms\"\nmax_ms = 30\np = 100")


class Capacity(BaseHTTPRequestHandler):
    """A server of fixed capacity: one request served at a time, SERVICE_S each, then two tokens streamed."""

    lock = threading.Lock()
    SERVICE_S = 0.008

    def log_message(self, *args):
        pass

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.lock:
            time.sleep(self.SERVICE_S)
        self.send_response(200)
        self.end_headers()
        for i in range(int(body["max_tokens"])):
            self.wfile.write(
                b"data: "
                + json.dumps({"choices": [{"text": f"{body['prompt'][i % len(body['prompt'])]} "}]}).encode()
                + b"\n\n"
            )
        self.wfile.write(
            b"data: "
            + json.dumps({"choices": [], "usage": {"completion_tokens": int(body["max_tokens"])}}).encode()
            + b"\n\n"
        )


def test_throughput_at_slo_is_found_by_probes_of_the_same_requests_on_both_sides(tmp_path):
    """The serving session's real search path (``ServeSession._search`` over the real generator) against a server
    whose queue grows as the rate nears its capacity (125 requests/s): the p90 TTFT limit of 60 ms holds at low
    rates and not near capacity, and two sides measured with the same seed probe the same requests."""
    import subprocess
    import sys

    from agentsearch.workloads import OutputsMatch
    from harness.serve_session import ServeSession

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Capacity)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    params = {
        "prompts": 120,
        "input_len": 8,
        "output_len": 2,
        "vary_lengths": False,
        "rate_min": 10,
        "rate_max": 250,
        "search_steps": 3,
    }
    spec = {"model": str(tmp_path), "engine": {}, "params": params, "slo": [{"base": "ttft", "max_ms": 60.0, "q": 0.9}]}
    sides = []
    for side in ("baseline", "candidate"):
        s = ServeSession(spec, tmp_path, None, {}, tmp_path / side, "rate_at_slo_req_s", 120.0, python=sys.executable)
        (tmp_path / side).mkdir()
        s.proc, s.port, s.startup_s = (
            subprocess.Popen(["sleep", "120"], start_new_session=True),
            srv.server_address[1],
            0.0,
        )  # the server is the fake
        try:
            out = s.measure(5, params=params)
        finally:
            s.close()
        assert out.ok, out.error
        sides.append(out)
        m = out.metrics
        assert 10 <= m["rate_at_slo_low"] <= out.value <= m["rate_at_slo_high"] <= 250 and not m["rate_at_slo_censored"]
        assert 15 < out.value < 200, m["probes"]
        assert len(m["probes"]) == 2 + 3 and m["probes"][0]["held"] and not m["probes"][1]["held"]
        assert m["requests"] == 5 * 120 and all("ttft_p90_ms" in p for p in m["probes"])
    srv.shutdown()
    match = OutputsMatch()
    assert match.check("baseline", 5, sides[0]) == "" and match.check("candidate", 5, sides[1]) == ""


@pytest.mark.parametrize("side", ["baseline", "candidate"])
def test_a_generator_that_fell_behind_is_the_runs_error_on_the_baselines_trial(side):
    """The candidate's engine is parked while the baseline is measured: a load generator that fell behind its
    schedule on the baseline's trial is the machine's doing (the run's error, nothing judged); on the candidate's
    trial its server may have loaded the generator (a stream of tiny chunks): a rejection, as a measurement error."""
    from types import SimpleNamespace

    from agentsearch.errors import RunError
    from agentsearch.evaluation import _judged, _State
    from harness.interleave import WorkloadRun
    from harness.trials import MEASUREMENT_ERROR, TrialRecord

    why = "the load generator fell behind its schedule (mean lag 41.0 ms > 5 ms at 80 requests/s)"
    trial = TrialRecord("ttft-p99", side, 1, 0, 0, "AB", 0, False, None, {}, 1.0, error=why, failure=MEASUREMENT_ERROR)
    run = WorkloadRun("ttft-p99", trials=[trial], failure=why, failure_kind=MEASUREMENT_ERROR)
    ctx = SimpleNamespace(st=_State())
    if side == "baseline":
        with pytest.raises(RunError, match="on the baseline's trial: the run's error, nothing was judged"):
            _judged(ctx, run, "guard-workloads", "ttft-p99", "ok")
        assert not ctx.st.checks
    else:
        assert _judged(ctx, run, "guard-workloads", "ttft-p99", "ok") is False
        (check,) = ctx.st.checks
        assert (
            check.failure == "measurement-error" and "fell behind" in check.detail and ctx.st.baseline_failure is None
        )


def test_a_trace_of_real_lengths_is_drawn_the_same_on_both_sides(tmp_path):
    rows = [{"input_len": 10 + i, "output_len": 1 + i % 7} for i in range(500)]
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    trace = serving_load.read_trace(path)
    assert len(trace) == 500 and trace[3] == (13, 4)
    p = {"prompts": 200, "trace": "trace.jsonl"}
    a, b = serving_load.plan(p, 4, 1000, trace=trace), serving_load.plan(p, 4, 1000, trace=trace)
    assert a == b and a != serving_load.plan(p, 5, 1000, trace=trace)
    pairs = [(len(x), o) for x, o in zip(a.prompts, a.output_lens, strict=True)]
    assert len(set(pairs)) == 200 and all(pr in trace for pr in pairs)  # drawn without replacement while it lasts
    many = serving_load.plan({"prompts": 800}, 4, 1000, trace=trace)
    assert len(many.prompts) == 800 and all(
        (len(x), o) in trace for x, o in zip(many.prompts, many.output_lens, strict=True)
    )
    for text, says in [
        ("not json\n", "line 1: not JSON"),
        ('{"input_len": 3}\n', "line 1: expected"),
        ('{"input_len": 3, "output_len": 0}\n', "positive integers"),
        ("\n", "no requests"),
    ]:
        path.write_text(text)
        with pytest.raises(ValueError, match=says):
            serving_load.read_trace(path)
    with pytest.raises(ValueError, match="No such file"):
        serving_load.read_trace(tmp_path / "missing.jsonl")
    for bad in ("/etc/passwd", "../x.jsonl", ""):
        with pytest.raises(ConfigError, match="trace must be a path inside the target"):
            config("output_tok_s", f'{{ prompts = 8, trace = "{bad}" }}')

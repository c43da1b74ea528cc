"""Serving metrics from per-request timings: what each one measures, its quantiles, and how many requests a
quantile needs.

A serving trial sends its requests (``harness.serving_load``) and records, per request, when it was sent and when
each streamed chunk of text came back. Every serving metric is computed here, from those records, the same way for
both sides; each has one definition (``DEFINITIONS``, shown in reports):

- ``ttft``: time to first token, per request: from the request's send to its first streamed chunk that carries
  text (a request whose text is empty — tokens that decode to nothing — to its last chunk).
- ``tpot``: time per output token, per request: (E2E - TTFT) / (output tokens - 1); requests of one output token
  have none.
- ``itl``: inter-token latency, per chunk (not a per-request average): the gap between two successive chunks of one
  request, all chunks of all requests pooled.
- ``e2e``: end-to-end latency, per request: from the send to its last chunk.
- ``goodput``: requests per second that met every per-request SLO (``[[slo]]``), over the trial's duration.
- ``rate_at_slo``: throughput at SLO: the highest request rate at which every SLO's quantile holds (``[[slo]]``
  with ``p``), found per trial by a bounded geometric bisection between ``rate_min`` and ``rate_max``
  (``harness.serving_load.search_rate``); the value is the geometric middle of the final bracket, which is recorded
  beside it (``rate_at_slo_low`` / ``rate_at_slo_high``).

A quantile metric is named ``<metric>_p<q>_ms`` (``ttft_p99_ms``, ``itl_p50_ms``, ``e2e_p99.9_ms``...). Its value
is the Harrell-Davis estimate (a Beta-weighted average of all order statistics, continuous in the data), not one
order statistic. No estimator rescues a small sample: at n = 71 a p99 is the maximum, whichever one
(vllm-project/guidellm #243), and one stalled request moves it all the way. So a quantile q is judged only over
trials of at least ``min_requests(q)`` requests (ten expected beyond it: 1,000 for a p99), refused before anything
is measured; at n = 1,000 one stalled request moves the Harrell-Davis p99 by under 1%. How the per-pair log-ratios
of these estimates behave in the gate's paired test (A/A false alarms, power against tail-only and median
regressions, against the sample quantile) is measured by ``benchmarks/serving_tails.py``.

Pure functions, numpy and scipy only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

DEFINITIONS = {
    "ttft": "time to first token, per request: from the request's send to its first streamed chunk that carries text",
    "tpot": "time per output token, per request: (E2E - TTFT) / (output tokens - 1)",
    "itl": "inter-token latency, per chunk: the gap between two successive chunks of a request, all requests pooled",
    "e2e": "end-to-end latency, per request: from the request's send to its last chunk",
}
GOODPUT = "goodput_req_s"
GOODPUT_DEFINITION = "requests per second that met every per-request SLO ([[slo]]), over the trial's duration"
RATE_AT_SLO = "rate_at_slo_req_s"
RATE_AT_SLO_DEFINITION = (
    "the highest request rate (open loop) at which every [[slo]] quantile holds: the geometric middle "
    "of the bracket a bounded bisection between rate_min and rate_max ends with"
)
SLO_METRICS = ("ttft", "tpot", "e2e")  # per-request SLOs (ITL is per chunk: a request's worst gap is its own metric)
RATE_METRICS = {
    "output_tok_s": "output tokens per second over the trial's duration (first send to last chunk)",
    "requests_s": "completed requests per second over the trial's duration",
    "total_tok_s": "input and output tokens per second over the trial's duration",
}
QUANTILE = re.compile(r"^(ttft|tpot|itl|e2e)_p(\d{1,2}(?:\.\d{1,3})?)_ms$")
EXCEEDANCES = 10  # a quantile q is judged over at least 10 / (1 - q) requests: ten expected beyond it


@dataclass(frozen=True)
class QuantileMetric:
    """A tail metric's name parsed: ``ttft_p99_ms`` -> base ``ttft``, q 0.99."""

    name: str
    base: str
    q: float

    @property
    def definition(self) -> str:
        return f"{self.q * 100:g}th percentile (Harrell-Davis) of {DEFINITIONS[self.base]}"


def quantile_metric(name: str) -> QuantileMetric | None:
    m = QUANTILE.match(name)
    if not m:
        return None
    q = float(m.group(2)) / 100
    return QuantileMetric(name, m.group(1), q) if 0 < q < 1 else None


@dataclass(frozen=True)
class Slo:
    """One ``[[slo]]``: a per-request limit on a base metric (goodput counts the requests within every one), and,
    with ``q``, a limit on the trial's q-quantile of it (throughput at SLO searches the rate where they all hold)."""

    base: str  # ttft | tpot | e2e
    max_ms: float
    q: float | None = None

    def text(self) -> str:
        what = f"{self.base} p{self.q * 100:g}" if self.q is not None else self.base
        return f"{what} <= {self.max_ms:g} ms"


def is_serving_metric(name: str) -> bool:
    return name in RATE_METRICS or name in (GOODPUT, RATE_AT_SLO) or quantile_metric(name) is not None


def definition(name: str) -> str:
    """What a serving metric measures, in one line ('' for a metric that is not one)."""
    qm = quantile_metric(name)
    if qm:
        return qm.definition
    if name == RATE_AT_SLO:
        return RATE_AT_SLO_DEFINITION
    return GOODPUT_DEFINITION if name == GOODPUT else RATE_METRICS.get(name, "")


def min_requests(q: float) -> int:
    """Requests a trial needs before its q-quantile is judged: ten expected beyond it (1,000 for a p99)."""
    return int(math.ceil(round(EXCEEDANCES / (1 - q), 6)))


def harrell_davis(values: Sequence[float] | np.ndarray, q: float) -> float:
    """The Harrell-Davis estimate of the q-quantile: sum_i w_i x_(i), w_i = I_{i/n}(a, b) - I_{(i-1)/n}(a, b) with
    a = q(n + 1), b = (1 - q)(n + 1) (Harrell and Davis, Biometrika 1982). NaN for no values."""
    x = np.sort(np.asarray(values, dtype=float))
    n = len(x)
    if n == 0:
        return math.nan
    if n == 1:
        return float(x[0])
    from scipy import special  # here: the config validates serving metrics without scipy

    a, b = q * (n + 1), (1 - q) * (n + 1)
    cdf = special.betainc(a, b, np.arange(n + 1) / n)
    return float(np.dot(np.diff(cdf), x))


@dataclass(frozen=True)
class RequestTiming:
    """One measured request as the load generator saw it (seconds on its clock)."""

    sent: float  # when it was sent
    ttft: float  # first chunk, after the send
    e2e: float  # last chunk, after the send
    gaps: tuple[float, ...]  # between successive chunks
    output_tokens: int  # as the server reported them (usage)
    input_tokens: int

    @property
    def tpot(self) -> float | None:
        return (self.e2e - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else None

    def value(self, base: str) -> float | None:
        return {"ttft": self.ttft, "e2e": self.e2e, "tpot": self.tpot}.get(base)


def samples(requests: Sequence[RequestTiming], base: str) -> np.ndarray:
    """The values a metric's quantiles are taken over, in seconds: per request, or (ITL) per chunk."""
    if base == "itl":
        return np.fromiter((g for r in requests for g in r.gaps), dtype=float)
    return np.array([v for r in requests if (v := r.value(base)) is not None], dtype=float)


def met_slos(r: RequestTiming, slos: Sequence[Slo]) -> bool:
    """Whether a request met every per-request SLO."""
    for slo in slos:
        v = r.value(slo.base)
        if v is None and slo.base == "tpot":
            continue  # one output token: no time per output token to miss
        if v is None or v * 1000 > slo.max_ms:
            return False
    return True


def slo_quantile(slo: Slo) -> str:
    """The quantile metric an SLO with a percentile limits (``ttft_p99_ms``)."""
    assert slo.q is not None
    return f"{slo.base}_p{slo.q * 100:g}_ms"


def quantiles_held(metrics: Mapping[str, object], slos: Sequence[Slo]) -> tuple[bool, dict[str, float | None]]:
    """Whether every SLO's quantile holds in a trial's metrics, and those quantiles (ms, by metric name)."""
    seen: dict[str, float | None] = {}
    ok = True
    for slo in slos:
        if slo.q is None:
            continue
        v = metrics.get(slo_quantile(slo))
        seen[slo_quantile(slo)] = v if isinstance(v, (int, float)) else None
        ok = ok and isinstance(v, (int, float)) and v <= slo.max_ms
    return ok, seen


def duration(requests: Sequence[RequestTiming]) -> float:
    """From the first send to the last chunk, in seconds."""
    return max(r.sent + r.e2e for r in requests) - min(r.sent for r in requests) if requests else 0.0


def serving_metrics(
    requests: Sequence[RequestTiming], quantiles: Sequence[str] = (), slos: Sequence[Slo] = ()
) -> dict[str, float | None]:
    """The trial's metrics: rates over its duration, the p50 and p99 of every base metric, and every named quantile
    metric (``ttft_p99.9_ms``) and goodput when SLOs are given. Milliseconds for latencies."""
    dur = duration(requests)
    out: dict[str, float | None] = {}
    out["duration_s"] = dur
    out["requests_s"] = len(requests) / dur if dur > 0 else None
    out["output_tok_s"] = sum(r.output_tokens for r in requests) / dur if dur > 0 else None
    out["total_tok_s"] = sum(r.output_tokens + r.input_tokens for r in requests) / dur if dur > 0 else None
    names = [f"{base}_p{p}_ms" for base in DEFINITIONS for p in (50, 99)] + [q for q in quantiles if q not in out]
    cache: dict[str, np.ndarray] = {}
    for name in dict.fromkeys(names):
        qm = quantile_metric(name)
        if qm is None:
            continue
        xs = cache.setdefault(qm.base, samples(requests, qm.base))
        v = harrell_davis(xs, qm.q) * 1000 if len(xs) else None
        out[name] = v if v is not None and math.isfinite(v) else None
    if slos:
        good = sum(met_slos(r, slos) for r in requests)
        out[GOODPUT] = good / dur if dur > 0 else None
        out["slo_attainment"] = good / len(requests) if requests else None
    return out

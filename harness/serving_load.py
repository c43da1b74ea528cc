"""The serving workload's load: which requests, when, and whether the generator kept to it.

A trial's load is a ``LoadPlan`` built here from the workload's ``params`` and the pair's seed, so both sides of a
pair get the same requests at the same offsets:

- **requests**: ``prompts`` measured requests, preceded by ``warmup`` unmeasured ones; their input and output
  lengths drawn around ``input_len`` / ``output_len`` from ``length_dist`` (fixed, uniform, zipf: the pair's length
  profile, ``harness.lengths``), or drawn from a **trace** of real lengths (``trace``: a JSONL file in the target,
  one ``{"input_len": N, "output_len": M}`` per line, read from the baseline's worktree: ``read_trace``); prompts
  are token ids (exact lengths, no tokenizer round trip).
- **arrivals**: ``request_rate`` requests per second as a renewal process with gamma inter-arrival times of shape
  ``burstiness`` (1: Poisson; below 1 burstier, above 1 more regular), or ``"inf"``: all at once, the closed loop
  that ``max_concurrency`` bounds. With a rate, ``max_concurrency`` (if given) caps requests in flight, and the time a
  request waits for a slot is its client queue time (reported, not part of its TTFT).
- **the generator keeps up**: every request's lag (its actual send minus its scheduled arrival, before any
  concurrency slot) is measured; a trial whose mean lag exceeds ``max_mean_lag_s`` or whose p99 lag exceeds
  ``max_lag_s`` is the instrument's failure, said in one line: the machine cannot sustain that rate.

**Throughput at SLO** (``rate_at_slo_req_s``): each trial searches the highest rate at which every ``[[slo]]``
quantile holds (``search_rate``): a probe of ``prompts`` requests at ``rate_min`` (it must hold there) and at
``rate_max`` (it must not: the answer would lie beyond the range), then ``search_steps`` geometric bisections. The
k-th probe of a trial sends the same requests on both sides (its seed is the trial's and k), at the rate each side's
own search reached.

``check_params`` is the one validation of these params (the config calls it, before anything runs).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import lengths, tails

DEFAULT_PROMPTS, DEFAULT_INPUT_LEN, DEFAULT_OUTPUT_LEN, DEFAULT_CONCURRENCY = 32, 32, 32, 4
MAX_RATE = 500.0  # requests per second one warm generator process sends on schedule here (benchmarks/serving_tails.py)
MAX_REQUESTS = 20_000  # per trial (one JSON message each way)
MAX_TOKENS = 2_000_000  # output tokens per trial: the report's per-token gaps stay under the generator's read cap
# The generator keeps up while its lag behind the schedule is small on average (mean under 20 ms or a quarter of the
# mean inter-arrival time) and never long (p99 under 100 ms or four inter-arrival times). On a quiet machine here
# its p99 lag is 1.3-2.8 ms at 80-100 requests/s; a test suite running beside it made stalls of 13 and 26 ms, which
# bunch two requests in a Poisson stream (noise, not a broken load), and three full CI runs beside the other
# worker's engines read mean lags of 6.2 to 8.3 ms on single trials (a 5 ms floor made each the run's error or a
# rejection). A generator that cannot keep its rate falls further behind with every request: its mean lag grows
# without bound (10% short of 80 requests/s, the last of 1,000 requests is over a second late, the mean half that).
MEAN_LAG_FLOOR_S, MEAN_LAG_SHARE = 0.020, 0.25
LAG_FLOOR_S, LAG_SHARE = 0.100, 4.0
PARAMS = (
    "prompts",
    "input_len",
    "output_len",
    "length_dist",
    "max_concurrency",
    "request_rate",
    "burstiness",
    "warmup",
    "vary_lengths",
    "batch_size",
    "iterations",
    "rate_min",
    "rate_max",
    "search_steps",
    "trace",
)
MAX_TRACE_LINES = 1_000_000
TRACE_BYTES = 64 << 20
MAX_SEARCH_STEPS = 8


@dataclass(frozen=True)
class LoadPlan:
    """One trial's requests and their arrival offsets (seconds from the trial's start)."""

    prompts: tuple[tuple[int, ...], ...]
    output_lens: tuple[int, ...]
    arrivals: tuple[float, ...] | None  # None: all at once (closed loop under max_concurrency)
    max_concurrency: int | None
    warmup: int  # the first ``warmup`` requests are sent before the clock starts and not measured
    rate: float | None

    @property
    def measured(self) -> int:
        return len(self.prompts) - self.warmup

    @property
    def max_lag_s(self) -> float:
        """The p99 lag (seconds) the generator may fall behind its schedule."""
        return max(LAG_FLOOR_S, LAG_SHARE / self.rate) if self.rate else math.inf

    @property
    def max_mean_lag_s(self) -> float:
        """The mean lag (seconds) the generator may fall behind its schedule."""
        return max(MEAN_LAG_FLOOR_S, MEAN_LAG_SHARE / self.rate) if self.rate else math.inf

    def report_bytes(self) -> int:
        """How long the generator's honest report of this load can be: per request its fields and hashes, per
        token a gap (the JSON of a microsecond count and a separator), with room to spare."""
        return (1 << 20) + (self.measured * 1500 + sum(self.output_lens[self.warmup :]) * 12) * 2

    def command(self, base_url: str, model: str) -> dict[str, Any]:
        """The load generator's command (``workers/bench_client.py``)."""
        return {
            "cmd": "load",
            "base_url": base_url,
            "model": model,
            "prompts": [list(p) for p in self.prompts],
            "output_lens": list(self.output_lens),
            "arrivals": list(self.arrivals) if self.arrivals is not None else None,
            "max_concurrency": self.max_concurrency,
            "warmup": self.warmup,
        }


def _number(value: Any) -> float | None:
    """A finite number (int or float, not bool) as a float, or None (an integer beyond a double is none)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        f = float(value)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def _rate(value: Any) -> float | None:
    if value in (None, "inf", math.inf):
        return None
    f = _number(value)
    if f is None or not 0 < f <= MAX_RATE:
        raise ValueError(
            f"request_rate must be \"inf\" or a number of requests per second in (0, {MAX_RATE:g}] "
            f"(the most one load generator sends on schedule here), got {value!r}"
        )
    return float(value)


def _int(params: Mapping[str, Any], key: str, default: int | None, lo: int, hi: int) -> int | None:
    v = params.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"{key} must be an integer in [{lo}, {hi}], got {v!r}")
    return v


def check_params(
    params: Mapping[str, Any], metric: str, slos: Sequence[tails.Slo] | None = None, timeout_s: float | None = None
) -> None:
    """Raise ValueError (one line) for params a serving workload cannot run, or a metric its trials cannot judge
    (``slos`` None: not known yet, the SLO-dependent rules are skipped)."""
    unknown = sorted(set(params) - set(PARAMS))
    if unknown:
        raise ValueError(f"unknown serving param {unknown[0]!r} (known: {', '.join(PARAMS)})")
    prompts = _int(params, "prompts", DEFAULT_PROMPTS, 1, MAX_REQUESTS)
    _int(params, "input_len", DEFAULT_INPUT_LEN, 1, 1 << 20)
    _int(params, "output_len", DEFAULT_OUTPUT_LEN, 1, 1 << 20)
    _int(params, "warmup", 0, 0, MAX_REQUESTS)
    tokens = int(prompts or DEFAULT_PROMPTS) * int(params.get("output_len", DEFAULT_OUTPUT_LEN))
    if tokens > MAX_TOKENS:
        raise ValueError(
            f"a trial of {tokens} output tokens (prompts x output_len) is more than the {MAX_TOKENS} one load "
            "generator's report carries; lower prompts or output_len"
        )
    _int(params, "max_concurrency", DEFAULT_CONCURRENCY, 1, 1 << 16)
    trace = params.get("trace")
    if trace is not None and (
        not isinstance(trace, str) or not trace or trace.startswith("/") or ".." in trace.split("/")
    ):
        raise ValueError(f"trace must be a path inside the target (relative, no '..'), got {trace!r}")
    if params.get("length_dist", "fixed") not in lengths.DISTS:
        raise ValueError(f"length_dist must be one of {', '.join(lengths.DISTS)}, got {params.get('length_dist')!r}")
    _rate(params.get("request_rate"))
    b = _number(params.get("burstiness", 1.0))
    if b is None or not 0.05 <= b <= 100:
        raise ValueError(
            f"burstiness must be a number in [0.05, 100] (1: Poisson arrivals), got {params.get('burstiness')!r}"[:200]
        )
    if not tails.is_serving_metric(metric):
        raise ValueError(
            f"a serving workload has no metric {metric!r}: one of {', '.join(tails.RATE_METRICS)}, "
            f"{tails.GOODPUT} or {tails.RATE_AT_SLO} (with [[slo]]) or a quantile such as ttft_p99_ms "
            f"({', '.join(tails.DEFINITIONS)})"
        )
    searching = metric == tails.RATE_AT_SLO
    given = [k for k in ("rate_min", "rate_max", "search_steps") if k in params]
    if given and not searching:
        raise ValueError(f"{given[0]} is a param of {tails.RATE_AT_SLO} only (this workload judges {metric})")
    if searching:
        if "request_rate" in params:
            raise ValueError(f"{tails.RATE_AT_SLO} searches the rate between rate_min and rate_max: drop request_rate")
        if "max_concurrency" in params:
            raise ValueError(
                f"{tails.RATE_AT_SLO} offers open-loop rates: under max_concurrency a request's wait for a slot "
                "is not in its latencies, so the SLOs would hold past the server's capacity; drop max_concurrency"
            )
        lo, hi = _rate(params.get("rate_min", 1.0)), _rate(params.get("rate_max"))
        if lo is None or hi is None or not hi > lo:
            raise ValueError(
                f"{tails.RATE_AT_SLO} needs rate_min < rate_max, both in requests per second "
                f"(got {params.get('rate_min', 1.0)!r} and {params.get('rate_max')!r})"[:300]
            )
        _int(params, "search_steps", 4, 1, MAX_SEARCH_STEPS)
    if searching and slos is not None:
        quantiled = [x for x in slos if x.q is not None]
        if not quantiled:
            raise ValueError(
                f"{tails.RATE_AT_SLO} searches where every [[slo]] quantile holds: give an [[slo]] a "
                "percentile, e.g. metric = \"ttft_ms\" max_ms = 500 p = 99"
            )
        n = int(prompts or DEFAULT_PROMPTS)
        for x in quantiled:
            assert x.q is not None
            if n < tails.min_requests(x.q):
                raise ValueError(
                    f"the [[slo]] {x.text()} needs probes of at least {tails.min_requests(x.q)} requests "
                    f"(prompts = {n}): raise prompts or lower its p"
                )
    slowest = _rate(params.get("rate_min", 1.0)) if searching else _rate(params.get("request_rate"))
    if timeout_s is not None and slowest is not None:
        sending = int(prompts or DEFAULT_PROMPTS) / slowest
        if sending > timeout_s:
            what = "a probe at rate_min" if searching else "a trial"
            raise ValueError(
                f"{what} sends {int(prompts or DEFAULT_PROMPTS)} requests over {sending:.0f} s, beyond the workload's "
                f"timeout_s of {timeout_s:g} s: raise {'rate_min' if searching else 'request_rate'} or timeout_s, "
                "or lower prompts"
            )
    qm = tails.quantile_metric(metric)
    if qm is not None:
        need = tails.min_requests(qm.q)
        n = int(prompts or DEFAULT_PROMPTS)
        if qm.base != "itl" and n < need:  # ITL pools every chunk of every request: output_len - 1 per request
            raise ValueError(
                f"{metric} needs trials of at least {need} requests (prompts = {n}): a p{qm.q * 100:g} "
                f"over fewer is close to their maximum; raise prompts or judge a lower quantile"
            )
        chunks = n * max(0, int(params.get("output_len", DEFAULT_OUTPUT_LEN)) - 1)
        if qm.base == "itl" and chunks < need:
            raise ValueError(
                f"{metric} needs at least {need} token gaps per trial ({chunks} here): raise prompts or output_len"
            )


def vocab_size(model_dir: str) -> int:
    """The model's vocabulary size (its config.json), for drawing prompt token ids; 1,000 when it says none."""
    try:
        v = json.loads((Path(model_dir) / "config.json").read_text()).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        return 1000
    return int(v) if isinstance(v, int) and not isinstance(v, bool) and v > 20 else 1000


def read_trace(path: Path) -> tuple[tuple[int, int], ...]:
    """A trace of request lengths: one JSON object per line with positive integers ``input_len`` and
    ``output_len``. Raises ValueError (one line, naming the line) for anything else."""
    from .safe_io import read_beneath

    try:  # never through a link, a regular file, size-capped (harness.safe_io)
        data = read_beneath(path.parent, path, TRACE_BYTES)
    except OSError as exc:
        raise ValueError(f"trace {path.name}: {exc.strerror or exc}") from None
    lines = data.decode("utf-8", "replace").splitlines()
    rows = []
    for i, line in enumerate(lines[:MAX_TRACE_LINES], 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            raise ValueError(f"trace {path.name} line {i}: not JSON") from None
        ok = isinstance(obj, dict) and all(
            isinstance(obj.get(k), int) and not isinstance(obj.get(k), bool) and 0 < obj[k] <= 1 << 20
            for k in ("input_len", "output_len")
        )
        if not ok:
            raise ValueError(
                f"trace {path.name} line {i}: expected {{\"input_len\": N, \"output_len\": M}} with positive integers"
            )
        rows.append((obj["input_len"], obj["output_len"]))
    if not rows:
        raise ValueError(f"trace {path.name}: no requests")
    return tuple(rows)


def plan(
    params: Mapping[str, Any],
    seed: int,
    vocab: int,
    max_model_len: int = 1024,
    trace: Sequence[tuple[int, int]] | None = None,
) -> LoadPlan:
    """The trial's load for this seed (the same on both sides of a pair); with ``trace``, the requests' lengths
    are a seeded draw from it (without replacement while it lasts)."""
    rng = random.Random(int.from_bytes(hashlib.sha256(f"serving-load:{seed}".encode()).digest()[:8], "big"))
    warm = int(params.get("warmup", 0))
    n = int(params.get("prompts", DEFAULT_PROMPTS)) + warm
    if trace:
        picks = rng.sample(range(len(trace)), n) if n <= len(trace) else [rng.randrange(len(trace)) for _ in range(n)]
        ins, outs = [trace[i][0] for i in picks], [trace[i][1] for i in picks]
    else:
        dist = str(params.get("length_dist", "fixed"))
        ins = lengths.draw(rng, n, int(params.get("input_len", DEFAULT_INPUT_LEN)), dist)
        outs = lengths.draw(rng, n, int(params.get("output_len", DEFAULT_OUTPUT_LEN)), dist)
    ins = [max(1, min(i, max_model_len // 2)) for i in ins]  # every request fits the context
    # one token of headroom: the outputs rule scores prompt + answer with one more token (prompt_logprobs)
    outs = [max(1, min(o, max_model_len - i - 1)) for i, o in zip(ins, outs, strict=True)]
    prompts = tuple(tuple(rng.randrange(10, vocab) for _ in range(i)) for i in ins)
    rate = _rate(params.get("request_rate"))
    arrivals = None
    if rate is not None:
        shape = float(params.get("burstiness", 1.0))
        t, offs = 0.0, []
        for _ in range(n - warm):
            offs.append(t)
            t += rng.gammavariate(shape, 1.0 / (rate * shape))
        arrivals = tuple(offs)
    mc = params.get("max_concurrency", None if rate is not None else DEFAULT_CONCURRENCY)
    return LoadPlan(prompts, tuple(outs), arrivals, int(mc) if mc is not None else None, warm, rate)


def probe_seed(seed: int, k: int) -> int:
    """The seed of a rate search's k-th probe: the same on both sides of a pair."""
    return int.from_bytes(hashlib.sha256(f"probe:{seed}:{k}".encode()).digest()[:4], "big")


class SearchOutOfRange(ValueError):
    """The SLOs do not hold at rate_min: the answer lies below the search's range."""


@dataclass(frozen=True)
class Search:
    """A rate search's outcome: the estimate, the last bracket [low, high] (high = rate_max and ``censored`` when
    the SLOs still held there), and every probe (rate, held)."""

    rate: float
    low: float
    high: float
    censored: bool
    probes: tuple[tuple[float, bool], ...]


def search_rate(holds: Callable[[float], bool], lo: float, hi: float, steps: int, shift: float = 0.5) -> Search:
    """Throughput at SLO by a bounded geometric bisection. ``holds(rate)`` runs one probe. The SLOs must hold at
    ``lo`` (else SearchOutOfRange, one line); if they still hold at ``hi`` the answer is censored there (a lower
    bound). The first split is at the fraction 0.25 + 0.5 x ``shift`` of the range (log scale), later ones halve:
    a ``shift`` drawn per pair (the same on both sides) moves the grid, so that thresholds between two grid points
    do not read alike on every pair. The estimate is the bracket's geometric middle (``interpolate`` refines it)."""
    probes: list[tuple[float, bool]] = []

    def probe(rate: float) -> bool:
        ok = holds(rate)
        probes.append((rate, ok))
        return ok

    if not probe(lo):
        raise SearchOutOfRange(
            f"the SLOs do not hold even at rate_min = {lo:g} requests/s: lower rate_min (or relax the SLOs)"
        )
    if probe(hi):
        return Search(hi, hi, hi, True, tuple(probes))
    for k in range(steps):
        w = 0.25 + 0.5 * shift if k == 0 else 0.5
        mid = math.exp(math.log(lo) * (1 - w) + math.log(hi) * w)
        if probe(mid):
            lo = mid
        else:
            hi = mid
    return Search(math.sqrt(lo * hi), lo, hi, False, tuple(probes))


def interpolate(
    low: float,
    high: float,
    at_low: Mapping[str, float | None],
    at_high: Mapping[str, float | None],
    slos: Sequence[tails.Slo],
) -> float | None:
    """Where the first SLO quantile crosses its limit between the bracket's ends, on log-log scales (a quantile that
    grows as a power of the rate is exact); None when a quantile is missing or does not grow across the bracket."""
    crossings = []
    for slo in slos:
        if slo.q is None:
            continue
        name = tails.slo_quantile(slo)
        a, b = at_low.get(name), at_high.get(name)
        if a is None or b is None or a <= 0 or b <= a:
            return None
        if b <= slo.max_ms:
            continue  # not the SLO that failed at the bracket's top
        t = (math.log(slo.max_ms) - math.log(a)) / (math.log(b) - math.log(a))
        crossings.append(math.exp(math.log(low) + min(1.0, max(0.0, t)) * (math.log(high) - math.log(low))))
    return min(crossings) if crossings else None

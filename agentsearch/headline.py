"""The one-line verdict with number and unit, and the unit of a metric: one place for both.

``headline(data)`` reads an evaluation's JSON (``Evaluation.to_json()``) or an episode's verdict
record and returns, e.g.::

    MERGE — output_tok_s 780.6 → 1,266 tok/s (+62.2%, 95% CI +17.6…+123.8%, p=0.0035, 12 pairs), guards ok, confirmed +114.0%

Every terminal view (evaluate, episode, history, review), the report title and the PR title use
it, so a verdict reads the same everywhere. Pure: no I/O, no heavy imports.
"""  # noqa: E501 - the example above is one line of output, not to be broken

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

# a metric name's last part -> its unit (checked in order; the first match wins)
_UNITS: tuple[tuple[str, str], ...] = (
    (r"(^|_)(output_|total_|input_|prompt_)?(tok|toks|tokens)_(s|per_s|per_sec|ps)$", "tok/s"),
    (r"(^|_)(req|reqs|request|requests)_(s|per_s|per_sec|ps)$", "req/s"),
    (r"(^|_)(tps)$", "tok/s"),
    (r"(^|_)(rps|qps)$", "req/s"),
    (r"_(us|usec)$", "µs"),
    (r"_(ms|msec)$", "ms"),
    (r"_(ns)$", "ns"),
    (
        r"(latency|ttft|tpot|itl|elapsed|duration|time|wall|startup|delay)(_p\d+|_mean|_median|_max|_min)?_(s|sec|secs|seconds)$",
        "s",
    ),
    (r"^(p\d+_|mean_|median_)?(latency|ttft|tpot|itl|elapsed|duration|time|wall)_?(s|sec)?$", "s"),
    (r"_(pct|percent)$", "%"),
    (r"_(bytes|b)$", "B"),
    (r"_(mib)$", "MiB"),
    (r"_(gib)$", "GiB"),
)
_PER_SECOND = re.compile(r"(^|_)([a-z]+)_(s|per_s|per_sec|ps)$")


def unit(metric: str, configured: str | None = None) -> str:
    """The unit of ``metric``: the workload's configured ``unit`` when given, else from the
    metric's name (``output_tok_s`` tok/s, ``requests_s`` req/s, ``ttft_p50_ms`` ms,
    ``latency_mean_s`` s, ``ops_s`` ops/s); "" when the name says nothing."""
    if configured:
        return configured
    name = (metric or "").strip().lower()
    for pattern, u in _UNITS:
        if re.search(pattern, name):
            return u
    m = _PER_SECOND.search(name)  # `<things>_s` is things per second (ops_s, images_s, samples_s)
    if m:
        return f"{m.group(2)}/s"
    return ""


def number(x: float | None) -> str:
    """780.6, 1,393, 0.01234: four significant digits, thousands separated, no exponent below 1e9."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if x == 0:
        return "0"
    return f"{x:.4g}" if abs(x) >= 1e-4 else f"{x:.2e}"


def pct(ratio: float | None) -> str:
    """A speedup ratio as a signed percentage: 1.622 -> +62.2%."""
    if ratio is None:
        return "—"
    return f"{ratio - 1:+.1%}"


def ci_text(ci: Any) -> str:
    """``+17.6…+123.8%`` for a ratio interval (compact: keeps on 80 columns)."""
    if not ci or len(ci) != 2 or ci[0] is None or ci[1] is None:
        return "—"
    return f"{ci[0] - 1:+.1%}"[:-1] + "…" + f"{ci[1] - 1:+.1%}"


def p_text(p: float | None) -> str:
    return "—" if p is None else f"{p:.2g}"


def decision_label(w: Mapping[str, Any]) -> str:
    """A workload's decision in words for tables: a futility stop is "no gain (stopped)" or
    "slower (stopped)", never "lose"; a confirmation that held is "confirmed"."""
    d = w.get("decision") or "—"
    reason = str(w.get("reason") or "")
    if d == "lose":
        return "slower (stopped)" if reason.startswith("slower") else "no gain (stopped)"
    if d == "ok" and w.get("role") == "confirmation":
        return "confirmed"
    return {
        "win": "win",
        "ok": "ok",
        "regressed": "regressed",
        "inconclusive": "inconclusive",
        "not-confirmed": "not confirmed",
        "unconfirmed": "regression not confirmed",
        "failed": "failed",
        "not-run": "not run",
    }.get(d, d)


def objective_of(data: Mapping[str, Any]) -> tuple[str | None, Mapping[str, Any] | None]:
    """(workload name, its summary) of the objective in an evaluation or verdict record."""
    workloads = data.get("workloads") or {}
    name = data.get("objective")
    if name and name in workloads:
        return name, workloads[name]
    for n, w in workloads.items():
        if w.get("role") == "objective":
            return n, w
    return name, None


def measured(w: Mapping[str, Any], units: Mapping[str, str] | None = None, name: str | None = None) -> str:
    """``output_tok_s 780.6 → 1,266 tok/s (+62.2%, 95% CI +17.6…+123.8%, p=0.0035, 12 pairs)``: the baseline's
    median, then that median moved by the paired estimate (``speedup``; for a lower-is-better metric divided by it), so
    the arrow and the percentage always agree. The candidate's own median could point the other way (660.5 → 657.3
    beside a paired +0.5%): it pairs no trials and no engine sessions; the report's table shows both sides' medians."""
    metric = w.get("metric") or name or w.get("name") or "objective"
    u = w.get("unit") or (units or {}).get(name or w.get("name") or "") or unit(metric)
    base, cand = w.get("baseline_median"), w.get("candidate_median")
    speedup, higher = w.get("speedup"), w.get("higher_is_better")
    if (
        isinstance(higher, bool)
        and isinstance(base, (int, float))
        and isinstance(speedup, (int, float))
        and 0 < speedup < math.inf
    ):
        cand = (
            base * speedup if higher else base / speedup
        )  # (no direction: a record from before it was kept shows the medians)
    values = f"{number(base)} → {number(cand)}" + (f" {u}" if u else "")
    stats = [pct(speedup)]
    if w.get("ci"):
        stats.append(f"95% CI {ci_text(w.get('ci'))}")
    if w.get("p_value") is not None:
        stats.append(f"p={p_text(w.get('p_value'))}")
    pairs = w.get("pairs")
    if pairs is not None:
        stats.append(f"{int(pairs)} pair" + ("" if int(pairs) == 1 else "s"))
    return f"{metric} {values} ({', '.join(stats)})"


def _guards(data: Mapping[str, Any]) -> str | None:
    guards = [(n, w) for n, w in (data.get("workloads") or {}).items() if w.get("role") == "guard"]
    if not guards:
        return None
    bad = [
        f"guard {n} {decision_label(w)} {pct(w.get('speedup'))}" for n, w in guards if w.get("decision") not in ("ok",)
    ]
    return ", ".join(bad) if bad else "guards ok"


def _confirmation(data: Mapping[str, Any]) -> str | None:
    c = data.get("confirmation")
    if not c:
        return None
    if c.get("decision") == "ok":
        return f"confirmed {pct(c.get('speedup'))}"
    if c.get("decision") == "not-confirmed":
        return f"not confirmed on fresh seeds ({pct(c.get('speedup'))})"
    return None


def _short(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _first_reason(data: Mapping[str, Any], skip_objective: bool) -> str | None:
    for r in data.get("reasons") or []:
        if skip_objective and str(r).startswith("objective:"):
            continue
        return str(r)
    return None


def _objective_words(w: Mapping[str, Any]) -> str | None:
    d = w.get("decision")
    if d == "lose":
        return (
            "slower, stopped early"
            if str(w.get("reason") or "").startswith("slower")
            else "no worthwhile speedup, stopped early"
        )
    if d == "inconclusive":
        return "not significant"
    if d == "failed":
        return "measurement failed"
    return None


def headline(data: Mapping[str, Any], units: Mapping[str, str] | None = None, reason_chars: int = 120) -> str:
    """The verdict in one line, from an evaluation's JSON or a verdict record.

    ``units``: workload name -> unit, for old records that do not carry their metric's unit."""
    verdict = str(data.get("verdict") or "?").upper()
    name, obj = objective_of(data)
    parts: list[str] = []
    if obj is not None and obj.get("speedup") is not None:
        parts.append(measured(obj, units, name))
    tail: list[str] = []
    if verdict == "MERGE":
        tail += [x for x in (_guards(data), _confirmation(data)) if x]
    else:
        words = _objective_words(obj) if obj is not None else None
        guards, confirmation = _guards(data), _confirmation(data)
        if words:
            tail.append(words)
        elif guards and guards != "guards ok":
            tail.append(guards)
        elif confirmation and not confirmation.startswith("confirmed"):
            tail.append(confirmation)
        else:
            why = _first_reason(data, skip_objective=obj is not None and obj.get("speedup") is not None)
            if why:
                tail.append(_short(why, reason_chars))
    if data.get("candidate") and data.get("candidate") == data.get("baseline"):
        tail.append("no change: the candidate is the baseline")
    body = ", ".join(parts + tail)
    return f"{verdict} — {body}" if body else verdict

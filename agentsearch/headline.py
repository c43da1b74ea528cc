"""The one-line verdict with number and unit, and the unit of a metric: one place for both.

``headline(v)`` reads a judged record (an episode's ``Verdict``, an ``evaluate``'s ``Evaluation``: anything with their
verdict, reasons, commits and typed workload summaries) and returns, e.g.::

    MERGE — output_tok_s 780.6 → 1,266 tok/s (+62.2%, 95% CI +17.6…+123.8%, p=0.0035, 12 pairs), guards ok, confirmed +114.0%

Every terminal view (evaluate, episode, history, review), the report title and the PR title use
it, so a verdict reads the same everywhere. Pure: no I/O, no heavy imports.
"""  # noqa: E501 - the example above is one line of output, not to be broken

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from history.records import Role, WorkloadSummary

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


def decision_label(w: WorkloadSummary) -> str:
    """A workload's decision in words for tables: a futility stop is "no gain (stopped)" or
    "slower (stopped)", never "lose"; a confirmation that held is "confirmed"."""
    d = w.decision or "—"
    if d == "lose":
        return "slower (stopped)" if w.reason.startswith("slower") else "no gain (stopped)"
    if d == "ok" and w.role == Role.CONFIRMATION:
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


class Judged(Protocol):
    """What a headline reads: history.records' ``Verdict`` and ``Evaluation`` are both."""

    @property
    def verdict(self) -> str: ...
    @property
    def reasons(self) -> Sequence[str]: ...
    @property
    def baseline(self) -> str: ...
    @property
    def candidate(self) -> str | None: ...
    @property
    def workloads(self) -> Mapping[str, WorkloadSummary]: ...
    @property
    def confirmation(self) -> WorkloadSummary | None: ...
    @property
    def objective_summary(self) -> WorkloadSummary | None: ...


def measured(w: WorkloadSummary, units: Mapping[str, str] | None = None) -> str:
    """``output_tok_s 780.6 → 1,266 tok/s (+62.2%, 95% CI +17.6…+123.8%, p=0.0035, 12 pairs)``: the baseline's
    median, then that median moved by the paired estimate (``speedup``; for a lower-is-better metric divided by it), so
    the arrow and the percentage always agree. The candidate's own median could point the other way (660.5 → 657.3
    beside a paired +0.5%): it pairs no trials and no engine sessions; the report's table shows both sides' medians.
    ``units``: workload name -> unit, for old records that do not carry their metric's unit."""
    metric = w.metric or w.name or "objective"
    u = w.unit or (units or {}).get(w.name) or unit(metric)
    base, cand, speedup = w.baseline_median, w.candidate_median, w.speedup
    if isinstance(w.higher_is_better, bool) and base is not None and speedup is not None and 0 < speedup < math.inf:
        # (no direction: a record from before it was kept shows the medians)
        cand = base * speedup if w.higher_is_better else base / speedup
    values = f"{number(base)} → {number(cand)}" + (f" {u}" if u else "")
    stats = [pct(speedup)]
    if w.ci:
        stats.append(f"95% CI {ci_text(w.ci)}")
    if w.p_value is not None:
        stats.append(f"p={p_text(w.p_value)}")
    stats.append(f"{w.pairs} pair" + ("" if w.pairs == 1 else "s"))
    return f"{metric} {values} ({', '.join(stats)})"


def _guards(v: Judged) -> str | None:
    guards = [w for w in v.workloads.values() if w.role == Role.GUARD]
    if not guards:
        return None
    bad = [f"guard {w.name} {decision_label(w)} {pct(w.speedup)}" for w in guards if w.decision != "ok"]
    return ", ".join(bad) if bad else "guards ok"


def _confirmation(v: Judged) -> str | None:
    c = v.confirmation
    if c is None:
        return None
    if c.decision == "ok":
        return f"confirmed {pct(c.speedup)}"
    if c.decision == "not-confirmed":
        return f"not confirmed on fresh seeds ({pct(c.speedup)})"
    return None


def _short(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _first_reason(v: Judged, skip_objective: bool) -> str | None:
    for r in v.reasons:
        if skip_objective and r.startswith("objective:"):
            continue
        return r
    return None


def _objective_words(w: WorkloadSummary) -> str | None:
    if w.decision == "lose":
        return "slower, stopped early" if w.reason.startswith("slower") else "no worthwhile speedup, stopped early"
    if w.decision == "inconclusive":
        return "not significant"
    return None  # "failed": the check's own reason says what failed (outputs that differ, an engine that died)


def headline(v: Judged, units: Mapping[str, str] | None = None, reason_chars: int = 120) -> str:
    """The verdict in one line.

    ``units``: workload name -> unit, for old records that do not carry their metric's unit."""
    verdict = (v.verdict or "?").upper()
    obj = v.objective_summary
    measured_obj = obj is not None and obj.speedup is not None
    parts: list[str] = [measured(obj, units)] if obj is not None and measured_obj else []
    tail: list[str] = []
    if verdict == "MERGE":
        tail += [x for x in (_guards(v), _confirmation(v)) if x]
    else:
        words = _objective_words(obj) if obj is not None else None
        guards, confirmation = _guards(v), _confirmation(v)
        if words:
            tail.append(words)
        elif guards and guards != "guards ok":
            tail.append(guards)
        elif confirmation and not confirmation.startswith("confirmed"):
            tail.append(confirmation)
        else:
            why = _first_reason(v, skip_objective=measured_obj and obj is not None and obj.decision != "failed")
            if why:
                tail.append(_short(why, reason_chars))
    if v.candidate and v.candidate == v.baseline:
        tail.append("no change: the candidate is the baseline")
    body = ", ".join(parts + tail)
    return f"{verdict} — {body}" if body else verdict

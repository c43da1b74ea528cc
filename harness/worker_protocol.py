"""What a warm worker and the orchestrator say to each other: the worker's errors, the candidate's serving settings
(serving.json, the environment it may set), and how one measurement's reply is checked against the orchestrator's
own clock and combined from its parts."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .trials import (
    CRASH,
    TIMEOUT,
    TrialOutcome,
    metric_error,
)

MAX_MESSAGE_BYTES = 4 << 20  # one line on the result pipe
# candidate-controlled environment (the fork's serving.json) may only set these
SERVING_ENV_PREFIXES = ("VLLM_", "OMP_", "KMP_", "MKL_", "ONEDNN_", "DNNL_", "TORCHINDUCTOR_")


class WorkerError(RuntimeError):
    pass


class WorkerTimeout(WorkerError):
    """The worker did not answer within its limit (recorded as a ``timeout``, not a crash)."""


def failure_of(exc: BaseException) -> str:
    """A trial's failure kind for a worker's error: a timeout, else a crash."""
    return TIMEOUT if isinstance(exc, WorkerTimeout) else CRASH


SERVING_FILE = "serving.json"  # the fork's serving config: the engine arguments and environment proposals may change


def read_serving(worktree: Path) -> Any:
    """The worktree's serving.json ({} when absent), read without following links and size-capped."""
    from .safe_io import read_beneath

    path = worktree / SERVING_FILE
    if not path.exists() and not path.is_symlink():
        return {}
    try:
        return json.loads(read_beneath(worktree, path, 1024 * 1024))
    except (ValueError, OSError, RecursionError) as exc:
        raise WorkerError(f"serving.json is not usable: {exc}") from None


def serving_env(worktree: Path) -> dict[str, str]:
    """Environment variables from the worktree's serving.json (whitelisted prefixes only)."""
    data = read_serving(worktree)
    env = data.get("env", {}) if isinstance(data, dict) else {}
    if not isinstance(env, dict):
        raise WorkerError("serving.json: env must be an object of strings")
    bad = [k for k in env if not k.startswith(SERVING_ENV_PREFIXES)]
    if bad:
        raise WorkerError(
            f"serving.json: env {bad[0]!r} is not allowed (allowed prefixes: {', '.join(SERVING_ENV_PREFIXES)})"
        )
    return {str(k): str(v) for k, v in env.items()}


MAX_OUTPUT_TOKENS = 1_000_000  # generated tokens one measurement may report
CLOCK_BREACH = "the worker's clock disagrees with the orchestrator's"
CLOCK_SLACK_S = 50e-6  # a worker's span lies inside the orchestrator's round trip around it: the clocks' granularity


def clock_disagrees(wall_s: float, worker_s: float, allowance_s: float) -> str:
    """'' or how a worker's own reading of a span (``worker_s``) disagrees with the orchestrator's round trip
    around it (``wall_s``): longer than the round trip, or under half of it less ``allowance_s`` (it runs slow)."""
    if worker_s > wall_s + CLOCK_SLACK_S:
        return (
            f"{CLOCK_BREACH}: {worker_s * 1e3:.3f} ms on its clock in a round trip of {wall_s * 1e3:.3f} ms "
            "on the orchestrator's"
        )
    if worker_s < wall_s / 2 - allowance_s:
        return (
            f"{CLOCK_BREACH}: {worker_s * 1e3:.3f} ms on its clock, {wall_s * 1e3:.3f} ms on the orchestrator's: "
            "it runs slow"
        )
    return ""


def parse_outputs(raw: Any) -> tuple[tuple[tuple[int, ...], ...] | None, str]:
    """(outputs, error): the token ids a measurement generated, validated (None when not reported)."""
    if raw is None:
        return None, ""
    if not isinstance(raw, list) or not all(isinstance(o, list) for o in raw):
        return None, "the worker reported malformed outputs (expected lists of token ids)"
    if sum(len(o) for o in raw) > MAX_OUTPUT_TOKENS:
        return None, "the worker reported more generated tokens than any measurement makes"
    if not all(type(t) is int and 0 <= t < 2**31 for o in raw for t in o):
        return None, "the worker reported token ids that are not small non-negative integers"
    return tuple(tuple(o) for o in raw), ""


def on_orchestrator_clock(metrics: dict[str, Any], outputs: tuple[tuple[int, ...], ...] | None, wall: float) -> str:
    """Rates on the orchestrator's clock, counted from the outputs: a clock or a counter inside the
    candidate's process (which it could patch) never decides a number. '' or why the round is invalid.

    Throughput rounds (every round ``measure`` times itself): tokens and requests are counted from ``outputs``
    and divided by the round trip of the measure command (prompt building and the answer included, the same on
    both sides), whatever the worker reported; the worker's own ``elapsed_s`` is kept as ``worker_elapsed_s``.
    A reading longer than the round trip around it is impossible on an honest clock, under any load: it fails the
    round (``clock_disagrees``). A reading much shorter is not a failure here: it decides no number (the rate is
    the round trip's), and a loaded orchestrator makes honest round trips long: the rule "under half the round
    trip less 50 ms" failed an honest baseline trial in a demo under load, and the evaluation rejected its
    candidate (red team round 4). Latency rounds are timed batch by batch by the
    orchestrator (``_measure_latency``)."""
    if wall <= 0:
        return "the measurement took no time on the orchestrator's clock"
    if outputs is None:
        return "the worker reported a throughput without the outputs it generated"
    out_tokens, n = sum(len(o) for o in outputs), len(outputs)
    in_tokens = metrics.get("input_tokens")
    if type(in_tokens) is not int or in_tokens < 0:
        return "the worker reported no input token count"
    worker = metrics.get("elapsed_s")
    if isinstance(worker, (int, float)) and not isinstance(worker, bool):
        why = clock_disagrees(wall, float(worker), math.inf)  # only the impossible reading
        if why:
            return why
    metrics["worker_elapsed_s"] = worker
    metrics.update(
        elapsed_s=wall,
        output_tokens=out_tokens,
        output_tok_s=out_tokens / wall,
        total_tok_s=(out_tokens + in_tokens) / wall,
        requests_s=n / wall,
    )
    return ""


DEFAULT_PROMPTS = 64  # a throughput trial's prompts when the workload does not say (the worker's default too)
SLICEABLE_METRICS = ("output_tok_s", "total_tok_s", "requests_s", "elapsed_s")  # what combine_parts recomputes
HARNESS_KEYS = ("cpu_s", "cpus_pinned", "cpu_wait_s", "slices")  # metrics only the orchestrator writes


def harness_key(key: str) -> bool:
    """A metric only the orchestrator writes (``HARNESS_KEYS``, and the outputs rule's ``outputs_*``): a worker's is
    dropped, so a side cannot write what the report says of its outputs."""
    return key in HARNESS_KEYS or key.startswith("outputs_")


def combine_parts(parts: list[TrialOutcome], metric: str) -> TrialOutcome:
    """One throughput trial from its parts (all successful): the tokens and requests of their outputs over their
    summed round trips on the orchestrator's clock (never a number the worker reported), outputs in part order."""
    outputs = tuple(o for p in parts for o in (p.outputs or ()))
    wall = sum(p.wall_s for p in parts)
    out_tokens = sum(len(o) for o in outputs)
    in_tokens = sum(int(p.metrics.get("input_tokens") or 0) for p in parts)  # checked per part (on_orchestrator_clock)
    metrics: dict[str, Any] = {
        "elapsed_s": wall,
        "output_tokens": out_tokens,
        "input_tokens": in_tokens,
        "worker_elapsed_s": sum(float(p.metrics.get("worker_elapsed_s") or 0) for p in parts),
    }
    if all("cpus_pinned" in p.metrics for p in parts):
        metrics.update(
            cpu_s=round(sum(p.metrics["cpu_s"] for p in parts), 4), cpus_pinned=parts[0].metrics["cpus_pinned"]
        )
    if all("cpu_wait_s" in p.metrics for p in parts):
        metrics["cpu_wait_s"] = round(sum(p.metrics["cpu_wait_s"] for p in parts), 4)
    if wall <= 0 or any(p.outputs is None for p in parts):
        return TrialOutcome(
            False, None, metrics, wall, "a part of the trial has no time or no outputs on the orchestrator's clock"
        )
    metrics.update(
        output_tok_s=out_tokens / wall,
        total_tok_s=(out_tokens + in_tokens) / wall,
        requests_s=len(outputs) / wall,
        slices=len(parts),
        engine_startup_s=parts[0].metrics.get("engine_startup_s"),
    )
    err = metric_error(metrics, metric)
    if err:
        return TrialOutcome(False, None, metrics, wall, err)
    return TrialOutcome(True, float(metrics[metric]), metrics, wall, outputs=outputs)

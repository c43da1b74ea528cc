"""Regimes: the engine arguments that decide which code paths a vLLM run reaches, not what it computes.

A change whose numerics depend on the decode batch size, on chunked prefill, on prefix-cache hits or on the
KV block size is dormant in one regime and bites in another. The distribution checks therefore name the
regime each logprob run used and compare like with like: the candidate against the pinned reference in the
candidate's regime (and in every regime the target says production uses), and the baseline against the
reference in the same regime when main is to be blamed.

A regime is the values of ``REGIME_KEYS`` a run's engine gets: the logprob engine's arguments
(``[verify] engine``) with the side's ``serving.json`` engine section over them. ``None`` means "not set":
the engine's own default. Pure functions; the worker applies an override after ``serving.json``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

# batching (decode batch size, token budget per step), chunked prefill, prefix caching, KV block size
REGIME_KEYS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "block_size",
)
Regime = dict[str, Any]


class RegimeError(ValueError):
    pass


def check_value(key: str, value: Any) -> None:
    """RegimeError unless ``key`` is a regime key and ``value`` a value it can take (a count or a switch)."""
    if key not in REGIME_KEYS:
        raise RegimeError(f"unknown regime key {key!r} (regime keys: {', '.join(REGIME_KEYS)})")
    if value is None:
        return
    if key.startswith("enable_"):
        if not isinstance(value, bool):
            raise RegimeError(f"regime {key}: expected true or false, got {value!r}")
    elif isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1 << 20:
        raise RegimeError(f"regime {key}: expected a whole number from 1 to 1048576, got {value!r}")


def effective(engine: Mapping[str, Any], serving: Any) -> Regime:
    """The regime of a run whose logprob engine gets ``engine`` with the side's serving.json (``serving``,
    already parsed: anything a candidate wrote) over it. RegimeError when serving.json sets a regime key to a
    value no engine takes (the run would fail anyway; the regime must be one the reference can run in)."""
    if serving is not None and not isinstance(serving, dict):
        raise RegimeError("serving.json must be an object")
    over = (serving or {}).get("engine", {})
    if not isinstance(over, dict):
        raise RegimeError("serving.json: engine must be an object of engine arguments")
    out: Regime = {}
    for key in REGIME_KEYS:
        value = over[key] if key in over else engine.get(key)
        check_value(key, value)
        out[key] = value
    return out


def with_overrides(regime: Mapping[str, Any], overrides: Mapping[str, Any]) -> Regime:
    """``regime`` with a configured partial regime (``[verify] regimes`` entry) over it."""
    for key, value in overrides.items():
        check_value(key, value)
    return {**regime, **overrides}


def key(regime: Mapping[str, Any]) -> str:
    return json.dumps({k: regime.get(k) for k in REGIME_KEYS}, sort_keys=True)


def describe(regime: Mapping[str, Any], against: Mapping[str, Any] | None = None) -> str:
    """'max_num_seqs 32' — the keys that are set (with ``against``: only those that differ from it)."""
    keys = [
        k for k in REGIME_KEYS if regime.get(k) is not None and (against is None or regime.get(k) != against.get(k))
    ]
    if not keys and against is not None:
        return "the same regime"
    return ", ".join(f"{k} {json.dumps(regime[k])}" for k in keys) or "the engine's defaults"


__all__ = ["REGIME_KEYS", "Regime", "RegimeError", "check_value", "effective", "with_overrides", "key", "describe"]


def apart_from_regime(a: Any, b: Any) -> bool:
    """Whether two parsed serving.json files are the same but for the ``REGIME_KEYS`` of their engine sections: run in
    one regime (the worker sets every regime key), their engines get the same arguments and environment. Compared as
    JSON text, types kept: ``1``, ``1.0`` and ``true`` are equal in Python but reach an engine (or an environment
    variable, ``str(v)``) as different values."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False

    def rest(x: dict) -> dict:
        engine = x.get("engine", {})
        if not isinstance(engine, dict):
            return {"\0not an object": engine}
        return {**x, "engine": {k: v for k, v in engine.items() if k not in REGIME_KEYS}}

    try:
        return json.dumps(rest(a), sort_keys=True) == json.dumps(rest(b), sort_keys=True)
    except (TypeError, ValueError):
        return False

"""Varied input-length distributions: each pair's seed picks a length profile.

A candidate tuned to one request shape would win on it and lose elsewhere; the gate measures
every workload over a spread of shapes instead. Both sides of a pair share the seed, so they
see the same shape. For built-in vLLM workloads the profile rewrites the workload's
``length_dist`` and scales ``input_len``/``output_len``; command workloads get it as
AGENTSEARCH_LENGTH_DIST and AGENTSEARCH_LENGTH_SCALE to use if their inputs have lengths.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping
from typing import Any

DISTS = ("fixed", "uniform", "zipf")
# moderate on purpose: enough that no exact shape can be special-cased, not so wide that the
# effect's heterogeneity across shapes drowns a real win (a 4x range did, on the tiny model)
SCALES = (0.75, 1.0, 1.25)


def profile(seed: int) -> tuple[str, float]:
    h = hashlib.sha256(f"lengths:{seed}".encode()).digest()
    return DISTS[h[0] % len(DISTS)], SCALES[h[1] % len(SCALES)]


def draw(rng: random.Random, n: int, mean: int, dist: str, lo: int = 4, hi: int | None = None) -> list[int]:
    """n lengths around ``mean`` from a seeded distribution: fixed, uniform or zipf. The same as
    ``harness/workers/vllm_worker.py``'s ``lengths`` (which runs in the sandbox and imports nothing of ours;
    tests/test_serving_tails.py holds the two equal)."""
    hi = hi or 2 * mean
    if dist == "fixed":
        return [mean] * n
    if dist == "uniform":
        return [rng.randint(max(lo, mean // 2), max(lo, mean + mean // 2)) for _ in range(n)]
    if dist == "zipf":
        raw = [1.0 / (rng.random() ** (1 / 1.5)) for _ in range(n)]
        scale = mean / (sum(raw) / n)
        return [int(min(hi * 4, max(lo, round(r * scale)))) for r in raw]
    raise ValueError(f"unknown length distribution {dist!r} ({', '.join(DISTS)})")


def vary(params: Mapping[str, Any], seed: int, default_len: int = 64) -> dict[str, Any]:
    """``params`` with this seed's length profile, unless the workload sets vary_lengths = false; lengths the params
    do not set are the workload kind's ``default_len`` (64 for the engine workloads, 32 for serving), scaled."""
    out = dict(params)
    if not out.pop("vary_lengths", True):
        return out
    dist, scale = profile(seed)
    out["length_dist"] = dist
    for key in ("input_len", "output_len"):
        out[key] = max(4, int(round(int(out.get(key, default_len)) * scale)))
    return out


def env(seed: int) -> dict[str, str]:
    dist, scale = profile(seed)
    return {"AGENTSEARCH_LENGTH_DIST": dist, "AGENTSEARCH_LENGTH_SCALE": f"{scale:g}"}

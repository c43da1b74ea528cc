"""Token-level distribution checks: is the candidate's next-token distribution the baseline's?

Input: two logprob dumps in the contract of docs/CONTRACTS.md (one JSON line per prompt and path:
``{"id", "path", "tokens", "topk"}``). Per compared position: KL divergence and total
variation on the union of both top-k supports plus a tail bucket, |Δ logprob| of the
baseline's top token (and its signed value, for the systematic-shift test), top-1 agreement.

``prefill`` positions are teacher-forced on the same tokens (different tokens = the
tokenization changed = failure). ``decode`` sequences are aligned step by step until they
diverge; a divergence is acceptable only where the baseline's top two tokens are a near tie.
``sample`` sequences are seeded sampled continuations with the sampler's *processed* logprobs
(after temperature, top-k/top-p/min-p and penalties); both sides use the same seed per prompt,
so they are aligned step by step until a draw differs (the draw test judges the draws).

The statistics people already read (llama.cpp's ``--kl-divergence``): mean KL with its standard
error, KL percentiles, the RMS of Δp (the change of the probability of the baseline's top token)
and the share of positions with the same top token.

The verdict compares the candidate against the **noise floor** — the baseline against itself
under a different batch composition and order — in one of three modes:
``exact`` (bit-identical), ``tight`` (within the floor, with a dtype-aware minimum so that
floating-point reassociation passes), ``approx`` (user caps). In every mode a systematic
shift (the top token's logprob moved the same way almost everywhere) fails.
Pure functions; no I/O except ``read_dump``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

PATHS = ("prefill", "decode", "sample", "draws")
KL_PERCENTILES = (99.9, 99, 95, 90, 50)


def _stats() -> Any:
    """scipy.stats, imported where a distribution check first tests (its import costs every process 0.7 s)."""
    from scipy import stats

    return stats


# Smallest differences "tight" mode always tolerates, per dtype (reassociation of fused or
# reordered matmuls moves float32 logprobs by about 1e-6; bf16/fp16 by far more).
DTYPE_FLOOR = {
    "float32": {"dlogprob_max": 1e-4, "kl_mean": 1e-9, "kl_p99": 1e-8, "kl_max": 1e-7, "tie": 1e-4},
    "bfloat16": {"dlogprob_max": 5e-2, "kl_mean": 1e-5, "kl_p99": 1e-4, "kl_max": 1e-3, "tie": 5e-2},
    "float16": {"dlogprob_max": 1e-2, "kl_mean": 1e-6, "kl_p99": 1e-5, "kl_max": 1e-4, "tie": 1e-2},
}
# The tail bucket's smallest mass. Logprobs are float32 (vLLM computes them in float32 whatever the model's
# dtype): a complete listing (the sample path's processed logprobs, where the sampler masked every other token)
# sums to 1 within ~1e-7. Without a floor, 0.9999999 on one side and 1.00000003 on the other read as a tail of
# 1e-7 against none: KL 5e-6 at every such position (the benign reassociation's false alarm, measured).
TAIL_FLOOR = 1e-6
FLOOR_MULTIPLIER = 3.0  # tight: candidate statistics may be at most 3x the noise floor's
SHIFT_ALPHA = 1e-4  # systematic-shift test level


@dataclass(frozen=True)
class Record:
    id: str
    path: str
    tokens: tuple[int, ...]
    topk: tuple[tuple[tuple[int, float], ...] | None, ...]


MAX_DUMP_BYTES = 512 * 1024 * 1024


def read_dump(path: Path, root: Path | None = None) -> dict[tuple[str, str], Record]:
    """Parse a logprob dump; ValueError naming the line on any contract violation. With ``root`` (the
    side's output directory) the file is read without following links, regular and size-capped."""
    from .safe_io import read_beneath

    raw = read_beneath(root, path, MAX_DUMP_BYTES) if root is not None else path.read_bytes()
    out: dict[tuple[str, str], Record] = {}
    for n, line in enumerate(raw.decode("utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            p = d["path"]
            if p not in PATHS:
                raise ValueError(f"path must be one of {PATHS}, got {p!r}")
            tokens = tuple(int(t) for t in d["tokens"])
            topk = tuple(None if e is None else tuple((int(t), float(lp)) for t, lp in e) for e in d.get("topk") or [])
            if any(e and any(math.isnan(lp) or lp == math.inf for _, lp in e) for e in topk):
                raise ValueError("a logprob is NaN or +inf (a logprob is a finite number at most 0, or -inf)")
            if p != "draws" and len(topk) != len(tokens):
                raise ValueError(f"{len(tokens)} tokens but {len(topk)} topk entries")
            rec = Record(str(d["id"]), p, tokens, topk)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path.name}:{n}: bad logprob line ({exc})") from None
        out[(rec.id, rec.path)] = rec
    return out


def _dist(entries: Iterable[tuple[int, float]]) -> dict[int, float]:
    return {t: lp for t, lp in entries}


def compare_position(a: Mapping[int, float], b: Mapping[int, float]) -> tuple[float, float, float, float, bool]:
    """(KL(a||b), TV, |Δ lp top|, signed Δ lp top, top-1 agrees) on the union support + tail.

    A token missing from one side's top-k gets an equal share of that side's tail mass (one share
    stays in the tail), never more than its smallest listed probability; both sides' distributions
    are normalized, with a tail of at least ``TAIL_FLOOR``.
    """
    union = set(a) | set(b)

    def probs(d: Mapping[int, float]) -> tuple[dict[int, float], float]:
        known = {t: math.exp(lp) for t, lp in d.items()}
        # a listing of every token the sampler kept (processed logprobs) sums to 1 only within rounding:
        # the tail is at least TAIL_FLOOR on both sides, so rounding is never read as a difference
        tail = max(TAIL_FLOOR, 1.0 - sum(known.values()))
        missing = [t for t in union if t not in known]
        if missing:
            share = min(tail / (len(missing) + 1), min(known.values()) if known else tail)
            for t in missing:
                known[t] = share
            tail -= share * len(missing)
        total = sum(known.values()) + tail
        return {t: p / total for t, p in known.items()}, tail / total

    pa, ta = probs(a)
    pb, tb = probs(b)
    eps = 1e-30
    kl = sum(p * (math.log(max(p, eps)) - math.log(max(pb[t], eps))) for t, p in pa.items() if p > 0)
    if ta > 0:
        kl += ta * (math.log(max(ta, eps)) - math.log(max(tb, eps)))
    tv = 0.5 * (sum(abs(pa[t] - pb[t]) for t in union) + abs(ta - tb))
    top_a = max(a.items(), key=lambda kv: kv[1])[0]
    top_b = max(b.items(), key=lambda kv: kv[1])[0]
    lp_b_of_top = b.get(top_a, math.log(max(pb[top_a], eps)))
    signed = lp_b_of_top - a[top_a]
    return max(kl, 0.0), tv, abs(signed), signed, top_a == top_b


@dataclass
class PathStats:
    kl: list[float] = field(default_factory=list)
    tv: list[float] = field(default_factory=list)
    dlp: list[float] = field(default_factory=list)
    signed: list[float] = field(default_factory=list)
    dp: list[float] = field(default_factory=list)  # p_cand(top) - p_base(top), top = the baseline's top token
    agree: list[bool] = field(default_factory=list)
    pos: list[int] = field(default_factory=list)  # position of each compared entry
    exact: bool = True
    sequences: int = 0
    divergences: int = 0
    bad_divergences: list[str] = field(default_factory=list)
    first_divergence: list[int] = field(default_factory=list)
    token_mismatch: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)  # positions the baseline lists and the candidate does not

    def summary(self) -> dict[str, Any]:
        def q(xs: list[float], p: float) -> float | None:
            return float(np.quantile(xs, p)) if xs else None

        n = len(self.kl)
        se = float(np.std(self.kl, ddof=1) / math.sqrt(n)) if n > 1 else None
        agree = float(np.mean(self.agree)) if self.agree else None
        return {
            "positions": n,
            "sequences": self.sequences,
            "kl_mean": float(np.mean(self.kl)) if self.kl else None,
            "kl_mean_se": se,
            "kl_p99": q(self.kl, 0.99),
            "kl_percentiles": {f"{p:g}": q(self.kl, p / 100) for p in KL_PERCENTILES} if self.kl else {},
            "kl_max": max(self.kl) if self.kl else None,
            "tv_max": max(self.tv) if self.tv else None,
            "dlogprob_max": max(self.dlp) if self.dlp else None,
            "dp_rms": float(np.sqrt(np.mean(np.square(self.dp)))) if self.dp else None,
            "top1_agreement": agree,
            "same_top_pct": None if agree is None else 100 * agree,
            "same_top_pct_se": None if agree is None or n < 2 else 100 * math.sqrt(agree * (1 - agree) / (n - 1)),
            "exact": self.exact,
            "divergences": self.divergences,
            "first_divergence_median": float(np.median(self.first_divergence)) if self.first_divergence else None,
            "kl_by_position": self.profile(),
        }

    def profile(self, positions: int = 48) -> list[float]:
        """Mean KL at each position 0..positions-1 (the last bin holds every later position)."""
        if not self.kl or len(self.pos) != len(self.kl):
            return []
        sums = np.zeros(positions)
        counts = np.zeros(positions)
        idx = np.minimum(np.asarray(self.pos), positions - 1)
        np.add.at(sums, idx, np.asarray(self.kl))
        np.add.at(counts, idx, 1)
        last = int(idx.max()) + 1
        return [float(f"{v:.4g}") for v in (sums[:last] / np.maximum(counts[:last], 1))]


def compare(
    base: Mapping[tuple[str, str], Record],
    cand: Mapping[tuple[str, str], Record],
    ids: Iterable[str],
    tie: float,
    paths: Iterable[str] = ("prefill", "decode"),
) -> dict[str, PathStats]:
    """Per-path statistics of ``cand`` against ``base`` over the prompts ``ids`` (the ids of the
    ``sample`` path carry a setting suffix, ``<prompt id>#s<n>``: every record of a prompt counts)."""
    out = {p: PathStats() for p in paths}
    wanted = set(ids)
    by_prompt: dict[str, list[str]] = {}
    for rid, path in base:
        if path == "sample" and rid.split("#", 1)[0] in wanted:
            by_prompt.setdefault(rid.split("#", 1)[0], []).append(rid)
    for pid in ids:
        for path, st in out.items():
            for rid in sorted(by_prompt.get(pid, [])) if path == "sample" else [pid]:
                _compare_record(base.get((rid, path)), cand.get((rid, path)), rid, path, st, tie)
    return out


def _compare_record(a: Record | None, b: Record | None, pid: str, path: str, st: PathStats, tie: float) -> None:
    if a is None:
        return
    if b is None:
        st.missing.append(pid)
        return
    st.sequences += 1
    if path == "prefill" and a.tokens != b.tokens:
        st.token_mismatch.append(pid)
        st.exact = False
        return
    diverged = False
    for i, (ea, eb) in enumerate(zip(a.topk, b.topk, strict=False)):
        if not ea:
            continue  # nothing to compare against (the first prompt position has no logprobs)
        if not eb:  # a candidate listing nothing (or only NaN, which the worker drops) must not shrink the comparison
            st.dropped.append(f"{pid}@{i}")
            st.exact = False
            continue
        da, db = _dist(ea), _dist(eb)
        kl, tv, dlp, signed, agree = compare_position(da, db)
        st.kl.append(kl)
        st.tv.append(tv)
        st.dlp.append(dlp)
        st.signed.append(signed)
        top_lp = max(da.values())
        st.dp.append(math.exp(top_lp) * math.expm1(signed) if math.isfinite(signed) else -math.exp(top_lp))
        st.agree.append(agree)
        st.pos.append(i)
        if ea != eb:
            st.exact = False
        if path in ("decode", "sample") and i < len(b.tokens) and a.tokens[i] != b.tokens[i]:
            st.divergences += 1
            st.first_divergence.append(i)
            diverged = True
            if path == "decode":
                top2 = sorted(da.values(), reverse=True)[:2]
                gap = top2[0] - top2[1] if len(top2) == 2 else float("inf")
                if gap > tie:
                    st.bad_divergences.append(f"{pid}@{i} (top-2 gap {gap:.2g})")
            # sample: a different draw with the same seed is the draw test's to judge
            break  # after a divergence the contexts differ: stop comparing
    if path in ("decode", "sample") and len(a.tokens) != len(b.tokens) and not diverged:
        st.exact = False


@dataclass(frozen=True)
class PathVerdict:
    path: str
    passed: bool
    reasons: tuple[str, ...]
    stats: Mapping[str, Any]


def judge_path(
    path: str, cand: PathStats, floor: PathStats, mode: str, dtype: str, caps: Mapping[str, float] | None = None
) -> PathVerdict:
    """Pass/fail of one path against the noise floor (``tight``), bit-identity (``exact``) or caps."""
    reasons: list[str] = []
    s = cand.summary()
    if cand.missing:
        reasons.append(
            f"{path}: candidate produced no output for {len(cand.missing)} prompt(s), e.g. {cand.missing[0]}"
        )
    if cand.dropped:
        reasons.append(
            f"{path}: candidate listed no logprobs at {len(cand.dropped)} position(s) the baseline did, "
            f"e.g. {cand.dropped[0]}"
        )
    if cand.token_mismatch:
        reasons.append(
            f"{path}: prompt tokens differ for {len(cand.token_mismatch)} prompt(s), e.g. {cand.token_mismatch[0]} "
            "(tokenization changed)"
        )
    if cand.bad_divergences:
        reasons.append(
            f"{path}: greedy continuation diverged without a near tie in {len(cand.bad_divergences)} sequence(s), "
            f"e.g. {cand.bad_divergences[0]}"
        )
    if not cand.kl and not reasons:
        reasons.append(f"{path}: no positions compared")
    if mode == "exact":
        if not cand.exact:
            reasons.append(
                f"{path}: not bit-identical (max |Δ logprob| {s['dlogprob_max']:.3g})"
                if s["dlogprob_max"] is not None
                else f"{path}: not bit-identical"
            )
    elif cand.kl:
        if mode == "tight":
            f = floor.summary()
            mins = DTYPE_FLOOR.get(dtype, DTYPE_FLOOR["float32"])
            limits = {
                key: max(FLOOR_MULTIPLIER * (f[key] or 0.0), mins[key])
                for key in ("kl_mean", "kl_p99", "kl_max", "dlogprob_max")
            }
        else:
            limits = dict(caps or {})
        for key, limit in limits.items():
            if key in s and s[key] is not None and not s[key] <= limit:  # NaN is never within a limit
                reasons.append(
                    f"{path}: {key} {s[key]:.3g} exceeds {limit:.3g}"
                    + (" (noise floor x3 or the dtype minimum)" if mode == "tight" else "")
                )
        if mode == "approx" and caps and "min_top1" in caps and (s["top1_agreement"] or 0) < caps["min_top1"]:
            reasons.append(f"{path}: top-1 agreement {s['top1_agreement']:.3f} below {caps['min_top1']}")
        if (
            mode == "tight"
            and floor.kl
            and len(cand.kl) >= 20
            and max(cand.kl) > DTYPE_FLOOR.get(dtype, DTYPE_FLOOR["float32"])["kl_max"]
        ):
            # consistency: are the candidate's divergences stochastically larger than the floor's?
            u = _stats().mannwhitneyu(cand.kl, floor.kl, alternative="greater")
            if u.pvalue < 1e-3:
                reasons.append(f"{path}: divergences larger than the noise floor (Mann-Whitney p={u.pvalue:.2g})")
    shift = systematic_shift(cand.signed, floor.signed, dtype)
    if shift:
        reasons.append(f"{path}: {shift}")
    return PathVerdict(path, not reasons, tuple(reasons), s)


def systematic_shift(signed: list[float], floor_signed: list[float], dtype: str) -> str:
    """A consistent move of the top token's logprob in one direction, however small each one is."""
    nonzero = [x for x in signed if x != 0.0]
    if len(nonzero) < 20:
        return ""
    pos = sum(1 for x in nonzero if x > 0)
    p = float(_stats().binomtest(pos, len(nonzero), 0.5).pvalue)
    mean = float(np.mean(signed))
    floor_mean = abs(float(np.mean(floor_signed))) if floor_signed else 0.0
    tiny = DTYPE_FLOOR.get(dtype, DTYPE_FLOOR["float32"])["dlogprob_max"] / 100
    if p < SHIFT_ALPHA and abs(mean) > max(tiny, 3 * floor_mean):
        direction = "up" if mean > 0 else "down"
        return (
            f"systematic shift: the top token's logprob moved {direction} at {max(pos, len(nonzero) - pos)} "
            f"of {len(nonzero)} positions (mean {mean:+.3g}, sign test p={p:.2g})"
        )
    return ""


DRAW_ALPHA = 1e-3  # level of the paired draw test
DRAW_MIN = 100  # draws per context and setting below which the draw test cannot resolve anything


def judge_draws(
    base: Mapping[tuple[str, str], Record],
    floor: Mapping[tuple[str, str], Record],
    unrelated: Mapping[tuple[str, str], Record],
    cand: Mapping[tuple[str, str], Record],
) -> PathVerdict:
    """The end-to-end check of the sampler itself (its use of the random numbers), paired.

    ``base`` and ``cand`` drew with the same seeds: a correct sampler makes the same draw from the
    same distribution, so the statistic is the share of draws that changed. ``floor`` is the
    baseline again with the same seeds in another batch (how many change by themselves);
    ``unrelated`` is the baseline with seeds from a range that overlaps neither (how many change
    when the seeds have nothing to do with each other: what a sampler that ignores or misuses its
    seed looks like). A context whose draws are all one token under unrelated seeds cannot show a
    change: it is *not testable* and reported as such; if no context is testable the draw test is
    ``not testable`` (the processed logprobs of the sample path still judge the sampler's maths).
    """
    keys = sorted(k for k in base if k[1] == "draws")
    reasons: list[str] = []
    if not keys:
        return PathVerdict("draws", True, (), {"contexts": 0, "status": "not run"})
    total = changed = floor_changed = unrelated_changed = 0
    testable, untestable = 0, []
    for key in keys:
        a, f, u, c = base[key], floor.get(key), unrelated.get(key), cand.get(key)
        if f is None or u is None or c is None:
            reasons.append(f"draws: no draws for {key[0]}")
            continue
        n = min(len(a.tokens), len(f.tokens), len(u.tokens), len(c.tokens))
        if n < DRAW_MIN:
            reasons.append(
                f"draws: only {n} draws for {key[0]}; at least {DRAW_MIN} are needed to resolve a difference"
            )
            continue
        if len(set(a.tokens[:n]) | set(u.tokens[:n])) < 2:
            untestable.append(key[0])  # a single category: no draw can change
            continue
        testable += 1
        total += n
        changed += sum(x != y for x, y in zip(a.tokens[:n], c.tokens[:n], strict=True))
        floor_changed += sum(x != y for x, y in zip(a.tokens[:n], f.tokens[:n], strict=True))
        unrelated_changed += sum(x != y for x, y in zip(a.tokens[:n], u.tokens[:n], strict=True))
    stats: dict[str, Any] = {
        "contexts": len(keys),
        "testable": testable,
        "not_testable": untestable,
        "draws": total,
        "changed": changed,
        "floor_changed": floor_changed,
        "unrelated_changed": unrelated_changed,
        "changed_share": changed / total if total else None,
        "floor_share": floor_changed / total if total else None,
        "unrelated_share": unrelated_changed / total if total else None,
        "p": None,
    }
    if total and not reasons:
        if floor_changed * 2 > unrelated_changed:
            reasons.append(
                f"draws: the baseline does not reproduce its own draws with the same seeds "
                f"({floor_changed} of {total} changed, "
                f"{unrelated_changed} with unrelated seeds); the sampler cannot be judged by draws"
            )
        else:
            p = float(
                _stats().fisher_exact(
                    [[changed, total - changed], [floor_changed, total - floor_changed]], alternative="greater"
                )[1]
            )
            stats["p"] = p
            if p < DRAW_ALPHA:
                reasons.append(
                    f"draws: {changed} of {total} draws changed with the same seeds (noise floor {floor_changed}, "
                    f"unrelated seeds {unrelated_changed}; Fisher p={p:.2g}): the sampler draws differently"
                )
    stats["status"] = "fail" if reasons else ("pass" if testable else "not testable")
    return PathVerdict("draws", not reasons, tuple(reasons), stats)

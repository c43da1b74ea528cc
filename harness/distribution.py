"""Token-level distribution checks: is the candidate's next-token distribution the baseline's?

Input: two logprob dumps in the contract of docs/CONTRACTS.md (one JSON line per prompt and path:
``{"id", "path", "tokens", "topk"}``). Per compared position: KL divergence and total
variation on the union of both top-k supports plus a tail bucket, |Δ logprob| of the
baseline's top token (and its signed value, for the systematic-shift test), top-1 agreement.

``prefill`` positions are teacher-forced on the same tokens (different tokens = the
tokenization changed = failure). ``decode`` sequences are aligned step by step until they
diverge; a divergence is acceptable only where the baseline's top two tokens are a near tie.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
from scipy import stats as sps

PATHS = ("prefill", "decode", "sample")

# Smallest differences "tight" mode always tolerates, per dtype (reassociation of fused or
# reordered matmuls moves float32 logprobs by about 1e-6; bf16/fp16 by far more).
DTYPE_FLOOR = {
    "float32": {"dlogprob_max": 1e-4, "kl_mean": 1e-9, "kl_p99": 1e-8, "kl_max": 1e-7, "tie": 1e-4},
    "bfloat16": {"dlogprob_max": 5e-2, "kl_mean": 1e-5, "kl_p99": 1e-4, "kl_max": 1e-3, "tie": 5e-2},
    "float16": {"dlogprob_max": 1e-2, "kl_mean": 1e-6, "kl_p99": 1e-5, "kl_max": 1e-4, "tie": 1e-2},
}
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
            if p != "sample" and len(topk) != len(tokens):
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

    A token missing from one side's top-k gets an equal share of that side's tail mass,
    never more than its smallest listed probability.
    """
    union = set(a) | set(b)

    def probs(d: Mapping[int, float]) -> tuple[dict[int, float], float]:
        known = {t: math.exp(lp) for t, lp in d.items()}
        tail = max(0.0, 1.0 - sum(known.values()))
        missing = [t for t in union if t not in known]
        if missing:
            share = min(tail / len(missing), min(known.values()) if known else tail)
            for t in missing:
                known[t] = share
            tail = max(0.0, tail - share * len(missing))
        return known, tail

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
    agree: list[bool] = field(default_factory=list)
    pos: list[int] = field(default_factory=list)  # position of each compared entry
    exact: bool = True
    sequences: int = 0
    divergences: int = 0
    bad_divergences: list[str] = field(default_factory=list)
    first_divergence: list[int] = field(default_factory=list)
    token_mismatch: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        def q(xs: list[float], p: float) -> float | None:
            return float(np.quantile(xs, p)) if xs else None

        return {
            "positions": len(self.kl), "sequences": self.sequences,
            "kl_mean": float(np.mean(self.kl)) if self.kl else None, "kl_p99": q(self.kl, 0.99),
            "kl_max": max(self.kl) if self.kl else None, "tv_max": max(self.tv) if self.tv else None,
            "dlogprob_max": max(self.dlp) if self.dlp else None,
            "top1_agreement": float(np.mean(self.agree)) if self.agree else None,
            "exact": self.exact, "divergences": self.divergences,
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


def compare(base: Mapping[tuple[str, str], Record], cand: Mapping[tuple[str, str], Record], ids: Iterable[str],
            tie: float, paths: Iterable[str] = ("prefill", "decode")) -> dict[str, PathStats]:
    """Per-path statistics of ``cand`` against ``base`` over the prompts ``ids``."""
    out = {p: PathStats() for p in paths}
    for pid in ids:
        for path, st in out.items():
            a, b = base.get((pid, path)), cand.get((pid, path))
            if a is None:
                continue
            if b is None:
                st.missing.append(pid)
                continue
            st.sequences += 1
            if path == "prefill" and a.tokens != b.tokens:
                st.token_mismatch.append(pid)
                st.exact = False
                continue
            for i, (ea, eb) in enumerate(zip(a.topk, b.topk)):
                if ea is None or eb is None:
                    continue
                da, db = _dist(ea), _dist(eb)
                kl, tv, dlp, signed, agree = compare_position(da, db)
                st.kl.append(kl)
                st.tv.append(tv)
                st.dlp.append(dlp)
                st.signed.append(signed)
                st.agree.append(agree)
                st.pos.append(i)
                if ea != eb:
                    st.exact = False
                if path == "decode" and i < len(b.tokens) and a.tokens[i] != b.tokens[i]:
                    st.divergences += 1
                    st.first_divergence.append(i)
                    top2 = sorted(da.values(), reverse=True)[:2]
                    gap = top2[0] - top2[1] if len(top2) == 2 else float("inf")
                    if gap > tie:
                        st.bad_divergences.append(f"{pid}@{i} (top-2 gap {gap:.2g})")
                    break  # after a divergence the contexts differ: stop comparing
            if path == "decode" and len(a.tokens) != len(b.tokens) and not st.first_divergence:
                st.exact = False
    return out


@dataclass(frozen=True)
class PathVerdict:
    path: str
    passed: bool
    reasons: tuple[str, ...]
    stats: Mapping[str, Any]


def judge_path(path: str, cand: PathStats, floor: PathStats, mode: str, dtype: str, caps: Mapping[str, float] | None = None) -> PathVerdict:
    """Pass/fail of one path against the noise floor (``tight``), bit-identity (``exact``) or caps."""
    reasons: list[str] = []
    s = cand.summary()
    if cand.missing:
        reasons.append(f"{path}: candidate produced no output for {len(cand.missing)} prompt(s), e.g. {cand.missing[0]}")
    if cand.token_mismatch:
        reasons.append(f"{path}: prompt tokens differ for {len(cand.token_mismatch)} prompt(s), e.g. {cand.token_mismatch[0]} (tokenization changed)")
    if cand.bad_divergences:
        reasons.append(f"{path}: greedy continuation diverged without a near tie in {len(cand.bad_divergences)} sequence(s), e.g. {cand.bad_divergences[0]}")
    if not cand.kl and not reasons:
        reasons.append(f"{path}: no positions compared")
    if mode == "exact":
        if not cand.exact:
            reasons.append(f"{path}: not bit-identical (max |Δ logprob| {s['dlogprob_max']:.3g})" if s["dlogprob_max"] is not None
                           else f"{path}: not bit-identical")
    elif cand.kl:
        if mode == "tight":
            f = floor.summary()
            mins = DTYPE_FLOOR.get(dtype, DTYPE_FLOOR["float32"])
            limits = {
                key: max(FLOOR_MULTIPLIER * (f[key] or 0.0), mins[key]) for key in ("kl_mean", "kl_p99", "kl_max", "dlogprob_max")
            }
        else:
            limits = dict(caps or {})
        for key, limit in limits.items():
            if key in s and s[key] is not None and s[key] > limit:
                reasons.append(f"{path}: {key} {s[key]:.3g} exceeds {limit:.3g}" + (" (noise floor x3 or the dtype minimum)" if mode == "tight" else ""))
        if mode == "approx" and caps and "min_top1" in caps and (s["top1_agreement"] or 0) < caps["min_top1"]:
            reasons.append(f"{path}: top-1 agreement {s['top1_agreement']:.3f} below {caps['min_top1']}")
        if mode == "tight" and floor.kl and len(cand.kl) >= 20 and max(cand.kl) > DTYPE_FLOOR.get(dtype, DTYPE_FLOOR["float32"])["kl_max"]:
            # consistency: are the candidate's divergences stochastically larger than the floor's?
            u = sps.mannwhitneyu(cand.kl, floor.kl, alternative="greater")
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
    p = float(sps.binomtest(pos, len(nonzero), 0.5).pvalue)
    mean = float(np.mean(signed))
    floor_mean = abs(float(np.mean(floor_signed))) if floor_signed else 0.0
    tiny = DTYPE_FLOOR.get(dtype, DTYPE_FLOOR["float32"])["dlogprob_max"] / 100
    if p < SHIFT_ALPHA and abs(mean) > max(tiny, 3 * floor_mean):
        direction = "up" if mean > 0 else "down"
        return (f"systematic shift: the top token's logprob moved {direction} at {max(pos, len(nonzero) - pos)} of {len(nonzero)} "
                f"positions (mean {mean:+.3g}, sign test p={p:.2g})")
    return ""


SAMPLE_ALPHA = 1e-3  # family-wise level of the sampled-token frequency tests
SAMPLE_MIN_DRAWS = 200


def _counts_test(a: Iterable[int], b: Iterable[int]) -> tuple[float, float]:
    """(TV distance, chi-square p-value) between two samples of token ids."""
    ca: dict[int, int] = {}
    cb: dict[int, int] = {}
    for t in a:
        ca[t] = ca.get(t, 0) + 1
    for t in b:
        cb[t] = cb.get(t, 0) + 1
    na, nb = sum(ca.values()), sum(cb.values())
    tokens = sorted(set(ca) | set(cb))
    tv = 0.5 * sum(abs(ca.get(t, 0) / na - cb.get(t, 0) / nb) for t in tokens)
    # merge rare categories so every expected count is >= 5
    rows = [[ca.get(t, 0), cb.get(t, 0)] for t in tokens]
    big, other = [], [0, 0]
    for r in rows:
        if (r[0] + r[1]) * min(na, nb) / (na + nb) >= 5:
            big.append(r)
        else:
            other = [other[0] + r[0], other[1] + r[1]]
    if sum(other):
        big.append(other)
    if len(big) < 2:
        return tv, 1.0
    p = float(sps.chi2_contingency(np.array(big).T)[1])
    return tv, p


def judge_samples(base_a: Mapping[tuple[str, str], Record], base_b: Mapping[tuple[str, str], Record],
                  cand: Mapping[tuple[str, str], Record]) -> PathVerdict:
    """Sampled-token frequencies: the candidate's draws against the baseline's (other seeds).

    The baseline against itself with other seeds is the floor; it must pass, and the sample
    size must be large enough to resolve a difference (``SAMPLE_MIN_DRAWS`` per context).
    """
    keys = sorted(k for k in base_a if k[1] == "sample")
    reasons: list[str] = []
    if not keys:
        return PathVerdict("sample", True, (), {"contexts": 0})
    m = len(keys)
    tvs, floor_tvs, worst = [], [], (1.0, "")
    for key in keys:
        a, b, c = base_a[key], base_b.get(key), cand.get(key)
        if b is None or c is None:
            reasons.append(f"sample: no draws for {key[0]}")
            continue
        if min(len(a.tokens), len(b.tokens), len(c.tokens)) < SAMPLE_MIN_DRAWS:
            reasons.append(f"sample: only {min(len(a.tokens), len(c.tokens))} draws for {key[0]}; "
                           f"at least {SAMPLE_MIN_DRAWS} are needed to resolve a difference")
            continue
        ftv, fp = _counts_test(a.tokens, b.tokens)
        tv, p = _counts_test(c.tokens, b.tokens)
        floor_tvs.append(ftv)
        tvs.append(tv)
        if fp * m < SAMPLE_ALPHA:
            reasons.append(f"sample: the baseline disagrees with itself at {key[0]} (p={fp:.2g}); the sampler is not reproducible enough to judge")
        if p < worst[0]:
            worst = (p, key[0])
        if p * m < SAMPLE_ALPHA:
            reasons.append(f"sample: sampled-token frequencies differ at {key[0]}: TV {tv:.3f} vs noise floor {ftv:.3f} "
                           f"(chi-square p={p:.2g}, {m} contexts x settings)")
    stats = {
        "contexts": m, "tv_max": max(tvs) if tvs else None, "tv_mean": float(np.mean(tvs)) if tvs else None,
        "floor_tv_mean": float(np.mean(floor_tvs)) if floor_tvs else None, "min_p": worst[0],
        "draws": len(base_a[keys[0]].tokens),
    }
    return PathVerdict("sample", not reasons, tuple(reasons), stats)

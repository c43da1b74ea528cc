"""The timed runs' outputs rule: correct by distribution, not by bit.

Timed runs decode greedily and every request's answer is compared between the two sides (``OutputsMatch`` in
``agentsearch/workloads.py``). Identical answers pass. Where a request's answers differ, the question is not
"are the bits the same" but "could the reference model itself have said the candidate's answer":

* **Length.** Timed runs ignore EOS and fix every request's number of tokens: an answer of another length was cut
  or stopped early, whatever its tokens. Refused.
* **The candidate's answer under the reference's model** (teacher forcing: the baseline's engine scores the prompt
  followed by the candidate's answer). At every token the *gap* — the reference's top logprob minus the logprob of
  the token the candidate chose — must be within the **tie**: the token is the reference's greedy choice, or its
  near-tie. At the first differing position this is the flip's margin; after it, the continuation must still be
  what the reference would say given the candidate's own previous tokens. A cut-and-padded tail, a skipped layer,
  a cache answer or a lower precision makes tokens the reference does not choose: gaps far beyond the tie.
* **The baseline's answer under the candidate's model** (the other direction, when the candidate's engine is up):
  the same test. The candidate's engine is the candidate's code, so this direction can only refuse (an honest
  but lossy change shows itself in both); the reference direction decides.

The **tie** is measured, never only assumed: the larger of the dtype's reassociation minimum (a change of kernel
may sum in another order; ``DTYPE_FLOOR``) and ``TIE_MULTIPLIER`` times the reference's own **rounding floor**,
measured in the same scoring call on exactly the positions judged: the reference's logprobs in two batch orders
(A/A), and the reference's own greedy answer (decoded) against its teacher-forced scores (decode vs prefill).
On a CPU whose engine is bit-exact the measured floor is 0 and the tie is the dtype's minimum; on a GPU it
includes the batch variance the reference itself shows.

What a flip cannot hide: any token that is not the reference's near-greedy choice, at the flip or after it; a
length change. What it can: a change whose only effect is at positions where the reference's top two are within
the tie (by construction indistinguishable from the reference's own rounding), and a lossy change that never
changes a greedy token in the requests timed (the distribution check, ``verify``, judges logprobs, not tokens).
Pure functions; no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .distribution import DTYPE_FLOOR

PERIOD_MAX = 4  # a tail that repeats a cycle of at most this many tokens is "padded" (when the other side's is not)


def first_difference(x: Sequence[int], y: Sequence[int]) -> int | None:
    """The first position where ``x`` and ``y`` differ (the shorter one's length when one is a prefix), or None."""
    for i, (p, q) in enumerate(zip(x, y, strict=False)):
        if p != q:
            return i
    return None if len(x) == len(y) else min(len(x), len(y))


def padded(tail: Sequence[int]) -> bool:
    """Whether ``tail`` (four tokens or more) is one cycle of at most ``PERIOD_MAX`` tokens repeated."""
    if len(tail) < 4:
        return False
    return any(all(tail[i] == tail[i % k] for i in range(len(tail))) for k in range(1, PERIOD_MAX + 1) if k < len(tail))


# A flip needs the two sides' roundings to move a margin by opposite amounts, at most twice the reference's own move;
# a changed kernel may round more than the reference's own A/A does (compiled bfloat16 flipped at 3 logit quanta
# where its decode against its prefill moved 1: benchmarks/outputs_corpus.py): 3x
TIE_MULTIPLIER = 3.0
TIE_SLACK = 1e-3  # relative: logprobs are float32 differences of float32 sums; a margin of exactly the tie is within it
FLOOR_CAP = 10.0  # a measured floor beyond this many times the dtype's minimum cannot be judged by: refused


# One answer teacher-forced through one model: per token (the model's top token id, its logprob, the logprob of
# the answer's token). Built from a worker's answer by ``parse_scores``.
Row = tuple[int, float, float]


def parse_scores(raw: Any, answers: Sequence[Sequence[int]]) -> tuple[tuple[tuple[Row, ...], ...] | None, str]:
    """(rows per answer, error): a worker's ``scores`` validated against the answers it scored."""
    if not isinstance(raw, list) or len(raw) != len(answers):
        return None, f"expected scores for {len(answers)} answer(s)"
    out = []
    for rows, answer in zip(raw, answers, strict=True):
        if not isinstance(rows, list) or len(rows) != len(answer):
            return None, "a scored answer has the wrong number of positions"
        got = []
        for row in rows:
            if not (isinstance(row, list) and len(row) == 3 and type(row[0]) is int):
                return None, "a score row is not [top id, top logprob, token logprob]"
            top, lp_top, lp_tok = row[0], row[1], row[2]
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (lp_top, lp_tok)):
                return None, "a score row holds a logprob that is not a number"
            if math.isnan(lp_top) or math.isnan(lp_tok) or lp_top > 1e-3 or lp_tok > 1e-3:
                return None, "a score row holds a logprob that is NaN or above 0"
            got.append((top, float(lp_top), float(lp_tok)))
        out.append(tuple(got))
    return tuple(out), ""


def within(gap: float, tie: float) -> bool:
    """Whether ``gap`` is within ``tie`` (with ``TIE_SLACK``: a gap of exactly the tie, computed in float32, is)."""
    return gap <= tie * (1 + TIE_SLACK)


def gaps(rows: Sequence[Row]) -> list[float]:
    """Per token: the model's top logprob minus the logprob of the token (0 where it is the model's choice)."""
    return [max(0.0, top - tok) if math.isfinite(tok) else math.inf for _, top, tok in rows]


@dataclass(frozen=True)
class Floor:
    """The tie a flip must be within, and what it was made of."""

    dtype: str
    measured: float  # the largest margin change the reference itself showed (A/A orders; decode vs prefill)
    positions: int  # how many positions the measurement covered
    minimum: float = 0.0  # the dtype's reassociation minimum

    def __post_init__(self) -> None:
        if not (self.measured >= 0 and math.isfinite(self.measured)):
            raise ValueError(f"a measured floor is a finite number >= 0, got {self.measured!r}")

    @property
    def tie(self) -> float:
        return max(self.minimum, TIE_MULTIPLIER * self.measured)

    @property
    def judgeable(self) -> bool:
        """Whether the reference's own rounding is small enough to judge by (``FLOOR_CAP`` times the dtype's minimum):
        a reference that does not reproduce its own answers (a scoring that is not its decoding: another prompt,
        penalties) would widen the tie until anything passed, so such a floor is a refusal, never a wide tie."""
        return self.measured <= FLOOR_CAP * self.minimum

    @classmethod
    def of(cls, dtype: str, measured: float, positions: int) -> Floor:
        mins = DTYPE_FLOOR.get(dtype, DTYPE_FLOOR["float32"])
        return cls(dtype, measured, positions, mins["tie"])

    def to_json(self) -> dict[str, Any]:
        return {
            "dtype": self.dtype,
            "measured": self.measured,
            "positions": self.positions,
            "minimum": self.minimum,
            "tie": self.tie,
        }


def measured_floor(
    base_first: Sequence[Sequence[Row]], base_again: Sequence[Sequence[Row]], own: Sequence[Sequence[Row]]
) -> tuple[float, int]:
    """(the reference's largest margin change, positions): the same answers scored in two batch orders (every
    position's gap, compared), and the reference's own greedy answers scored (their gaps: decode vs prefill)."""
    worst, n = 0.0, 0
    for a, b in zip(base_first, base_again, strict=True):
        for ga, gb in zip(gaps(a), gaps(b), strict=True):
            n += 1
            if math.isfinite(ga) and math.isfinite(gb):
                worst = max(worst, abs(ga - gb))
    for rows in own:
        for g in gaps(rows):
            if math.isfinite(g):
                worst = max(worst, g)
    return worst, n


@dataclass(frozen=True)
class Direction:
    """One answer scored by the other side's model: its worst gap and where."""

    worst: float
    at: int  # position of the worst gap
    over: int  # positions whose gap exceeds the tie
    logprob: float  # the answer's total logprob under that model (teacher forced)

    @classmethod
    def of(cls, rows: Sequence[Row], tie: float) -> Direction:
        g = gaps(rows)
        at = max(range(len(g)), key=lambda i: g[i]) if g else 0
        return cls(
            worst=g[at] if g else 0.0,
            at=at,
            over=sum(1 for x in g if not within(x, tie)),
            logprob=sum(tok for _, _, tok in rows),
        )

    def to_json(self) -> dict[str, Any]:
        return {"worst_gap": _num(self.worst), "at": self.at, "over_tie": self.over, "logprob": _num(self.logprob)}


def _num(x: float) -> float | None:
    return round(x, 9) if math.isfinite(x) else None


@dataclass(frozen=True)
class Flip:
    """A request whose answers differ, judged: where, by how much, and what each side's model says of the other."""

    request: int
    position: int  # the first differing token
    length: int  # tokens in the baseline's answer
    base_token: int
    cand_token: int
    margin: float  # the reference's gap of the candidate's token at the flip (its top-2 margin when top-2)
    cand_under_base: Direction
    base_under_cand: Direction | None  # None: the candidate's engine did not score (not up, or it failed)
    tie: float
    reason: str = ""  # why it is not a flip the reference could make ('' = it could)

    @property
    def honest(self) -> bool:
        return not self.reason

    def to_json(self) -> dict[str, Any]:
        return {
            "request": self.request,
            "position": self.position,
            "length": self.length,
            "base_token": self.base_token,
            "cand_token": self.cand_token,
            "margin": _num(self.margin),
            "cand_under_base": self.cand_under_base.to_json(),
            "base_under_cand": None if self.base_under_cand is None else self.base_under_cand.to_json(),
            "tie": self.tie,
            "reason": self.reason,
        }


def judge_flip(
    request: int,
    base: Sequence[int],
    cand: Sequence[int],
    cand_under_base: Sequence[Row],
    base_under_cand: Sequence[Row] | None,
    floor: Floor,
) -> Flip:
    """One divergent request of equal length: a flip the reference could make, or the first reason it is not."""
    d = first_difference(base, cand)
    if d is None or len(base) != len(cand):
        raise ValueError("judge_flip takes two different answers of one length")
    tie = floor.tie
    mine = Direction.of(cand_under_base, tie)
    theirs = None if base_under_cand is None else Direction.of(base_under_cand, tie)
    margin = gaps(cand_under_base)[d]
    reason = ""
    if not within(margin, tie):
        reason = (
            f"at token {d} the reference's top-2 margin is {margin:.3g} nats, beyond the tie {tie:.3g} "
            "(not a flip the reference could make)"
        )
    elif mine.over:
        reason = (
            f"after the flip at token {d}, {mine.over} token(s) of the candidate's answer are not the reference's "
            f"greedy choice (worst gap {mine.worst:.3g} nats at token {mine.at}, tie {tie:.3g})"
        )
    if reason and padded(cand[d:]) and not padded(base[d:]):
        reason += "; the rest of the candidate's answer repeats one short cycle (padded)"
    elif theirs is not None and theirs.over:
        reason = (
            f"the candidate's own model does not choose the reference's answer: {theirs.over} token(s) beyond the tie "
            f"(worst gap {theirs.worst:.3g} nats at token {theirs.at}, tie {tie:.3g})"
        )
    return Flip(request, d, len(base), int(base[d]), int(cand[d]), margin, mine, theirs, tie, reason)


@dataclass(frozen=True)
class OutputsVerdict:
    """The rule's answer for one pair: passed, why not, the flips and the floor they were judged against."""

    passed: bool
    reasons: tuple[str, ...]
    flips: tuple[Flip, ...] = ()
    floor: Floor | None = None
    compared: str = "bits"  # "bits": every answer identical; "distributions": flips judged by the rule
    score_s: float = 0.0  # seconds the scoring took (both engines)
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not self.passed and not self.reasons:
            raise ValueError("a failed outputs verdict needs a reason")

    def metrics(self) -> dict[str, Any]:
        """What a trial records of the rule (numbers a report shows; never the tokens)."""
        out: dict[str, Any] = {"outputs_compared": self.compared, "outputs_flips": len(self.flips)}
        if self.floor is not None:
            out["outputs_floor"] = self.floor.measured
            out["outputs_tie"] = self.floor.tie
            out["outputs_score_s"] = round(self.score_s, 4)
        if self.flips:
            worst = max(self.flips, key=lambda f: f.margin)
            out["outputs_flip_margin_max"] = _num(worst.margin)
            out["outputs_flip_example"] = (
                f"request {worst.request} token {worst.position}/{worst.length}: margin {worst.margin:.3g}, "
                f"continuation worst gap {worst.cand_under_base.worst:.3g} (tie {worst.tie:.3g})"
            )
        return out


def judge(
    base: Sequence[Sequence[int]],
    cand: Sequence[Sequence[int]],
    scores: Mapping[int, tuple[Sequence[Row], Sequence[Row] | None]],
    floor: Floor,
    score_s: float = 0.0,
) -> OutputsVerdict:
    """The pair's verdict: ``scores`` maps every divergent request (equal lengths) to (the candidate's answer under
    the reference's model, the baseline's answer under the candidate's model or None). A divergent request
    without a score fails (nothing proves it); so does a floor the rule cannot judge by (``Floor.judgeable``)."""
    if scores and not floor.judgeable:
        return OutputsVerdict(
            False,
            (
                f"the reference does not reproduce its own answers when it scores them (its rounding floor "
                f"{floor.measured:.3g} nats, beyond {FLOOR_CAP:g}x the {floor.dtype} minimum {floor.minimum:.3g}): "
                "the flips cannot be judged",
            ),
            (),
            floor,
            "distributions",
            score_s,
        )
    flips, reasons = [], []
    for i, (x, y) in enumerate(zip(base, cand, strict=True)):
        if x == y:
            continue
        if len(x) != len(y):
            reasons.append(
                f"request {i} (of {len(base)}): {len(y)} tokens against {len(x)} (timed runs ignore EOS: an answer "
                "of another length was cut or stopped early)"
            )
            continue
        if i not in scores:
            reasons.append(f"request {i} (of {len(base)}) differs and was not scored (nothing proves it)")
            continue
        f = judge_flip(i, x, y, scores[i][0], scores[i][1], floor)
        flips.append(f)
        if not f.honest:
            reasons.append(f"request {i} (of {len(base)}): {f.reason}")
    return OutputsVerdict(
        not reasons, tuple(reasons), tuple(flips), floor, "distributions" if flips or reasons else "bits", score_s
    )

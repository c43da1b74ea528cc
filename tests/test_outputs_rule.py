"""The timed runs' outputs rule (harness/outputs_rule.py): flips the reference could make pass, lossy answers fail.

Scores here are what a worker's ``score`` command returns (per answer token: the model's top token, its logprob,
the token's logprob), built from a small Markov model whose margins are known, so every case's truth is known.
The rule on the real engine path: tests/redteam/test_outputs_flips.py (toy vLLM fork) and
benchmarks/outputs_rule.py (vLLM on CPU)."""

from __future__ import annotations

import math

import pytest

from harness import outputs_rule as rule
from harness.outputs_rule import Floor, judge, judge_flip, measured_floor, parse_scores

HALF = math.log(0.5)


def nxt(t: int) -> int:
    return (t * 31 + 7) % 997


def alt(t: int) -> int:
    return (t * 17 + 3) % 997


def margin(t: int) -> float:
    return 1e-6 if t % 23 == 0 else (5e-3 if t % 5 == 0 else 0.5)


def greedy(start: int, n: int, flip_below: float = 0.0) -> tuple[int, ...]:
    """The model's greedy answer; ``flip_below``: take the runner-up wherever the margin is below it."""
    out, t = [], start
    for _ in range(n):
        t = alt(t) if margin(t) < flip_below else nxt(t)
        out.append(t)
    return tuple(out)


def score(start: int, answer: tuple[int, ...], jitter: float = 0.0) -> tuple[rule.Row, ...]:
    """The reference's teacher-forced rows for ``answer`` after a prompt ending in ``start``."""
    rows, prev = [], start
    for tok in answer:
        top = nxt(prev)
        lp = HALF if tok == top else (HALF - margin(prev) if tok == alt(prev) else math.log(1e-4))
        rows.append((top, HALF + jitter, lp + jitter * (tok != top)))
        prev = tok
    return tuple(rows)


FLOOR = Floor.of("float32", 0.0, 100)


def starts_with_flips(n: int, flip_below: float) -> list[int]:
    return [s for s in range(1, 2000) if greedy(s, 32) != greedy(s, 32, flip_below)][:n]


def test_identical_answers_are_compared_as_bits():
    base = (greedy(1, 16), greedy(2, 16))
    v = judge(base, base, {}, FLOOR)
    assert v.passed and v.compared == "bits" and v.metrics()["outputs_flips"] == 0


def test_a_flip_at_a_near_tie_and_the_reference_s_continuation_after_it_pass():
    starts = starts_with_flips(5, 1e-5)
    assert len(starts) == 5
    base = tuple(greedy(s, 32) for s in starts)
    cand = tuple(greedy(s, 32, 1e-5) for s in starts)
    scores = {i: (score(s, cand[i]), score(s, base[i])) for i, s in enumerate(starts)}
    v = judge(base, cand, scores, FLOOR)
    assert v.passed, v.reasons
    assert v.compared == "distributions" and len(v.flips) == 5
    f = v.flips[0]
    assert f.margin == pytest.approx(1e-6, rel=1e-3) and f.cand_under_base.over == 0
    m = v.metrics()
    assert m["outputs_flips"] == 5 and m["outputs_tie"] == pytest.approx(1e-4)
    assert "request 0 token" in m["outputs_flip_example"]


def test_a_flip_beyond_the_tie_fails_with_its_margin():
    starts = [s for s in starts_with_flips(40, 1e-2) if greedy(s, 32, 1e-5) == greedy(s, 32)][:3]
    base = tuple(greedy(s, 32) for s in starts)
    cand = tuple(greedy(s, 32, 1e-2) for s in starts)  # a lower precision: flips at margins of 5e-3 too
    v = judge(base, cand, {i: (score(s, cand[i]), None) for i, s in enumerate(starts)}, FLOOR)
    assert not v.passed and len(v.reasons) == 3
    assert "top-2 margin is 0.005 nats, beyond the tie 0.0001" in v.reasons[0]


@pytest.mark.parametrize("share", [0.1, 0.3, 0.5, 0.7, 0.9])
def test_cut_and_padded_answers_fail_wherever_they_are_cut(share):
    base = tuple(greedy(s, 40) for s in range(1, 9))
    cut = int(40 * share)
    cand = list(base)
    cand[3] = base[3][:cut] + (base[3][cut - 1],) * (40 - cut)
    v = judge(base, tuple(cand), {3: (score(4, cand[3]), score(4, base[3]))}, FLOOR)
    assert not v.passed
    assert "not the reference's greedy choice" in v.reasons[0] or "top-2 margin" in v.reasons[0]
    assert "padded" in v.reasons[0]


def test_an_answer_of_another_length_fails_without_scoring():
    base = (greedy(1, 16), greedy(2, 16))
    cand = (greedy(1, 16), greedy(2, 16)[:12])
    v = judge(base, cand, {}, FLOOR)
    assert not v.passed and "12 tokens against 16" in v.reasons[0] and "ignore EOS" in v.reasons[0]


def test_a_divergent_answer_nobody_scored_fails():
    base = (greedy(1, 16),)
    cand = (greedy(1, 15) + (0,),)
    v = judge(base, cand, {}, FLOOR)
    assert not v.passed and "was not scored" in v.reasons[0]


def test_the_continuation_after_an_honest_flip_must_still_be_the_reference_s():
    """A near-tie flip followed by the tokens of another context (a cache answering from the wrong request)."""
    s = starts_with_flips(1, 1e-5)[0]
    base = greedy(s, 32)
    honest = greedy(s, 32, 1e-5)
    d = rule.first_difference(base, honest)
    assert d is not None
    cand = honest[: d + 1] + greedy(777, 32 - d - 1)
    f = judge_flip(0, base, cand, score(s, cand), None, FLOOR)
    assert not f.honest and "after the flip" in f.reason and f.cand_under_base.over > 0


def test_the_candidate_s_own_model_can_refuse_but_not_pass():
    s = starts_with_flips(1, 1e-5)[0]
    base, cand = greedy(s, 32), greedy(s, 32, 1e-5)
    lying = tuple((t, HALF, HALF) for t in base)  # the candidate's engine says the baseline's answer is all greedy
    assert judge_flip(0, base, cand, score(s, cand), lying, FLOOR).honest
    refusing = tuple((t + 1, HALF, HALF - 1.0) for t in base)  # an honest but lossy engine disagrees everywhere
    f = judge_flip(0, base, cand, score(s, cand), refusing, FLOOR)
    assert not f.honest and "candidate's own model" in f.reason
    padded = base[:5] + (base[4],) * 27  # the reference direction decides: a lie there cannot rescue a cheat
    assert not judge_flip(0, base, padded, score(s, padded), lying, FLOOR).honest


def test_the_floor_is_measured_and_widens_the_tie_only_above_the_dtype_minimum():
    rows = score(3, greedy(3, 16))
    assert measured_floor([rows], [rows], [rows]) == (0.0, 16)
    moved = score(3, greedy(3, 16, 1e-5), jitter=0.0)
    again = tuple((t, a, b - 2e-4) if a != b else (t, a, b) for t, a, b in moved)
    worst, n = measured_floor([moved], [again], [])
    assert n == 16 and (worst == 0.0 or worst == pytest.approx(2e-4))
    gpu = Floor.of("bfloat16", 0.03, 100)
    assert gpu.tie == pytest.approx(0.09) and Floor.of("bfloat16", 0.0, 10).tie == pytest.approx(5e-2)
    assert Floor.of("float32", 1e-3, 10).tie == pytest.approx(3e-3)
    with pytest.raises(ValueError):
        Floor.of("float32", math.nan, 1)


def test_worker_scores_are_validated_against_the_answers():
    answers = [(1, 2, 3)]
    ok, why = parse_scores([[[5, -0.1, -0.2], [5, -0.1, -0.1], [7, -0.3, -0.9]]], answers)
    assert ok is not None and why == ""
    for bad in (
        None,
        [],
        [[[5, -0.1, -0.2]]],
        [[[5, -0.1, -0.2], [5, -0.1, -0.1], [7, "x", -0.9]]],
        [[[5, -0.1, -0.2], [5, -0.1, -0.1], [7, 0.5, -0.9]]],
        [[[5, -0.1, -0.2], [5, -0.1, -0.1], [7.0, -0.3, -0.9]]],
        [[[5, -0.1, -0.2], [5, -0.1, -0.1], [7, True, -0.9]]],
    ):
        got, why = parse_scores(bad, answers)
        assert got is None and why, bad


def test_a_failed_verdict_needs_a_reason():
    with pytest.raises(ValueError):
        rule.OutputsVerdict(False, ())


class Scorer:
    """A side's session as OutputsMatch sees it (``up``, ``score``, ``engine``), scoring with the Markov model above
    (``starts``: per seed, each request's prompt's last token); it keeps every command it was sent."""

    def __init__(self, starts: dict[int, dict[int, int]], alive: bool = True):
        self.starts, self.alive, self.asked, self.started = starts, alive, [], 0
        self.engine = self
        self.vocab_size, self.dtype = 997, "float32"

    def wait_ready(self) -> None:
        pass

    def up(self) -> bool:
        return self.alive

    def start(self) -> None:
        self.started += 1
        self.alive = True

    def close(self) -> None:
        self.alive = False

    def score(self, seed, answers, timeout_s):
        self.asked.append([(i, tuple(a)) for i, a in answers])
        rows = tuple(score(self.starts[seed][i], tuple(a)) for i, a in answers)
        return rows, rows


def pair(flip_below: float, n: int = 4):
    """(request -> start, the baseline's answers, the candidate's flipping where the margin is below ``flip_below``)."""
    starts = dict(enumerate(starts_with_flips(n, flip_below)))
    base = tuple(greedy(s, 32) for s in starts.values())
    cand = tuple(greedy(s, 32, flip_below) for s in starts.values())
    return starts, base, cand


def outcome(outputs):
    from harness.trials import TrialOutcome

    return TrialOutcome(True, 1.0, {"input_tokens": 7}, 1.0, outputs=outputs)


def test_both_engines_are_asked_the_same_so_neither_learns_its_side():
    from agentsearch.workloads import OutputsMatch

    starts, base, cand = pair(1e-5)
    m = OutputsMatch()
    m.sessions = {"baseline": Scorer({5: starts}), "candidate": Scorer({5: starts})}
    assert m.check("candidate", 5, outcome(cand)) == ""
    assert m.check("baseline", 5, outcome(base)) == ""
    assert m.verdict is not None and m.verdict.compared == "distributions" and len(m.verdict.flips) == 4
    b, c = m.sessions["baseline"].asked, m.sessions["candidate"].asked
    assert b == c and len(b) == 1 and len(b[0]) == 8  # one command each: both answers of every differing request
    for i in range(4):  # in an order set by the tokens, not by whose answer it is
        assert [a for j, a in b[0] if j == i] == sorted([base[i], cand[i]])


def test_pairs_wait_for_the_baseline_s_engine_and_a_cheat_among_them_is_refused_after_the_last_pair():
    from agentsearch.workloads import OutputsMatch

    honest_starts, base1, honest = pair(1e-5)
    lossy_starts, base2, lossy = pair(1e-2)
    starts = {1: honest_starts, 2: lossy_starts}
    m = OutputsMatch()
    m.sessions = {"baseline": Scorer(starts, alive=False), "candidate": Scorer(starts)}  # alternate placement
    fresh = Scorer(starts, alive=False)
    m.fresh_baseline = lambda: fresh
    for seed, base, cand in ((1, base1, honest), (2, base2, lossy)):
        m.check("baseline", seed, outcome(base))
        assert m.check("candidate", seed, outcome(cand)) == ""  # waits: judged when a baseline engine is up
        assert m.verdict is not None and m.verdict.compared == "pending"
    assert len(m.pending) == 2 and fresh.started == 0
    why = m.settle()
    assert fresh.started == 1 and not fresh.alive and m.pending == []  # started for them, then closed
    assert why.startswith("outputs check:") and "(seed 2)" in why and "beyond the tie" in why, why


def test_without_a_baseline_engine_to_score_a_differing_answer_fails_closed():
    from agentsearch.workloads import OutputsMatch

    starts, base, honest = pair(1e-5)
    m = OutputsMatch()  # no sessions registered, no fresh baseline: a command workload, or a serving one
    m.check("baseline", 3, outcome(base))
    why = m.check("candidate", 3, outcome(honest))
    assert why.startswith("outputs check:") and "every request must agree in full" in why, why
    m = OutputsMatch()
    m.sessions = {"baseline": Scorer({3: starts}, alive=False)}
    m.check("baseline", 3, outcome(base))
    assert "every request must agree in full" in m.check("candidate", 3, outcome(honest))
    assert m.pending == [] and m.settle() == ""  # nothing waited: no fresh baseline to start


def test_pairs_left_waiting_when_no_baseline_engine_comes_up_are_refused_not_looped():
    from agentsearch.workloads import OutputsMatch

    starts, base, honest = pair(1e-5)

    class Dead(Scorer):
        def start(self) -> None:  # a baseline engine that cannot start (its start-up error is set, no process)
            self.started += 1

    m = OutputsMatch()
    m.sessions = {"baseline": Scorer({1: starts}, alive=False), "candidate": Scorer({1: starts})}
    dead = Dead({1: starts}, alive=False)
    m.fresh_baseline = lambda: dead
    m.check("baseline", 1, outcome(base))
    assert m.check("candidate", 1, outcome(honest)) == "" and len(m.pending) == 1
    why = m.settle()
    assert dead.started == 1 and m.pending == []
    assert why.startswith("outputs check:") and "not up to score it" in why, why


def test_a_reference_that_does_not_reproduce_its_own_answers_is_a_refusal_not_a_wide_tie():
    """A scoring that is not the decoding (another prompt, a penalty) makes the reference's own answers look
    non-greedy: that floor would widen the tie until a padded answer passed. It is refused instead."""
    s = starts_with_flips(1, 1e-5)[0]
    base = (greedy(s, 32),)
    padded = (base[0][:4] + (base[0][3],) * 28,)
    own = [score(999, base[0])]  # scored after the wrong prompt: gaps of 8.5 nats on its own answer
    worst, n = measured_floor(own, own, own)
    floor = Floor.of("float32", worst, n)
    assert floor.tie > 15 and not floor.judgeable
    v = judge(base, padded, {0: (score(s, padded[0]), None)}, floor)
    assert not v.passed and "does not reproduce its own answers" in v.reasons[0], v.reasons


def test_a_side_cannot_write_what_the_report_says_of_its_outputs():
    from agentsearch.workloads import GuardedSession, OutputsMatch
    from harness.trials import TrialOutcome
    from harness.worker_protocol import harness_key

    assert harness_key("outputs_compared") and harness_key("cpu_s") and not harness_key("output_tok_s")

    class Inner:
        def measure(self, seed):
            forged = {"outputs_compared": "bits", "outputs_flips": 0, "outputs_tie": 9.0, "input_tokens": 7}
            return TrialOutcome(True, 1.0, forged, 1.0, outputs=((1, 2, 3),))

    m = OutputsMatch()
    got = GuardedSession(Inner(), lambda: "", "candidate", m).measure(3)
    assert got.ok and not any(k.startswith("outputs_") for k in got.metrics), got.metrics


def test_a_margin_of_exactly_the_tie_is_within_it_whatever_float32_made_of_it():
    """bfloat16 logits move in quanta (0.125 nats at magnitudes 16-32): a flip at 3 quanta against a floor of one is
    at the tie, and the float32 logprobs make it 0.37500012 or 0.37499988."""
    tie = Floor.of("bfloat16", 0.125, 10).tie
    assert tie == pytest.approx(0.375)
    assert rule.within(0.37500012, tie) and rule.within(0.37499988, tie) and not rule.within(0.377, tie)

"""From a [[workload]] to the harness sessions that measure it on one side.

Every session is guarded: after each measurement both worktrees must be as they were built
(``Sides.check``), else the trial fails with "worktree modified during a trial".
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from harness import environment, models, outputs_rule, serving_load
from harness import placement as placement_mod
from harness.engine_pool import EnginePool
from harness.engine_session import ResolveSession, WorkerSession
from harness.interleave import CommandSession, Session, SessionFactory
from harness.outputs_rule import OutputsVerdict, first_difference
from harness.quiet import Probe
from harness.serve_session import ServeSession
from harness.serve_session import instrument as serve_instrument
from harness.trials import BASELINE, CANDIDATE, CHANGED_OUTPUTS, WORKTREE_CHANGED, CommandSpec, TrialOutcome
from harness.worker_protocol import WorkerError, read_serving, serving_env

from .config import Config, WorkloadConfig, parse_cpus
from .errors import AgentsearchError

if TYPE_CHECKING:
    from .sides import Sides

from .sides import RESOLVER


class UnsupportedWorkload(AgentsearchError):
    pass


# Timed runs decode greedily and every request's answer is compared between the sides (the per-request rule, red
# team round 3: an average over requests let one request cut at half its length and padded through). Identical
# answers pass; where answers differ, the rule is statistical, not bitwise (``harness.outputs_rule``): the
# candidate's answer must be what the reference model itself could say — each flip within the measured tie, every
# token after it the reference's near-greedy choice — judged by the baseline's warm engine, teacher forcing.
def agreement(a: tuple[tuple[int, ...], ...], b: tuple[tuple[int, ...], ...]) -> tuple[float, float]:
    """(mean over requests of the common prefix over the longer answer, share of identical answers)."""
    if len(a) != len(b):
        return 0.0, 0.0
    if not a:
        return 1.0, 1.0
    shares = []
    for x, y in zip(a, b, strict=True):
        d = first_difference(x, y)
        shares.append(1.0 if d is None else d / max(len(x), len(y)))
    return sum(shares) / len(shares), sum(1 for x, y in zip(a, b, strict=True) if x == y) / len(a)


class OutputsMatch:
    """Timed runs prove their own outputs: what one side generated for a seed must be what the other side
    generated for the same seed (the same requests), or what the reference model could have generated in its
    place (``harness.outputs_rule``: a flip at a near tie, the reference's greedy choice after it, judged by the
    baseline's warm engine). A side that does less work — skips requests, stops early, pads, answers from a
    cache it could not have, computes in a lower precision, or is fast only when it is not being verified —
    fails the trial in the act.

    ``sessions`` holds each side's current session (``session_factory`` registers them): the scoring asks the
    baseline's engine. Where it is not up when a pair completes (``alternate`` placement finishes every other round
    in the candidate's session, after the baseline's engine is gone), the pair's differing answers wait: the next
    baseline session scores them, or ``settle()`` — which ``run_interleaved`` calls when the sessions are over —
    starts a baseline engine (``fresh_baseline``) for them. Without ``fresh_baseline`` they fail at once."""

    def __init__(self, digest_key: str | None = None, timeout_s: float = 600.0, calibrated: float | None = None):
        self.digest_key = digest_key
        self.timeout_s = timeout_s
        # the reference's rounding floor: as ``agentsearch calibrate`` measured it for this engine (if it still
        # describes the set-up), and the largest this run has measured (the first pair with flips scores every
        # answer of the baseline's, later ones the answers of the requests that differ)
        self.calibrated = calibrated
        self.floor_seen, self.floor_positions = 0.0, 0
        self.last: tuple[float, float] | None = None  # (agreement, identical) of the latest completed pair
        self.verdict: OutputsVerdict | None = None  # the rule's verdict on the latest completed pair
        self.seen: dict[int, tuple[str, tuple[tuple[int, ...], ...] | None, object, object]] = {}
        self.sessions: dict[str, Session] = {}
        self.fresh_baseline: Callable[[], Session] | None = None
        self.pending: list[tuple[int, tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]] = []

    def check(self, side: str, seed: int, outcome: TrialOutcome) -> str:
        if not outcome.ok:
            return ""
        if self.digest_key is not None:
            return self._check_digest(side, seed, outcome)
        kind = outcome.metrics.get("outputs_kind", "tokens")  # a server without token ids: hashes of its texts
        mine = (side, outcome.outputs, outcome.metrics.get("input_tokens"), kind)
        other = self.seen.pop(seed, None)
        if other is None or other[0] == side:
            self.seen[seed] = mine
            return ""
        if (other[1] is None) != (mine[1] is None):
            return "outputs check: one side reported the tokens it generated and the other did not"
        if mine[1] is None or other[1] is None:
            return ""  # a workload without outputs (command workloads declare none)
        if other[3] != kind:
            return "outputs check: one side reported the token ids of its answers and the other only their texts"
        if other[2] != mine[2]:
            return (
                f"outputs check: the two sides processed different inputs for seed {seed} ({other[2]} vs {mine[2]} "
                "input tokens)"
            )
        if len(other[1]) != len(mine[1]):
            return f"outputs check: the two sides answered {len(other[1])} and {len(mine[1])} requests for seed {seed}"
        self.last = agreement(other[1], mine[1])
        base, cand = (other[1], mine[1]) if other[0] == BASELINE else (mine[1], other[1])
        self.verdict = self.judge(seed, base, cand, scorable=kind == "tokens")
        if not self.verdict.passed:
            return self._refusal(seed, self.verdict, self.last)
        return self._settle_pending() if self.baseline_up() else ""

    @staticmethod
    def _refusal(seed: int, verdict: OutputsVerdict, last: tuple[float, float]) -> str:
        share, same = last
        reasons = verdict.reasons
        more = f"; {len(reasons) - 1} more request(s) refused" if len(reasons) > 1 else ""
        return (
            f"outputs check: the tokens generated for the same requests (seed {seed}) differ between the sides "
            f"beyond what the reference model itself could say (greedy decoding: {verdict.compared}): "
            f"{reasons[0]}{more}; {same:.0%} of requests and {share:.1%} of tokens agree"
        )

    def baseline_up(self) -> bool:
        b = self.sessions.get(BASELINE)
        return b is not None and callable(getattr(b, "score", None)) and b.up()  # type: ignore[attr-defined]

    def _settle_pending(self) -> str:
        """Judge the pairs that waited for the baseline's engine (it is up): '' or the first refusal."""
        while self.pending:
            seed, base, cand = self.pending.pop(0)
            verdict = self.judge(seed, base, cand, may_wait=False)
            if not verdict.passed:
                self.pending.clear()
                return self._refusal(seed, verdict, agreement(base, cand))
        return ""

    def settle(self) -> str:
        """After the last pair: the waiting pairs judged on a baseline engine started for them ('' = all passed)."""
        if not self.pending:
            return ""
        if self.fresh_baseline is None:
            self.pending.clear()
            return "outputs check: differing answers waited for the baseline's engine to score them, and none came"
        session = self.fresh_baseline()
        self.sessions[BASELINE] = session
        try:
            session.start()
            return self._settle_pending()
        finally:
            self.pending.clear()
            session.close()

    def judge(
        self,
        seed: int,
        base: tuple[tuple[int, ...], ...],
        cand: tuple[tuple[int, ...], ...],
        scorable: bool = True,
        may_wait: bool = True,
    ) -> OutputsVerdict:
        """The rule's verdict on one pair's answers: identical (bits), or every difference scored and judged
        (``scorable``: the answers are token ids; hashes of texts can only be compared bit for bit). ``may_wait``:
        a pair may wait for a baseline engine (never while the waiting pairs are being judged)."""
        differ = [i for i, (x, y) in enumerate(zip(base, cand, strict=True)) if x != y]
        flips = [i for i in differ if len(base[i]) == len(cand[i])]
        if not flips:  # identical, or only answers of another length (refused without scoring)
            return outputs_rule.judge(base, cand, {}, outputs_rule.Floor.of("float32", 0.0, 0))
        n = len(base)
        d = first_difference(base[flips[0]], cand[flips[0]])
        what = f"request {flips[0]} (of {n}) differs from token {d}"
        if d is not None and outputs_rule.padded(cand[flips[0]][d:]) and not outputs_rule.padded(base[flips[0]][d:]):
            what += " and the rest of it repeats one short cycle (padded)"
        if not scorable:
            return OutputsVerdict(
                False,
                (
                    f"{what}; the server gave the texts of its answers, not their token ids: every request must "
                    "agree in full",
                ),
                compared="bits",
            )
        b, c = self.sessions.get(BASELINE), self.sessions.get(CANDIDATE)
        if (
            may_wait
            and not self.baseline_up()
            and self.fresh_baseline is not None
            and callable(getattr(b, "score", None))
        ):
            self.pending.append((seed, base, cand))  # judged when a baseline engine is up (``settle``)
            return OutputsVerdict(True, (), compared="pending")
        if b is None or not self.baseline_up():
            return OutputsVerdict(
                False,
                (
                    f"{what} and the baseline's engine is not up to score it (one engine at a time: alternate "
                    "placement; or a workload whose engine cannot score): every request must agree in full",
                ),
                compared="bits",
            )
        engine = b.engine  # type: ignore[attr-defined]
        engine.wait_ready()  # a baseline engine started for waiting answers may still be booting
        vocab = engine.vocab_size
        for i in flips:
            bad = next((t for t in cand[i] if vocab is None or t >= vocab), None)
            if bad is not None:
                why = "is outside the model's vocabulary" if vocab is not None else "cannot be checked (no vocabulary)"
                return OutputsVerdict(
                    False, (f"request {i} (of {n}): the candidate's token id {bad} {why}",), compared="distributions"
                )
        t0 = time.perf_counter()
        # both engines get the same command: per request, the two answers in an order set by their tokens, never by
        # whose they are (a side that could tell which answer is the other's would know which side it is)
        # the run's first flips: the floor is measured on every answer of the pair (the requests that agree, too)
        judged = [i for i in range(n) if i in flips or base[i] == cand[i]] if self.floor_positions == 0 else flips
        asked = [(i, a) for i in judged for a in sorted({base[i], cand[i]})]
        try:
            first, again = _score(b, seed, asked, self.timeout_s)
        except (WorkerError, ValueError) as exc:
            return OutputsVerdict(
                False,
                (f"{what} and the baseline's engine could not score it ({exc}); nothing proves the answer",),
                compared="distributions",
            )
        spent = time.perf_counter() - t0
        where = {(i, a): j for j, (i, a) in enumerate(asked)}
        # the baseline's own answers: the floor is measured on them only
        mine = [where[(i, base[i])] for i in judged]
        own = [first[j] for j in mine]
        measured, positions = outputs_rule.measured_floor(own, [again[j] for j in mine], own)
        self.floor_seen, self.floor_positions = max(self.floor_seen, measured), self.floor_positions + positions
        floor = outputs_rule.Floor.of(
            engine.dtype or "float32", max(self.floor_seen, self.calibrated or 0.0), self.floor_positions
        )
        theirs: dict[int, Any] = {}
        if c is not None and callable(getattr(c, "score", None)) and c.up():  # type: ignore[attr-defined]
            # the candidate's engine is the candidate's code: it gets a few times what the baseline's took, no more
            limit = min(self.timeout_s, max(CANDIDATE_SCORE_MIN_S, CANDIDATE_SCORE_FACTOR * spent))
            try:
                got, _ = _score(c, seed, asked, limit)
                theirs = {i: got[where[(i, base[i])]] for i in flips}
            except (WorkerError, ValueError):
                theirs = {}  # the candidate's direction can only refuse: without it the reference's decides
        scores = {i: (first[where[(i, cand[i])]], theirs.get(i)) for i in flips}
        return outputs_rule.judge(base, cand, scores, floor, time.perf_counter() - t0)

    def _check_digest(self, side: str, seed: int, outcome: TrialOutcome) -> str:
        """Command workloads declare ``outputs = KEY``: the digest both sides report must be equal."""
        assert self.digest_key is not None
        value = outcome.metrics.get(self.digest_key)
        if not isinstance(value, (str, int)) or isinstance(value, bool) or value == "":
            return f"outputs check: the run reported no {self.digest_key!r} (the workload declares it as its outputs)"
        other = self.seen.pop(seed, None)
        if other is None or other[0] == side:
            self.seen[seed] = (side, None, value, "digest")
            return ""
        if other[2] != value:
            return (
                f"outputs check: the two sides computed different {self.digest_key!r} for the same inputs "
                f"(seed {seed}): {str(other[2])[:24]!r} vs {str(value)[:24]!r}"
            )
        return ""


SCORE_CHUNK_TOKENS = 4096  # answer tokens per scoring command: every answer's rows fit one message of the worker's pipe
CANDIDATE_SCORE_MIN_S = 30.0  # the candidate's engine scores within this, or CANDIDATE_SCORE_FACTOR x the baseline's
CANDIDATE_SCORE_FACTOR = 5.0


def _score(
    session: Session, seed: int, asked: list[tuple[int, tuple[int, ...]]], timeout_s: float
) -> tuple[list[Any], list[Any]]:
    """``session.score`` in commands of at most ``SCORE_CHUNK_TOKENS`` answer tokens (whole answers), concatenated."""
    first: list[Any] = []
    again: list[Any] = []
    chunk: list[tuple[int, tuple[int, ...]]] = []
    size = 0
    deadline = time.monotonic() + timeout_s
    for item in [*asked, None]:
        if item is None or (chunk and size + len(item[1]) > SCORE_CHUNK_TOKENS):
            if chunk:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WorkerError(f"scoring timed out after {timeout_s:g} s")
                f, a = session.score(seed, chunk, left)  # type: ignore[attr-defined]
                first += f
                again += a
            chunk, size = [], 0
        if item is not None:
            chunk.append(item)
            size += len(item[1])
    return first, again


def blames_candidate(error: str) -> bool:
    """A failure found by comparing the sides (the outputs check) or in the candidate's worktree is the
    candidate's, whichever side's trial it was found after (the prefixes are the orchestrator's own)."""
    return error.startswith(("outputs check:", f"worktree modified during a trial: {CANDIDATE}:"))


class GuardedSession:
    """A session whose every measurement is followed by the worktree check and the outputs check."""

    def __init__(
        self,
        inner: Session,
        check: Callable[[], str],
        side: str = "",
        match: OutputsMatch | None = None,
        fresh: Callable[[], None] | None = None,
    ):
        self.inner, self.check, self.side, self.match, self.fresh = inner, check, side, match, fresh

    def start(self) -> None:
        if self.fresh is not None:
            self.fresh()
        self.inner.start()

    def boot_failed(self) -> bool | None:
        probe = getattr(self.inner, "boot_failed", None)
        return False if probe is None else probe()

    def add_wait(self, seconds: float) -> None:
        add = getattr(self.inner, "add_wait", None)
        if add is not None:
            add(seconds)

    def measure(self, seed: int) -> TrialOutcome:
        if self.fresh is not None:
            self.fresh()  # every trial starts with an empty output directory
        return self._checked(seed, self.inner.measure(seed))

    def parts(self, seed: int) -> int:
        parts = getattr(self.inner, "parts", None)
        return 1 if parts is None else parts(seed)

    def measure_part(self, seed: int, part: int, parts: int) -> TrialOutcome:
        """One part of a sliced trial (``harness.interleave``): the worktree is checked after every part, the
        outputs once the parts are combined (``combine``)."""
        if part == 0 and self.fresh is not None:
            self.fresh()
        outcome = self.inner.measure_part(seed, part, parts)  # type: ignore[attr-defined]
        why = self.check()
        if why:
            return dataclasses.replace(outcome, ok=False, value=None, error=why, failure=WORKTREE_CHANGED)
        return outcome

    def combine(self, seed: int, parts: list[TrialOutcome]) -> TrialOutcome:
        outcome = self.inner.combine(seed, parts)  # type: ignore[attr-defined]
        return self._checked(seed, outcome) if outcome.ok else outcome

    def _checked(self, seed: int, outcome: TrialOutcome) -> TrialOutcome:
        """``outcome`` after the worktree check and the outputs check (failed when either fails)."""
        why, kind = self.check(), WORKTREE_CHANGED
        if not why and self.match is not None:
            kind = CHANGED_OUTPUTS
            self.match.last, self.match.verdict = None, None
            why = self.match.check(self.side, seed, outcome)
            # what the report says of the outputs is ours alone: a side's own outputs_* numbers are dropped
            outcome = dataclasses.replace(
                outcome,
                metrics={
                    k: v for k, v in outcome.metrics.items() if not k.startswith("outputs_") or k == "outputs_kind"
                },
            )
            if self.match.last is not None:  # the pair is complete: say how closely the outputs agreed, and how
                share, same = self.match.last  # the rule judged them (bits, or flips against the measured tie)
                rule = self.match.verdict.metrics() if self.match.verdict is not None else {}
                outcome = dataclasses.replace(
                    outcome,
                    metrics={
                        **outcome.metrics,
                        "outputs_agreement": round(share, 6),
                        "outputs_identical": round(same, 6),
                        **rule,
                    },
                )
        if why:
            return dataclasses.replace(outcome, ok=False, value=None, error=why, failure=kind)
        return outcome

    def close(self) -> None:
        self.inner.close()


def session_factory(
    config: Config,
    workload: WorkloadConfig,
    sd: Sides,
    pool: EnginePool | None = None,
    out: str = "",
    outputs_floor: float | None = None,
) -> GuardedFactory:
    """A factory (side, restart) -> Session for ``workload`` with each side in its worktree.

    Warm-engine workloads lease their engines from ``pool`` (the caller closes it). Outputs go to the
    side's own output directory (``out`` names a sub-directory), logs where no side can read them."""
    if workload.spec.engine:
        if pool is None:
            raise ValueError("warm-engine workloads need an EnginePool")
        raw = engine_factory(config, workload, sd, pool, out)
    else:
        assert workload.command

        def raw(side: str, restart: int) -> Session:
            env = {**config.target.env, **workload.env}
            spec = CommandSpec(
                command=workload.command or "",
                worktree=sd.worktrees[side],
                metric=workload.metric,
                timeout_s=workload.timeout_s,
                env=env,
            )
            return CommandSession(spec, sd.out(side) / (out or "trials") / f"{workload.name}-{restart}")

    match = OutputsMatch(
        digest_key=workload.outputs if workload.spec.outputs == "digest" else None,
        timeout_s=workload.timeout_s,
        calibrated=outputs_floor,
    )
    if workload.spec.engine:
        scorers = iter(range(SCORING_RESTART, SCORING_RESTART + 1000))
        match.fresh_baseline = lambda: raw(BASELINE, next(scorers))
    return GuardedFactory(raw, match, sd, out)


SCORING_RESTART = 10_000  # restart indices of baseline engines started only to score waiting answers (``settle``)


class GuardedFactory:
    """``session_factory``'s answer: (side, restart) -> a GuardedSession; ``settle()`` judges what waited."""

    def __init__(self, raw: SessionFactory, match: OutputsMatch, sd: Sides, out: str, offset: int = 0):
        self.raw, self.match, self.sd, self.out, self.offset = raw, match, sd, out, offset

    def at(self, offset: int) -> GuardedFactory:
        """The same factory with restart indices from ``offset`` on (fresh engines for a confirmation or a guard's
        re-measure), its ``settle`` kept: a wrapper that dropped it would let waiting outputs go unjudged."""
        return GuardedFactory(self.raw, self.match, self.sd, self.out, self.offset + offset)

    def __call__(self, side: str, restart: int) -> Session:
        restart += self.offset
        inner = self.match.sessions[side] = self.raw(side, restart)  # the scoring of a flip asks the sides' engines
        sd, out = self.sd, self.out
        return GuardedSession(inner, sd.check, side, self.match, fresh=lambda: sd.fresh_outputs(side, keep=out))

    def settle(self) -> str:
        return self.match.settle()

    def rounding_floor(self, seed: int) -> outputs_rule.Floor | str:
        """The reference's own rounding on this engine (``agentsearch calibrate``): one more round of ``seed`` on the
        baseline's engine (the current one, or one started for it), every answer scored in two batch orders and
        against its own decode. The floor, or why it could not be measured."""
        match = self.match
        b = match.sessions.get(BASELINE)
        started = None
        if not match.baseline_up():
            if match.fresh_baseline is None:
                return "this workload's engine cannot score answers"
            b = started = match.fresh_baseline()
            b.start()
        assert b is not None
        try:
            outcome = b.measure(seed)
            if not outcome.ok or not outcome.outputs:
                return f"the baseline's round failed: {outcome.error or 'no outputs'}"
            answers = list(enumerate(outcome.outputs))
            first, again = _score(b, seed, answers, match.timeout_s)
            measured, positions = outputs_rule.measured_floor(first, again, first)
            return outputs_rule.Floor.of(b.engine.dtype or "float32", measured, positions)  # type: ignore[attr-defined]
        except (WorkerError, ValueError) as exc:
            return f"the baseline's engine could not score its answers ({exc})"
        finally:
            if started is not None:
                started.close()


def model_path(workload: WorkloadConfig) -> str:
    try:
        return models.resolve(workload.model)
    except (RuntimeError, OSError) as exc:
        raise UnsupportedWorkload(f"workload {workload.name!r}: {exc}") from None


def engine_spec(workload: WorkloadConfig) -> dict:
    """What the warm worker needs: kind, model, engine arguments, workload parameters."""
    engine = {"enforce_eager": True, "max_model_len": 1024, "seed": 0, **workload.engine}
    return {"kind": workload.kind, "model": model_path(workload), "engine": engine, "params": dict(workload.params)}


@functools.lru_cache(maxsize=8)
def _devices(visible: str | None) -> tuple[str, ...]:
    return placement_mod.cuda_devices({} if visible is None else {"CUDA_VISIBLE_DEVICES": visible})


def placement_for(config: Config) -> placement_mod.Placement:
    """The concrete placement of this machine for ``[engine] placement`` (a machine that cannot give it
    — split with fewer than two GPUs — is a set-up error, the run's)."""
    try:
        place = placement_mod.resolve(
            config.engine.placement, _devices(os.environ.get("CUDA_VISIBLE_DEVICES")), config.engine.memory_split
        )
    except placement_mod.PlacementError as exc:
        raise AgentsearchError(f"[engine] placement: {exc}") from None
    if place.mode == placement_mod.SPLIT:  # a side on each device: only comparable when the devices are the same
        differ = environment.same_devices(list(place.devices))
        if differ:
            raise AgentsearchError(
                f"[engine] placement split: {differ}; use \"alternate\" or \"shared\" on one of them"
            )
    return place


def measure_options(config: Config, workload: WorkloadConfig) -> dict[str, Any]:
    """How ``run_interleaved`` measures ``workload``: restarts, warm-up, alternate sessions, the quiet probe, slices."""
    warm = workload.spec.engine
    alternate = warm and placement_for(config).exclusive
    threshold = config.engine.foreign_load
    return {
        "restarts": restarts_for(workload),
        "warmup": config.engine.warmup if warm else 0,
        "alternate": alternate,
        "probe": lambda: Probe(threshold),
        "slices": 1 if alternate else config.engine.slices,
    }


def engine_factory(
    config: Config, workload: WorkloadConfig, sd: Sides, pool: EnginePool, out: str = ""
) -> SessionFactory:
    place = placement_for(config)
    spec = engine_spec(workload)
    spec["engine"] = place.engine_args(spec["engine"])
    if workload.spec.serving and config.slos:
        spec["slo"] = config.slo_specs()  # what goodput counts, and throughput at SLO searches for
    if workload.spec.serving and workload.params.get("trace"):
        # the trace of request lengths is read from the baseline's worktree, never the candidate's
        try:
            spec["trace"] = serving_load.read_trace(sd.worktrees[BASELINE] / str(workload.params["trace"]))
        except ValueError as exc:
            raise UnsupportedWorkload(f"workload {workload.name!r}: {exc}") from None
    worktrees, logs = sd.worktrees, sd.logs / (out or "engines")

    env = {**config.target.env, **workload.env}
    serve = workload.spec.serving
    cpus = engine_cpus(config, workload, place)
    ident = json.dumps(
        {
            "serve": serve,
            "model": spec["model"],
            "engine": spec["engine"],
            "env": env,
            "cpus": sorted(cpus) if cpus else None,
        },
        sort_keys=True,
    )

    def make(side: str, restart: int) -> Session:
        key = f"{side}/{restart}/{ident}"
        n = len(pool)
        side_env = {**env, **place.env(side, restart)}  # split: the side's device this session
        if serve:

            def engine() -> ServeSession:
                return ServeSession(
                    spec,
                    worktrees[side],
                    serve_instrument(worktrees[BASELINE]),
                    side_env,
                    logs / f"serve-{sd.label(side)}-{restart}-{n}",
                    workload.metric,
                    workload.timeout_s,
                    workload.startup_timeout_s,
                    cpus=cpus,
                )
        else:

            def engine() -> WorkerSession:  # type: ignore[misc]
                return WorkerSession(
                    spec,
                    worktrees[side],
                    side_env,
                    logs / f"engine-{sd.label(side)}-{restart}-{n}.log",
                    workload.metric,
                    workload.timeout_s,
                    workload.startup_timeout_s,
                    cpus=cpus,
                )

        return pool.lease(key, engine, workload.kind, spec["params"], workload.metric, exclusive=place.exclusive)

    return make


def engine_cpus(config: Config, workload: WorkloadConfig, place: placement_mod.Placement) -> frozenset[int] | None:
    """The CPUs both sides' warm engines of ``workload`` are pinned to (None: not pinned), from ``[engine] cpus``.

    auto pins only where it is known to help and cannot starve the engine: no GPU, the engines' OpenMP threads set
    (``OMP_NUM_THREADS`` = n in [target.env] or the workload's env) and more than n CPUs available: the last n (the
    orchestrator, its probes and the booting engines keep the others). A CPU list the machine cannot give is the
    run's set-up error."""
    choice = config.engine.cpus
    if choice == "none":
        return None
    allowed = os.sched_getaffinity(0)
    if choice == "auto":
        if place.devices:
            return None
        try:
            n = int({**config.target.env, **workload.env}.get("OMP_NUM_THREADS", ""))
        except ValueError:
            return None
        return frozenset(sorted(allowed)[-n:]) if 1 <= n < len(allowed) else None
    cpus = parse_cpus(choice)
    if not cpus <= allowed:
        raise AgentsearchError(
            f"[engine] cpus = {choice!r}: CPU(s) {', '.join(map(str, sorted(cpus - allowed)))} are not available here "
            f"(available: {', '.join(map(str, sorted(allowed)))}); choose among them or use \"auto\""
        )
    return cpus


def restarts_for(workload: WorkloadConfig) -> int:
    """Session restarts per evaluation (warm-engine workloads restart; commands never need to)."""
    return workload.spec.sessions(workload.restarts)


def confirmation_restarts(config: Config) -> int:
    """Sessions of the confirmation on fresh engines: one; two under split placement, so that the sides swap devices as
    in every other round."""
    return 2 if placement_for(config).mode == placement_mod.SPLIT else 1


def guard_check_sessions(config: Config) -> int:
    """Fresh engine sessions of a guard's re-measure (``[gate] guard_check_sessions``), a multiple of the
    confirmation's (so that under split placement the sides swap devices evenly)."""
    per = confirmation_restarts(config)
    return -(-config.gate.guard_check_sessions // per) * per


__all__ = [
    "session_factory",
    "guard_check_sessions",
    "restarts_for",
    "confirmation_restarts",
    "measure_options",
    "placement_for",
    "blames_candidate",
    "UnsupportedWorkload",
    "BASELINE",
]


def resolve_sides(
    config: Config, workload: WorkloadConfig, sd: Sides, timeout_s: float, pool: EnginePool | None = None
) -> dict[str, dict | str]:
    """Each side's engine configuration and environment as its own vLLM resolves them for ``workload`` (the worker's
    ``--resolve``, in the side's sandbox and environment: no engine starts), both at once: side -> the resolution,
    or the one-line error that stopped it. A kept baseline side's earlier resolution of the same arguments is reused
    (marked ``kept``): the candidate alone is resolved.

    With a ``pool`` (an evaluation's in an episode), the baseline's resolving worker stays in it, parked, under a
    ``RESOLVER`` key (kept with the baseline side between the episode's decisions). The caller has checked that the
    two sides differ in ``serving.json`` alone, so their code is the same; when the placement gives both sides'
    workers the same variables, that worker resolves the candidate's file (its engine section, its variables over
    the baseline's; marked ``warm``): vLLM imported once, a no-op decided in seconds. It must answer the baseline's
    own file as it did before its answer counts; else it is retired and both sides resolve cold again."""
    place = placement_for(config)
    spec = engine_spec(workload)
    spec["engine"] = place.engine_args(spec["engine"])
    env = {**config.target.env, **workload.env}
    sessions = {
        side: ResolveSession(
            spec,
            sd.worktrees[side],
            {**env, **place.env(side, 0)},
            sd.logs / "engines" / f"resolve-{sd.label(side)}.log",
            workload.metric,
            timeout_s,
            timeout_s,
        )
        for side in (BASELINE, CANDIDATE)
    }
    out: dict[str, dict | str] = {}
    # a kept baseline side resolved these arguments in this environment before: the same answer (its commit, spec
    # and environment are the key; the side itself is checked unchanged before it is lent again)
    key = hashlib.sha256(
        json.dumps([sd.commits[BASELINE], spec, sessions[BASELINE].env], sort_keys=True, default=str).encode()
    ).hexdigest()
    # a warm resolver needs the two sides' workers in one environment but for serving.json (placement's per side too)
    warmable = pool is not None and place.env(BASELINE, 0) == place.env(CANDIDATE, 0)
    if sd.kept is not None and isinstance(sd.resolutions.get(key), dict):
        if pool is not None and warmable:
            warm = warm_request(pool, RESOLVER + key, sd.resolutions[key], sd, timeout_s)
            if warm is not None:
                return {BASELINE: {**sd.resolutions[key], "kept": True}, CANDIDATE: warm}
        if not warmable or (pool is not None and RESOLVER + key in pool.engines):
            out[BASELINE] = {**sd.resolutions[key], "kept": True}
            del sessions[BASELINE]
        # else no warm resolver (never made, or retired): the baseline's is started again beside the candidate's
    # both at once, unless the placement runs one engine at a time (alternate: a device's memory is one side's)
    waves = [[side] for side in sessions] if place.exclusive else [list(sessions)]
    try:
        for wave in waves:
            for side in wave:
                sessions[side].start()
            for side in wave:
                try:
                    out[side] = sessions[side].resolved()
                except WorkerError as exc:
                    out[side] = str(exc) or "the resolving worker failed"
                finally:
                    if side == BASELINE and pool is not None and warmable and isinstance(out.get(side), dict):
                        sessions[side].park()  # the warm resolver: the pool closes it, or keeps it with the side
                        pool.engines[RESOLVER + key] = sessions.pop(side)
                    else:
                        sessions[side].close()
    finally:
        for s in sessions.values():
            s.close()
    got = out.get(BASELINE)
    if isinstance(got, dict):
        sd.resolutions[key] = {k: v for k, v in got.items() if k != "kept"}
    return out


WARM_REQUEST_S = 60.0  # a warm resolution answers in well under a second; one that hangs is retired, then cold


def request_env(
    given: Mapping[str, str], baseline: Mapping[str, str], candidate: Mapping[str, str]
) -> dict[str, str | None]:
    """The variables a warm worker started with ``given`` and the baseline's serving.json env (``baseline``) must set
    for one request to run as the candidate's own worker would: the candidate's serving env over ``given``. A variable
    only the baseline's file sets goes back to ``given``'s value (None: unset), as the candidate's worker has it."""
    return {**{k: given.get(k) for k in baseline}, **candidate}


def warm_request(
    pool: EnginePool, key: str, baseline: Mapping[str, Any], sd: Sides, timeout_s: float
) -> dict[str, Any] | str | None:
    """The candidate's resolution by the baseline's kept resolving worker; a string: the candidate's file made that
    worker change the baseline's worktree (its rejection); None: resolve it cold (no warm worker, an unreadable
    serving.json, a worker that failed or hung, or one that no longer answers the baseline's own file as it did)."""
    warm = pool.engines.get(key)
    if warm is None:
        return None
    try:
        served = {side: read_serving(sd.worktrees[side]) for side in (BASELINE, CANDIDATE)}
        envs = {side: serving_env(sd.worktrees[side]) for side in (BASELINE, CANDIDATE)}
        sections = {side: (s if isinstance(s, dict) else {}).get("engine", {}) for side, s in served.items()}
    except Exception:  # noqa: BLE001 - an unreadable serving.json or a refused variable: the candidate's worker says
        return None
    limit = min(timeout_s, WARM_REQUEST_S)
    try:
        got = warm.resolve_again(sections[CANDIDATE], request_env(warm.env, envs[BASELINE], envs[CANDIDATE]), limit)
        # the same worker, asked the baseline's own file again, must answer what it answered cold: a request that
        # changed what it resolves (arguments that register or import something) is caught here
        again = warm.resolve_again(sections[BASELINE], {}, limit)
    except Exception:  # noqa: BLE001 - gone, hung, or a section it cannot even be sent: the candidate's own decides
        pool.retire(key)
        return None
    # the worker runs in the baseline's worktree: what the candidate's file made it write there is the candidate's
    # doing (cold, it would have written the candidate's worktree, and the trial's check would have caught it)
    changed = sd.check()
    if changed:
        pool.retire(key)
        return f"resolving the candidate's serving.json changed the worktree it ran in ({changed})"
    if _disagree(baseline, again):
        pool.retire(key)
        return None
    return {**got, "warm": True}


def _disagree(before: Mapping[str, Any], now: Mapping[str, Any]) -> bool:
    """Whether a resolution differs from an earlier one of the same arguments, in what the earlier one holds."""

    def walk(a: Any, b: Any) -> bool:
        if isinstance(a, Mapping):
            return not isinstance(b, Mapping) or any(k not in b or walk(v, b[k]) for k, v in a.items())
        return a != b

    return any(walk(before.get(part), now.get(part)) for part in ("config", "env"))

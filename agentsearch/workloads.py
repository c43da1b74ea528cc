"""From a [[workload]] to the harness sessions that measure it on one side.

Every session is guarded: after each measurement both worktrees must be as they were built
(``Sides.check``), else the trial fails with "worktree modified during a trial".
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from harness import environment, models, serving_load
from harness import placement as placement_mod
from harness.engine_pool import EnginePool
from harness.engine_session import WorkerSession
from harness.interleave import CommandSession, Session, SessionFactory
from harness.quiet import Probe
from harness.serve_session import ServeSession
from harness.serve_session import instrument as serve_instrument
from harness.trials import BASELINE, CANDIDATE, CHANGED_OUTPUTS, WORKTREE_CHANGED, CommandSpec, TrialOutcome

from .config import Config, WorkloadConfig, parse_cpus
from .errors import AgentsearchError

if TYPE_CHECKING:
    from .sides import Sides


class UnsupportedWorkload(AgentsearchError):
    pass


# Timed runs decode greedily: every request must give the other side's tokens in full (the per-request rule,
# red team round 3: an average over requests let one request cut at half its length and padded through). On
# CPU vLLM's greedy decoding is batch-invariant here (every honest pair agreed 100%; docs/measurements); a
# machine whose kernels are not bit-exact needs a near-tie check at the divergence (not built yet: it fails closed).
PERIOD_MAX = 4  # a tail that repeats a cycle of at most this many tokens is "padded" (when the other side's is not)


def first_difference(x: tuple[int, ...], y: tuple[int, ...]) -> int | None:
    """The first position where ``x`` and ``y`` differ (the shorter one's length when one is a prefix), or None."""
    for i, (p, q) in enumerate(zip(x, y, strict=False)):
        if p != q:
            return i
    return None if len(x) == len(y) else min(len(x), len(y))


def padded(tail: tuple[int, ...]) -> bool:
    """Whether ``tail`` (four tokens or more) is one cycle of at most ``PERIOD_MAX`` tokens repeated."""
    if len(tail) < 4:
        return False
    return any(all(tail[i] == tail[i % k] for i in range(len(tail))) for k in range(1, PERIOD_MAX + 1) if k < len(tail))


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


def divergence(base: tuple[tuple[int, ...], ...], cand: tuple[tuple[int, ...], ...]) -> str:
    """'' when every request agrees in full, else the first request that does not, in words."""
    bad = [i for i, (x, y) in enumerate(zip(base, cand, strict=True)) if x != y]
    if not bad:
        return ""
    i = bad[0]
    x, y = base[i], cand[i]
    d = first_difference(x, y)
    assert d is not None
    what = f"request {i} (of {len(base)}) differs from token {d} of {len(x)}"
    if len(y) != len(x):
        what += f" ({len(y)} tokens against {len(x)})"
    elif padded(y[d:]) and not padded(x[d:]):
        what += " and the rest of it repeats one short cycle (padded)"
    more = f"; {len(bad) - 1} more request(s) differ" if len(bad) > 1 else ""
    return what + more


class OutputsMatch:
    """Timed runs prove their own outputs: what one side generated for a seed must be what the other
    side generated for the same seed (the same requests). Greedy decoding, so near-ties aside the
    tokens are equal; a side that does less work — skips requests, stops early, answers from a cache
    it could not have, or is fast only when it is not being verified — fails the trial in the act."""

    def __init__(self, digest_key: str | None = None):
        self.digest_key = digest_key
        self.last: tuple[float, float] | None = None  # (agreement, identical) of the latest completed pair
        self.seen: dict[int, tuple[str, tuple[tuple[int, ...], ...] | None, object]] = {}

    def check(self, side: str, seed: int, outcome: TrialOutcome) -> str:
        if not outcome.ok:
            return ""
        if self.digest_key is not None:
            return self._check_digest(side, seed, outcome)
        mine = (side, outcome.outputs, outcome.metrics.get("input_tokens"))
        other = self.seen.pop(seed, None)
        if other is None or other[0] == side:
            self.seen[seed] = mine
            return ""
        if (other[1] is None) != (mine[1] is None):
            return "outputs check: one side reported the tokens it generated and the other did not"
        if mine[1] is None or other[1] is None:
            return ""  # a workload without outputs (command workloads declare none)
        if other[2] != mine[2]:
            return (
                f"outputs check: the two sides processed different inputs for seed {seed} ({other[2]} vs {mine[2]} "
                "input tokens)"
            )
        if len(other[1]) != len(mine[1]):
            return f"outputs check: the two sides answered {len(other[1])} and {len(mine[1])} requests for seed {seed}"
        self.last = agreement(other[1], mine[1])
        base, cand = (other[1], mine[1]) if other[0] == BASELINE else (mine[1], other[1])
        what = divergence(base, cand)
        if what:
            share, same = self.last
            return (
                f"outputs check: the tokens generated for the same requests (seed {seed}) differ between the sides "
                f"(greedy decoding: every request must agree in full): {what}; {same:.0%} of requests and "
                f"{share:.1%} of tokens agree"
            )
        return ""

    def _check_digest(self, side: str, seed: int, outcome: TrialOutcome) -> str:
        """Command workloads declare ``outputs = KEY``: the digest both sides report must be equal."""
        assert self.digest_key is not None
        value = outcome.metrics.get(self.digest_key)
        if not isinstance(value, (str, int)) or isinstance(value, bool) or value == "":
            return f"outputs check: the run reported no {self.digest_key!r} (the workload declares it as its outputs)"
        other = self.seen.pop(seed, None)
        if other is None or other[0] == side:
            self.seen[seed] = (side, None, value)
            return ""
        if other[2] != value:
            return (
                f"outputs check: the two sides computed different {self.digest_key!r} for the same inputs "
                f"(seed {seed}): {str(other[2])[:24]!r} vs {str(value)[:24]!r}"
            )
        return ""


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
            self.match.last = None
            why = self.match.check(self.side, seed, outcome)
            if self.match.last is not None:  # the pair is complete: say how closely the outputs agreed
                share, same = self.match.last
                outcome = dataclasses.replace(
                    outcome,
                    metrics={
                        **outcome.metrics,
                        "outputs_agreement": round(share, 6),
                        "outputs_identical": round(same, 6),
                    },
                )
        if why:
            return dataclasses.replace(outcome, ok=False, value=None, error=why, failure=kind)
        return outcome

    def close(self) -> None:
        self.inner.close()


def session_factory(
    config: Config, workload: WorkloadConfig, sd: Sides, pool: EnginePool | None = None, out: str = ""
) -> SessionFactory:
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

    match = OutputsMatch(digest_key=workload.outputs if workload.spec.outputs == "digest" else None)

    def make(side: str, restart: int) -> Session:
        return GuardedSession(raw(side, restart), sd.check, side, match, fresh=lambda: sd.fresh_outputs(side, keep=out))

    return make


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

"""The engines of one evaluation: ``EnginePool`` keeps one warm worker per side, restart and engine identity, shared
by every phase and workload; ``EngineLease`` is a workload's hold on them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from . import lengths
from .outputs_rule import Row
from .seeds import batch_seed
from .trials import TrialOutcome
from .worker_protocol import DEFAULT_PROMPTS, SLICEABLE_METRICS, combine_parts


class EnginePool:
    """Warm engines shared by every phase and workload of one evaluation.

    Workloads whose engine (model, engine arguments, environment) is the same reuse the same
    warm process per side and restart index: objective, guard and confirmation rounds do not
    pay another start-up. ``close()`` ends them all.
    """

    def __init__(self) -> None:
        self.engines: dict[str, Any] = {}  # WorkerSession or ServeSession
        self.wait_s = 0.0

    def lease(
        self,
        key: str,
        make: Callable[[], Any],
        kind: str,
        params: Mapping[str, Any],
        metric: str,
        exclusive: bool = False,
    ) -> EngineLease:
        """A lease on the engine ``key`` (made by ``make()`` the first time it is asked for). An
        ``exclusive`` lease (placement ``alternate``) shuts every other engine down before its engine
        starts, and its own engine when the session closes: one engine at a time, each session fresh."""
        if key not in self.engines:
            self.engines[key] = make()
        return EngineLease(self, key, kind, params, metric, exclusive)

    def retire(self, key: str) -> None:
        """Shut engine ``key`` down now (its wait time counted) and forget it."""
        self.retire_many([key])

    def retire_many(self, keys: Sequence[str]) -> None:
        """Shut the engines ``keys`` down now, together (``close_together``), and forget them; every one is closed
        even if one fails (the first failure re-raised)."""
        close_together([self.engines.pop(k) for k in keys if k in self.engines], self)

    def retire_others(self, key: str) -> None:
        self.retire_many([k for k in self.engines if k != key])

    def __len__(self) -> int:
        return len(self.engines)

    def activate(self, key: str) -> None:
        """Only engine ``key`` runs: every other engine of the pool is parked (stopped) until its turn.

        Engines still booting finish first (both sides boot concurrently; nothing is measured meanwhile),
        unless engine ``key`` failed to start: its measure reports that at once."""
        if self.engines[key].start_error:
            return
        for eng in self.engines.values():
            if not eng.parked and eng.proc is not None:
                eng.wait_ready()
        for k, eng in self.engines.items():
            if k != key:
                eng.park()
        self.engines[key].unpark()

    def park_all(self) -> None:
        for eng in self.engines.values():
            eng.park()

    def adopt(self, engines: Mapping[str, Any]) -> None:
        """Take warm engines over from another pool (a kept baseline): leased like any of this pool's,
        parked until their turn."""
        for key, eng in engines.items():
            self.engines[key] = eng
            eng.park()

    def release(self, keep: Callable[[str], bool]) -> dict[str, Any]:
        """Hand the engines whose key ``keep`` accepts back, parked, if they are up and healthy; close
        every other one (as ``close``). Their wait time so far is counted here."""
        kept: dict[str, Any] = {}
        going = []
        for key, eng in list(self.engines.items()):
            healthy = eng.proc is not None and eng.proc.poll() is None and not eng.start_error
            if keep(key) and healthy:
                eng.park()
                self.wait_s += eng.wait_s
                eng.wait_s = 0.0
                kept[key] = eng
                continue
            going.append(eng)
        self.engines.clear()
        try:
            close_together(going, self)
        except BaseException:
            for eng in kept.values():  # an error on the way out keeps nothing warm
                eng.close()
            raise
        return kept

    def close(self) -> None:
        """Shut every engine down (all closed even if one fails; the first failure re-raised)."""
        self.release(lambda _key: False)


def close_together(engines: Sequence[Any], pool: EnginePool) -> None:
    """Close ``engines`` at once, each in a thread of its own: a clean shutdown is mostly waiting (a served engine's
    took ~17 s on the demo; four retired one after another held the evaluation for over a minute). Every one is
    closed even if one fails; the first failure is re-raised. ``pool.wait_s`` counts the wall time this took (the
    engines' start-up waits before it, plus the time the closing held the evaluation), not the sum of the closes."""
    if not engines:
        return
    before = sum(eng.wait_s for eng in engines)
    errors: list[BaseException] = []

    def close(eng: Any) -> None:
        try:
            eng.close()
        except BaseException as exc:  # noqa: BLE001 - close the others too
            errors.append(exc)

    t0 = time.perf_counter()
    if len(engines) == 1:
        close(engines[0])
    else:
        threads = [threading.Thread(target=close, args=(eng,), daemon=True) for eng in engines]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    pool.wait_s += before + (time.perf_counter() - t0)
    if errors:
        raise errors[0]


class EngineLease:
    """A Session view of a pooled engine: start() boots it once, close() leaves it warm."""

    def __init__(
        self, pool: EnginePool, key: str, kind: str, params: Mapping[str, Any], metric: str, exclusive: bool = False
    ):
        self.pool, self.key, self.kind, self.params, self.metric = pool, key, kind, params, metric
        self.exclusive = exclusive
        self.sliced: dict[int, int] = {}  # seed -> the parts its trial was measured in (sliced trials only)

    @property
    def engine(self) -> Any:
        return self.pool.engines[self.key]

    def start(self) -> None:
        if self.exclusive:
            self.pool.retire_others(self.key)
        eng = self.engine
        if eng.proc is None and not eng.start_error:
            eng.start()

    def boot_failed(self) -> bool | None:
        return self.engine.boot_failed()

    def add_wait(self, seconds: float) -> None:
        """Time spent waiting for start-ups outside the engine's own waits (counted as engine time)."""
        self.engine.wait_s += seconds

    def measure(self, seed: int) -> TrialOutcome:
        self.pool.activate(self.key)
        try:
            default_len = 32 if self.kind == "vllm-serve" else 64  # harness.serving_load's default, the workers'
            return self.engine.measure(seed, self.kind, lengths.vary(self.params, seed, default_len), self.metric)
        finally:
            self._done()

    def _done(self) -> None:
        """Park the engine as soon as its answer is in (shared placement): work it put off until after answering
        runs inside its next measurement, never between the two sides' timed windows."""
        if not self.exclusive and len(self.pool.engines) > 1:
            self.engine.park()

    def parts(self, seed: int) -> int:
        """Into how many parts a trial of ``seed`` can be split (``harness.interleave``'s slices): its prompts,
        for a throughput trial of a shared engine; 1 (whole trials only) for anything else."""
        if self.kind != "vllm-throughput" or self.exclusive or self.metric not in SLICEABLE_METRICS:
            return 1
        return max(1, int(lengths.vary(self.params, seed).get("prompts", DEFAULT_PROMPTS)))

    def measure_part(self, seed: int, part: int, parts: int) -> TrialOutcome:
        """Part ``part`` of ``parts`` of the trial of ``seed``: its share of the prompts, on inputs of their own
        (``batch_seed``), the same length profile as the whole trial."""
        self.pool.activate(self.key)
        params = lengths.vary(self.params, seed)
        total = int(params.get("prompts", DEFAULT_PROMPTS))
        params["prompts"] = total // parts + (1 if part < total % parts else 0)
        self.sliced[seed] = parts
        try:
            return self.engine.measure(batch_seed(seed, part), self.kind, params, self.metric)
        finally:
            self._done()

    def up(self) -> bool:
        """Whether this lease's engine is in the pool, running and healthy (it can still answer a command)."""
        eng = self.pool.engines.get(self.key)
        return eng is not None and eng.proc is not None and eng.proc.poll() is None and not eng.start_error

    def score(
        self, seed: int, answers: Sequence[tuple[int, Sequence[int]]], timeout_s: float
    ) -> tuple[tuple[tuple[Row, ...], ...], tuple[tuple[Row, ...], ...]]:
        """``answers`` ((request index in the trial of ``seed``, tokens), ...) teacher-forced by this engine after the
        prompts the trial gave those requests (its length profile, its slices, its latency batches, its planned
        load): see ``WorkerSession.score`` and ``ServeSession.score``."""
        if not hasattr(self.engine, "score"):
            raise ValueError(f"a {self.kind} engine does not score answers")
        where = self._where(seed, [r for r, _ in answers])
        items = [{**w, "tokens": list(tokens)} for w, (_, tokens) in zip(where, answers, strict=True)]
        self.pool.activate(self.key)
        try:
            return self.engine.score(self.kind, items, timeout_s)
        finally:
            self._done()

    def _where(self, seed: int, answers: Sequence[int]) -> list[dict[str, Any]]:
        """For each answer, the prompt that made it: (seed, index, request, params) as the worker builds prompts."""
        default_len = 32 if self.kind == "vllm-serve" else 64  # as ``measure`` varies them
        params = lengths.vary(self.params, seed, default_len)
        out = []
        if self.kind == "vllm-serve":  # the requests of the load planned for this seed, warm-up excluded
            return [{"seed": seed, "index": 0, "request": r, "params": params} for r in answers]
        if self.kind == "vllm-latency":
            batch = int(params.get("batch_size", 8))
            for r in answers:  # batch 0 is the warm-up; the outputs are batches 1..iterations in order
                out.append(
                    {"seed": batch_seed(seed, r // batch + 1), "index": 0, "request": r % batch, "params": params}
                )
            return out
        parts = self.sliced.get(seed, 1)
        total = int(params.get("prompts", DEFAULT_PROMPTS))
        sizes = [total // parts + (1 if p < total % parts else 0) for p in range(parts)]
        for r in answers:
            if parts == 1:
                out.append({"seed": seed, "index": 0, "request": r, "params": params})
                continue
            part, j = 0, r
            while j >= sizes[part]:
                j -= sizes[part]
                part += 1
            out.append(
                {"seed": batch_seed(seed, part), "index": 0, "request": j, "params": {**params, "prompts": sizes[part]}}
            )
        return out

    def combine(self, seed: int, parts: list[TrialOutcome]) -> TrialOutcome:
        return combine_parts(parts, self.metric)

    def close(self) -> None:
        if self.exclusive:
            self.pool.retire(self.key)

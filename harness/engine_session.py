"""Warm-engine sessions: one long-lived worker process per side serves many measurements.

The worker (``harness/workers/vllm_worker.py``) runs with the candidate worktree first on
PYTHONPATH and the worktree as cwd, in its own process group; it answers on a dedicated
pipe so vLLM's logs cannot corrupt results (they go to a log file whose tail becomes the
error message when something fails). ``close()`` always ends the whole process group.
"""

from __future__ import annotations

import json
import math
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

from . import sandbox
from .outputs_rule import Row, parse_scores
from .processes import Parkable
from .seeds import batch_seed
from .trials import (
    CRASH,
    TIMEOUT,
    TrialOutcome,
    check_metrics,
    child_env,
    kill_group,
    log_error_line,
    log_tail,
    metric_error,
    safe_json_loads,
    tail,
)
from .worker_protocol import (
    MAX_MESSAGE_BYTES,
    WorkerError,
    WorkerTimeout,
    failure_of,
    harness_key,
    on_orchestrator_clock,
    parse_outputs,
    serving_env,
)

WORKER = Path(__file__).with_name("workers") / "vllm_worker.py"


class WorkerSession(Parkable):
    """A warm vLLM engine for one side; ``measure(seed)`` runs one measurement round."""

    flags: tuple[str, ...] = ()  # the worker's mode (none: an engine)
    counts = True  # an engine start (``Parkable.counted``)

    def __init__(
        self,
        spec: Mapping[str, Any],
        worktree: Path,
        env: Mapping[str, str],
        log_path: Path,
        metric: str,
        timeout_s: float,
        startup_timeout_s: float = 600.0,
        python: str = sys.executable,
        cpus: frozenset[int] | None = None,
    ):
        self.cpus = cpus
        self.spec = dict(spec)
        self.metric = metric
        self.worktree = worktree
        self.env = dict(env)
        self.log_path = log_path
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.python = python
        self.proc: subprocess.Popen | None = None
        self.ready: dict[str, Any] = {}
        self._rfd: int | None = None
        self._buf = b""
        self.start_error = ""
        self.start_failure = CRASH  # the failure kind of start_error: a start-up past its limit is a timeout
        self.wait_s = 0.0  # wall time spent waiting for start-up and shutdown
        self.started_at = 0.0

    # -------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Spawn the engine and return at once, so both sides boot concurrently; the first
        ``measure`` waits for it to be ready (and reports a failed start-up as its error)."""
        self.start_error, self.start_failure = "", CRASH
        self.started_at = time.perf_counter()
        if self.counts:
            Parkable.counted()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            extra = serving_env(self.worktree)
        except WorkerError as exc:
            self.start_error = str(exc)
            return
        env = child_env({**self.env, **extra}, self.worktree, None, self.log_path)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.worktree), self.env.get("PYTHONPATH", "")) if p)
        env.setdefault("PYTHONUNBUFFERED", "1")
        rfd, wfd = sandbox.pipe()
        argv, _ = sandbox.wrap(
            [self.python, str(WORKER), "--fd", str(wfd), *self.flags, json.dumps(self.spec)], cwd=self.worktree
        )
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                argv,
                cwd=str(self.worktree),
                env=env,
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(wfd,),
                start_new_session=True,
                preexec_fn=self._new_group(),
            )
        finally:
            os.close(wfd)
            log.close()
        self._rfd = rfd

    def boot_failed(self) -> bool | None:
        """Without waiting: None while the engine is still starting, else whether its start-up failed
        (a start-up past ``startup_timeout_s`` has failed)."""
        if not (self.ready or self.start_error or self.proc is None or self._rfd is None or self.parked):
            readable, _, _ = select.select([self._rfd], [], [], 0)
            if not readable and b"\n" not in self._buf and self.proc.poll() is None:
                if time.perf_counter() - self.started_at <= self.startup_timeout_s:
                    return None
                self.start_error, self.start_failure = (
                    f"engine start-up timed out after {self.startup_timeout_s:g} s",
                    TIMEOUT,
                )
                return True
            self.wait_ready()  # a message (or the end of the pipe) is there: reading it does not wait
        return bool(self.start_error) or self.proc is None

    def wait_ready(self) -> None:
        if self.ready or self.start_error or self.proc is None:
            return
        t0 = time.perf_counter()
        try:
            msg = self._read(self.startup_timeout_s, "engine start-up")
            if msg.get("event") != "ready":
                raise WorkerError(f"unexpected first message from the worker: {msg}")
            self.ready = msg
            self.pin()
        except WorkerError as exc:
            self.start_error = str(exc)
            self.start_failure = failure_of(exc)
        finally:
            self.wait_s += time.perf_counter() - t0

    def measure(
        self, seed: int, kind: str | None = None, params: Mapping[str, Any] | None = None, metric: str | None = None
    ) -> TrialOutcome:
        metric = metric or self.metric
        if (kind or self.spec.get("kind")) == "vllm-latency":
            return self._measure_latency(seed, dict(self.spec.get("params", {}) if params is None else params), metric)
        not_ready = self._not_ready()
        if not_ready is not None:
            return not_ready
        clock = self._start_clock()
        t0 = time.perf_counter()
        try:
            cmd: dict[str, Any] = {"cmd": "measure", "seed": seed}
            if kind:
                cmd["kind"] = kind
            if params is not None:
                cmd["params"] = dict(params)
            self._send(cmd)
            msg = self._read(self.timeout_s, "measurement")
        except WorkerError as exc:
            return TrialOutcome(
                False, None, {}, time.perf_counter() - t0, str(exc), self.log_tail(), failure=failure_of(exc)
            )
        wall = time.perf_counter() - t0
        metrics = {k: v for k, v in dict(msg.get("metrics", {})).items() if not harness_key(k)}
        metrics["engine_startup_s"] = self.ready.get("startup_s")
        outputs, why = parse_outputs(msg.get("outputs"))
        why = why or self._envelope(clock, wall, metrics) or on_orchestrator_clock(metrics, outputs, wall)
        if why:
            return TrialOutcome(False, None, metrics, wall, why, self.log_tail())
        err = metric_error(metrics, metric)
        if err:
            return TrialOutcome(False, None, metrics, wall, err, self.log_tail())
        return TrialOutcome(True, float(metrics[metric]), metrics, wall, outputs=outputs)

    def _not_ready(self) -> TrialOutcome | None:
        """Wait for start-up; the failed trial to report when the engine is not there."""
        self.wait_ready()
        if self.proc is None and not self.start_error:
            self.start_error = "engine was not started"
        if self.start_error:
            return TrialOutcome(False, None, {}, 0.0, self.start_error, self.log_tail(), failure=self.start_failure)
        return None

    def _measure_latency(self, seed: int, params: dict[str, Any], metric: str) -> TrialOutcome:
        """The latency workload, timed here: one warm-up batch, then ``iterations`` batches, each its own
        round trip on the orchestrator's clock (a clock inside the candidate's process never decides)
        and each one's generated tokens kept for the outputs check."""
        not_ready = self._not_ready()
        if not_ready is not None:
            return not_ready
        clock = self._start_clock()
        t_all = time.perf_counter()
        iters = int(params.get("iterations", 5))
        lat: list[float] = []
        outputs: list[tuple[int, ...]] = []
        try:
            for i in range(iters + 1):
                t0 = time.perf_counter()
                # each batch's prompts come from a seed the worker sees only with that batch: the warm-up
                # cannot reveal (and precompute) the timed batches
                self._send({"cmd": "generate", "seed": batch_seed(seed, i), "index": 0, "params": params})
                msg = self._read(self.timeout_s, "measurement")
                dt = time.perf_counter() - t0
                got, why = parse_outputs(msg.get("outputs"))
                if why or got is None:
                    return TrialOutcome(
                        False,
                        None,
                        {},
                        time.perf_counter() - t_all,
                        why or "the worker reported no outputs",
                        self.log_tail(),
                    )
                if i:  # index 0 is the warm-up
                    lat.append(dt)
                    outputs.extend(got)
        except WorkerError as exc:
            return TrialOutcome(
                False, None, {}, time.perf_counter() - t_all, str(exc), self.log_tail(), failure=failure_of(exc)
            )
        why = self._envelope(clock, time.perf_counter() - t_all)
        if why:
            return TrialOutcome(False, None, {}, time.perf_counter() - t_all, why, self.log_tail())
        lat.sort()

        def pct(q: float) -> float:
            return lat[min(len(lat) - 1, max(0, math.ceil(q * len(lat)) - 1))]

        metrics: dict[str, Any] = {
            "latency_mean_s": sum(lat) / len(lat),
            "latency_p50_s": pct(0.5),
            "latency_p90_s": pct(0.9),
            "latency_p99_s": pct(0.99),
            "iterations": iters,
            "engine_startup_s": self.ready.get("startup_s"),
        }
        wall = time.perf_counter() - t_all
        err = metric_error(metrics, metric)
        if err:
            return TrialOutcome(False, None, metrics, wall, err, self.log_tail())
        return TrialOutcome(True, float(metrics[metric]), metrics, wall, outputs=tuple(outputs))

    def score(
        self, kind: str, items: list[dict[str, Any]], timeout_s: float
    ) -> tuple[tuple[tuple[Row, ...], ...], tuple[tuple[Row, ...], ...]]:
        """Each item's answer (``tokens``) teacher-forced after its request's prompt (``seed``, ``index``,
        ``request``, ``params``: as the measurement made it), in two batch orders: (first, again), rows
        validated (``harness.outputs_rule``). A WorkerError when the engine fails or answers out of protocol."""
        msg = self.request({"cmd": "score", "kind": kind, "items": items}, timeout_s)
        if msg.get("error"):
            raise WorkerError(f"the engine could not score the answers: {tail(str(msg['error']), 1, 300)}")
        answers = [it["tokens"] for it in items]
        first, why = parse_scores(msg.get("scores"), answers)
        again, why2 = parse_scores(msg.get("again"), answers)
        if first is None or again is None:
            raise WorkerError(f"the engine's scores are malformed: {why or why2}")
        return first, again

    @property
    def vocab_size(self) -> int | None:
        """The model's vocabulary size as this engine reported it when it was up (None: not said)."""
        v = self.ready.get("vocab_size")
        return v if type(v) is int and v > 0 else None

    @property
    def dtype(self) -> str | None:
        """The model's dtype as this engine reported it ("float32", "bfloat16", ...; None: not said)."""
        v = self.ready.get("dtype")
        return v if isinstance(v, str) and v else None

    def request(self, cmd: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send any command (e.g. logprobs) and wait for its answer."""
        self.wait_ready()
        if self.start_error:
            raise WorkerError(self.start_error)
        self._send(cmd)
        return self._read(timeout_s, cmd.get("cmd", "request"))

    def close(self) -> None:
        self.unpark()
        proc, self.proc = self.proc, None
        if proc is None:
            return
        t0 = time.perf_counter()
        try:
            if proc.poll() is None and proc.stdin and self.ready:  # a graceful quit only for an engine that is up
                try:
                    proc.stdin.write(b'{"cmd": "quit"}\n')
                    proc.stdin.flush()
                    proc.stdin.close()
                except (BrokenPipeError, OSError):
                    pass
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    pass
        finally:
            # the engine's own child processes share the worker's process group
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                time.sleep(0.2)
            except (ProcessLookupError, PermissionError):
                pass
            kill_group(proc)
            proc.wait()
            self._end_group()
            if self._rfd is not None:
                os.close(self._rfd)
                self._rfd = None
            self.wait_s += time.perf_counter() - t0

    # -------------------------------------------------------------- plumbing
    def log_tail(self, lines: int = 25) -> str:
        return log_tail(self.log_path, lines)

    def _engine_error(self) -> str:
        return log_error_line(self.log_path)

    def _send(self, obj: dict[str, Any]) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(obj) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise WorkerError(f"engine process died: {self._engine_error()}") from None

    def _read(self, timeout_s: float, what: str) -> dict[str, Any]:
        """The next message on the result pipe, which candidate code can write to: a line of at
        most MAX_MESSAGE_BYTES, safe JSON (no NaN, infinities or unbounded integers), one object,
        and for a measurement a metrics object that ``check_metrics`` accepts. A violation is a
        WorkerError and ends the session (the pipe can no longer be trusted)."""
        assert self._rfd is not None and self.proc is not None
        deadline = time.monotonic() + timeout_s
        scanned = 0
        while b"\n" not in self._buf[scanned:]:
            scanned = len(self._buf)
            if scanned > MAX_MESSAGE_BYTES:
                self._poisoned(f"worker sent an oversized message (over {MAX_MESSAGE_BYTES} bytes) during {what}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkerTimeout(f"{what} timed out after {timeout_s:g} s")
            ready, _, _ = select.select([self._rfd], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(self._rfd, 65536)
                if not chunk:
                    try:
                        self.proc.wait(timeout=30)
                        status = f"exited with status {self.proc.returncode}"
                    except subprocess.TimeoutExpired:
                        status = "closed its result pipe"
                    raise WorkerError(f"engine {status} during {what}: {self._engine_error()}")
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        if len(line) > MAX_MESSAGE_BYTES:
            self._poisoned(f"worker sent an oversized message ({len(line)} bytes) during {what}")
        try:
            msg = safe_json_loads(line.decode("utf-8"))
        except ValueError as exc:
            self._poisoned(
                f"worker sent a malformed message during {what} ({exc.__class__.__name__}: {tail(str(exc), 1, 120)})"
            )
        if not isinstance(msg, dict):
            self._poisoned(f"worker sent a malformed message during {what} (not a JSON object)")
        if msg.get("event") == "error":
            raise WorkerError(f"engine error during {what}: {tail(str(msg.get('error')), 1) or 'no detail'}")
        if msg.get("event") == "ready":
            s = msg.get("startup_s")
            if not (
                s is None
                or (isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s) and 0 <= s < 1e7)
            ):
                msg["startup_s"] = None
        if what == "measurement":
            metrics, err = check_metrics(msg.get("metrics", {}))
            if metrics is None:
                self._poisoned(f"worker sent unusable metrics: {err}")
            msg["metrics"] = metrics
        return msg

    def _poisoned(self, reason: str) -> NoReturn:
        """The result pipe broke its protocol: drop what is buffered, fail this and every later request."""
        self._buf = b""
        self.start_error = reason
        raise WorkerError(reason)


class ResolveSession(WorkerSession):
    """The worker in a side's sandbox and environment, asked only to resolve the engine's configuration
    (``--resolve``: ``EngineArgs.create_engine_config`` and ``vllm.envs``); no engine starts, and it counts as none."""

    flags = ("--resolve",)
    counts = False

    def resolved(self) -> dict[str, Any]:
        """The side's resolution; WorkerError (with the log's tail) when the worker failed or answered nonsense."""
        self.wait_ready()
        if self.proc is None and not self.start_error:
            self.start_error = "the resolving worker was not started"
        if self.start_error:
            cause = self._engine_error()
            raise WorkerError(self.start_error + (f" ({cause})" if cause and cause not in self.start_error else ""))
        return _resolution(self.ready.get("resolved"))

    def resolve_again(self, engine: Any, env: Mapping[str, str | None], timeout_s: float) -> dict[str, Any]:
        """The same side's code resolving another ``serving.json``: ``engine`` is that file's ``engine`` value as read,
        ``env`` the variables its ``env`` sets over this worker's (None: unset): what the other side's worker would
        answer when the two differ in ``serving.json`` alone. The worker waits parked between requests. WorkerError
        when it failed or answered nonsense."""
        self.unpark()
        try:
            msg = self.request({"cmd": "resolve", "engine": engine, "env": dict(env)}, timeout_s)
        finally:
            self.park()
        if msg.get("event") != "result":
            raise WorkerError(str(msg.get("error") or "the resolving worker answered no configuration"))
        return _resolution(msg.get("resolved"))


def _resolution(got: Any) -> dict[str, Any]:
    if not isinstance(got, dict) or not all(isinstance(got.get(k), dict) for k in ("config", "env")):
        raise WorkerError("the resolving worker answered no configuration")
    return got

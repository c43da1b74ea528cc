"""The serving workload: a warm ``vllm serve`` per side, measured by a warm load generator of our own.

The server runs the candidate's code (PYTHONPATH = the candidate worktree, cwd = worktree);
the load generator is our own (``workers/bench_client.py``: the standard library and aiohttp from the
orchestrator's environment; the measuring instrument must not be something a proposal can change, not even one
merged into the baseline). It is warm: one long-lived process per server runs every trial's planned load
(``harness.serving_load``: open-loop arrivals at a rate, or a closed loop under a concurrency limit), so a serving
trial costs its requests. Every request must succeed: a
failed request fails the trial. Metrics (``harness.tails``, one definition each): rates, and quantiles of TTFT,
TPOT, ITL and E2E latency from the per-request timings; goodput under ``[[slo]]``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import sandbox, serving_load, tails
from .outputs_rule import Row, parse_scores
from .processes import Parkable
from .trials import (
    CRASH,
    MEASUREMENT_ERROR,
    TIMEOUT,
    TrialOutcome,
    child_env,
    kill_group,
    log_error_line,
    log_tail,
    metric_error,
    safe_json_loads,
    tail,
)
from .worker_protocol import WorkerError, read_serving, serving_env

CLIENT = Path(__file__).with_name("workers") / "bench_client.py"
SERVER = Path(__file__).with_name("workers") / "vllm_serve.py"  # `vllm serve`, model classes inspected in-process
REPORT_MAX_BYTES = 64 << 20  # the longest honest report of the largest load the config accepts is ~55 MB
CLIENT_START_S = 300.0  # the load generator's import of vLLM, at most


def instrument(baseline: Path) -> Path | None:
    """The load generator's extra import path: none, ever. It needs only the standard library and aiohttp from the
    orchestrator's environment and runs isolated (``python -I``): a module merged into the fork (an ``argparse.py``)
    must never run as the measuring instrument, outside every sandbox."""
    return None


def context_len(engine: Mapping[str, Any]) -> int:
    """The context the load is planned for: the config's ``max_model_len`` (the same on both sides; a side's own
    serving.json may set another, and then serves the same requests or fails them), 1,024 when it sets none."""
    v = engine.get("max_model_len")
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 1 << 24 else 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def engine_flags(engine: Mapping[str, Any]) -> list[str]:
    """Engine arguments as ``vllm serve`` flags: key -> --key-name, booleans as flags."""
    out: list[str] = []
    for key, value in engine.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False:
            out.append("--no-" + key.replace("_", "-"))
        else:
            out += [flag, str(value)]
    return out


def serving_engine(worktree: Path) -> dict[str, Any]:
    data = read_serving(worktree)
    engine = data.get("engine", {}) if isinstance(data, dict) else {}
    if not isinstance(engine, dict):
        raise WorkerError("serving.json: engine must be an object")
    return engine


def read_child_pid(fd: int, timeout_s: float) -> int:
    """The sandboxed child's pid from bubblewrap's ``--info-fd`` JSON."""
    import select

    buf, deadline = b"", time.monotonic() + timeout_s
    while b"}" not in buf:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise WorkerError("the sandbox did not report the server's process in time")
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        buf += chunk
    try:
        return int(json.loads(buf[: buf.index(b"}") + 1])["child-pid"])
    except (ValueError, KeyError, json.JSONDecodeError):
        raise WorkerError(f"the sandbox reported no server process ({buf[:200]!r})") from None


# How long a server may take to shut down on SIGINT before its process group and cgroup are killed. Nothing it holds
# outlives it (its sandbox, its cgroup and its port go with it), so the grace is a courtesy: 20 s until 0.8, and in the
# sandbox the server never logged a shutdown (the signal reaches bubblewrap, not uvicorn), so every close waited the
# full 20 s — at every guard re-measure, confirmation and merge (issue #56).
SHUTDOWN_GRACE_S = 2.0


class ServeSession(Parkable):
    def __init__(
        self,
        spec: Mapping[str, Any],
        worktree: Path,
        client_path: Path | None,
        env: Mapping[str, str],
        log_dir: Path,
        metric: str,
        timeout_s: float,
        startup_timeout_s: float = 600.0,
        python: str = sys.executable,
        cpus: frozenset[int] | None = None,
    ):
        # the server's processes pinned here once it is healthy (the load generator is not: it is the harness's)
        self.cpus = cpus
        self.spec, self.worktree, self.client_path = dict(spec), worktree, client_path
        self.env, self.log_dir, self.metric = dict(env), log_dir, metric
        self.timeout_s, self.startup_timeout_s, self.python = timeout_s, startup_timeout_s, python
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.start_error = ""
        self.started_at = 0.0
        self.startup_s: float | None = None
        self.wait_s = 0.0
        self.log_path = log_dir / f"serve-{os.getpid()}-{time.monotonic_ns()}.log"
        self.netns_pid: int | None = None  # the sandboxed server's process, whose network namespace the client joins
        self.client: BenchClient | None = None  # the warm load generator, started with the first trial
        self.engine: dict[str, Any] = dict(spec.get("engine", {}))  # with the fork's serving.json, once started

    def start(self) -> None:
        Parkable.counted()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            extra = serving_env(self.worktree)
            engine = self.engine = {**self.spec.get("engine", {}), **serving_engine(self.worktree)}
        except (WorkerError, json.JSONDecodeError) as exc:
            self.start_error = f"bad serving.json: {exc}"
            return
        env = child_env({**self.env, **extra}, self.worktree, None, self.log_path)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.worktree), self.env.get("PYTHONPATH", "")) if p)
        self.port = free_port()
        argv: list[str] | str = [
            self.python,
            str(SERVER),
            "serve",
            self.spec["model"],
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *engine_flags(engine),
        ]
        self.started_at = time.perf_counter()
        own_net = sandbox.active() is not None and sandbox.can_join_network()
        rfd, wfd = sandbox.pipe() if own_net else (-1, -1)
        try:
            with open(self.log_path, "ab") as log:
                # sandboxed: the server gets a network namespace of its own (loopback only) and the load
                # generator and health checks join it; otherwise it shares the host's loopback
                argv, _ = sandbox.wrap(argv, network=not own_net, cwd=self.worktree, info_fd=wfd if own_net else None)
                self.proc = subprocess.Popen(
                    argv,
                    cwd=str(self.worktree),
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    pass_fds=(wfd,) if own_net else (),
                    preexec_fn=self._new_group(),
                )
        finally:
            if own_net:
                os.close(wfd)
        if own_net:
            try:
                self.netns_pid = read_child_pid(rfd, 30.0)
            except WorkerError as exc:
                self.start_error = str(exc)
            finally:
                os.close(rfd)

    def _in_net(self, argv: list[str]) -> list[str]:
        return [*sandbox.join_network(self.netns_pid), *argv] if self.netns_pid else argv

    def _healthy(self) -> bool:
        if self.netns_pid:
            probe = f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{self.port}/health', timeout=2)"
            try:
                return (
                    subprocess.run(self._in_net([self.python, "-c", probe]), capture_output=True, timeout=10).returncode
                    == 0
                )
            except (OSError, subprocess.TimeoutExpired):
                return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def boot_failed(self) -> bool | None:
        """Without waiting: None while the server is still starting, else whether its start-up failed."""
        if not (self.startup_s is not None or self.start_error or self.proc is None or self.parked):
            if self.proc.poll() is None and not self._healthy():
                if time.perf_counter() - self.started_at <= self.startup_timeout_s:
                    return None
                self.start_error = f"server start-up timed out after {self.startup_timeout_s:g} s"
                return True
            self.wait_ready()
        return bool(self.start_error) or self.proc is None

    def wait_ready(self) -> None:
        if self.startup_s is not None or self.start_error or self.proc is None:
            return
        t0 = time.perf_counter()
        try:
            deadline = time.monotonic() + self.startup_timeout_s
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    self.start_error = (
                        f"server exited with status {self.proc.returncode} during start-up: {self._error_line()}"
                    )
                    return
                if self._healthy():
                    self.startup_s = time.perf_counter() - self.started_at
                    self.pin()
                    return
                time.sleep(0.5)
            self.start_error = f"server start-up timed out after {self.startup_timeout_s:g} s"
        finally:
            self.wait_s += time.perf_counter() - t0

    def _error_line(self) -> str:
        return log_error_line(self.log_path)

    def measure(
        self, seed: int, kind: str | None = None, params: Mapping[str, Any] | None = None, metric: str | None = None
    ) -> TrialOutcome:
        metric = metric or self.metric
        self.wait_ready()
        if self.start_error or self.proc is None:
            return TrialOutcome(False, None, {}, 0.0, self.start_error or "server was not started", self._log_tail())
        p = self.spec.get("params", {}) if params is None else params
        slos = [tails.Slo(**x) for x in self.spec.get("slo") or ()]
        t0 = time.perf_counter()
        try:
            if self._ensure_client():
                t0 = time.perf_counter()  # its start-up, not the trial's time
        except WorkerError as exc:
            self._close_client()
            return TrialOutcome(
                False, None, {}, time.perf_counter() - t0, f"load generator: {exc}", self._log_tail(), failure=CRASH
            )
        clock = self._start_clock()
        if metric == tails.RATE_AT_SLO:
            out = self._search(seed, p, slos, metric)
        else:
            out = self._probe(seed, p, slos, metric)
        if not out.ok:
            return out
        wall = time.perf_counter() - t0
        metrics = dict(out.metrics)
        over = self._envelope(clock, wall, metrics)  # pinned: the server used no more CPU time than its CPUs give
        if over:
            return TrialOutcome(False, None, metrics, wall, over, self._log_tail())
        return TrialOutcome(True, out.value, metrics, wall, outputs=out.outputs)

    def _probe(self, seed: int, p: Mapping[str, Any], slos: list[tails.Slo], metric: str) -> TrialOutcome:
        """One planned load, its metrics and outputs (a whole trial, or one probe of a rate search)."""
        assert self.client is not None
        load = serving_load.plan(
            p,
            seed,
            serving_load.vocab_size(self.spec["model"]),
            context_len(self.spec.get("engine") or {}),
            trace=self.spec.get("trace"),
        )
        t0 = time.perf_counter()
        try:
            data = self.client.run(
                load.command(f"http://127.0.0.1:{self.port}", self.spec["model"]), load.report_bytes()
            )
        except WorkerError as exc:
            return self._generator_failed(exc, time.perf_counter() - t0)
        wall = time.perf_counter() - t0
        timings, outputs, why = served_requests(data, load)
        if why:
            return TrialOutcome(False, None, {}, wall, why, self._log_tail())
        limited = tuple(tails.slo_quantile(x) for x in slos if x.q is not None)
        metrics = self._load_metrics(data, timings, slos, (metric, *limited))
        unsound = self._unsound(metrics, wall, load, timings, (metric, *limited), metric)
        if unsound is not None:
            return unsound
        if metric == tails.RATE_AT_SLO:
            return TrialOutcome(True, None, metrics, wall, outputs=outputs)
        err_msg = metric_error(metrics, metric)
        if err_msg:
            if metric == tails.GOODPUT and metrics.get(tails.GOODPUT) == 0:
                err_msg = f"no request met the SLOs ({', '.join(x.text() for x in slos)}): goodput 0 cannot be compared"
            return TrialOutcome(False, None, metrics, wall, err_msg, self._log_tail())
        return TrialOutcome(True, float(metrics[metric]), metrics, wall, outputs=outputs)

    def _generator_failed(self, exc: WorkerError, wall: float) -> TrialOutcome:
        """The load generator did not answer with a report: the trial fails (a timeout or a crash)."""
        timed_out = isinstance(exc, ClientTimeout)
        if not isinstance(exc, ClientReported) or self.client is None or not self.client.alive():
            self._close_client()  # hung, dead, never started or off protocol: replaced at the next trial
        return TrialOutcome(
            False,
            None,
            {},
            wall,
            f"load generator: {exc}",
            self._log_tail(),
            failure=TIMEOUT if timed_out else CRASH,
        )

    def _load_metrics(
        self,
        data: Mapping[str, Any],
        timings: list[tails.RequestTiming],
        slos: list[tails.Slo],
        judged: tuple[str, ...],
    ) -> dict[str, Any]:
        """The load's metrics (``judged``: the metric and the SLOs' quantiles), and what the checks read beside them:
        the requests and tokens sent, the kind of outputs, and how the generator kept its schedule."""
        kinds = {r.get("outputs_kind") for r in data["requests"]}
        metrics: dict[str, Any] = dict(tails.serving_metrics(timings, judged, slos))
        # the outputs check: both sides got the same requests
        metrics["input_tokens"] = sum(t.input_tokens for t in timings)
        metrics["requests"] = len(timings)
        # token ids (every request's: the outputs rule can score them) or text hashes (compared bit for bit)
        metrics["outputs_kind"] = "tokens" if kinds == {"tokens"} else "text"
        metrics["engine_startup_s"] = self.startup_s
        metrics["generator_trial"] = self.client.served if self.client else None  # n-th trial of this warm generator
        lags_ms = [r["lag"] / 1000 for r in data["requests"]]
        metrics["generator_lag_p99_ms"] = tails.harrell_davis(lags_ms, 0.99)
        metrics["generator_lag_mean_ms"] = sum(lags_ms) / len(lags_ms) if lags_ms else 0.0
        metrics["client_queue_p99_ms"] = tails.harrell_davis([r["queue"] / 1000 for r in data["requests"]], 0.99)
        return metrics

    def _unsound(
        self,
        metrics: dict[str, Any],
        wall: float,
        load: serving_load.LoadPlan,
        timings: list[tails.RequestTiming],
        judged: tuple[str, ...],
        metric: str,
    ) -> TrialOutcome | None:
        """A load that measured nothing to judge: the generator fell behind its schedule, the reported duration is
        impossible, or a quantile judged has too few samples. None: sound."""
        behind = _behind_schedule(metrics, load)
        if any(behind):
            return TrialOutcome(
                False,
                None,
                metrics,
                wall,
                (
                    f"the load generator fell behind its schedule ({'; '.join(b for b in behind if b)} "
                    f"at {load.rate:g} requests/s): "
                    "this machine cannot send that rate on time; "
                    f"lower {'rate_max' if metric == tails.RATE_AT_SLO else 'request_rate'}"
                ),
                self._log_tail(),
                failure=MEASUREMENT_ERROR,
                disturbed=True,
            )
        d = metrics["duration_s"]
        if not isinstance(d, (int, float)) or isinstance(d, bool) or not 0 < d <= wall:
            return TrialOutcome(
                False,
                None,
                metrics,
                wall,
                f"the load reported a duration of {d!r} s in a {wall:.2f} s round trip",
                self._log_tail(),
            )
        for name in judged:  # the quantiles judged: over enough samples as measured, not only as planned
            qm = tails.quantile_metric(name)
            if qm is not None and (n := len(tails.samples(timings, qm.base))) < tails.min_requests(qm.q):
                return TrialOutcome(
                    False,
                    None,
                    metrics,
                    wall,
                    f"{name} over {n} samples: a p{qm.q * 100:g} needs at least "
                    f"{tails.min_requests(qm.q)} (raise prompts or output_len)",
                    self._log_tail(),
                    failure=MEASUREMENT_ERROR,
                )
        return None

    def _search(self, seed: int, p: Mapping[str, Any], slos: list[tails.Slo], metric: str) -> TrialOutcome:
        """Throughput at SLO: ``serving_load.search_rate`` over probes of this server; the k-th probe's requests are
        the same on both sides (seed, k), its rate the one this side's search reached."""
        t0 = time.perf_counter()
        outputs: list[tuple[int, ...]] = []
        seen: list[dict[str, Any]] = []
        failed: list[TrialOutcome] = []
        tokens: list[int] = []

        def holds(rate: float) -> bool:
            if failed:
                return False
            k = len(seen)
            r = self._probe(serving_load.probe_seed(seed, k), {**p, "request_rate": rate}, slos, metric)
            if not r.ok:
                failed.append(r)
                return False
            assert r.outputs is not None
            outputs.extend(r.outputs)
            ok, quantiles = tails.quantiles_held(r.metrics, slos)
            seen.append({"rate": rate, "held": ok, **quantiles})
            tokens.append(int(r.metrics.get("input_tokens") or 0))
            return ok

        lo, hi = float(p.get("rate_min", 1.0)), float(p["rate_max"])
        shift = serving_load.probe_seed(seed, -1) / 2**32  # the grid's offset: per pair, the same on both sides
        try:
            found = serving_load.search_rate(holds, lo, hi, int(p.get("search_steps", 4)), shift)
        except serving_load.SearchOutOfRange as exc:
            if failed:
                return failed[0]
            # on the baseline's trial the run's error (the range is the config's); on the candidate's a rejection
            return TrialOutcome(
                False,
                None,
                {"probes": seen},
                time.perf_counter() - t0,
                f"throughput at SLO: {exc}",
                self._log_tail(),
                failure=MEASUREMENT_ERROR,
            )
        if failed:
            return failed[0]
        rate = found.rate
        if not found.censored:
            at = {x["rate"]: x for x in seen}
            rate = (
                serving_load.interpolate(found.low, found.high, at.get(found.low, {}), at.get(found.high, {}), slos)
                or rate
            )
        metrics = {
            metric: rate,
            "rate_at_slo_low": found.low,
            "rate_at_slo_high": found.high,
            "rate_at_slo_censored": found.censored,
            "probes": seen,
            "requests": len(outputs),
            "outputs_kind": "text",  # several probes' answers: compared bit for bit, never scored
            "input_tokens": sum(tokens),
            "engine_startup_s": self.startup_s,
            "generator_trial": self.client.served if self.client else None,
        }
        return TrialOutcome(True, rate, metrics, time.perf_counter() - t0, outputs=tuple(outputs))

    def _ensure_client(self) -> bool:
        """Start the warm load generator if it is not up (True when it was started: its start-up is wait time)."""
        if self.client is not None:
            return False
        self.client = BenchClient(self._in_net, self.python, self.client_path, self.env, self.log_dir, self.timeout_s)
        self.wait_s += self.client.start()
        return True

    @property
    def vocab_size(self) -> int | None:
        """The model's vocabulary size (its config.json): token ids below it are tokens."""
        return serving_load.vocab_size(self.spec["model"])

    @property
    def dtype(self) -> str | None:
        """The dtype the config asks the server for, else the model's own (its config.json); None when neither says.
        (A server does not report the dtype it chose for "auto": where vLLM casts a float32 model down, the float32
        tie is too tight for its rounding and flips are refused — fail closed; set the dtype.)"""
        v = (self.spec.get("engine") or {}).get("dtype")
        if isinstance(v, str) and v not in ("", "auto"):
            return v
        try:
            cfg = json.loads((Path(self.spec["model"]) / "config.json").read_text())
        except (OSError, ValueError, KeyError, TypeError):
            return None
        own = cfg.get("torch_dtype") or cfg.get("dtype") if isinstance(cfg, dict) else None
        return own if isinstance(own, str) and own else None

    def score(
        self, kind: str, items: list[dict[str, Any]], timeout_s: float
    ) -> tuple[tuple[tuple[Row, ...], ...], tuple[tuple[Row, ...], ...]]:
        """The timed outputs rule's scoring on this server (``harness.outputs_rule``): each item's answer
        (``tokens``) teacher-forced after the prompt its trial sent (``seed``, ``request``, ``params``: the same
        plan), by the warm load generator, twice in two orders. A WorkerError when it cannot."""
        self.wait_ready()
        if self.start_error or self.proc is None:
            raise WorkerError(f"the server is not up to score answers: {self.start_error or 'not started'}")
        try:
            self._ensure_client()
        except WorkerError:
            self._close_client()
            raise
        assert self.client is not None
        plans: dict[str, serving_load.LoadPlan] = {}
        asked = []
        for it in items:
            key = json.dumps([it["seed"], it["params"]], sort_keys=True)
            if key not in plans:
                plans[key] = serving_load.plan(
                    it["params"],
                    it["seed"],
                    serving_load.vocab_size(self.spec["model"]),
                    context_len(self.spec.get("engine") or {}),
                    trace=self.spec.get("trace"),
                )
            load = plans[key]
            asked.append({"prompt": list(load.prompts[load.warmup + int(it["request"])]), "tokens": list(it["tokens"])})
        url = f"http://127.0.0.1:{self.port}"
        result = self.client.ask({"cmd": "score", "base_url": url, "model": self.spec["model"], "items": asked})
        answers = [it["tokens"] for it in items]
        first, why = parse_scores(result.get("scores"), answers)
        again, why2 = parse_scores(result.get("again"), answers)
        if first is None or again is None:
            raise WorkerError(f"the server's scores are malformed: {why or why2}")
        return first, again

    def _close_client(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            client.close()

    def _log_tail(self) -> str:
        return log_tail(self.log_path)

    def close(self) -> None:
        self.unpark()
        self._close_client()
        proc, self.proc = self.proc, None
        if proc is None:
            return
        t0 = time.perf_counter()
        try:
            try:
                if self.startup_s is None:  # never came up: nothing to shut down cleanly
                    raise ProcessLookupError
                os.killpg(proc.pid, signal.SIGINT)  # let uvicorn and the engine shut down cleanly, briefly
                proc.wait(timeout=SHUTDOWN_GRACE_S)
            except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
                pass
        finally:
            kill_group(proc)
            proc.wait()
            self._end_group()
            self.wait_s += time.perf_counter() - t0


def _behind_schedule(metrics: Mapping[str, Any], load: serving_load.LoadPlan) -> list[str]:
    """How the load generator fell behind its schedule, by its mean and its p99 lag ("": within its bound)."""
    return [
        (f"mean lag {metrics['generator_lag_mean_ms']:.1f} ms > {load.max_mean_lag_s * 1000:.0f} ms")
        if metrics["generator_lag_mean_ms"] > load.max_mean_lag_s * 1000
        else "",
        (f"p99 lag {metrics['generator_lag_p99_ms']:.1f} ms > {load.max_lag_s * 1000:.0f} ms")
        if metrics["generator_lag_p99_ms"] > load.max_lag_s * 1000
        else "",
    ]


def _count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def served_requests(
    data: Mapping[str, Any], load: serving_load.LoadPlan
) -> tuple[list[tails.RequestTiming], tuple[tuple[int, ...], ...] | None, str]:
    """The measured requests' timings and outputs (per request, the hashes of its text's chunks), or why the
    run cannot be trusted. Every request must have succeeded and report exactly the output tokens it asked for
    (``ignore_eos``), as the server counted them (its ``usage``): the rates are computed from them, and a server
    that reports more than it generated is caught by the texts, which the outputs check compares with the other
    side's. Times arrive in microseconds."""
    rows = data.get("requests")
    n = load.measured
    if not isinstance(rows, list) or len(rows) != n or not all(isinstance(r, dict) for r in rows):
        return [], None, f"the load generator reported no per-request results for its {n} requests"
    failed = [r for r in rows if r.get("ok") is not True]
    if failed:
        return (
            [],
            None,
            f"{len(failed)} of {n} requests failed: {tail(str(failed[0].get('error') or 'no reason'), 1, 200)}",
        )
    timings, outputs = [], []
    wrong = 0
    for j, r in enumerate(rows):
        gaps, out = r.get("gaps"), r.get("outputs")
        fields = (
            r.get("sent"),
            r.get("ttft"),
            r.get("e2e"),
            r.get("output_tokens"),
            r.get("input_tokens"),
            r.get("lag"),
            r.get("queue"),
        )
        if (
            not all(isinstance(v, int) and not isinstance(v, bool) for v in fields)
            or not isinstance(gaps, list)
            or not all(_count(g) for g in gaps)
            or not isinstance(out, list)
            or not all(_count(h) for h in out)
        ):
            return [], None, "malformed per-request results from the load generator"
        if r["output_tokens"] != load.output_lens[load.warmup + j]:
            wrong += 1
        if (
            not 0 <= r["ttft"] <= r["e2e"]
            or len(gaps) > max(0, r["output_tokens"] - 1)
            or sum(gaps) > r["e2e"] - r["ttft"] + len(gaps) + 1
        ):
            return (
                [],
                None,
                f"request {j}: inconsistent timings (TTFT {r['ttft']} us, E2E {r['e2e']} us, {len(gaps)} gaps)",
            )
        timings.append(
            tails.RequestTiming(
                r["sent"] / 1e6,
                r["ttft"] / 1e6,
                r["e2e"] / 1e6,
                tuple(g / 1e6 for g in gaps),
                r["output_tokens"],
                r["input_tokens"],
            )
        )
        outputs.append(tuple(out))
    if wrong:
        return [], None, f"{wrong} of {n} requests reported a number of output tokens other than the one requested"
    return timings, tuple(outputs), ""


class ClientTimeout(WorkerError):
    pass


class ClientReported(WorkerError):
    """The load generator ran the command and reported its failure (it stays usable)."""


class BenchClient:
    """The warm load generator: ``workers/bench_client.py`` with the baseline's vLLM on its path, in the
    server's network namespace (``in_net``), outside every sandbox; one JSON line per trial each way."""

    def __init__(
        self,
        in_net: Any,
        python: str,
        client_path: Path | None,
        env: Mapping[str, str],
        log_dir: Path,
        timeout_s: float,
    ):
        self.in_net, self.python, self.client_path = in_net, python, client_path
        self.env, self.log_dir, self.timeout_s = dict(env), log_dir, timeout_s
        self.proc: subprocess.Popen | None = None
        self._rfd: int | None = None
        self._buf = b""
        self.served = 0  # benchmarks run by this process
        self.nice: int | None = None  # its scheduling niceness (workers/bench_client.py raises it where it may)

    def start(self) -> float:
        """Spawn it and wait for its import; the seconds waited. Raises WorkerError when it does not come up."""
        t0 = time.perf_counter()
        env = child_env(self.env, self.log_dir, None, self.log_dir)
        env.pop("PYTHONPATH", None)  # and -I: the instrument imports nothing from a worktree, whatever it is given
        env.setdefault("PYTHONUNBUFFERED", "1")
        rfd, wfd = sandbox.pipe()
        try:
            with open(self.log_dir / "bench-client.log", "ab") as log:
                self.proc = subprocess.Popen(
                    self.in_net([self.python, "-I", str(CLIENT), "--fd", str(wfd)]),
                    cwd=str(self.log_dir),
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    pass_fds=(wfd,),
                    start_new_session=True,
                )
        except OSError as exc:
            os.close(rfd)
            raise WorkerError(f"the load generator could not be started: {exc}") from None
        finally:
            os.close(wfd)
        self._rfd = rfd
        msg = self._read(CLIENT_START_S, "the load generator's start-up")
        if msg.get("event") != "ready":
            raise WorkerError(f"the load generator did not start: {tail(str(msg.get('error')), 1)}")
        nice = msg.get("nice")
        self.nice = nice if isinstance(nice, int) and not isinstance(nice, bool) else None
        return time.perf_counter() - t0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def run(self, command: Mapping[str, Any], max_bytes: int = 0) -> dict[str, Any]:
        """Send one measuring command (``load``) and wait for its result (at most ``max_bytes`` of it)."""
        result = self.ask(command, max_bytes)
        self.served += 1
        return result

    def ask(self, command: Mapping[str, Any], max_bytes: int = 0) -> dict[str, Any]:
        """Send one command (``load``, ``score``) and wait for its result (at most ``max_bytes`` of it)."""
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(command) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise WorkerError("the load generator died") from None
        msg = self._read(self.timeout_s, "the benchmark", max_bytes)
        if msg.get("event") == "error":
            raise ClientReported(tail(str(msg.get("error") or "no result"), 1))
        if msg.get("event") != "result" or not isinstance(msg.get("result"), dict):
            raise WorkerError("the load generator answered something other than a result")
        return msg["result"]

    def _read(self, timeout_s: float, what: str, max_bytes: int = 0) -> dict[str, Any]:
        import select

        assert self._rfd is not None
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buf:
            if len(self._buf) > (max_bytes or REPORT_MAX_BYTES):
                raise WorkerError(f"oversized message during {what}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise ClientTimeout(f"{what} timed out after {timeout_s:g} s")
            if select.select([self._rfd], [], [], min(left, 1.0))[0]:
                chunk = os.read(self._rfd, 65536)
                if not chunk:
                    raise WorkerError(f"the load generator exited during {what}")
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            msg = safe_json_loads(line.decode("utf-8", "replace"))
        except ValueError as exc:
            raise WorkerError(f"malformed message during {what}: {exc}") from None
        if not isinstance(msg, dict):
            raise WorkerError(f"malformed message during {what}")
        return msg

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            try:
                if proc.poll() is None and proc.stdin:
                    proc.stdin.write(b'{"cmd": "quit"}\n')
                    proc.stdin.flush()
                    proc.wait(timeout=10)
            except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
                pass
            finally:
                if proc.stdin:
                    try:
                        proc.stdin.close()
                    except OSError:
                        pass
            kill_group(proc)
            proc.wait()
        if self._rfd is not None:
            os.close(self._rfd)
            self._rfd = None

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
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn

from . import lengths, sandbox
from .cgroups import CpusetGroup, Group
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

WORKER = Path(__file__).with_name("workers") / "vllm_worker.py"
MAX_MESSAGE_BYTES = 4 << 20  # one line on the result pipe
# candidate-controlled environment (the fork's serving.json) may only set these
SERVING_ENV_PREFIXES = ("VLLM_", "OMP_", "KMP_", "MKL_", "ONEDNN_", "DNNL_", "TORCHINDUCTOR_")


def descendants(pid: int) -> list[int]:
    """``pid`` and every live process below it (a sandbox's daemons included: they are reparented to
    its PID namespace's init, itself below the sandbox's bubblewrap process)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (a zombie has left its cgroups)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :][:1] != b"Z"


def _tasks(pid: int) -> list[str]:
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


def signal_tree(pid: int, sig: int) -> None:
    """Send ``sig`` to ``pid`` and all its descendants (those that vanish meanwhile are skipped)."""
    for p in descendants(pid):
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


class Parkable:
    """An engine whose processes can be stopped while the other side is measured: an idle side must
    not compete for the cores (noise), nor run a hog that slows the other side (a fake win).

    With a cgroup (``harness.cgroups``: every process the engine ever starts is in it) parking is a
    freeze of the whole group, atomic; without one, SIGSTOP of its process tree, repeated until a scan
    finds nothing new (a side can fork faster than one scan)."""

    proc: subprocess.Popen | None
    parked: bool = False
    group: Group | None = None
    cpus: frozenset[int] | None = None  # the CPUs the engine is pinned to once it is up (None: not pinned)
    cpuset: CpusetGroup | None = None  # where the machine has one: the pinning is enforced, not only set

    def pin(self) -> None:
        """Pin the engine's processes (its process tree and any that left it: its cgroup's) to ``cpus``: into a
        cpuset (enforced: nothing in it can run elsewhere)
        where the machine gives one, and every thread's affinity set (what it starts later inherits both),
        repeated until a scan finds nothing new. Both sides' engines get the same CPUs: whichever is measured
        runs where the other ran (the idle one is parked), so a drift between cores is not a difference between
        the sides. Without a cpuset an engine could unpin itself: the CPU-envelope check (``over_envelope``)
        then fails any measurement that used more CPU time than its CPUs give."""
        if not self.cpus or self.proc is None:
            return
        if self.cpuset is None:
            self.cpuset = CpusetGroup.create(self.cpus, self.group)
        if self.cpuset is None or self.group is None:
            # nothing would hold an engine to its CPUs, and no exact account would show that it left them:
            # pinned, a side could borrow the free cores unseen, so neither side is pinned
            self.cpus = None
            return
        seen: set[int] = set()
        group = self.group

        def everything() -> set[int]:  # its process tree and whatever left it (a daemon stays in the cgroup)
            return set(descendants(self.proc.pid)) | set(group.pids()) if self.proc is not None else set(group.pids())

        for _ in range(20):
            pids = everything()
            tids = {int(t) for pid in pids for t in _tasks(pid)}
            if tids <= seen:
                break
            for pid in pids:
                self.cpuset.add(pid)
            for tid in tids - seen:
                try:
                    os.sched_setaffinity(tid, self.cpus)
                except OSError:
                    pass
            seen |= tids
        missing = {p for p in everything() if _alive(p)} - set(self.cpuset.pids())
        if missing:
            cpus = ",".join(map(str, sorted(self.cpus)))
            self.start_error = (
                f"could not pin the engine to CPU(s) {cpus}: process(es) {sorted(missing)[:5]} are not in its cpuset"
            )

    def _end_cpuset(self) -> None:
        if self.cpuset is not None:
            self.cpuset.remove()
            self.cpuset = None

    def cpu_seconds(self) -> float | None:
        """CPU time the engine used so far: its cgroup's exact account (None without one: a process tree's account
        misses children the kernel reaped on its own)."""
        return self.group.cpu_seconds() if self.group is not None else None

    def over_envelope(self, used: float | None, wall: float) -> str:
        """'' or why a measurement of a pinned engine is invalid: it used more CPU time than its pinned CPUs can give
        in ``wall`` (a process that unpinned itself to borrow the other cores: a win that is not the code's)."""
        if not self.cpus or used is None:
            return ""
        allowed = len(self.cpus) * wall * 1.01 + 0.005  # the cgroup's account is exact; it lags by a scheduler tick
        if used > allowed:
            return (
                f"the engine used {used:.3f} CPU-seconds in {wall:.3f} s, more than its {len(self.cpus)} pinned CPU(s) "
                f"allow: it left its CPU pinning ([engine] cpus)"
            )
        return ""

    def _start_clock(self) -> tuple[float | None, float | None]:
        """(the engine's CPU time, how long its runnable processes have waited for a CPU) at a measurement's start;
        (None, None) unpinned."""
        if not self.cpus or self.group is None:
            return None, None
        return self.cpu_seconds(), self.group.cpu_wait_seconds()

    def _envelope(
        self, start: tuple[float | None, float | None], wall: float, metrics: dict[str, Any] | None = None
    ) -> str:
        """The CPU-envelope check of a pinned engine's measurement that started at ``start`` (``_start_clock``);
        records ``cpu_s`` (CPU time used), ``cpus_pinned`` and ``cpu_wait_s`` (how long a runnable process of the
        engine waited for a CPU: contention on its CPUs, from other processes or its own) in ``metrics``."""
        cpu0, wait0 = start
        if cpu0 is None:
            return ""
        now = self.cpu_seconds()
        used = None if now is None else now - cpu0
        if metrics is not None and used is not None and self.cpus:
            metrics.update(cpu_s=round(used, 4), cpus_pinned=len(self.cpus))
            wait = self.group.cpu_wait_seconds() if self.group is not None and wait0 is not None else None
            if wait is not None and wait0 is not None:
                metrics["cpu_wait_s"] = round(wait - wait0, 4)
        return self.over_envelope(used, wall)

    def _new_group(self) -> Callable[[], None] | None:
        """Make this engine's cgroup; the ``preexec_fn`` that puts the child in it (None: no cgroup)."""
        self.group = Group.create("engine")
        return self.group.join_self if self.group is not None else None

    def park(self) -> None:
        if self.proc is None or self.parked or self.proc.poll() is not None:
            return
        if self.group is not None and self.group.freeze():
            self.parked = True
            return
        seen: set[int] = set()
        for _ in range(50):
            tree = set(descendants(self.proc.pid))
            if tree <= seen:
                break
            signal_tree(self.proc.pid, signal.SIGSTOP)
            seen |= tree
        self.parked = True

    def unpark(self) -> None:
        if self.proc is not None and self.parked:
            if self.group is not None:
                self.group.thaw()
            signal_tree(self.proc.pid, signal.SIGCONT)
        self.parked = False

    def _end_group(self) -> None:
        """Kill whatever is left in the cgroup (a process that left the process group too) and remove it (and the
        cpuset, once its processes are gone)."""
        if self.group is not None:
            self.group.kill()
            self.group.remove()
            self.group = None
        self._end_cpuset()


class WorkerError(RuntimeError):
    pass


class WorkerTimeout(WorkerError):
    """The worker did not answer within its limit (recorded as a ``timeout``, not a crash)."""


def _kind(exc: BaseException) -> str:
    return TIMEOUT if isinstance(exc, WorkerTimeout) else CRASH


def read_serving(worktree: Path) -> Any:
    """The worktree's serving.json ({} when absent), read without following links and size-capped."""
    from .safe_io import read_beneath

    path = worktree / "serving.json"
    if not path.exists() and not path.is_symlink():
        return {}
    try:
        return json.loads(read_beneath(worktree, path, 1024 * 1024))
    except (ValueError, OSError, RecursionError) as exc:
        raise WorkerError(f"serving.json is not usable: {exc}") from None


def serving_env(worktree: Path) -> dict[str, str]:
    """Environment variables from the worktree's serving.json (whitelisted prefixes only)."""
    data = read_serving(worktree)
    env = data.get("env", {}) if isinstance(data, dict) else {}
    if not isinstance(env, dict):
        raise WorkerError("serving.json: env must be an object of strings")
    bad = [k for k in env if not k.startswith(SERVING_ENV_PREFIXES)]
    if bad:
        raise WorkerError(
            f"serving.json: env {bad[0]!r} is not allowed (allowed prefixes: {', '.join(SERVING_ENV_PREFIXES)})"
        )
    return {str(k): str(v) for k, v in env.items()}


MAX_OUTPUT_TOKENS = 1_000_000  # generated tokens one measurement may report
CLOCK_BREACH = "the worker's clock disagrees with the orchestrator's"
CLOCK_SLACK_S = 50e-6  # a worker's span lies inside the orchestrator's round trip around it: the clocks' granularity
# what a throughput round trip adds to the worker's timed generate besides the pipe (building the prompts and
# sampling parameters, the answer with every output): a worker's elapsed_s under half the round trip less this
# is a slowed clock
ENGINE_CLOCK_ALLOWANCE_S = 0.05


def clock_disagrees(wall_s: float, worker_s: float, allowance_s: float) -> str:
    """'' or how a worker's own reading of a span (``worker_s``) disagrees with the orchestrator's round trip
    around it (``wall_s``): longer than the round trip, or under half of it less ``allowance_s`` (it runs slow)."""
    if worker_s > wall_s + CLOCK_SLACK_S:
        return (
            f"{CLOCK_BREACH}: {worker_s * 1e3:.3f} ms on its clock in a round trip of {wall_s * 1e3:.3f} ms "
            "on the orchestrator's"
        )
    if worker_s < wall_s / 2 - allowance_s:
        return (
            f"{CLOCK_BREACH}: {worker_s * 1e3:.3f} ms on its clock, {wall_s * 1e3:.3f} ms on the orchestrator's: "
            "it runs slow"
        )
    return ""


def parse_outputs(raw: Any) -> tuple[tuple[tuple[int, ...], ...] | None, str]:
    """(outputs, error): the token ids a measurement generated, validated (None when not reported)."""
    if raw is None:
        return None, ""
    if not isinstance(raw, list) or not all(isinstance(o, list) for o in raw):
        return None, "the worker reported malformed outputs (expected lists of token ids)"
    if sum(len(o) for o in raw) > MAX_OUTPUT_TOKENS:
        return None, "the worker reported more generated tokens than any measurement makes"
    if not all(type(t) is int and 0 <= t < 2**31 for o in raw for t in o):
        return None, "the worker reported token ids that are not small non-negative integers"
    return tuple(tuple(o) for o in raw), ""


def on_orchestrator_clock(metrics: dict[str, Any], outputs: tuple[tuple[int, ...], ...] | None, wall: float) -> str:
    """Rates on the orchestrator's clock, counted from the outputs: a clock or a counter inside the
    candidate's process (which it could patch) never decides a number. '' or why the round is invalid.

    Throughput rounds (every round ``measure`` times itself): tokens and requests are counted from ``outputs``
    and divided by the round trip of the measure command (prompt building and the answer included, the same on
    both sides), whatever the worker reported; the worker's own ``elapsed_s`` is kept as ``worker_elapsed_s``
    and must agree with the round trip (``clock_disagrees``). Latency rounds are timed batch by batch by the
    orchestrator (``_measure_latency``)."""
    if wall <= 0:
        return "the measurement took no time on the orchestrator's clock"
    if outputs is None:
        return "the worker reported a throughput without the outputs it generated"
    out_tokens, n = sum(len(o) for o in outputs), len(outputs)
    in_tokens = metrics.get("input_tokens")
    if type(in_tokens) is not int or in_tokens < 0:
        return "the worker reported no input token count"
    worker = metrics.get("elapsed_s")
    if isinstance(worker, (int, float)) and not isinstance(worker, bool):
        why = clock_disagrees(wall, float(worker), ENGINE_CLOCK_ALLOWANCE_S)
        if why:
            return why
    metrics["worker_elapsed_s"] = worker
    metrics.update(
        elapsed_s=wall,
        output_tokens=out_tokens,
        output_tok_s=out_tokens / wall,
        total_tok_s=(out_tokens + in_tokens) / wall,
        requests_s=n / wall,
    )
    return ""


DEFAULT_PROMPTS = 64  # a throughput trial's prompts when the workload does not say (the worker's default too)
SLICEABLE_METRICS = ("output_tok_s", "total_tok_s", "requests_s", "elapsed_s")  # what combine_parts recomputes
HARNESS_KEYS = ("cpu_s", "cpus_pinned", "cpu_wait_s", "slices")  # metrics only the orchestrator writes


def combine_parts(parts: list[TrialOutcome], metric: str) -> TrialOutcome:
    """One throughput trial from its parts (all successful): the tokens and requests of their outputs over their
    summed round trips on the orchestrator's clock (never a number the worker reported), outputs in part order."""
    outputs = tuple(o for p in parts for o in (p.outputs or ()))
    wall = sum(p.wall_s for p in parts)
    out_tokens = sum(len(o) for o in outputs)
    in_tokens = sum(int(p.metrics.get("input_tokens") or 0) for p in parts)  # checked per part (on_orchestrator_clock)
    metrics: dict[str, Any] = {
        "elapsed_s": wall,
        "output_tokens": out_tokens,
        "input_tokens": in_tokens,
        "worker_elapsed_s": sum(float(p.metrics.get("worker_elapsed_s") or 0) for p in parts),
    }
    if all("cpus_pinned" in p.metrics for p in parts):
        metrics.update(
            cpu_s=round(sum(p.metrics["cpu_s"] for p in parts), 4), cpus_pinned=parts[0].metrics["cpus_pinned"]
        )
    if all("cpu_wait_s" in p.metrics for p in parts):
        metrics["cpu_wait_s"] = round(sum(p.metrics["cpu_wait_s"] for p in parts), 4)
    if wall <= 0 or any(p.outputs is None for p in parts):
        return TrialOutcome(
            False, None, metrics, wall, "a part of the trial has no time or no outputs on the orchestrator's clock"
        )
    metrics.update(
        output_tok_s=out_tokens / wall,
        total_tok_s=(out_tokens + in_tokens) / wall,
        requests_s=len(outputs) / wall,
        slices=len(parts),
        engine_startup_s=parts[0].metrics.get("engine_startup_s"),
    )
    err = metric_error(metrics, metric)
    if err:
        return TrialOutcome(False, None, metrics, wall, err)
    return TrialOutcome(True, float(metrics[metric]), metrics, wall, outputs=outputs)


class WorkerSession(Parkable):
    """A warm vLLM engine for one side; ``measure(seed)`` runs one measurement round."""

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
        argv, _ = sandbox.wrap([self.python, str(WORKER), "--fd", str(wfd), json.dumps(self.spec)], cwd=self.worktree)
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
            self.start_failure = _kind(exc)
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
                False, None, {}, time.perf_counter() - t0, str(exc), self.log_tail(), failure=_kind(exc)
            )
        wall = time.perf_counter() - t0
        metrics = {k: v for k, v in dict(msg.get("metrics", {})).items() if k not in HARNESS_KEYS}
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
                False, None, {}, time.perf_counter() - t_all, str(exc), self.log_tail(), failure=_kind(exc)
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
        eng = self.engines.pop(key, None)
        if eng is not None:
            try:
                eng.close()
            finally:
                self.wait_s += eng.wait_s

    def retire_others(self, key: str) -> None:
        first: BaseException | None = None
        for k in [k for k in self.engines if k != key]:
            try:
                self.retire(k)
            except BaseException as exc:  # noqa: BLE001 - retire the others too
                first = first or exc
        if first is not None:
            raise first

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
        first: BaseException | None = None
        for key, eng in list(self.engines.items()):
            healthy = eng.proc is not None and eng.proc.poll() is None and not eng.start_error
            if keep(key) and healthy:
                eng.park()
                self.wait_s += eng.wait_s
                eng.wait_s = 0.0
                kept[key] = eng
                continue
            try:
                eng.close()
            except BaseException as exc:  # noqa: BLE001 - close the others too
                first = first or exc
            self.wait_s += eng.wait_s
        self.engines.clear()
        if first is not None:
            for eng in kept.values():  # an error on the way out keeps nothing warm
                eng.close()
            raise first
        return kept

    def close(self) -> None:
        """Shut every engine down (all closed even if one fails; the first failure re-raised)."""
        self.release(lambda _key: False)


class EngineLease:
    """A Session view of a pooled engine: start() boots it once, close() leaves it warm."""

    def __init__(
        self, pool: EnginePool, key: str, kind: str, params: Mapping[str, Any], metric: str, exclusive: bool = False
    ):
        self.pool, self.key, self.kind, self.params, self.metric = pool, key, kind, params, metric
        self.exclusive = exclusive

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
        try:
            return self.engine.measure(batch_seed(seed, part), self.kind, params, self.metric)
        finally:
            self._done()

    def combine(self, seed: int, parts: list[TrialOutcome]) -> TrialOutcome:
        return combine_parts(parts, self.metric)

    def close(self) -> None:
        if self.exclusive:
            self.pool.retire(self.key)

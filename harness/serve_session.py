"""The serving workload: a warm ``vllm serve`` per side, measured with ``vllm bench serve``.

The server runs the candidate's code (PYTHONPATH = the candidate worktree, cwd = worktree);
the load generator is always the *baseline's* ``vllm bench serve`` (the measuring instrument
must not be something a proposal can change). Every request must succeed: a failed request
fails the trial. Metrics: output throughput and TTFT / TPOT / ITL p50 and p99.
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
from pathlib import Path
from typing import Any, Mapping

from . import sandbox
from .engine_session import Parkable, WorkerError, read_serving, serving_env
from .trials import TIMEOUT, TrialOutcome, child_env, kill_group, log_error_line, log_tail, metric_error, run_child, tail

METRICS = {
    "output_throughput": "output_tok_s", "request_throughput": "requests_s", "total_token_throughput": "total_tok_s",
    "median_ttft_ms": "ttft_p50_ms", "p99_ttft_ms": "ttft_p99_ms", "median_tpot_ms": "tpot_p50_ms",
    "p99_tpot_ms": "tpot_p99_ms", "median_itl_ms": "itl_p50_ms", "p99_itl_ms": "itl_p99_ms",
}


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


class ServeSession(Parkable):
    def __init__(self, spec: Mapping[str, Any], worktree: Path, client_path: Path, env: Mapping[str, str],
                 log_dir: Path, metric: str, timeout_s: float, startup_timeout_s: float = 600.0, python: str = sys.executable):
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

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            extra = serving_env(self.worktree)
            engine = {**self.spec.get("engine", {}), **serving_engine(self.worktree)}
        except (WorkerError, json.JSONDecodeError) as exc:
            self.start_error = f"bad serving.json: {exc}"
            return
        env = child_env({**self.env, **extra}, self.worktree, None, self.log_path)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.worktree), self.env.get("PYTHONPATH", "")) if p)
        self.port = free_port()
        argv: list[str] | str = [self.python, "-m", "vllm.entrypoints.cli.main", "serve", self.spec["model"], "--host", "127.0.0.1",
                "--port", str(self.port), *engine_flags(engine)]
        self.started_at = time.perf_counter()
        own_net = sandbox.active() is not None and sandbox.can_join_network()
        rfd, wfd = os.pipe() if own_net else (-1, -1)
        try:
            with open(self.log_path, "ab") as log:
                # sandboxed: the server gets a network namespace of its own (loopback only) and the load
                # generator and health checks join it; otherwise it shares the host's loopback
                argv, _ = sandbox.wrap(argv, network=not own_net, cwd=self.worktree, info_fd=wfd if own_net else None)
                self.proc = subprocess.Popen(argv, cwd=str(self.worktree), env=env, stdin=subprocess.DEVNULL, stdout=log,
                                             stderr=subprocess.STDOUT, start_new_session=True, pass_fds=(wfd,) if own_net else (),
                                             preexec_fn=self._new_group())
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
                return subprocess.run(self._in_net([self.python, "-c", probe]), capture_output=True, timeout=10).returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self) -> None:
        if self.startup_s is not None or self.start_error or self.proc is None:
            return
        t0 = time.perf_counter()
        try:
            deadline = time.monotonic() + self.startup_timeout_s
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    self.start_error = f"server exited with status {self.proc.returncode} during start-up: {self._error_line()}"
                    return
                if self._healthy():
                    self.startup_s = time.perf_counter() - self.started_at
                    return
                time.sleep(0.5)
            self.start_error = f"server start-up timed out after {self.startup_timeout_s:g} s"
        finally:
            self.wait_s += time.perf_counter() - t0

    def _error_line(self) -> str:
        return log_error_line(self.log_path)

    def measure(self, seed: int, kind: str | None = None, params: Mapping[str, Any] | None = None, metric: str | None = None) -> TrialOutcome:
        metric = metric or self.metric
        self.wait_ready()
        if self.start_error or self.proc is None:
            return TrialOutcome(False, None, {}, 0.0, self.start_error or "server was not started", self._log_tail())
        p = self.spec.get("params", {}) if params is None else params
        result_dir = self.log_dir / f"bench-{time.monotonic_ns()}"
        result_dir.mkdir(parents=True)
        argv = [
            self.python, "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--backend", "vllm",
            "--base-url", f"http://127.0.0.1:{self.port}", "--model", self.spec["model"], "--tokenizer", self.spec["model"],
            "--dataset-name", "random", "--random-input-len", str(p.get("input_len", 32)),
            "--random-output-len", str(p.get("output_len", 32)), "--num-prompts", str(p.get("prompts", 32)),
            "--max-concurrency", str(p.get("max_concurrency", 4)), "--request-rate", str(p.get("request_rate", "inf")),
            "--seed", str(seed), "--ignore-eos", "--disable-tqdm", "--save-result", "--result-dir", str(result_dir),
            "--result-filename", "result.json",
        ]
        env = child_env(self.env, self.client_path, seed, result_dir)
        env["PYTHONPATH"] = str(self.client_path)
        rc, _out, err, wall = run_child(self._in_net(argv), result_dir, env, self.timeout_s, sandboxed=False)
        if rc is None:
            return TrialOutcome(False, None, {}, wall, f"bench serve timed out after {self.timeout_s:g} s", tail(err), failure=TIMEOUT)
        if rc != 0:
            return TrialOutcome(False, None, {}, wall, f"bench serve exited with status {rc}: {tail(err, 1)}", tail(err))
        try:
            data = json.loads((result_dir / "result.json").read_text())
        except (OSError, json.JSONDecodeError) as exc:
            return TrialOutcome(False, None, {}, wall, f"bench serve wrote no readable result ({exc})", tail(err))
        failed = int(data.get("failed", 0) or 0)
        if failed or int(data.get("completed", 0)) != int(data.get("num_prompts", -1)):
            return TrialOutcome(False, None, {}, wall, f"{failed} of {data.get('num_prompts')} requests failed: {self._error_line()}", self._log_tail())
        metrics: dict[str, Any] = {ours: data.get(theirs) for theirs, ours in METRICS.items()}
        metrics["engine_startup_s"] = self.startup_s
        metrics["duration_s"] = data.get("duration")
        err_msg = metric_error(metrics, metric)
        if err_msg:
            return TrialOutcome(False, None, metrics, wall, err_msg, tail(err))
        return TrialOutcome(True, float(metrics[metric]), metrics, wall)

    def _log_tail(self) -> str:
        return log_tail(self.log_path)

    def close(self) -> None:
        self.unpark()
        proc, self.proc = self.proc, None
        if proc is None:
            return
        t0 = time.perf_counter()
        try:
            try:
                if self.startup_s is None:  # never came up: nothing to shut down cleanly
                    raise ProcessLookupError
                os.killpg(proc.pid, signal.SIGINT)  # let uvicorn and the engine shut down cleanly
                proc.wait(timeout=20)
            except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
                pass
        finally:
            kill_group(proc)
            proc.wait()
            self._end_group()
            self.wait_s += time.perf_counter() - t0

"""One trial = one measurement of one side of one workload with one input seed.

Command trials run in a fresh child process (own session, so a timeout kills the whole
process group) with an explicit, minimal environment, the command contract of DESIGN.md
(``{worktree}``, ``{seed}``, ``{out}`` substituted and exported as AGENTSEARCH_*), and return
one validated result. A non-zero exit, a timeout, unreadable JSON or a missing/non-positive
metric is a failed trial with its reason and the tail of stderr.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from . import lengths, sandbox

TRIAL_SCHEMA = 1
BASELINE = "baseline"
CANDIDATE = "candidate"

# what a child inherits from the orchestrator; everything else comes from the target's config
ENV_WHITELIST = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER", "VIRTUAL_ENV", "PYTHONHASHSEED", "TZ")


@dataclass(frozen=True)
class TrialOutcome:
    """What one child process returned."""

    ok: bool
    value: float | None
    metrics: Mapping[str, Any]
    wall_s: float
    error: str = ""
    stderr_tail: str = ""


@dataclass(frozen=True)
class TrialRecord:
    """One trial as recorded: outcome plus where it sat in the interleaved schedule."""

    workload: str
    side: str
    seed: int
    pair: int
    position: int  # 0 = first of its pair, 1 = second
    order: str  # "AB" (baseline first) or "BA"
    session: int  # engine/session restart index
    ok: bool
    value: float | None
    metrics: Mapping[str, Any]
    wall_s: float
    error: str = ""
    stderr_tail: str = ""
    phase: str = "objective"  # objective | guard | confirmation | calibration
    schema_version: int = TRIAL_SCHEMA

    def __post_init__(self) -> None:
        if self.side not in (BASELINE, CANDIDATE):
            raise ValueError(f"side must be baseline or candidate, got {self.side!r}")
        if self.ok and (self.value is None or not math.isfinite(self.value) or self.value <= 0):
            raise ValueError("a successful trial needs a positive, finite value")
        if not self.ok and not self.error:
            raise ValueError("a failed trial needs an error")


@dataclass(frozen=True)
class CommandSpec:
    command: str
    worktree: Path
    metric: str
    timeout_s: float
    env: Mapping[str, str] = field(default_factory=dict)
    extra: Mapping[str, str] = field(default_factory=dict)  # more {placeholders}


def tail(text: str, lines: int = 15, chars: int = 2000) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])[-chars:]


def child_env(spec_env: Mapping[str, str], worktree: Path, seed: int | None, out: Path) -> dict[str, str]:
    env = {k: os.environ[k] for k in ENV_WHITELIST if k in os.environ}
    env.update(spec_env)
    env["AGENTSEARCH_WORKTREE"] = str(worktree)
    env["AGENTSEARCH_OUT"] = str(out)
    if seed is not None:
        env["AGENTSEARCH_SEED"] = str(seed)
    return env


def substitute(command: str, values: Mapping[str, str]) -> str:
    out = command
    for key, val in values.items():
        out = out.replace("{" + key + "}", shlex.quote(val))
    return out


def run_child(argv: list[str] | str, cwd: Path, env: Mapping[str, str], timeout_s: float, shell: bool = False,
              sandboxed: bool = True) -> tuple[int | None, str, str, float]:
    """Run a child in its own process group (inside the active sandbox unless ``sandboxed`` is
    False: the measuring instrument itself); kill the group on timeout. rc None = timed out."""
    t0 = time.perf_counter()
    if sandboxed:
        argv, shell = sandbox.wrap(argv, shell)
    proc = subprocess.Popen(
        argv, cwd=str(cwd), env=dict(env), shell=shell, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL, text=True, start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
        rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, err = proc.communicate()
        rc = None
    except BaseException:
        kill_group(proc)
        proc.wait()
        raise
    return rc, out or "", err or "", time.perf_counter() - t0


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        return tail(path.read_text(errors="replace"), lines, 4000)
    except OSError:
        return ""


def log_error_line(path: Path) -> str:
    """The most telling line of a child's log: its last exception line, else its last line."""
    lines = [l for l in log_tail(path, 200).splitlines() if l.strip()]
    for line in reversed(lines):
        core = line.split("] ", 1)[-1].strip()
        if any(k in core for k in ("Error", "Exception", "error:")) and not core.startswith("File "):
            return core[:500]
    return lines[-1][:500] if lines else "no output"


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def read_metrics(out: Path, metric: str) -> tuple[dict[str, Any] | None, str]:
    """(metrics, error): the JSON object at ``out`` and whether ``metric`` is usable."""
    if not out.exists():
        return None, f"no metrics file written to {out.name}"
    try:
        data = json.loads(out.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return None, f"metrics file is not JSON ({exc.__class__.__name__}: {exc})"
    if not isinstance(data, dict):
        return None, "metrics file must hold one JSON object"
    return data, metric_error(data, metric)


def metric_error(data: Mapping[str, Any], metric: str) -> str:
    """Why ``data[metric]`` cannot be judged ('' when it can)."""
    if metric not in data:
        return f"metric {metric!r} missing from the output (keys: {', '.join(sorted(data)) or 'none'})"
    v = data[metric]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        return f"metric {metric!r} must be a positive finite number, got {v!r}"
    return ""


def run_command_trial(spec: CommandSpec, seed: int, out_dir: Path) -> TrialOutcome:
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"metrics-{os.getpid()}-{time.monotonic_ns()}.json"
    values = {"worktree": str(spec.worktree), "seed": str(seed), "out": str(out), **spec.extra}
    cmd = substitute(spec.command, values)
    env = child_env({**lengths.env(seed), **spec.env}, spec.worktree, seed, out)
    rc, _stdout, stderr, wall = run_child(cmd, spec.worktree, env, spec.timeout_s, shell=True)
    try:
        if rc is None:
            return TrialOutcome(False, None, {}, wall, f"timed out after {spec.timeout_s:g} s", tail(stderr))
        if rc != 0:
            last = tail(stderr, 1) or "no stderr"
            return TrialOutcome(False, None, {}, wall, f"exited with status {rc}: {last}", tail(stderr))
        data, err = read_metrics(out, spec.metric)
        if err:
            return TrialOutcome(False, None, data or {}, wall, err, tail(stderr))
        assert data is not None
        return TrialOutcome(True, float(data[spec.metric]), data, wall, "", tail(stderr))
    finally:
        out.unlink(missing_ok=True)

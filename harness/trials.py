"""One trial = one measurement of one side of one workload with one input seed.

Command trials run in a fresh child process (own session, so a timeout kills the whole
process group) with an explicit, minimal environment, the command contract of docs/CONTRACTS.md
(``{worktree}``, ``{seed}``, ``{out}`` substituted and exported as AGENTSEARCH_*), and return
one validated result. A non-zero exit, a timeout, unreadable JSON or a missing/non-positive
metric is a failed trial with its reason and the tail of stderr.

Everything a child controls is treated as hostile input: stdout/stderr go to temporary files
of which only a capped tail is read; ``{out}`` must be a plain file of bounded size, parsed
without NaN, infinities or unbounded integers, with at most MAX_METRIC_KEYS short keys and
scalar values; every text that reaches a reason or a record goes through ``tail`` (sanitized
and capped); and when a trial ends, every process left from it is killed.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import select
import shlex
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from history.records.trial import BASELINE as BASELINE
from history.records.trial import CANDIDATE as CANDIDATE
from history.records.trial import TrialRecord as TrialRecord

from . import lengths, reaper, sandbox

# why a trial failed, as a word (the values of history.records.FailureKind a trial can have)
CRASH, TIMEOUT, CHANGED_OUTPUTS, WORKTREE_CHANGED = "crash", "timeout", "changed-outputs", "worktree-changed"
# the instrument failed (a load generator that fell behind its schedule): on the baseline's trial, the run's error
MEASUREMENT_ERROR = "measurement-error"
TRIAL_FAILURES = (CRASH, TIMEOUT, CHANGED_OUTPUTS, WORKTREE_CHANGED, MEASUREMENT_ERROR)

# what a child inherits from the orchestrator; everything else comes from the target's config
ENV_WHITELIST = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "TMPDIR",
    "USER",
    "VIRTUAL_ENV",
    "PYTHONHASHSEED",
    "TZ",
    # the devices this orchestrator may use (a Ray task sets them to the GPUs its bundle reserved,
    # "" when it reserved none): a child never sees more; a placement narrows them further
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
)
# every trial child gets a random marker in its environment; whatever still carries it (or
# still holds the trial's output files) after the trial is killed
TRIAL_MARKER = "AGENTSEARCH_TRIAL"
# what candidate code can make the orchestrator read or record is bounded
OUTPUT_TAIL_BYTES = 64 * 1024  # of a child's stdout / stderr / log
METRICS_MAX_BYTES = 1 << 20  # the {out} metrics file
MAX_METRIC_KEYS = 64
MAX_METRIC_KEY_CHARS = 64
MAX_METRIC_STR_CHARS = 200
TAIL_CHARS = 2000  # a stderr / log tail
REASON_CHARS = 300  # an excerpt inside a verdict reason


@dataclass(frozen=True)
class TrialOutcome:
    """What one child process returned."""

    ok: bool
    value: float | None
    metrics: Mapping[str, Any]
    wall_s: float
    error: str = ""
    stderr_tail: str = ""
    # what the timed run produced (e.g. the generated token ids per request), for the outputs check;
    # never recorded in the history
    outputs: tuple[tuple[int, ...], ...] | None = None
    failure: str = ""  # when not ok: one of TRIAL_FAILURES ('' = crash); history.records.FailureKind values
    # when not ok: the instrument was disturbed (a load generator behind its schedule under the machine's other
    # load), not broken: the same trial measured again may succeed (harness.interleave re-measures the baseline's)
    disturbed: bool = False


@dataclass(frozen=True)
class CommandSpec:
    command: str
    worktree: Path
    metric: str
    timeout_s: float
    env: Mapping[str, str] = field(default_factory=dict)
    extra: Mapping[str, str] = field(default_factory=dict)  # more {placeholders}


_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def sanitize(text: str | bytes) -> str:
    """Text fit for a reason, a record or a terminal: undecodable bytes replaced, ANSI escapes
    and control characters dropped (newlines and tabs kept)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    elif not isinstance(text, str):
        text = str(text)
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\t", "    ")
    return _CONTROL.sub("", _ANSI.sub("", text))


def tail(text: str | bytes, lines: int = 15, chars: int | None = None) -> str:
    """The last ``lines`` lines of a child's output, sanitized and capped: at most ``chars``
    characters (default: REASON_CHARS for one line, the excerpt of a reason; else TAIL_CHARS)."""
    if chars is None:
        chars = REASON_CHARS if lines <= 1 else TAIL_CHARS
    if not text:
        return ""
    text = text[-(chars + 1) * max(lines, 1) * 8 :]  # bound the work on huge input
    kept = [ln.rstrip() for ln in sanitize(text).strip().splitlines() if ln.strip()]
    return "\n".join(kept[-lines:])[-chars:]


def child_env(spec_env: Mapping[str, str], worktree: Path, seed: int | None, out: Path) -> dict[str, str]:
    env = {k: os.environ[k] for k in ENV_WHITELIST if k in os.environ}
    env.update(spec_env)
    env["AGENTSEARCH_WORKTREE"] = str(worktree)
    env["AGENTSEARCH_OUT"] = str(out)
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # nothing is written into a worktree by importing it
    if seed is not None:
        env["AGENTSEARCH_SEED"] = str(seed)
    return reaper.marked(env)  # whatever runs with it dies with this process (harness.reaper)


def substitute(command: str, values: Mapping[str, str]) -> str:
    out = command
    for key, val in values.items():
        out = out.replace("{" + key + "}", shlex.quote(val))
    return out


def run_child(
    argv: list[str] | str,
    cwd: Path,
    env: Mapping[str, str],
    timeout_s: float,
    shell: bool = False,
    sandboxed: bool = True,
    prefix: Sequence[str] = (),
) -> tuple[int | None, str, str, float]:
    """Run a child in its own process group (inside the active sandbox unless ``sandboxed`` is
    False: the measuring instrument itself); kill the group on timeout. rc None = timed out.

    stdout and stderr go to unlinked temporary files of the orchestrator (never into its
    memory); only their last OUTPUT_TAIL_BYTES come back, decoded with replacement. Every
    wait is bounded, and when the child ends (or is killed) whatever is left of the trial is
    killed too: its process group, every process carrying its AGENTSEARCH_TRIAL marker and
    every process still holding its output files (a ``setsid`` daemon included)."""
    t0 = time.perf_counter()
    if sandboxed:
        argv, shell = sandbox.wrap(argv, shell, cwd=cwd)
    if prefix:  # e.g. joining resource-limit groups before the sandbox starts (cgroups.Limits.join_prefix)
        assert not shell and not isinstance(argv, str)
        argv = [*prefix, *argv]
    if shell:
        argv, shell = ["/bin/sh", "-c", str(argv)], False
    argv = [*dies_with_us(), *argv]
    token = secrets.token_hex(16)
    env = reaper.marked({**env, TRIAL_MARKER: token})
    with (
        tempfile.TemporaryFile(prefix="agentsearch-out-") as fo,
        tempfile.TemporaryFile(prefix="agentsearch-err-") as fe,
    ):
        proc = subprocess.Popen(
            argv,
            cwd=str(cwd),
            env=env,
            shell=shell,
            stdout=fo,
            stderr=fe,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        rc: int | None = None
        try:
            try:
                rc = wait_exit(proc, timeout_s)
            except subprocess.TimeoutExpired:
                rc = None
            wall = time.perf_counter() - t0
        finally:
            kill_group(proc)
            kill_leftovers(token, (fo, fe))
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # unkillable (D state): do not wait for it
                pass
        out, err = read_tail(fo), read_tail(fe)
    return rc, out, err, wall


def dies_with_us() -> list[str]:
    """A prefix for a child to die with this process even where this process is SIGKILLed (nothing of ours
    can then kill the child's group): ``setpriv --pdeathsig KILL`` (kept across the execs that follow until
    one changes credentials, as bubblewrap's set-up does), then a check that our pid is still the parent's,
    for a death between fork and exec, before the child carried the marker ``harness.reaper`` kills by.
    [] where util-linux has no setpriv: the reaper still holds from the exec on."""
    setpriv = _setpriv()
    if setpriv is None:
        return []
    return [
        setpriv,
        "--pdeathsig",
        "KILL",
        "--",
        "/bin/sh",
        "-c",
        f'[ "$PPID" = {os.getpid()} ] || exit 137; exec "$@"',
        "sh",
    ]


_SETPRIV: list[str | None] = []


def _setpriv() -> str | None:
    if not _SETPRIV:
        import shutil

        _SETPRIV.append(shutil.which("setpriv", path="/usr/bin:/bin:/usr/sbin:/sbin"))
    return _SETPRIV[0]


def wait_exit(proc: subprocess.Popen, timeout_s: float) -> int:
    """``proc.wait(timeout_s)``, told of the exit at once: CPython waits with a timeout by polling with delays
    that double up to 50 ms, so a child that ended at 34 ms was seen at 64 ms (an agent's every tool call, and
    the wall of every short trial). A pidfd is readable the moment the process exits."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # an old kernel, or the child was already reaped
        return proc.wait(timeout=timeout_s)
    try:
        ready, _, _ = select.select([fd], [], [], max(0.0, timeout_s))
        if not ready:
            raise subprocess.TimeoutExpired(proc.args, timeout_s)
        return proc.wait()
    finally:
        os.close(fd)


def read_tail(fh: Any, limit: int = OUTPUT_TAIL_BYTES) -> str:
    """The last ``limit`` bytes of an open file, decoded with replacement."""
    try:
        size = os.fstat(fh.fileno()).st_size
        fh.seek(max(0, size - limit))
        return fh.read(limit).decode("utf-8", "replace")
    except (OSError, ValueError):
        return ""


def _marked_or_holding(pid: int, marker: bytes, files: set[tuple[int, int]]) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            if marker in fh.read(1 << 20).split(b"\0"):
                return True
    except OSError:
        pass
    if files:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            return False
        for fd in fds:
            try:
                st = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in files:
                return True
    return False


def kill_leftovers(token: str, held: tuple[Any, ...] = ()) -> int:
    """SIGKILL every process (but this one) whose environment carries ``AGENTSEARCH_TRIAL=token``
    or that still holds one of the files ``held``; returns how many were killed."""
    marker = f"{TRIAL_MARKER}={token}".encode()
    files = set()
    for fh in held:
        try:
            st = os.fstat(fh.fileno())
            files.add((st.st_dev, st.st_ino))
        except (OSError, ValueError):
            pass
    me, killed = os.getpid(), 0
    for _ in range(20):  # a process may fork while it is being hunted: repeat until none is left
        found = 0
        try:
            pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
        except OSError:
            return killed
        for pid in pids:
            if pid == me or not _marked_or_holding(pid, marker, files):
                continue
            try:
                with open(f"/proc/{pid}/stat", "rb") as fh:
                    fields = fh.read().rsplit(b")", 1)[-1].split()
                if fields[0] == b"Z":
                    continue  # a zombie holds nothing; its parent reaps it
                if int(fields[1]) == me:
                    # a child this process is starting in another thread (an agent session's tool, a git call),
                    # between fork and exec: it holds every descriptor of ours for that moment, the trial's
                    # output files included. A trial's own leftovers are never our children: the trial's
                    # process was reaped above, and what it left behind was reparented to init.
                    continue
            except (OSError, IndexError, ValueError):
                continue
            try:
                os.kill(pid, signal.SIGKILL)
                found += 1
            except (ProcessLookupError, PermissionError):
                pass
        killed += found
        if not found:
            break
        time.sleep(0.02)
    return killed


def log_tail(path: Path, lines: int = 25, chars: int = TAIL_CHARS) -> str:
    """The sanitized tail of a log file (only its last OUTPUT_TAIL_BYTES are read)."""
    try:
        with open(path, "rb") as fh:
            return tail(read_tail(fh), lines, chars)
    except OSError:
        return ""


def log_error_line(path: Path) -> str:
    """The most telling line of a child's log: its last exception line, else its last line."""
    lines = [ln for ln in log_tail(path, 200, 16000).splitlines() if ln.strip()]
    for line in reversed(lines):
        core = line.split("] ", 1)[-1].strip()
        if any(k in core for k in ("Error", "Exception", "error:")) and not core.startswith("File "):
            return core[:REASON_CHARS]
    return lines[-1][:REASON_CHARS] if lines else "no output"


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class UnsafeJSON(ValueError):
    """JSON that parses but holds a number no float can hold (NaN, Infinity, 1e999, 400 digits)."""


def _json_int(text: str) -> int | float:
    if len(text) <= 18:
        return int(text)
    value = float(text)  # beyond 64 bits: a float, refused when even that overflows
    if not math.isfinite(value):
        raise UnsafeJSON(f"integer out of range ({len(text.lstrip('-'))} digits)")
    return value


def _json_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise UnsafeJSON(f"number out of range ({text[:20]}{'...' if len(text) > 20 else ''})")
    return value


def _json_constant(name: str) -> Any:
    raise UnsafeJSON(f"{name} is not a number a metric may hold")


def safe_json_loads(text: str | bytes) -> Any:
    """``json.loads`` that never yields NaN, infinities or unbounded integers and raises only
    ValueError (UnsafeJSON, JSONDecodeError, UnicodeDecodeError) for any bad input."""
    try:
        return json.loads(text, parse_int=_json_int, parse_float=_json_float, parse_constant=_json_constant)
    except RecursionError:
        raise UnsafeJSON("nested too deeply") from None


def _scalar_ok(v: Any) -> bool:
    return v is None or isinstance(v, (bool, int, float, str))


def check_metrics(data: Any) -> tuple[dict[str, Any] | None, str]:
    """(metrics, error): the part of a metrics object that may be recorded. Refused (error):
    not an object, more than MAX_METRIC_KEYS keys, a name longer than MAX_METRIC_KEY_CHARS.
    Dropped: values that are not scalars (their names listed under ``dropped_metrics``);
    strings are sanitized and capped. Never raises."""
    if not isinstance(data, dict):
        return None, "metrics must be one JSON object"
    if len(data) > MAX_METRIC_KEYS:
        return None, f"metrics hold {len(data)} keys; at most {MAX_METRIC_KEYS} are allowed"
    clean: dict[str, Any] = {}
    dropped: list[str] = []
    for key, value in data.items():
        if not isinstance(key, str) or not key or len(key) > MAX_METRIC_KEY_CHARS:
            shown = sanitize(str(key))[:40]
            return (
                None,
                f"metric name {shown!r}{'...' if len(str(key)) > 40 else ''} is empty or longer than "
                f"{MAX_METRIC_KEY_CHARS} characters",
            )
        key = sanitize(key)
        if isinstance(value, float) and not math.isfinite(value):
            return None, f"metric {key!r} is not a finite number ({value!r})"
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 1 << 64:
            return (
                None,
                f"metric {key!r} is an integer out of range (about {int(value.bit_length() * 0.30103) + 1} digits)",
            )
        if not _scalar_ok(value):
            dropped.append(key)
            continue
        clean[key] = sanitize(value)[:MAX_METRIC_STR_CHARS] if isinstance(value, str) else value
    if dropped:
        clean["dropped_metrics"] = (", ".join(dropped) + " (not scalars; not recorded)")[:MAX_METRIC_STR_CHARS]
    return clean, ""


def _open_output(out: Path) -> tuple[int | None, str]:
    """A read-only descriptor of ``out`` if it is a plain file of bounded size, else why not."""
    try:
        fd = os.open(out, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None, f"no metrics file written to {out.name}"
    except OSError as exc:
        if os.path.islink(out):
            return None, f"metrics file {out.name} is a symbolic link, not a plain file"
        return None, f"metrics file {out.name} cannot be opened ({exc.__class__.__name__})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            return None, f"metrics file {out.name} is not a plain file"
        if st.st_size > METRICS_MAX_BYTES:
            os.close(fd)
            return None, f"metrics file is {st.st_size} bytes; at most {METRICS_MAX_BYTES} are read"
    except OSError as exc:
        os.close(fd)
        return None, f"metrics file {out.name} cannot be read ({exc.__class__.__name__})"
    return fd, ""


def read_metrics(out: Path, metric: str) -> tuple[dict[str, Any] | None, str]:
    """(metrics, error): the JSON object at ``out`` and whether ``metric`` is usable.

    ``out`` must be a plain file (not a link, FIFO or device) of at most METRICS_MAX_BYTES; it
    is parsed without NaN, infinities or unbounded integers and checked by ``check_metrics``.
    Never raises: every problem is an error string."""
    fd, err = _open_output(out)
    if fd is None:
        return None, err
    try:
        with os.fdopen(fd, "rb") as fh:
            raw = fh.read(METRICS_MAX_BYTES + 1)
    except OSError as exc:
        return None, f"metrics file {out.name} cannot be read ({exc.__class__.__name__})"
    if len(raw) > METRICS_MAX_BYTES:
        return None, f"metrics file is over {METRICS_MAX_BYTES} bytes"
    try:
        data = safe_json_loads(raw.decode("utf-8"))
    except ValueError as exc:
        detail = tail(str(exc), 1, 120)
        return None, f"metrics file is not JSON ({exc.__class__.__name__}: {detail})"
    if not isinstance(data, dict):
        return None, "metrics file must hold one JSON object"
    clean, err = check_metrics(data)
    if clean is None:
        return None, err
    return clean, metric_error(clean, metric)


def metric_error(data: Mapping[str, Any], metric: str) -> str:
    """Why ``data[metric]`` cannot be judged ('' when it can). Never raises."""
    try:
        if metric not in data:
            keys = sorted(sanitize(str(k))[:MAX_METRIC_KEY_CHARS] for k in data)
            shown = ", ".join(keys[:20]) + (f", ... ({len(keys)} keys)" if len(keys) > 20 else "")
            return f"metric {metric!r} missing from the output (keys: {shown or 'none'})"
        v = data[metric]
        ok = not isinstance(v, bool) and isinstance(v, (int, float))
        if ok:
            try:
                f = float(v)
            except (OverflowError, ValueError):
                f = math.inf
            ok = math.isfinite(f) and f > 0
        if not ok:
            small = not isinstance(v, int) or isinstance(v, bool) or abs(v) < 1 << 64
            shown = repr(v) if small else f"an integer of about {int(v.bit_length() * 0.30103) + 1} digits"
            return f"metric {metric!r} must be a positive finite number, got {tail(shown, 1, 80)}"
        return ""
    except Exception as exc:  # noqa: BLE001 - adversarial input must never crash the judge
        return f"metric {metric!r} cannot be read ({exc.__class__.__name__})"


# metric = "wall_s": the trial's wall time on the orchestrator's clock, which no code under test can
# touch (a bench's own timer runs in a process that imports the candidate's code, which may patch it)
WALL_METRIC = "wall_s"


def run_command_trial(spec: CommandSpec, seed: int, out_dir: Path) -> TrialOutcome:
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"metrics-{os.getpid()}-{time.monotonic_ns()}.json"
    values = {"worktree": str(spec.worktree), "seed": str(seed), "out": str(out), **spec.extra}
    cmd = substitute(spec.command, values)
    env = child_env({**lengths.env(seed), **spec.env}, spec.worktree, seed, out)
    rc, _stdout, stderr, wall = run_child(cmd, spec.worktree, env, spec.timeout_s, shell=True)
    try:
        if rc is None:
            return TrialOutcome(
                False, None, {}, wall, f"timed out after {spec.timeout_s:g} s", tail(stderr), failure=TIMEOUT
            )
        if rc != 0:
            last = tail(stderr, 1) or "no stderr"
            return TrialOutcome(False, None, {}, wall, f"exited with status {rc}: {last}", tail(stderr))
        if spec.metric == WALL_METRIC:
            # judged on the orchestrator's clock: whatever the command wrote (if anything) is context only
            data, err = read_metrics(out, spec.metric) if (out.exists() or out.is_symlink()) else ({}, "")
            data = {k: v for k, v in (data or {}).items() if k != WALL_METRIC}
            if err and not err.startswith(f"metric {WALL_METRIC!r} missing"):
                return TrialOutcome(False, None, data, wall, err, tail(stderr))
            data[WALL_METRIC] = wall
            return TrialOutcome(True, wall, data, wall, "", tail(stderr))
        data, err = read_metrics(out, spec.metric)
        if err:
            return TrialOutcome(False, None, data or {}, wall, err, tail(stderr))
        assert data is not None
        return TrialOutcome(True, float(data[spec.metric]), data, wall, "", tail(stderr))
    finally:
        _remove(out)


def _remove(path: Path) -> None:
    """Remove whatever a trial left at ``path`` (a file, link, FIFO or directory)."""
    try:
        path.unlink(missing_ok=True)
    except OSError:  # a directory, however deep (rm walks without recursion; shutil.rmtree recurses)
        try:
            subprocess.run(["rm", "-rf", "--", str(path)], capture_output=True, timeout=600)
        except (OSError, subprocess.SubprocessError):
            pass

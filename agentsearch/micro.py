"""The micro stage: op-level checks of a kernel proposal, before any engine starts.

A proposal is a kernel proposal when it changes the fork's IR-op code (``vllm/ir/``, ``vllm/kernels/``)
or an op's ``ir_op_priority`` in ``serving.json``. For each op in scope, in the sides' sandboxes:

1. **correctness** (one fresh candidate process): the op, dispatched by the candidate's own priority
   list exactly as the engine does, on every generated case (the model's hidden size, Zipf token
   counts, odd sizes, non-contiguous inputs, ``variance_size``, every dtype) and a hidden set (its
   seed derives from the evaluation's secret master); the outputs and the inputs after each call are
   written out and checked by ``kernels/check.py`` — a separate process with the trusted references and
   tolerances and no side code in it. Wrong values, a changed input or an output aliasing an input
   reject here.
2. **timing** (fresh processes, interleaved pairs, the gate's paired statistics): the wall time of a
   Zipf mix of calls, each on fresh inputs, baseline priority against candidate priority, on the
   **orchestrator's** clock: each round is the round trip of a ``go`` sent to the worker and its
   ``done`` (``_timed_trial``); no clock inside the candidate's process decides a number, and its own
   readings must agree with that round trip (``_clock_breach``). Every timed output is checked too,
   as copied inside the round when the call returned (nothing cached, skipped or deferred can pass),
   once the worker's processes are gone. A significant slowdown rejects; a speedup beyond
   ``[gate] plausibility`` is held for review.

The result is one recorded check, ``micro``, with its numbers.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import select
import shlex
import statistics as pystats
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from harness import sandbox
from harness.interleave import WorkloadRun, run_interleaved
from harness.safe_io import UnsafeFile, read_beneath
from harness.seeds import pair_seeds
from harness.sequential import OK, SequentialDesign, decide_guard
from harness.trials import (
    BASELINE,
    CANDIDATE,
    TIMEOUT,
    TRIAL_MARKER,
    CommandSpec,
    TrialOutcome,
    TrialRecord,
    child_env,
    kill_group,
    kill_leftovers,
    read_metrics,
    read_tail,
    run_command_trial,
    safe_json_loads,
    substitute,
    tail,
)
from harness.worker_protocol import SERVING_FILE, clock_disagrees
from history.records import FailureKind
from kernels import catalog
from kernels import fork as kfork

from .config import Config
from .gate import Check, Status
from .preflight import BaselineBroken
from .progress import Say
from .sides import Sides
from .workspace import git

MICRO_SCHEMA = 1
CODE_PREFIXES = ("vllm/ir/", "vllm/kernels/")
TRIAL_TIMEOUT_S = 300.0
CHECK_TIMEOUT_S = 300.0
ROUNDS = 5  # timing rounds of the mix in one process (each on fresh inputs; the median round counts)
MICRO_PAIRS = (4, 8)  # (min_pairs = look_every, max_pairs) of the timing stage
# what a timing round's round trip adds to the worker's own round (harness.worker_protocol.clock_disagrees): two
# pipe hand-offs; a slowed clock must show in *every* round (a late wake-up of a loaded machine shows in one)
CLOCK_IPC_S = 0.002
LATENESS_PROBE_S = 0.0005  # the orchestrator's sleep after each round, to read the machine's wake-up delay
WAKE_UPS = 4  # the slow-clock rule's allowance in wake-up delays: two per round trip, and a margin of two
SALTS = "salts"  # a timed trial's round salts and in-round output sums, handed to the checker, never recorded
MESSAGE_BYTES = 1 << 16  # the largest message a worker may send (a done carries one sum per output of the round)
MAX_SUMS = 4096  # output sums one round may commit to


@dataclass(frozen=True)
class Target:
    op: str
    baseline: tuple[str, ...]  # the baseline's priority list for the op (() = platform default)
    candidate: tuple[str, ...]
    why: str
    timed: bool = True  # False: correctness only (code changed, the op's priority did not)


@dataclass
class OpResult:
    op: str
    baseline: list[str]
    candidate: list[str]
    cases: int = 0
    hidden_cases: int = 0
    correct: bool = False
    failures: list[str] = field(default_factory=list)
    pairs: int = 0
    speedup: float | None = None
    ci: tuple[float, float] | None = None
    p_slower: float | None = None
    baseline_us: float | None = None
    candidate_us: float | None = None
    decision: str = ""
    providers: str = ""


@dataclass
class MicroResult:
    ops: list[OpResult] = field(default_factory=list)
    wall_s: float = 0.0
    schema_version: int = MICRO_SCHEMA

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def scope(repo_dir: Path, base: str, cand: str) -> list[Target]:
    """The ops a proposal changes (none: not a kernel proposal). An op whose priority changed is checked
    and timed; when IR-op code changed, every other op is checked for correctness too (not timed: the
    end-to-end measurement and the distribution checks follow)."""
    bp = kfork.priorities(git.show_file(repo_dir, base, SERVING_FILE))
    cp = kfork.priorities(git.show_file(repo_dir, cand, SERVING_FILE))
    code = sorted(p for p in git.changed_lines(repo_dir, base, cand) if p.startswith(CODE_PREFIXES))
    out = []
    for op in catalog.OPS:
        b, c = tuple(bp.get(op, ())), tuple(cp.get(op, ()))
        if b != c:
            out.append(Target(op, b, c, f"ir_op_priority {list(b) or ['native']} -> {list(c) or ['native']}"))
        elif code:
            out.append(
                Target(
                    op,
                    b,
                    c,
                    f"changes {code[0]}" + (f" (+{len(code) - 1} more files)" if len(code) > 1 else ""),
                    timed=not any(bp.get(o) != cp.get(o) for o in catalog.OPS),
                )
            )
    return out


def read_only() -> tuple[str, ...]:
    """What the sides' sandboxes mount for the micro stage: the kernel library (worker, specs)."""
    return (str(catalog.ROOT),)


def _hidden(config: Config) -> int:
    from harness import models

    w = config.objective
    if not w.spec.engine:
        return 128
    try:
        return catalog.hidden_size(models.resolve(w.model))
    except (RuntimeError, OSError):
        return 128


def _check(cases_path: Path, samples: list[Path], rounds: int = 1, salted: bool = False) -> tuple[int, list[str], str]:
    """Run the trusted checker on ``samples`` (``salted``: timed samples, each with the round salts and the sums
    its worker committed to in each round kept beside it as ``<samples>.salts.json``): (cases checked, failures,
    error)."""
    argv = [sys.executable, str(catalog.CHECKER), "--rounds", str(rounds), *(["--salted"] if salted else [])]
    argv += [str(cases_path), *map(str, samples)]
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return 0, [], f"the checker timed out after {CHECK_TIMEOUT_S:g} s"
    if p.returncode != 0:
        return 0, [], f"the checker failed: {tail(p.stderr, 1)}"
    try:
        res = json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return 0, [], "the checker printed no result"
    return int(res["checked"]), [str(f) for f in res["failures"]], ""


SAMPLES_LIMIT = 1 << 30  # the largest outputs file read back from a side


def _take(root: Path, samples: Path, kept: Path) -> bool:
    """Copy the side's ``samples`` (below its output directory ``root``) to the orchestrator's ``kept``: no link
    anywhere on the way (the side could have made ``micro`` itself a link to another side's directory), a
    regular file, capped. False when there is no such file."""
    try:
        kept.write_bytes(read_beneath(root, samples, SAMPLES_LIMIT))
    except (UnsafeFile, OSError):
        return False
    return True


class _WrongTimed(Exception):
    """A timed call's output did not match the reference."""


class _Session:
    """One side's timing trials: every measurement a fresh worker process; its outputs kept aside."""

    def __init__(self, sd: Sides, side: str, spec: CommandSpec, keep: Path, on_check: Callable[[str, Path], None]):
        self.sd, self.side, self.spec, self.keep, self.on_check = sd, side, spec, keep, on_check
        self.n = 0

    def start(self) -> None:
        pass

    def measure(self, seed: int) -> TrialOutcome:
        self.sd.fresh_outputs(self.side)
        out_dir = self.sd.out(self.side) / "micro"
        out_dir.mkdir(parents=True, exist_ok=True)
        outcome = _timed_trial(self.spec, out_dir)
        salts = outcome.metrics.get(SALTS)
        outcome = replace(outcome, metrics={k: v for k, v in outcome.metrics.items() if k != SALTS})
        moved = self.sd.check()
        if moved:
            return TrialOutcome(False, None, outcome.metrics, outcome.wall_s, moved, outcome.stderr_tail)
        if outcome.ok and outcome.metrics.get("aliased"):
            return TrialOutcome(
                False, None, outcome.metrics, outcome.wall_s, "an output is a view of an input", outcome.stderr_tail
            )
        samples = out_dir / "samples.npz"
        kept = self.keep / f"{self.side}-{self.n}.npz"
        self.n += 1
        if outcome.ok:
            Path(f"{kept}.salts.json").write_text(json.dumps(salts))
            if not _take(self.sd.out(self.side), samples, kept):
                return TrialOutcome(
                    False, None, outcome.metrics, outcome.wall_s, "the worker wrote no outputs", outcome.stderr_tail
                )
            self.on_check(self.side, kept)
        return outcome

    def close(self) -> None:
        pass


def _clock_breach(walls: list[float], spans: list[float], calls: list[float], lates: list[float] | None = None) -> str:
    """'' or how the worker's readings (µs per round: its round, its summed calls) disagree with the
    orchestrator's round trips ``walls`` (µs): longer than a round trip in any round (impossible under any
    load), slow in every round. ``lates`` (s per round): how late the orchestrator woke from a short sleep
    right after the round, the machine's wake-up delay then; a round trip holds two wake-ups (the worker's on
    ``go``, the orchestrator's on ``done``), so the slow rule allows CLOCK_IPC_S + WAKE_UPS x that delay: a
    loaded machine lengthens honest round trips by its wake-ups, never by a factor."""
    for r, (w, s_, c) in enumerate(zip(walls, spans, calls, strict=True)):
        why = clock_disagrees(w / 1e6, max(s_, c) / 1e6, math.inf)
        if why:
            return f"{why} (round {r + 1}{', its calls' if c > s_ else ''})"
    lates = lates or [0.0] * len(walls)
    slow = [
        clock_disagrees(w / 1e6, s_ / 1e6, CLOCK_IPC_S + WAKE_UPS * late)
        for w, s_, late in zip(walls, spans, lates, strict=True)
    ]
    return f"{slow[len(slow) // 2]} (every round)" if all(slow) else ""


def _lateness() -> float:
    """How late (s) this process wakes from a LATENESS_PROBE_S sleep: the machine's wake-up delay now."""
    t = time.perf_counter()
    time.sleep(LATENESS_PROBE_S)
    return max(0.0, time.perf_counter() - t - LATENESS_PROBE_S)


def _sums(msg: dict[str, Any]) -> list[float | None]:
    """A done message's output sums (finite numbers or null for outputs that sum to no number, at most MAX_SUMS;
    the checker compares them with the outputs written)."""
    v = msg.get("sums")
    if not isinstance(v, list) or len(v) > MAX_SUMS:
        raise ValueError("the worker's done carries no output sums")
    ok = (x is None or (isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)) for x in v)
    if not all(ok):
        raise ValueError("the worker's output sums are not numbers")
    return [None if x is None else float(x) for x in v]


def _number(msg: dict[str, Any], key: str) -> float:
    v = msg.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ValueError(f"the worker's {key} is not a time")
    return float(v)


class _Messages:
    """The worker's messages on its dedicated pipe: one JSON object a line, each awaited until the trial's deadline."""

    def __init__(self, rfd: int, deadline: float, timeout_s: float):
        self.rfd, self.deadline, self.timeout_s = rfd, deadline, timeout_s
        self.buf = b""

    def next(self, what: str) -> dict[str, Any]:
        while b"\n" not in self.buf:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"timed out after {self.timeout_s:g} s waiting for {what}")
            if select.select([self.rfd], [], [], min(left, 1.0))[0]:
                chunk = os.read(self.rfd, MESSAGE_BYTES)
                if not chunk:
                    raise EOFError(f"the worker exited before {what}")
                self.buf += chunk
            if len(self.buf) > MESSAGE_BYTES:
                raise ValueError(f"the worker sent an oversized message before {what}")
        line, self.buf = self.buf.split(b"\n", 1)
        msg = safe_json_loads(line.decode("utf-8", "replace"))
        if not isinstance(msg, dict):
            raise ValueError(f"the worker sent a malformed message before {what}")
        return msg


@dataclass
class _Rounds:
    """A timing trial's rounds as they are played: each round's salt, and per round played the orchestrator's round
    trip (µs), the worker's readings (µs: its round, its summed calls), its output sums and the wake-up delay after
    it (s)."""

    salts: list[int]
    walls: list[float] = field(default_factory=list)
    spans: list[float] = field(default_factory=list)
    calls: list[float] = field(default_factory=list)
    sums: list[list[float | None]] = field(default_factory=list)
    lates: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class _Ended:
    """How a timing trial's worker ended: the error ('' : none), the failure kind, its exit status (None: unknown)."""

    error: str
    failure: str
    rc: int | None


def _play(stdin: IO[bytes], messages: _Messages, rounds: _Rounds) -> None:
    """Play the ROUNDS rounds: each ``go`` (with its salt) answered by a ``done``, timed here."""
    for r in range(ROUNDS):
        t0 = time.perf_counter()
        stdin.write(f"go {r} {rounds.salts[r]}\n".encode())
        stdin.flush()
        msg = messages.next(f"round {r + 1}")
        rounds.walls.append((time.perf_counter() - t0) * 1e6)
        if msg.get("event") != "done" or msg.get("round") != r:
            raise ValueError(f"the worker did not answer round {r + 1}")
        rounds.spans.append(_number(msg, "span_us"))
        rounds.calls.append(_number(msg, "calls_us"))
        rounds.sums.append(_sums(msg))
        rounds.lates.append(_lateness())


def _converse(
    proc: subprocess.Popen[bytes], messages: _Messages, rounds: _Rounds, timeout_s: float, deadline: float
) -> _Ended:
    """The trial's conversation with its worker: its warm-up, the rounds, its exit."""
    error, failure, rc = "", "", None
    try:
        assert proc.stdin is not None
        if messages.next("its warm-up").get("event") != "ready":
            raise ValueError("the worker's first message is not ready")
        _play(proc.stdin, messages, rounds)
        proc.stdin.close()
        rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        error, failure = f"timed out after {timeout_s:g} s", TIMEOUT
    except TimeoutError as exc:
        error, failure = str(exc), TIMEOUT
    except ValueError as exc:  # it broke the protocol
        error = str(exc)
    except (OSError, EOFError) as exc:  # it died (a broken pipe): its exit status and last words say why
        try:
            rc = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            rc = None
        error = str(exc) if rc is None or rc == 0 else ""
    return _Ended(error, failure, rc)


def _reap(proc: subprocess.Popen[bytes], token: str, fe: IO[bytes], rfd: int) -> None:
    """Every process of the trial gone (its group, any leftover carrying its token), the pipe closed."""
    kill_group(proc)
    kill_leftovers(token, (fe,))
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # unkillable (D state): do not wait for it
        pass
    os.close(rfd)


def _timed_trial(spec: CommandSpec, out_dir: Path) -> TrialOutcome:
    """One timing trial in a fresh worker process (in its side's sandbox): ROUNDS rounds, each timed here as
    the round trip of ``go r`` (the worker's stdin) and its ``done`` (a dedicated pipe); the value ``us`` is
    the median round trip. Each ``go`` carries the round's salt (``secrets``: no process of the side knows it
    before), with which the worker salts the round's inputs; each ``done`` commits to the round's outputs (their
    sums, read inside the round); the salts and sums come back in ``metrics[SALTS]`` for the
    checker. The worker's own readings only ever fail the trial (``_clock_breach``). Its outputs are read by
    the caller once this returns: every process of the trial is gone by then."""
    out = out_dir / f"metrics-{os.getpid()}-{time.monotonic_ns()}.json"
    rfd, wfd = sandbox.pipe()
    argv, _ = sandbox.wrap(
        shlex.split(substitute(spec.command, {"out": str(out), **spec.extra})) + ["--fd", str(wfd)], cwd=spec.worktree
    )
    token = secrets.token_hex(16)
    env = {**child_env(spec.env, spec.worktree, None, out), TRIAL_MARKER: token}
    t_all = time.perf_counter()
    deadline = time.monotonic() + spec.timeout_s
    rounds = _Rounds([secrets.randbits(62) for _ in range(ROUNDS)])
    messages = _Messages(rfd, deadline, spec.timeout_s)
    with tempfile.TemporaryFile(prefix="agentsearch-err-") as fe:
        try:
            proc = subprocess.Popen(
                argv,
                cwd=str(spec.worktree),
                env=env,
                stdin=subprocess.PIPE,
                stdout=fe,
                stderr=fe,
                pass_fds=(wfd,),
                start_new_session=True,
            )
        finally:
            os.close(wfd)
        try:
            ended = _converse(proc, messages, rounds, spec.timeout_s, deadline)
        finally:
            _reap(proc, token, fe, rfd)
        stderr = tail(read_tail(fe))
    wall = time.perf_counter() - t_all
    try:
        return _trial_outcome(out, rounds, ended, wall, stderr)
    finally:
        try:
            out.unlink(missing_ok=True)
        except OSError:  # not a file: the side's out dir is emptied before its next trial
            pass


def _trial_outcome(out: Path, rounds: _Rounds, ended: _Ended, wall: float, stderr: str) -> TrialOutcome:
    """The trial's outcome from how its worker ended, its metrics file ``out`` and the rounds it played."""
    error = ended.error
    if not error and ended.rc != 0:
        error = f"exited with status {ended.rc}: {tail(stderr, 1) or 'no stderr'}"
    if error:
        return TrialOutcome(False, None, {}, wall, error, stderr, failure=ended.failure)
    data, err = read_metrics(out, "worker_us")
    if data is None or err:
        return TrialOutcome(False, None, data or {}, wall, err, stderr)
    metrics = {
        **data,
        "us": pystats.median(rounds.walls),
        "worker_us": pystats.median(rounds.calls),
        SALTS: {"salts": rounds.salts, "sums": rounds.sums},
    }
    breach = _clock_breach(rounds.walls, rounds.spans, rounds.calls, rounds.lates)
    if breach:
        return TrialOutcome(False, None, metrics, wall, breach, stderr)
    return TrialOutcome(True, metrics["us"], metrics, wall, "", stderr)


def _spec(
    sd: Sides, config: Config, side: str, mode: str, op: str, priority: tuple[str, ...], cases: Path
) -> CommandSpec:
    wt = sd.worktrees[side]
    prio = ",".join(priority) or "native"
    # the priority list comes from the side's serving.json: quoted, it is only ever an argument
    cmd = (
        f"{sys.executable} {catalog.WORKER} {mode} --side {shlex.quote(str(wt))} --op {shlex.quote(op)} "
        f"--priority {shlex.quote(prio)} --cases "
        f"{cases} --rounds {ROUNDS} --samples {{out_dir}}/samples.npz --out {{out}}"
    )
    return CommandSpec(
        command=cmd,
        worktree=wt,
        metric="us" if mode == "time" else "cases",
        timeout_s=TRIAL_TIMEOUT_S,
        # no PYTHONPATH: the worker puts the side's worktree on its path once its own modules are loaded
        env={**{k: v for k, v in config.target.env.items() if k != "PYTHONPATH"}, "OMP_NUM_THREADS": "1"},
        extra={"out_dir": str(sd.out(side) / "micro")},
    )


class _Rejected(Exception):
    """An op failed the micro stage: the check's detail and failure kind."""

    def __init__(self, detail: str, kind: FailureKind = FailureKind.CHANGED_OUTPUTS):
        super().__init__(detail)
        self.detail, self.kind = detail, kind


@dataclass(frozen=True)
class _Stage:
    """What every op's checks share: the config, the sides, the cases' directory (an input of the sides), where the
    outputs checked are kept (the orchestrator's), the model's hidden size, the evaluation's secret master."""

    config: Config
    sd: Sides
    work: Path
    keep: Path
    hidden: int
    master: int
    say: Say


def run(
    config: Config,
    sd: Sides,
    targets: list[Target],
    master: int,
    alpha: float,
    say: Say,
    record: Callable[[TrialRecord], None] | None = None,
    pairs: tuple[int, int] = MICRO_PAIRS,
    timing: bool = True,
) -> tuple[Check, MicroResult]:
    """Run the micro stage for ``targets``; the ``micro`` check and its numbers."""
    t0 = time.perf_counter()
    res = MicroResult()
    hidden = _hidden(config)
    work = sd.inputs / "micro"
    work.mkdir(parents=True, exist_ok=True)
    keep = sd.scratch / "micro-samples"  # the orchestrator's: no side can see or change what is checked
    keep.mkdir(parents=True, exist_ok=True)
    stage = _Stage(config, sd, work, keep, hidden, master, say)
    notes = []
    for t in targets:
        r = OpResult(t.op, list(t.baseline), list(t.candidate))
        res.ops.append(r)
        try:
            n_cases = _correctness(stage, t, r)
            if not (timing and t.timed):
                notes.append(f"{t.op}: {n_cases} cases correct ({r.providers})")
                continue
            nums = _timing(stage, t, r, n_cases, alpha, pairs, record)
        except _Rejected as exc:
            return _fail(res, t0, exc.detail, exc.kind)
        assert r.speedup is not None
        if r.speedup > config.gate.plausibility:
            res.wall_s = time.perf_counter() - t0
            return Check(
                "micro",
                Status.REVIEW,
                f"{nums}: beyond the plausibility bound {config.gate.plausibility:g}x, held for review",
            ), res
        notes.append(nums)
    res.wall_s = time.perf_counter() - t0
    return Check("micro", Status.PASS, "; ".join(notes) + f" ({res.wall_s:.0f} s)"), res


def _correctness(stage: _Stage, t: Target, r: OpResult) -> int:
    """The candidate's op on the public cases (seed fixed per op) and a hidden set (from the evaluation's secret
    master), in one fresh process, its outputs checked by the trusted checker; the number of cases. _Rejected when
    the worker fails, the worktree moved, an output aliases an input or a result is wrong."""
    sd = stage.sd
    public = catalog.cases(t.op, stage.hidden, seed=1)
    hidden_set = catalog.cases(t.op, stage.hidden, seed=pair_seeds(stage.master, f"micro-hidden-{t.op}")(0), n_zipf=4)
    cases = public + hidden_set
    r.cases, r.hidden_cases = len(public), len(hidden_set)
    cpath = stage.work / f"{t.op}-correct.json"
    cpath.write_text(json.dumps(cases))
    stage.say("micro", f"{t.op}: correctness of {list(t.candidate) or ['native']} on {len(cases)} cases")
    spec = _spec(sd, stage.config, CANDIDATE, "correct", t.op, t.candidate, cpath)
    sd.fresh_outputs(CANDIDATE)
    (sd.out(CANDIDATE) / "micro").mkdir(parents=True, exist_ok=True)
    out = run_command_trial(spec, 0, sd.out(CANDIDATE) / "micro")  # (untimed)
    moved = sd.check()
    if not out.ok or moved:
        r.failures = [moved or f"the candidate's worker failed: {out.error}"]
        raise _Rejected(f"{t.op}: {r.failures[0]}", FailureKind.WORKTREE_CHANGED if moved else FailureKind.CRASH)
    r.providers = str(out.metrics.get("providers", ""))
    if out.metrics.get("aliased"):
        r.failures = [f"{out.metrics['aliased']} outputs are views of an input"]
        raise _Rejected(f"{t.op}: {r.failures[0]}")
    samples = sd.out(CANDIDATE) / "micro" / "samples.npz"
    kept = stage.keep / f"{t.op}-correct.npz"
    if not _take(sd.out(CANDIDATE), samples, kept):
        raise _Rejected(f"{t.op}: the candidate's worker wrote no outputs", FailureKind.CRASH)
    checked, failures, err = _check(cpath, [kept])
    if err:  # the instrument failed: fail closed
        raise _Rejected(f"{t.op}: {err}", FailureKind.MEASUREMENT_ERROR)
    r.failures = failures
    if failures or checked != len(cases):
        raise _Rejected(
            f"{t.op} with {list(t.candidate)}: wrong result on {len(failures)} of {len(cases)} cases "
            f"(first: {failures[0] if failures else 'cases missing'})"
        )
    r.correct = True
    return len(cases)


class _TimedChecks:
    """Where a timed trial's outputs go: the candidate's first are checked at once (a cheat stops early), every
    other trial's are kept for the check after the measurement (``later``)."""

    def __init__(self, bench_path: Path, calls: int):
        self.bench_path, self.calls = bench_path, calls
        self.first: list[str] = []  # the first check's finding ('' : none)
        self.later: list[Path] = []

    def __call__(self, side: str, path: Path) -> None:
        if side == CANDIDATE and not self.first:
            n, fails, err = _check(self.bench_path, [path], ROUNDS, salted=True)
            self.first.append(
                err or (fails[0] if fails else "") or ("" if n == self.calls * ROUNDS else "outputs missing")
            )
            if self.first[0]:
                raise _WrongTimed(self.first[0])
        else:
            self.later.append(path)


def _timing(
    stage: _Stage,
    t: Target,
    r: OpResult,
    n_cases: int,
    alpha: float,
    pairs: tuple[int, int],
    record: Callable[[TrialRecord], None] | None,
) -> str:
    """Baseline priority against candidate priority, interleaved, fresh processes; every timed output checked. The
    numbers in words (``r`` holds them); _Rejected on a wrong timed result, a failed trial or a slowdown."""
    bpath = stage.work / f"{t.op}-bench.json"
    bench = catalog.bench_cases(t.op, stage.hidden, seed=pair_seeds(stage.master, f"micro-bench-{t.op}")(0))
    bpath.write_text(json.dumps(bench))
    checks = _TimedChecks(bpath, len(bench))
    specs = {
        s: _spec(stage.sd, stage.config, s, "time", t.op, t.baseline if s == BASELINE else t.candidate, bpath)
        for s in (BASELINE, CANDIDATE)
    }
    design = SequentialDesign(
        alpha=alpha,
        min_pairs=pairs[0],
        look_every=pairs[0],
        max_pairs=pairs[1],
        max_regression=stage.config.gate.max_regression,
        regression_alpha=stage.config.gate.regression_alpha,
    )
    wr = _interleave(stage, t, specs, checks, design)
    for tr in wr.trials:
        if record is not None:
            record(tr)
    if wr.failure:
        last = wr.trials[-1] if wr.trials else None
        if last is not None and last.side == BASELINE:  # the baseline's own provider: whose failure is it?
            _baseline_alone(stage.sd, specs[BASELINE], stage.keep, t, wr.failure, stage.say)
            raise _Rejected(
                f"{t.op}: {wr.failure} (the baseline alone passes: the failure came with this candidate)",
                FailureKind.CRASH,
            )
        raise _Rejected(f"{t.op}: {wr.failure}", FailureKind.CRASH)
    assert wr.decision is not None
    checked, failures, err = _check(bpath, checks.later, ROUNDS, salted=True)
    if err:
        raise _Rejected(f"{t.op}: {err}", FailureKind.MEASUREMENT_ERROR)
    if failures or checked != len(bench) * ROUNDS * len(checks.later) or not checks.first:
        r.failures = failures
        raise _Rejected(
            f"{t.op}: a timed call returned a wrong result ({failures[0] if failures else 'outputs missing'})"
        )
    return _estimate(t, r, wr, len(bench), n_cases)


def _interleave(
    stage: _Stage, t: Target, specs: dict[str, CommandSpec], checks: _TimedChecks, design: SequentialDesign
) -> WorkloadRun:
    """The interleaved timing pairs of ``t``'s op (each trial a fresh worker, its outputs handed to ``checks``)."""

    def factory(side: str, restart: int) -> _Session:
        return _Session(stage.sd, side, specs[side], stage.keep, checks)

    def on_pair(run_: WorkloadRun) -> None:
        est = math.exp(sum(run_.log_ratios) / len(run_.log_ratios)) - 1
        stage.say("micro", f"{t.op}: pair {run_.pairs}/{design.max_pairs}, running estimate {est:+.2%}")

    try:
        return run_interleaved(
            f"micro:{t.op}",
            factory,
            design,
            decide_guard,
            pair_seeds(stage.master, f"micro-{t.op}"),
            False,
            on_pair=on_pair,
        )
    except _WrongTimed as exc:
        raise _Rejected(f"{t.op}: a timed call returned a wrong result ({exc})") from None
    except (OSError, ValueError, RuntimeError) as exc:
        raise _Rejected(
            f"{t.op}: measurement error: {type(exc).__name__}: {exc}", FailureKind.MEASUREMENT_ERROR
        ) from None


def _estimate(t: Target, r: OpResult, wr: WorkloadRun, calls: int, n_cases: int) -> str:
    """The measurement's numbers, into ``r`` and in words; _Rejected on a significant slowdown."""
    assert wr.decision is not None
    est = wr.decision.estimate
    r.pairs, r.speedup, r.ci, r.p_slower = wr.pairs, est.speedup, est.ci(), est.p_worse()
    r.baseline_us = pystats.median(wr.values(BASELINE))
    r.candidate_us = pystats.median(wr.values(CANDIDATE))
    r.decision = wr.decision.action
    nums = (
        f"{t.op}: {r.baseline_us:.0f} -> {r.candidate_us:.0f} us per mix of {calls} calls, "
        f"{est.speedup:.2f}x [{r.ci[0]:.2f}, {r.ci[1]:.2f}] over {wr.pairs} pairs, {n_cases} cases correct"
    )
    if wr.decision.action != OK:
        raise _Rejected(f"{t.op}: micro-slowdown: {wr.decision.reason} ({nums})", FailureKind.SLOWER)
    return nums


def _baseline_alone(sd: Sides, spec: CommandSpec, keep: Path, t: Target, failure: str, say: Say) -> None:
    """The baseline's timing trial failed beside the candidate's: run it once more alone, in a fresh process.
    Failing alone too, it is a broken baseline (or machine): the run's error (BaselineBroken), never the
    candidate's rejection."""
    say("micro", f"{t.op}: the baseline's trial failed; re-running it alone to see whose failure it is")
    alone = _Session(sd, BASELINE, spec, keep, lambda side, path: None).measure(1)
    if not alone.ok:
        raise BaselineBroken(
            f"the baseline's {t.op} provider {list(t.baseline) or ['native']} fails in the micro stage: "
            f"{tail(alone.error, 1)} (it failed beside the candidate and fails alone too; first: {tail(failure, 1)}); "
            "nothing was judged: fix the baseline (or the machine) and run again"
        )


def _fail(
    res: MicroResult, t0: float, detail: str, kind: FailureKind = FailureKind.CHANGED_OUTPUTS
) -> tuple[Check, MicroResult]:
    res.wall_s = time.perf_counter() - t0
    return Check("micro", Status.FAIL, f"{detail} ({res.wall_s:.0f} s, no engine started)", kind), res

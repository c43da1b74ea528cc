from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from harness.interleave import CommandSession, run_interleaved
from harness.sequential import SequentialDesign, decide_objective
from harness.trials import BASELINE, CANDIDATE, CommandSpec, TrialRecord, run_command_trial


def spec(tmp_path: Path, code: str, timeout: float = 10, metric: str = "v", env: dict | None = None) -> CommandSpec:
    script = tmp_path / "b.py"
    script.write_text(code)
    return CommandSpec(f"{sys.executable} {script} {{seed}} {{out}}", tmp_path, metric, timeout, env or {})


def test_successful_trial_substitutes_and_exports(tmp_path):
    code = (
        "import json, os, sys\n"
        "json.dump({'v': 2.5, 'seed': int(sys.argv[1]), 'env_seed': os.environ['AGENTSEARCH_SEED'],"
        " 'wt': os.environ['AGENTSEARCH_WORKTREE'], 'leak': os.environ.get('SECRET_TOKEN'), 'mine': os.environ.get('MINE')},"
        " open(sys.argv[2], 'w'))\n"
    )
    os.environ["SECRET_TOKEN"] = "x"
    try:
        out = run_command_trial(spec(tmp_path, code, env={"MINE": "1"}), 42, tmp_path / "o")
    finally:
        del os.environ["SECRET_TOKEN"]
    assert out.ok and out.value == 2.5
    assert out.metrics["seed"] == 42 and out.metrics["env_seed"] == "42"
    assert out.metrics["wt"] == str(tmp_path)
    assert out.metrics["leak"] is None  # minimal environment: only a whitelist passes
    assert out.metrics["mine"] == "1"
    assert list((tmp_path / "o").iterdir()) == []  # output files are cleaned up


@pytest.mark.parametrize(
    "code, needle",
    [
        ("import sys; sys.stderr.write('boom: bad thing\\n'); sys.exit(3)", "exited with status 3: boom: bad thing"),
        ("pass", "no metrics file written"),
        ("import sys; open(sys.argv[2], 'w').write('{not json')", "not JSON"),
        ("import json, sys; json.dump({'other': 1}, open(sys.argv[2], 'w'))", "metric 'v' missing"),
        ("import json, sys; json.dump({'v': -1}, open(sys.argv[2], 'w'))", "positive finite number"),
        ("import json, sys; json.dump({'v': 'fast'}, open(sys.argv[2], 'w'))", "positive finite number"),
    ],
)
def test_failed_trials_carry_reason(tmp_path, code, needle):
    out = run_command_trial(spec(tmp_path, code), 1, tmp_path / "o")
    assert not out.ok and needle in out.error


def test_timeout_kills_the_whole_process_group(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    code = (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(120)\n"
    )
    t0 = time.perf_counter()
    out = run_command_trial(spec(tmp_path, code, timeout=1.5), 1, tmp_path / "o")
    assert time.perf_counter() - t0 < 20
    assert not out.ok and "timed out after 1.5 s" in out.error
    pid = int(pidfile.read_text())
    for _ in range(50):
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().split()[2] == "Z":
                    break
        except (ProcessLookupError, FileNotFoundError):
            break
        time.sleep(0.1)
    else:
        pytest.fail("grandchild survived the timeout")


def test_record_validation():
    with pytest.raises(ValueError):
        TrialRecord("w", "other", 1, 0, 0, "AB", 0, True, 1.0, {}, 0.1)
    with pytest.raises(ValueError):
        TrialRecord("w", BASELINE, 1, 0, 0, "AB", 0, True, None, {}, 0.1)
    with pytest.raises(ValueError):
        TrialRecord("w", BASELINE, 1, 0, 0, "AB", 0, False, None, {}, 0.1)


def test_interleaving_is_abba_with_shared_seeds(tmp_path):
    code = "import json, sys; json.dump({'v': 1.0 + (hash(sys.argv[1]) % 7) / 1000}, open(sys.argv[2], 'w'))"
    s = spec(tmp_path, code)
    design = SequentialDesign(alpha=0.005, min_pairs=6, max_pairs=6)
    run = run_interleaved(
        "w", lambda side, i: CommandSession(s, tmp_path / side), design, decide_objective, lambda i: 100 + i, True
    )
    sides = [t.side[0] for t in run.trials]
    assert "".join("A" if x == "b" else "B" for x in sides) == "ABBAABBAABBA"
    for pair in range(6):
        ts = [t for t in run.trials if t.pair == pair]
        assert {t.side for t in ts} == {BASELINE, CANDIDATE}
        assert {t.seed for t in ts} == {100 + pair}
        assert ts[0].order == ("AB" if pair % 2 == 0 else "BA")
    assert run.pairs == 6 and run.decision is not None


def test_restarts_open_fresh_sessions_and_always_close(tmp_path):
    events = []

    class Fake:
        def __init__(self, side, i):
            self.side, self.i = side, i

        def start(self):
            events.append(("start", self.side, self.i))

        def measure(self, seed):
            from harness.trials import TrialOutcome

            if self.i == 1 and self.side == CANDIDATE:
                return TrialOutcome(False, None, {}, 0.0, "engine died")
            return TrialOutcome(True, 1.0, {}, 0.0)

        def close(self):
            events.append(("close", self.side, self.i))

    from harness.sequential import CONTINUE, Decision

    def never_stop(design, d, prior, clusters=None):
        return Decision(CONTINUE, "", None, 0.0)  # type: ignore[arg-type]

    design = SequentialDesign(alpha=0.005, min_pairs=3, max_pairs=8)
    run = run_interleaved("w", Fake, design, never_stop, lambda i: i, True, restarts=2)
    assert run.failure and "engine died" in run.failure and "candidate trial failed" in run.failure
    starts = [e for e in events if e[0] == "start"]
    closes = [e for e in events if e[0] == "close"]
    assert {(s, i) for _, s, i in starts} == {(BASELINE, 0), (CANDIDATE, 0), (BASELINE, 1), (CANDIDATE, 1)}
    assert sorted(starts) == sorted(("start", s, i) for _, s, i in closes)


@pytest.mark.parametrize("visible, placed, seen", [("", None, ""), ("2,3", None, "2,3"), ("2,3", "3", "3")])
def test_a_trial_sees_only_the_devices_its_orchestrator_may_use(tmp_path, monkeypatch, visible, placed, seen):
    """A Ray task reserved GPUs 2,3 (or none: ""): its trials never see more; a placement narrows it further.
    (The variable was once dropped by the environment whitelist, so a child saw every GPU of the node.)"""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    code = "import json, os, sys\njson.dump({'v': 1.0, 'dev': os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}, open(sys.argv[2], 'w'))\n"
    out = run_command_trial(
        spec(tmp_path, code, env=None if placed is None else {"CUDA_VISIBLE_DEVICES": placed}), 1, tmp_path / "o"
    )
    assert out.ok and out.metrics["dev"] == seen, out


def test_sliced_pairs_alternate_parts_and_combine_them():
    """slices: each pair's trials are measured part by part, A B B A ... within the pair (the pair's own order
    first), every part of a seed on the same inputs on both sides, a side's trial being its parts combined;
    a machine whose speed drifts over the pair then lands on both halves (whole trials: on one)."""
    from harness.sequential import CONTINUE, Decision
    from harness.trials import TrialOutcome
    from harness.worker_protocol import combine_parts

    clock = [0.0]
    events: list[tuple[str, int, int, int]] = []

    def speed() -> float:  # the machine drifts: 1.0 -> 0.5 over every 10 s, a sawtooth
        return 1.0 - 0.05 * (clock[0] % 10.0)

    class Sliceable:
        def __init__(self, side, i):
            self.side = side

        def start(self): ...

        def close(self): ...

        def parts(self, seed):
            return 6  # this trial has 6 prompts: at most 6 parts

        def _run(self, tokens: int) -> TrialOutcome:
            wall = tokens / (100.0 * speed())
            clock[0] += wall
            return TrialOutcome(
                True,
                tokens / wall,
                {"output_tokens": tokens, "input_tokens": 0, "elapsed_s": wall, "output_tok_s": tokens / wall},
                wall,
                outputs=((1,) * tokens,),
            )

        def measure(self, seed):
            events.append((self.side, seed, -1, 1))
            return self._run(600)

        def measure_part(self, seed, part, parts):
            events.append((self.side, seed, part, parts))
            return self._run(600 // parts)

        def combine(self, seed, parts):
            return combine_parts(parts, "output_tok_s")

    def stop_at_max(design, d, prior, clusters=None):
        return Decision(CONTINUE if len(d) < design.max_pairs else "reject", "", None, 0.0)  # type: ignore[arg-type]

    design = SequentialDesign(alpha=0.005, min_pairs=4, max_pairs=4)
    sliced = run_interleaved("w", Sliceable, design, stop_at_max, lambda i: 100 + i, True, slices=8)
    parts_of_first_pair = [(s[0], p) for s, seed, p, n in events if seed == 100]
    # at most the trial's 6 parts; part i in the pair's order (AB) when i is even, reversed when odd
    assert parts_of_first_pair == [
        ("b", 0),
        ("c", 0),
        ("c", 1),
        ("b", 1),
        ("b", 2),
        ("c", 2),
        ("c", 3),
        ("b", 3),
        ("b", 4),
        ("c", 4),
        ("c", 5),
        ("b", 5),
    ]
    assert [(s[0], p) for s, seed, p, n in events if seed == 101][:2] == [("c", 0), ("b", 0)]  # the second pair is BA
    assert all(n == 6 for _, _, _, n in events)
    assert len(sliced.trials) == 8 and all(
        t.ok and t.metrics["slices"] == 6 and t.metrics["output_tokens"] == 600 for t in sliced.trials
    )
    events.clear()
    clock[0] = 0.0
    whole = run_interleaved("w", Sliceable, design, stop_at_max, lambda i: 100 + i, True)
    assert all(p == -1 for _, _, p, _ in events) and "slices" not in whole.trials[0].metrics
    spread = lambda r: max(abs(x) for x in r.log_ratios)  # noqa: E731
    assert spread(sliced) < spread(whole) / 3, (sliced.log_ratios, whole.log_ratios)


def test_a_failed_part_fails_its_sides_trial_with_its_reason():
    from harness.sequential import CONTINUE, Decision
    from harness.trials import TrialOutcome

    class Breaks:
        def __init__(self, side, i):
            self.side = side

        def start(self): ...

        def close(self): ...

        def parts(self, seed):
            return 4

        def measure_part(self, seed, part, parts):
            if self.side == CANDIDATE and part == 2:
                return TrialOutcome(False, None, {}, 0.1, "engine died in part 3")
            return TrialOutcome(
                True, 5.0, {"output_tokens": 5, "input_tokens": 0, "elapsed_s": 1.0}, 1.0, outputs=((1,),)
            )

        def combine(self, seed, parts):
            raise AssertionError("a failed pair is never combined")

    def stop_at_max(design, d, prior, clusters=None):
        return Decision(CONTINUE if len(d) < design.max_pairs else "reject", "", None, 0.0)  # type: ignore[arg-type]

    run = run_interleaved(
        "w", Breaks, SequentialDesign(alpha=0.005, min_pairs=2, max_pairs=2), stop_at_max, lambda i: i, True, slices=4
    )
    assert run.failure == "candidate trial failed (w, pair 1, seed 0): engine died in part 3"
    assert [(t.side, t.ok) for t in run.trials] == [(CANDIDATE, False)] and run.pairs == 0


def test_the_cpu_envelope_of_a_pinned_engine():
    """More CPU time than the pinned CPUs give in the measured wall time fails the measurement (an engine that
    left its pinning); within it, or unpinned, nothing is said."""
    from harness.processes import Parkable

    eng = Parkable()
    eng.proc = None
    assert eng.over_envelope(5.0, 1.0) == ""  # not pinned
    eng.cpus = frozenset({1})
    assert eng.over_envelope(0.98, 1.0) == "" and eng.over_envelope(None, 1.0) == ""
    assert "left its CPU pinning" in eng.over_envelope(
        1.2, 1.0
    ) and "1.200 CPU-seconds in 1.000 s" in eng.over_envelope(1.2, 1.0)
    eng.cpus = frozenset({2, 3})
    assert eng.over_envelope(1.9, 1.0) == "" and "2 pinned CPU(s)" in eng.over_envelope(2.5, 1.0)


def test_the_leftover_sweep_never_kills_a_child_another_thread_is_starting(tmp_path):
    """Agent sessions run in threads beside the episode: while one thread sweeps a finished trial's leftovers,
    another starts git or a tool. Between fork and exec that child holds every descriptor of ours — the
    trial's output files included — and the sweep used to SIGKILL it (a git call died with -9: 'main is not
    a branch', a failed hash-object)."""
    import subprocess as sp
    import threading

    from harness.trials import run_child

    stop, codes = threading.Event(), []

    def spawn() -> None:  # a child that lingers between fork and exec (the window, widened)
        while not stop.is_set():
            codes.append(sp.run(["true"], capture_output=True, preexec_fn=lambda: time.sleep(0.01)).returncode)

    t = threading.Thread(target=spawn)
    t.start()
    try:
        for _ in range(150):
            rc, *_ = run_child(["true"], tmp_path, {"PATH": "/usr/bin:/bin"}, 10, sandboxed=False)
            assert rc == 0
    finally:
        stop.set()
        t.join()
    assert len(codes) > 30 and set(codes) == {0}, sorted(set(codes))


CHILD_OF_A_KILLED_ORCHESTRATOR = """
import os, sys
from pathlib import Path
sys.path.insert(0, {root!r})
from harness import sandbox
from harness.trials import run_child
wt = Path(sys.argv[1])
box = sandbox.Containment({{os.path.realpath(wt): sandbox.Sandbox(str(wt), str(wt.parent / (wt.name + "-out")))}})
print("go", flush=True)
with sandbox.use(box):
    run_child(["sleep", sys.argv[2]], wt, {{"PATH": "/usr/bin:/bin"}}, 120)
"""


def test_a_sandboxed_child_dies_with_its_sigkilled_orchestrator_however_early_the_kill_lands(tmp_path):
    """The orchestrator SIGKILLed while a sandboxed child is still starting (before bubblewrap set its own
    --die-with-parent): nothing of ours is left to kill the child's group, so the child itself must die with
    its parent from its first instruction on (seen in CI: an agent's `run` outlived a killed episode)."""
    import signal
    import subprocess as sp

    from .conftest import ROOT

    script = tmp_path / "orchestrator.py"
    script.write_text(CHILD_OF_A_KILLED_ORCHESTRATOR.format(root=str(ROOT)))
    marker = f"7{time.time_ns() % 10_000_000:07d}"
    for i, delay in enumerate((0.0, 0.0, 0.001, 0.002, 0.003, 0.005, 0.008, 0.012, 0.02, 0.05, 0.3)):
        wt = tmp_path / f"wt{i}"
        wt.mkdir()
        proc = sp.Popen([sys.executable, str(script), str(wt), marker], stdout=sp.PIPE, start_new_session=True)
        assert proc.stdout is not None and proc.stdout.readline() == b"go\n"
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    time.sleep(2)
    left = sp.run(["pgrep", "-af", f"sleep {marker}"], capture_output=True, text=True)
    sp.run(["pkill", "-9", "-f", f"sleep {marker}"])
    assert left.returncode == 1, left.stdout

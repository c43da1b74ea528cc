"""Acceptance of the episode loop on a toy command target with a patch queue.

The toy engine (src/engine.py) sets the bench's speed and the toy LM's precision, so a
patch can be faster, faster-but-different, or neither; the bench and the config are
protected. Everything is real: git repositories, child processes, statistics, sandbox.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentsearch.workspace import Workspace
from history import HistoryLog
from history.log import HistoryError

from .conftest import ROOT, commit, git, make_repo, run_cli

ENGINE = """\
# the toy serving engine: how fast it runs and how precise its normalization is
VERSION = "1"


SPEED = 1.0


EPS = 1e-5
"""

BENCH = """\
import json, os, random, sys, time
sys.path.insert(0, os.getcwd())
seed, out = int(sys.argv[1]), sys.argv[2]
if os.path.exists("mode.txt") and open("mode.txt").read().strip() == "hang":
    time.sleep(3600)
from src import engine
cv = float(os.environ.get("TOY_CV", "0.02"))
json.dump({"ops_s": 1000.0 * engine.SPEED * random.gauss(1.0, cv), "seed": seed}, open(out, "w"))
"""

LM = (
    (ROOT / "tests" / "toy_lm.py")
    .read_text()
    .replace(
        "EPS = np.float32(1e-5)",
        "import os\nsys.path.insert(0, os.getcwd())\nfrom src import engine\nEPS = np.float32(engine.EPS)",
    )
)

CONFIG = """\
[target]
baseline = "main"
protected = ["bench/**", "lm.py"]

[target.env]
TOY_CV = "0.02"

[[workload]]
name = "speed"
command = "{python} bench/bench.py {{seed}} {{out}}"
metric = "ops_s"
timeout_s = 4

[gate]
episode_budget = 10
max_pairs = 12
confirm_pairs = 4

[verify]
logprobs = "{python} lm.py {{prompts}} {{out}}"
timeout_s = 120
"""


def make_target(path: Path, trial_timeout_s: int = 4, bench: str = BENCH, env: str = "") -> Path:
    """The toy target; ``bench`` replaces its benchmark, ``env`` adds lines to its ``[target.env]``."""
    config = CONFIG.format(python=sys.executable).replace("timeout_s = 4\n", f"timeout_s = {trial_timeout_s}\n")
    config = config.replace('TOY_CV = "0.02"\n', f'TOY_CV = "0.02"\n{env}')
    repo = make_repo(
        path,
        {
            "agentsearch.toml": config,
            "bench/bench.py": bench,
            "lm.py": LM,
            "src/__init__.py": "",
            "src/engine.py": ENGINE,
        },
    )
    assert run_cli("init", "-C", str(repo)).returncode == 0
    return repo


def patch_from(repo: Path, files: dict[str, str], name: str, subject: str) -> str:
    """A real `git format-patch` of a change to the toy target (made on a scratch branch)."""
    commit(repo, files, f"{subject}\n\nCategory: other", branch=f"scratch/{name}")
    text = git(repo, "format-patch", "--stdout", f"main..scratch/{name}")
    git(repo, "branch", "-D", f"scratch/{name}")
    return text


def write_queue(repo: Path, queue: Path, with_hang: bool = True, full: bool = True) -> None:
    """The acceptance queue, in order (full) or its first three kinds (for the crash test)."""
    queue.mkdir()
    if full:
        lossy = patch_from(
            repo,
            {"src/engine.py": ENGINE.replace("SPEED = 1.0", "SPEED = 1.3").replace("EPS = 1e-5", "EPS = 3e-1")},
            "lossy",
            "Faster with a coarser normalization",
        )
        (queue / "01-lossy.patch").write_text(lossy)
    fast = patch_from(
        repo, {"src/engine.py": ENGINE.replace("SPEED = 1.0", "SPEED = 1.3")}, "fast", "Make the engine 30% faster"
    )
    (queue / "02-fast.patch").write_text(fast)
    noop = patch_from(
        repo, {"src/engine.py": ENGINE.replace("# the toy", "# the tiny toy")}, "noop", "Reword a comment"
    )
    (queue / "03-noop.patch").write_text(noop)
    cheat = patch_from(repo, {"bench/bench.py": BENCH.replace("1000.0", "2000.0")}, "cheat", "Speed up the benchmark")
    (queue / "04-protected.patch").write_text(cheat)
    if not full:
        return
    (queue / "05-stale.diff").write_text(
        "--- a/src/engine.py\n+++ b/src/engine.py\n@@ -1,2 +1,2 @@\n-# an engine that never was\n-SPEED = 7.0\n+# nope\n+SPEED = 9.0\n"
    )
    if with_hang:
        hang = patch_from(repo, {"mode.txt": "hang\n", "VERSION.txt": "2\n"}, "hang", "Hang the bench")
        (queue / "06-hang.patch").write_text(hang)


def episode_json(repo: Path, *args: str, timeout: float = 900) -> tuple[int, dict]:
    proc = run_cli("episode", "-C", str(repo), "--json", *args, timeout=timeout)
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_patch_queue_episode_merges_only_the_real_win(tmp_path):
    repo = make_target(tmp_path / "toy")
    write_queue(repo, tmp_path / "queue")
    before = Workspace.open(repo).baseline_commit()
    rc, out = episode_json(repo, "--patches", str(tmp_path / "queue"), "--seed", "7")
    assert rc == 0, out
    by_title = {r["title"]: r for r in out["proposals"]}
    assert len(by_title) == 6
    fast = by_title["Make the engine 30% faster"]
    assert fast["verdict"] == "merge" and fast["merged"] and 1.2 < fast["speedup"] < 1.4
    for title, needle in [
        # an A/A passes the objective at its false-pass rate and the confirmation on fresh seeds then rejects it
        # (seen in CI under foreign load): either check is the gate working
        ("Reword a comment", ("objective", "confirmation")),
        ("Speed up the benchmark", "protected"),
        ("Faster with a coarser normalization", "distribution"),
        ("05-stale", "does not apply"),
        ("Hang the bench", "timed out"),
    ]:
        r = by_title[title]
        assert r["verdict"] == "reject" and not r["merged"], (title, r)
        needles = needle if isinstance(needle, tuple) else (needle,)
        assert any(n in reason for reason in r["reasons"] for n in needles), (title, r["reasons"])
    assert out["merged"] == 1

    ws = Workspace.open(repo)
    after = ws.baseline_commit()
    assert after == out["baseline_after"] != before
    assert "SPEED = 1.3" in (repo / "src" / "engine.py").read_text()  # the checked-out baseline follows
    # evidence: the merge message and a git note on the merge commit
    msg = git(repo, "log", "-1", "--format=%B", after)
    assert "Make the engine 30% faster" in msg and "Agentsearch-Proposal:" in msg and "check objective: pass" in msg
    note = git(repo, "notes", "--ref=agentsearch", "show", after)
    assert "Verdict: merge" in note and "\nMERGE — ops_s " in note and " ops/s (+" in note
    v = [
        e.data
        for e in HistoryLog(Workspace.open(repo).state / "history.jsonl").entries()
        if e.kind == "verdict" and e.data["verdict"] == "merge"
    ][0]
    assert (
        f"Reproduce: agentsearch evaluate {v['candidate']} --baseline {before} --seed {v['seed']} --alpha {v['alpha']!r}"
        in note
    )
    # the fast proposal was judged with the sandbox and its changed line ran
    fast_v = [
        e.data
        for e in HistoryLog(ws.state / "history.jsonl").entries()
        if e.kind == "verdict" and e.data["title"] == fast["title"]
    ][0]
    checks = {c["name"]: c for c in fast_v["checks"]}
    assert checks["sandbox"]["status"] == "pass" and checks["coverage"]["status"] == "pass"
    assert "1/1 changed executable lines ran" in checks["coverage"]["detail"]
    # the baseline side is kept across rejections ([engine] baseline_reuse), built afresh after the merge
    sides = {
        e.data["title"]: e.data.get("baseline_side")
        for e in HistoryLog(ws.state / "history.jsonl").entries()
        if e.kind == "verdict"
    }
    assert (
        sides["Faster with a coarser normalization"],
        sides["Make the engine 30% faster"],
        sides["Reword a comment"],
        sides["Hang the bench"],
    ) == ("fresh", "warm", "fresh", "warm"), sides
    assert len(git(repo, "worktree", "list").splitlines()) == 1 and not list((ws.state / "tmp").glob("warm-*"))
    # every event is in the history, and the history command shows one row per proposal
    kinds = [e.kind for e in HistoryLog(ws.state / "history.jsonl").entries()]
    for kind in (
        "episode-started",
        "proposal-created",
        "trial",
        "statistic",
        "distribution",
        "verdict",
        "merge",
        "episode-finished",
    ):
        assert kind in kinds, kind
    proc = run_cli("history", "-C", str(repo), "--json")
    rows = json.loads(proc.stdout)["evaluations"]
    assert len(rows) == 6 and all({"proposal", "branch", "verdict", "reasons"} <= set(r) for r in rows)
    assert run_cli("history", "verify", "-C", str(repo)).returncode == 0
    # nothing to resume now
    proc = run_cli("episode", "-C", str(repo), "--resume")
    assert proc.returncode == 2 and "no unfinished episode" in proc.stderr


def test_identical_proposal_is_not_measured_twice_and_branches_queue(tmp_path):
    repo = make_target(tmp_path / "toy")
    commit(repo, {"src/engine.py": ENGINE.replace("# the toy", "# the toy, v2")}, "comment A", branch="try/a")
    commit(
        repo, {"src/engine.py": ENGINE.replace("# the toy", "# the toy, v2")}, "comment B (same tree)", branch="try/b"
    )
    rc, out = episode_json(repo, "--branches", "try/*", "--seed", "3")
    assert rc == 0
    a, b = out["proposals"]
    assert a["verdict"] == "reject" and any(
        "objective" in r or "confirmation" in r for r in a["reasons"]
    )  # an A/A: either check
    assert b["verdict"] == "reject" and "not re-measured" in b["reasons"][0] and a["proposal"] in b["reasons"][0]
    ws = Workspace.open(repo)
    trials = [e for e in HistoryLog(ws.state / "history.jsonl").entries() if e.kind == "trial"]
    assert trials and {e.proposal for e in trials} == {a["proposal"]}
    # a later episode does not measure the same tree on the same baseline again either
    commit(
        repo, {"src/engine.py": ENGINE.replace("# the toy", "# the toy, v2")}, "comment C (same tree)", branch="again/c"
    )
    rc, out2 = episode_json(repo, "--branches", "again/*", "--seed", "4")
    assert rc == 0 and out2["episode"] != out["episode"]
    (c,) = out2["proposals"]
    assert c["verdict"] == "reject" and "not re-measured" in c["reasons"][0] and a["proposal"] in c["reasons"][0], c
    trials = [e for e in HistoryLog(ws.state / "history.jsonl").entries() if e.kind == "trial"]
    assert {e.proposal for e in trials} == {a["proposal"]}


def test_bad_input_is_one_line(tmp_path):
    repo = make_target(tmp_path / "toy")
    proc = run_cli("episode", "-C", str(repo), "--patches", str(tmp_path / "nope"))
    assert proc.returncode == 2 and "no such patch directory" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_cli("episode", "-C", str(repo), "--branches", "zzz/*")
    assert proc.returncode == 2 and "no branch matches" in proc.stderr
    proc = run_cli("episode", "-C", str(repo), "--patches", str(tmp_path), "--time-budget", "soon")
    assert proc.returncode == 2 and "--time-budget" in proc.stderr


def _final(repo: Path) -> tuple[dict[str, str], str]:
    ws = Workspace.open(repo)
    verdicts = {
        e.data["title"]: e.data["verdict"]
        for e in HistoryLog(ws.state / "history.jsonl").entries()
        if e.kind == "verdict"
    }
    tree = git(repo, "rev-parse", f"{ws.baseline_commit()}^{{tree}}").strip()
    return verdicts, tree


def _wait_for_start(ws: Workspace, proc: subprocess.Popen, limit_s: float = 300) -> None:
    """Until the episode's first record is written (or the process ends)."""
    deadline = time.monotonic() + limit_s
    log = ws.state / "history.jsonl"
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if log.exists() and any(e.kind == "episode-started" for e in HistoryLog(log).entries()):
                return
        except (HistoryError, ValueError, OSError):  # a line being written: look again
            pass
        time.sleep(0.1)


def test_sigkill_at_random_points_then_resume_matches_an_uninterrupted_run(tmp_path):
    ref = make_target(tmp_path / "ref")
    write_queue(ref, tmp_path / "queue-ref", full=False)
    t0 = time.monotonic()
    rc, out = episode_json(ref, "--patches", str(tmp_path / "queue-ref"), "--seed", "11")
    duration = time.monotonic() - t0
    assert rc == 0
    want = _final(ref)
    assert list(want[0].values()).count("merge") == 1

    repo = make_target(tmp_path / "crash")
    write_queue(repo, tmp_path / "queue", full=False)
    ws = Workspace.open(repo)
    rng = random.Random(2026)
    kills = 0
    env = {**os.environ}
    for attempt in range(60):
        entries = (
            list(HistoryLog(ws.state / "history.jsonl").entries()) if (ws.state / "history.jsonl").exists() else []
        )
        started = any(e.kind == "episode-started" for e in entries)
        args = ["--resume"] if started else ["--patches", str(tmp_path / "queue"), "--seed", "11"]
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentsearch.cli", "episode", "-C", str(repo), "--json", *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        if kills < 10:
            if not started and attempt > 0:  # only the first kill may come before the episode starts: on a
                _wait_for_start(ws, proc)  # loaded machine every random kill could (and once did), and nothing resumed
            time.sleep(rng.uniform(0.3, max(1.0, duration / 4)))
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.communicate()
                kills += 1
                continue
        stdout, stderr = proc.communicate(timeout=900)
        assert proc.returncode == 0, stderr
        break
    assert kills == 10
    got = _final(repo)
    assert got == want
    assert run_cli("history", "verify", "-C", str(repo)).returncode == 0
    entries = list(HistoryLog(ws.state / "history.jsonl").entries())
    for kind in ("proposal-created", "verdict", "merge", "episode-started", "episode-finished"):
        keys = [(e.proposal, e.data.get("number")) for e in entries if e.kind == kind]
        assert len(keys) == len(set(keys)), f"{kind} recorded twice: {keys}"
    assert sum(1 for e in entries if e.kind == "episode-resumed") >= 1


def test_one_edited_byte_is_found_by_history_verify(tmp_path):
    repo = make_target(tmp_path / "toy")
    write_queue(repo, tmp_path / "queue", full=False)
    rc, _ = episode_json(repo, "--patches", str(tmp_path / "queue"), "--budget", "1", "--seed", "5")
    assert rc == 0
    path = Workspace.open(repo).state / "history.jsonl"
    lines = path.read_bytes().split(b"\n")
    target_line = 3
    raw = bytearray(lines[target_line - 1])
    i = raw.index(b'"kind"') + 9
    raw[i] = raw[i] ^ 0x01
    lines[target_line - 1] = bytes(raw)
    path.write_bytes(b"\n".join(lines))
    proc = run_cli("history", "verify", "-C", str(repo))
    assert proc.returncode == 1 and f"line {target_line}" in proc.stderr


def test_time_budget_and_abandon(tmp_path):
    repo = make_target(tmp_path / "toy")
    write_queue(repo, tmp_path / "queue", full=False)
    rc, out = episode_json(repo, "--patches", str(tmp_path / "queue"), "--time-budget", "1s", "--seed", "1")
    assert rc == 0 and out["judged"] == 1 and out["reason"].startswith("time budget reached")
    # an interrupted episode blocks a new one until it is resumed or abandoned
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentsearch.cli", "episode", "-C", str(repo), "--patches", str(tmp_path / "queue")],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    ws = Workspace.open(repo)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if sum(1 for e in HistoryLog(ws.state / "history.jsonl").entries() if e.kind == "episode-started") == 2:
            break
        time.sleep(0.1)
    proc.kill()
    proc.communicate()
    again = run_cli("episode", "-C", str(repo), "--patches", str(tmp_path / "queue"))
    assert again.returncode == 2 and "is unfinished" in again.stderr and "--resume" in again.stderr
    # abandoning drops the progress of the episode's own stack check (a crash may have cut it off), no other
    pending = [e.episode for e in HistoryLog(ws.state / "history.jsonl").entries() if e.kind == "episode-started"]
    cut, other = ws.state / f"stack-progress-{pending[-1]}.json", ws.state / f"stack-progress-{pending[0]}.json"
    cut.write_text("{}")
    other.write_text("{}")
    assert run_cli("episode", "-C", str(repo), "--abandon").returncode == 0
    assert not cut.exists() and other.exists()
    proc2 = run_cli("episode", "-C", str(repo), "--resume")
    assert proc2.returncode == 2 and "no unfinished episode" in proc2.stderr


class Burst:
    """An agent proposer whose sessions all finish at once (each returns its candidate at the first call)."""

    name = "patches"
    agents = 3

    def __init__(self, cands: list) -> None:
        import threading

        self.cands, self.lock = list(cands), threading.Lock()

    def next(self, judged: set, context: object):
        with self.lock:
            return self.cands.pop(0) if self.cands else None


def test_agent_sessions_that_finish_at_once_are_judged_one_by_one_in_process(tmp_path):
    """Three sessions finish together: in this process each proposal is created, judged and merged before the next
    is created (its proposer context and baseline are the merged one's), nothing is measured ahead and then
    superseded, and a finished session's candidate waits in the pool (counted against the budget)."""
    from agentsearch import episode as ep
    from agentsearch.loop import EpisodeLoop
    from agentsearch.proposers.base import Candidate
    from agentsearch.records import open_log
    from agentsearch.workspace import Workspace
    from agentsearch.workspace.workspace import new_episode_id

    repo = make_target(tmp_path / "toy")
    faster = patch_from(repo, {"src/engine.py": ENGINE.replace("SPEED = 1.0", "SPEED = 1.5")}, "a", "Faster")
    comment = patch_from(repo, {"src/engine.py": ENGINE + "# a comment\n"}, "b", "A comment")
    version = patch_from(repo, {"src/engine.py": ENGINE.replace('VERSION = "1"', 'VERSION = "2"')}, "c", "Version")
    cands = [
        Candidate(f"k{i}", t, "", "other", "patches", p, {})
        for i, (t, p) in enumerate([("Faster", faster), ("A comment", comment), ("Version", version)])
    ]
    queue = tmp_path / "queue"  # the episode is started as a patch queue's; the burst proposer replaces it
    queue.mkdir()
    (queue / "a.patch").write_text(faster)
    ws = Workspace.open(repo)
    log = open_log(ws)
    log.open()
    e = ep.start(ws, log, "patches", {"patches": str(queue)}, 3, None, 7, new_episode_id())
    e.proposer = Burst(cands)  # type: ignore[assignment]
    summary = EpisodeLoop(e).run()
    assert summary["judged"] == 3 and summary["merged"] >= 1, summary
    kinds = [
        (x.kind, x.proposal)
        for x in HistoryLog(log.path).entries()
        if x.kind in ("proposal-created", "trial", "verdict", "merge", "superseded")
    ]
    assert not any(k == "superseded" for k, _ in kinds)
    created = [i for i, (k, _) in enumerate(kinds) if k == "proposal-created"]
    for n, i in enumerate(created[1:]):  # every proposal is decided (and merged) before the next is created
        before = {p for k, p in kinds[:i] if k == "verdict"}
        assert kinds[created[n]][1] in before, kinds
    for k, p in kinds:  # each trial belongs to the proposal created last
        if k == "trial":
            assert p == [q for kk, q in kinds[: kinds.index((k, p)) + 1] if kk == "proposal-created"][-1]


def test_the_summary_states_what_the_judge_spent_and_bought(tmp_path):
    """Issue #56: the episode summary and `history` state decisions per hour, seconds (and engine starts) per decision
    and machine-seconds per merged percent, from the verdicts' own timing (a real toy episode)."""
    from history.proposals import judge_line

    repo = make_target(tmp_path / "toy")
    write_queue(repo, tmp_path / "queue", full=False)
    rc, out = episode_json(repo, "--patches", str(tmp_path / "queue"), "--seed", "11")
    assert rc == 0
    j = out["judge"]
    assert j["decisions"] == out["judged"] == 3
    assert j["decisions_per_hour"] == pytest.approx(3 / out["elapsed_s"] * 3600, rel=0.05)
    assert j["engine_starts"] == 0  # command workloads: a fresh process per trial, no engine
    merged = [r for r in out["proposals"] if r["merged"]]
    assert len(merged) == 1 and j["merged_pct"] == pytest.approx((merged[0]["speedup"] - 1) * 100, abs=1e-3)
    assert j["machine_s_per_merged_pct"] == pytest.approx(j["judge_s"] / j["merged_pct"], rel=0.01)
    shown = run_cli("history", "-C", str(repo))
    assert (
        shown.returncode == 0
        and "judge: 3 decisions" in shown.stdout
        and "machine-s per merged percent" in shown.stdout
    )
    line = judge_line({**j, "engine_starts_per_decision": 7.0, "decisions_per_hour": 15.0})
    assert "7 engine starts" in line and "15 decisions/hour" in line
    assert "no merged win" in judge_line({**j, "machine_s_per_merged_pct": None})

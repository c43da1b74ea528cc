"""What the agent workbench costs and what it saves, on the toy command target.

Three measurements, all on the toy bench of the tests (a speed factor read from ``speed.txt``; the
target's functional test ``python -m py_compile src/model.py``), with the REAL bundled Claude Code CLI
driven by the scripted Messages API on loopback (``tests/messages_api.py``, loaded by file path: the
benchmarks sit below the tests and never import them):

1. The fence per tool call: wall ms of ``Workbench.call`` for read, write, edit, ls, grep and
   ``run true`` (each in the bubblewrap sandbox), against the same operation done directly on the host
   (plain Python file I/O; ``sh -c true``) and against the file tools' own worker run on the host
   without a sandbox (the interpreter start the sandboxed file tools pay too). Calls are interleaved
   round-robin so drifting machine load hits every row alike.
2. A broken change: an episode (``--budget 2``) where the agent proposes a change whose functional
   test fails without trying it (WITHOUT the workbench's ``test``) and fixes it only after the gate's
   verdict, against one where the agent calls ``test``, sees FAIL, fixes and proposes the working
   change (WITH). Harness seconds spent judging proposals that fail functional tests (from the
   history), the agent's workbench seconds, episode wall and time to the merge.
3. ``--agents N`` for N = 1, 2, 4 (budget N, each session: read, edit, ``measure`` 4 pairs, a closing
   JSON line): the episode's wall time against the sum of the sessions' wall times.

    .venv/bin/python benchmarks/agent_workbench.py [--calls 30] [--repeats 2] [--out FILE] [--keep DIR]

It needs bubblewrap (the workbench runs nothing unsandboxed) and the bundled CLI of claude-agent-sdk.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentsearch.workbench import FILES_TOOL, Workbench, sandbox_available  # noqa: E402
from agentsearch.workspace import Workspace  # noqa: E402
from benchmarks.toy import TOY_BENCH, toy_config  # noqa: E402
from history import HistoryLog  # noqa: E402
from history.records.agent_session import AgentSession  # noqa: E402


def _load_messages_api() -> Any:
    """tests/messages_api.py, loaded by path (not as ``tests.messages_api``: benchmarks do not import tests)."""
    path = ROOT / "tests" / "messages_api.py"
    spec = importlib.util.spec_from_file_location("_agentsearch_bench_messages_api", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------------------- the toy target (as tests/conftest.py)
GIT_ENV = {
    "GIT_AUTHOR_NAME": "Bench",
    "GIT_AUTHOR_EMAIL": "bench@example.com",
    "GIT_COMMITTER_NAME": "Bench",
    "GIT_COMMITTER_EMAIL": "bench@example.com",
}


# the tests' toy target, with functional tests and the session's advisory pairs
TEST = f'test = "{sys.executable} -m py_compile src/model.py"'


def clean_env(**extra: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("GIT_")} | extra


def git(repo: Path, *args: str) -> str:
    proc = subprocess.run(
        ["git", "-c", "commit.gpgsign=false", *args], cwd=repo, env=clean_env(**GIT_ENV), capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise RuntimeError(f"git {args} failed: {proc.stderr}")
    return proc.stdout


def make_target(path: Path) -> Path:
    """A git repository with the toy bench, initialised for agentsearch."""
    config = toy_config(5, "\n[agent]\nmax_measure_pairs = 8\n").replace(
        'protected = ["bench/**"]', 'protected = ["bench/**"]\n' + TEST
    )
    files = {"agentsearch.toml": config, "bench/bench.py": TOY_BENCH, "speed.txt": "1.0\n", "src/model.py": "X = 1\n"}
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    for rel, text in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(textwrap.dedent(text))
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "baseline")
    proc = subprocess.run(
        [sys.executable, "-m", "agentsearch.cli", "init", "-C", str(path)],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"agentsearch init failed: {proc.stderr}")
    return path


# ---------------------------------------------------------------------------- small statistics
def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, math.ceil(q * len(s)) - 1))]


def summary(xs: list[float]) -> dict[str, float]:
    return {
        "n": len(xs),
        "median_ms": round(statistics.median(xs), 2),
        "p90_ms": round(pct(xs, 0.9), 2),
        "min_ms": round(min(xs), 2),
        "max_ms": round(max(xs), 2),
    }


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1000, out


# ---------------------------------------------------------------------------- 1. the fence per call
def host_grep(root: Path, pattern: str) -> list[str]:
    rx, hits = re.compile(pattern), []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x != ".git")
        for name in sorted(files):
            p = os.path.join(d, name)
            try:
                text = open(p, encoding="utf-8", errors="replace").read()
            except OSError:
                continue
            hits += [f"{p}:{no}: {line}" for no, line in enumerate(text.splitlines(), 1) if rx.search(line)]
    return hits


def fence(work: Path, calls: int) -> dict[str, Any]:
    repo = make_target(work / "fence")
    ws = Workspace.open(repo)
    bench = Workbench(ws, ws.config(), ws.baseline_commit(), "bench-fence")
    host = work / "host-copy"  # the same files, plain directory on the host
    shutil.copytree(bench.worktree, host, ignore=shutil.ignore_patterns(".git"))
    (host / "notes.txt").write_text("state A\n")
    scratch = work / "worker-io"
    scratch.mkdir()
    try:
        assert bench.call("write", {"path": "notes.txt", "content": "state A\n"}).ok
        flip = {"bench": ["A", "B"], "host": ["A", "B"]}

        def wb_edit() -> Any:
            a, b = flip["bench"]
            flip["bench"].reverse()
            return bench.call("edit", {"path": "notes.txt", "old": f"state {a}", "new": f"state {b}"})

        def host_edit() -> None:
            a, b = flip["host"]
            flip["host"].reverse()
            p = host / "notes.txt"
            p.write_text(p.read_text().replace(f"state {a}", f"state {b}", 1))

        def worker(
            op: str, **req: Any
        ) -> None:  # the sandboxed file tools' worker, run on the host without the sandbox
            rq, an = scratch / "req.json", scratch / "ans.json"
            rq.write_text(json.dumps({"op": op, **req}))
            subprocess.run([sys.executable, str(FILES_TOOL), str(rq), str(an)], cwd=host, check=True)
            json.loads(an.read_text())

        ops: dict[str, dict[str, Callable[[], Any]]] = {
            "read": {
                "workbench": lambda: bench.call("read", {"path": "speed.txt"}),
                "host": lambda: (host / "speed.txt").read_text().splitlines(),
                "host worker": lambda: worker("read", path="speed.txt"),
            },
            "write": {
                "workbench": lambda: bench.call("write", {"path": "src/scratch.py", "content": "Y = 2\n"}),
                "host": lambda: (host / "src" / "scratch.py").write_text("Y = 2\n"),
                "host worker": lambda: worker("write", path="src/scratch.py", content="Y = 2\n"),
            },
            "edit": {
                "workbench": wb_edit,
                "host": host_edit,
                "host worker": lambda: worker("write", path="notes.txt", content="state A\n"),
            },
            "ls": {
                "workbench": lambda: bench.call("ls", {"path": "."}),
                "host": lambda: sorted(os.listdir(host)),
                "host worker": lambda: worker("ls", path="."),
            },
            "grep": {
                "workbench": lambda: bench.call("grep", {"pattern": r"X = \d"}),
                "host": lambda: host_grep(host, r"X = \d"),
                "host worker": lambda: worker("grep", pattern=r"X = \d", path=".", glob="*"),
            },
            "run true": {
                "workbench": lambda: bench.call("run", {"command": "true"}),
                "host": lambda: subprocess.run(["/bin/sh", "-c", "true"], cwd=host, check=True),
            },
            "run python": {
                "workbench": lambda: bench.call("run", {"command": f"{sys.executable} -c pass"}),
                "host": lambda: subprocess.run(["/bin/sh", "-c", f"{sys.executable} -c pass"], cwd=host, check=True),
            },
        }
        samples: dict[str, dict[str, list[float]]] = {op: {k: [] for k in ways} for op, ways in ops.items()}
        for i in range(calls + 3):  # 3 warm-up rounds, not counted
            for op, ways in ops.items():
                for way, fn in ways.items():
                    ms, out = timed(fn)
                    if way == "workbench" and not out.ok:
                        raise RuntimeError(f"workbench {op} failed: {out.text}")
                    if i >= 3:
                        samples[op][way].append(ms)
        recorded = {c.tool: c.seconds for c in bench.calls}  # sanity: the workbench's own account agrees
    finally:
        bench.close()
    rows: dict[str, dict[str, Any]] = {}
    for op, timings in samples.items():
        row: dict[str, Any] = {way: summary(xs) for way, xs in timings.items()}
        row["overhead_median_ms"] = round(row["workbench"]["median_ms"] - row["host"]["median_ms"], 2)
        if "host worker" in row:
            row["sandbox_median_ms"] = round(row["workbench"]["median_ms"] - row["host worker"]["median_ms"], 2)
        rows[op] = row
    return {"calls": calls, "ops": rows, "recorded_tools": sorted(recorded), "wait_polling": wait_polling()}


def wait_polling(reps: int = 7) -> dict[str, dict[str, float]]:
    """How late ``Popen.wait(timeout=...)`` (what ``harness.trials.run_child`` calls) notices a child's end: CPython
    polls with doubling sleeps capped at 50 ms (0.5, 1, 2, ... ms), where ``wait()`` blocks in waitpid."""
    out = {}
    for ms in (20, 34, 70):
        row = {}
        for mode in ("wait()", "wait(timeout)"):
            xs = []
            for _ in range(reps):
                t0 = time.perf_counter()
                p = subprocess.Popen(["sleep", f"{ms / 1000:.3f}"])
                p.wait() if mode == "wait()" else p.wait(timeout=60)
                xs.append((time.perf_counter() - t0) * 1000)
            row[mode] = round(statistics.median(xs), 1)
        out[f"{ms} ms"] = row
    return out


def print_fence(res: dict[str, Any]) -> None:
    print(f"\n1. Fence overhead per tool call ({res['calls']} calls each, interleaved; ms)")
    print(
        f"{'op':<10} {'workbench med':>13} {'p90':>7} {'host med':>9} {'p90':>7} {'overhead':>9} "
        f"{'worker med':>11} {'sandbox':>8}"
    )
    for op, r in res["ops"].items():
        w, h, hw = r["workbench"], r["host"], r.get("host worker")
        worker_med = f"{hw['median_ms']:.1f}" if hw else "-"
        sandbox_med = f"{r['sandbox_median_ms']:.1f}" if hw else "-"
        print(
            f"{op:<10} {w['median_ms']:>13.1f} {w['p90_ms']:>7.1f} {h['median_ms']:>9.3f} {h['p90_ms']:>7.3f} "
            f"{r['overhead_median_ms']:>9.1f} {worker_med:>11} {sandbox_med:>8}"
        )
    print(
        "   a child's end as seen by Popen.wait (median ms): "
        + "; ".join(
            f"sleep {k}: wait() {v['wait()']:.1f}, wait(timeout) {v['wait(timeout)']:.1f}"
            for k, v in res["wait_polling"].items()
        )
    )


# ---------------------------------------------------------------------------- the episodes
WB = "mcp__workbench__"
LESSONS = [{"text": "Lessons:\n- Run the functional tests before proposing."}]
FINAL = '{"title": "Raise the speed factor", "rationale": "fewer steps per op", "category": "config"}'
BROKEN_UNTESTED = [  # proposes a change that does not compile, never having tried it
    {"tool": WB + "edit", "input": {"path": "speed.txt", "old": "1.0", "new": "1.3"}},
    {"tool": WB + "write", "input": {"path": "src/model.py", "content": "X = (\n"}},
    {"text": FINAL},
]
FIXED_AFTER_VERDICT = [  # the next session, after the gate rejected the broken one: the speed change alone
    {"tool": WB + "edit", "input": {"path": "speed.txt", "old": "1.0", "new": "1.3"}},
    {"text": FINAL},
]
TESTED = [  # the same broken change, caught on the workbench and fixed before proposing
    {"tool": WB + "edit", "input": {"path": "speed.txt", "old": "1.0", "new": "1.3"}},
    {"tool": WB + "write", "input": {"path": "src/model.py", "content": "X = (\n"}},
    {"tool": WB + "test", "input": {}},
    {"tool": WB + "write", "input": {"path": "src/model.py", "content": "X = 1\n"}},  # the fix: model.py as it was
    {"tool": WB + "test", "input": {}},
    {"text": FINAL},
]
IDLE = [
    {"tool": WB + "ls", "input": {"path": "src"}},
    {"text": '{"title": "Nothing to do", "rationale": "no opportunity found", "category": "other"}'},
]
INSIGHTS_PROMPT = "statistics of proposals made to speed up"  # the insights pass's prompt (agentsearch.insights)


def measured(k: int) -> list[dict[str, Any]]:
    """Part 3, session k: the same small experiment; speed.txt 1.0 -> 1.0 and k more zeros (a patch of its own, no
    effect: the baseline never moves, so every session and every judging does the same work at any N)."""
    return [
        {"tool": WB + "read", "input": {"path": "speed.txt"}},
        {"tool": WB + "edit", "input": {"path": "speed.txt", "old": "1.0", "new": "1.0" + "0" * k}},
        {"tool": WB + "measure", "input": {"pairs": 4}},
        {"text": f'{{"title": "Respell the speed factor {k}", "rationale": "same value", "category": "config"}}'},
    ]


def measured_script(n: int) -> dict[str, list[dict[str, Any]]]:
    """Routed by the prompt (sessions at once arrive in any order): 'agent session 00k-' is session k."""
    return {f"agent session {k:03d}-": measured(k) for k in range(1, n + 1)} | {INSIGHTS_PROMPT: LESSONS}


def run_episode(api_mod: Any, work: Path, name: str, script: Any, *args: str) -> dict[str, Any]:
    repo = make_target(work / name)
    with api_mod.ScriptedMessagesAPI(script) as api:
        env = clean_env(
            **api_mod.cli_env(api.url, work / f"{name}-clihome"), AGENTSEARCH_LOG_DIR=str(work / f"{name}-logs")
        )
        t0 = time.perf_counter()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "agentsearch.cli",
                "episode",
                "-C",
                str(repo),
                "--proposer",
                "claude",
                "--json",
                *args,
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        wall = time.perf_counter() - t0
        outbound = len(api.outbound)
    if proc.returncode != 0:
        raise RuntimeError(f"episode {name} failed (exit {proc.returncode}): {proc.stderr[-3000:]}")
    entries = list(HistoryLog(Workspace.open(repo).state / "history.jsonl").entries())
    started = next(e.ts for e in entries if e.kind == "episode-started")
    finished = next(e for e in entries if e.kind == "episode-finished")
    created = {e.data["proposal"]: e for e in entries if e.kind == "proposal-created"}
    before = {e.seq: prev.ts for prev, e in zip(entries, entries[1:], strict=False)}
    proposals = []
    for v in (e for e in entries if e.kind == "verdict"):
        c = created[v.data["proposal"]]
        s = AgentSession.of(c.data["meta"])
        proposals.append(
            {
                "proposal": v.data["proposal"],
                "title": v.data["title"],
                "verdict": v.data["verdict"],
                "failed_check": v.data.get("failed_check"),
                "judge_s": round(v.ts - c.ts, 3),  # harness: proposal committed -> verdict recorded
                "eval_wall_s": v.data.get("wall_s"),  # the evaluation's own wall (absent for a proposal with no change)
                "session_s": s.session_s if s else None,
                "tool_seconds": s.tool_seconds if s else None,
                "tools": [c_.tool for c_ in s.calls] if s else [],
                "cost_usd": s.cost_usd if s else None,
                "test_s": round(sum(c_.seconds for c_ in s.calls if c_.tool == "test"), 3) if s else 0.0,
                "measure_s": next((c_.seconds for c_ in s.calls if c_.tool == "measure"), None) if s else None,
                # one session at a time: the record before is the previous verdict (or the start), so this is the whole
                # proposer call: the workbench made, the session, the worktree removed, the diff read
                "propose_s": round(c.ts - before[c.seq], 3),
            }
        )
    merges = [e.ts - started for e in entries if e.kind == "merge"]
    return {
        "wall_s": round(wall, 2),
        "elapsed_s": finished.data.get("elapsed_s"),
        "merged": len(merges),
        "time_to_first_merge_s": round(merges[0], 2) if merges else None,
        "outbound": outbound,
        "proposals": proposals,
        "speed_after": (repo / "speed.txt").read_text().strip(),
        "in_flight_seen": "in flight" in proc.stderr,
    }


def broken(api_mod: Any, work: Path) -> dict[str, Any]:
    out = {}
    for label, script in (
        ("without", [BROKEN_UNTESTED, FIXED_AFTER_VERDICT, LESSONS]),
        ("with", [TESTED, IDLE, LESSONS]),
    ):
        ep = run_episode(api_mod, work, f"broken-{label}", script, "--budget", "2", "--seed", "7")
        ps = ep["proposals"]
        failing = [p for p in ps if p["failed_check"] == "functional-tests"]
        ep["functional_fail_judge_s"] = round(sum(p["judge_s"] for p in failing), 3)
        ep["functional_fail_eval_wall_s"] = round(sum(p["eval_wall_s"] or 0 for p in failing), 3)
        ep["functional_fail_proposals"] = len(failing)
        ep["judge_s_total"] = round(sum(p["judge_s"] for p in ps), 3)
        ep["tool_seconds_total"] = round(sum(p["tool_seconds"] or 0 for p in ps), 3)
        ep["test_calls"] = sum(p["tools"].count("test") for p in ps)
        ep["test_seconds"] = round(sum(p["test_s"] for p in ps), 3)
        ep["session_s_total"] = round(sum(p["session_s"] or 0 for p in ps), 3)
        ep["cost_usd_total"] = round(sum(p["cost_usd"] or 0 for p in ps), 4)
        out[label] = ep
    return out


def print_broken(res: dict[str, Any]) -> None:
    print(
        "\n2. A broken change (src/model.py SyntaxError), --budget 2: "
        "proposed untested vs caught by the workbench's `test`"
    )
    print(
        f"{'agent':<8} {'verdicts':<32} {'func-fail judged':>16} {'harness s on them':>17} {'judging s (all)':>15} "
        f"{'agent tool s':>12} {'agent session s':>15} {'to merge s':>10} {'episode s':>9}"
    )
    for label, ep in res.items():
        v = ", ".join(
            f"{p['verdict']}" + (f"({p['failed_check']})" if p["failed_check"] else "") for p in ep["proposals"]
        )
        print(
            f"{label:<8} {v:<32} {ep['functional_fail_proposals']:>16} {ep['functional_fail_judge_s']:>17.2f} "
            f"{ep['judge_s_total']:>15.2f} "
            f"{ep['tool_seconds_total']:>12.2f} {ep['session_s_total']:>15.2f} "
            f"{ep['time_to_first_merge_s'] or float('nan'):>10.2f} "
            f"{ep['wall_s']:>9.2f}"
        )
    for label, ep in res.items():
        for p in ep["proposals"]:
            print(
                f"   {label:<8} {p['proposal'].split('/')[-1]} {p['title'][:26]:<26} {p['verdict']:<6} "
                f"judged {p['judge_s']:.2f} s "
                f"(eval wall {p['eval_wall_s']}); proposer call {p['propose_s']:.2f} s, session {p['session_s']} s, "
                f"tools {p['tool_seconds']} s: {' '.join(p['tools'])}"
            )


FAILED: list[str] = []  # episodes that ended in an error (their targets are kept)


METRICS = (
    "wall_s",
    "sum_session_s",
    "mean_session_s",
    "max_session_s",
    "mean_measure_s",
    "sum_tool_s",
    "judge_s_total",
)


def concurrency(api_mod: Any, work: Path, ns: tuple[int, ...], repeats: int) -> dict[str, Any]:
    """Each N at once (--agents N) and, for N > 1, the same budget one session at a time (--agents 1);
    ``repeats`` rounds, every configuration once per round (drifting load hits them alike); medians."""
    configs = [(n, agents) for n in ns for agents in sorted({n, 1}, reverse=True)]
    runs: dict[str, list[dict[str, Any]]] = {f"{n}x{a}": [] for n, a in configs}
    errors: dict[str, list[str]] = {k: [] for k in runs}
    for r in range(repeats):
        for n, agents in configs:
            key = f"{n}x{agents}"
            try:
                ep = run_episode(
                    api_mod,
                    work,
                    f"r{r}-budget{n}-agents{agents}",
                    measured_script(n),
                    "--budget",
                    str(n),
                    "--agents",
                    str(agents),
                    "--seed",
                    "11",
                )
            except RuntimeError as exc:  # recorded, and the run goes on (the target is kept for a look)
                errors[key].append(str(exc)[-4000:])
                FAILED.append(f"r{r}-budget{n}-agents{agents}")
                continue
            ps = ep["proposals"]
            sess = [p["session_s"] or 0 for p in ps]
            measure = [p["measure_s"] for p in ps if p["measure_s"] is not None]
            ep.update(
                {
                    "sessions": len(ps),
                    "sum_session_s": round(sum(sess), 3),
                    "max_session_s": round(max(sess), 3),
                    "mean_session_s": round(statistics.mean(sess), 3),
                    "sum_tool_s": round(sum(p["tool_seconds"] or 0 for p in ps), 3),
                    "mean_measure_s": round(statistics.mean(measure), 3) if measure else None,
                    "judge_s_total": round(sum(p["judge_s"] for p in ps), 3),
                    "verdicts": [p["verdict"] + (f"({p['failed_check']})" if p["failed_check"] else "") for p in ps],
                }
            )
            runs[key].append(ep)
    out: dict[str, Any] = {}
    for n, agents in configs:
        key = f"{n}x{agents}"
        done = runs[key]
        row: dict[str, Any] = {"budget": n, "agents": agents, "runs": done, "errors": errors[key], "repeats": len(done)}
        for m in METRICS:
            vals = [float(ep[m]) for ep in done if ep.get(m) is not None]
            row[m] = round(statistics.median(vals), 3) if vals else None
        row["walls"] = [ep["wall_s"] for ep in done]
        row["verdicts"] = sorted({v for ep in done for v in ep["verdicts"]})
        out[key] = row
    for n in ns:
        conc, serial = out.get(f"{n}x{n}"), out.get(f"{n}x1")
        if conc and serial and n > 1 and conc["wall_s"] is not None and serial["wall_s"] is not None:
            conc["serial_wall_s"] = serial["wall_s"]
            conc["saved_s"] = round(serial["wall_s"] - conc["wall_s"], 2)
            conc["saved_by_round_s"] = [
                round(b["wall_s"] - a["wall_s"], 2) for a, b in zip(conc["runs"], serial["runs"], strict=False)
            ]
    return out


def print_concurrency(res: dict[str, Any]) -> None:
    print(
        "\n3. Sessions at once: budget N, --agents N vs --agents 1 "
        "(each session: read, edit, measure 4 pairs, closing JSON); "
        "medians over rounds"
    )
    print(
        f"{'budget':>6} {'agents':>6} {'episode s':>9} {'(each round)':<18} {'sum session s':>13} "
        f"{'mean session s':>14} "
        f"{'max session s':>13} {'mean measure s':>14} {'sum tool s':>10} {'judging s':>9}  verdicts"
    )

    def f(x: Any, w: int) -> str:
        return f"{x:>{w}.2f}" if isinstance(x, (int, float)) else f"{'-':>{w}}"

    for row in res.values():
        for e in row["errors"]:
            print(f"{row['budget']:>6} {row['agents']:>6} FAILED: {e.strip().splitlines()[-1][:200]}")
        if not row["runs"]:
            continue
        each = " ".join(f"{w:.1f}" for w in row["walls"])
        print(
            f"{row['budget']:>6} {row['agents']:>6} {f(row['wall_s'], 9)} {each:<18} {f(row['sum_session_s'], 13)} "
            f"{f(row['mean_session_s'], 14)} {f(row['max_session_s'], 13)} {f(row['mean_measure_s'], 14)} "
            f"{f(row['sum_tool_s'], 10)} "
            f"{f(row['judge_s_total'], 9)}  {', '.join(row['verdicts'])}"
        )
    for row in res.values():
        if "saved_s" in row:
            print(
                f"   budget {row['budget']}: {row['agents']} at once {row['wall_s']:.2f} s "
                f"vs one at a time {row['serial_wall_s']:.2f} s: "
                f"saved {row['saved_s']:.2f} s (by round: {row['saved_by_round_s']}; "
                f"sessions summed {row['sum_session_s']:.2f} s)"
            )


def machine() -> dict[str, Any]:
    ok, why = sandbox_available()
    bwrap = (
        subprocess.run(["bwrap", "--version"], capture_output=True, text=True).stdout.strip()
        if shutil.which("bwrap")
        else ""
    )
    try:
        import claude_agent_sdk

        sdk = getattr(claude_agent_sdk, "__version__", "?")
    except ImportError:
        sdk = "missing"
    return {
        "cpus": os.cpu_count(),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "system": f"{platform.system()} {platform.release()}",
        "sandbox": ok,
        "sandbox_why_not": why,
        "bwrap": bwrap,
        "claude_agent_sdk": sdk,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=30, help="timed calls per operation in part 1 (default 30)")
    ap.add_argument("--agents", default="1,2,4", help="part 3: the N to run (default 1,2,4)")
    ap.add_argument("--repeats", type=int, default=2, help="part 3: rounds of every configuration (default 2)")
    ap.add_argument("--parts", default="1,2,3", help="which parts to run (default 1,2,3)")
    ap.add_argument("--out", type=Path, help="write a JSON summary here")
    ap.add_argument("--keep", type=Path, help="build the targets here and keep them")
    args = ap.parse_args()
    parts = {p.strip() for p in args.parts.split(",")}
    mach = machine()
    if not mach["sandbox"]:
        print(f"no sandbox on this machine: {mach['sandbox_why_not']}", file=sys.stderr)
        return 2
    work = args.keep.resolve() if args.keep else Path(tempfile.mkdtemp(prefix="agentsearch-workbench-"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ["AGENTSEARCH_LOG_DIR"] = str(work / "logs")
    print(
        f"machine: {mach['cpus']} CPUs, load {mach['load_avg']}, {mach['system']}, python {mach['python']}, "
        f"{mach['bwrap']}, "
        f"claude-agent-sdk {mach['claude_agent_sdk']}"
    )
    result: dict[str, Any] = {"machine": mach, "command": " ".join([Path(sys.executable).name, *sys.argv])}
    t0 = time.perf_counter()
    try:
        if "1" in parts:
            result["fence"] = fence(work, args.calls)
            print_fence(result["fence"])
        api_mod = _load_messages_api() if parts & {"2", "3"} else None
        if "2" in parts:
            result["broken"] = broken(api_mod, work)
            print_broken(result["broken"])
        if "3" in parts:
            result["concurrency"] = concurrency(
                api_mod, work, tuple(int(x) for x in args.agents.split(",")), args.repeats
            )
            print_concurrency(result["concurrency"])
    finally:
        if FAILED:
            print(f"\n{len(FAILED)} episode(s) failed ({', '.join(FAILED)}): targets kept in {work}", file=sys.stderr)
        elif not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    result["runtime_s"] = round(time.perf_counter() - t0, 1)
    result["failed_episodes"] = FAILED
    result["machine"]["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    print(
        f"\nbenchmark runtime {result['runtime_s']:.0f} s; load average at the end {result['machine']['load_avg_end']}"
    )
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"summary written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

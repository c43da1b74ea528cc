"""The Claude proposer end to end: `agentsearch episode --proposer claude` with the real bundled Claude
Code CLI, pointed at a scripted Messages API on loopback (tests/messages_api.py). The agent works on
its workbench (test, measure, kernels_bench, ...); what it ran and cost is recorded with the proposal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentsearch.proposers.claude import parse_final
from agentsearch.workspace import Workspace
from history import HistoryLog
from history.records.agent_session import AgentSession

from .conftest import ROOT, TOY_BENCH, make_repo, run_cli, toy_config
from .messages_api import INPUT_TOKENS, OUTPUT_TOKENS, ScriptedMessagesAPI, cli_env

WB = "mcp__workbench__"
WIN = [  # a real win, checked on the workbench first
    {"tool": WB + "read", "input": {"path": "speed.txt"}},
    {"tool": WB + "edit", "input": {"path": "speed.txt", "old": "1.0", "new": "1.3"}},
    {"tool": WB + "test", "input": {}},
    {"tool": WB + "measure", "input": {"pairs": 4}},
    {"tool": WB + "kernels_bench", "input": {"op": "rms_norm", "provider": "mine"}},
    {"tool": WB + "changes", "input": {}},
    {
        "text": 'Raised the engine speed factor.\n{"title": "Raise the speed factor", "rationale": "fewer steps per op", "category": "config"}'
    },
]
BROKEN_THEN_FIXED = [  # a broken change the workbench catches, then a working one
    {"tool": WB + "write", "input": {"path": "src/model.py", "content": "X = (\n"}},
    {"tool": WB + "test", "input": {}},
    {"tool": WB + "write", "input": {"path": "src/model.py", "content": "X = 2\n"}},
    {"tool": WB + "test", "input": {}},
    {"text": '{"title": "Tidy the model constant", "rationale": "no speed change expected", "category": "other"}'},
]
IDLE = [
    {"tool": WB + "ls", "input": {"path": "src"}},
    {"text": '{"title": "Nothing to do", "rationale": "no opportunity found", "category": "other"}'},
]
LESSONS = [
    {"text": "Lessons:\n- Raising the speed factor was a clear win.\n- Editing the benchmark is refused; do not try."}
]
PY_TEST = f"{sys.executable} -m py_compile src/model.py"


def claude_target(tmp_path: Path, agent: str = "") -> Path:
    cfg = toy_config(timeout=5, extra=f"\n[agent]\nmax_measure_pairs = 8\n{agent}").replace(
        'protected = ["bench/**"]', f'protected = ["bench/**"]\ntest = "{PY_TEST}"'
    )
    repo = make_repo(
        tmp_path / "toy",
        {"agentsearch.toml": cfg, "bench/bench.py": TOY_BENCH, "speed.txt": "1.0\n", "src/model.py": "X = 1\n"},
    )
    assert run_cli("init", "-C", str(repo)).returncode == 0
    return repo


def episode(
    repo: Path, api: ScriptedMessagesAPI, tmp_path: Path, *args: str, timeout: float = 600
) -> subprocess.CompletedProcess:
    env = {**os.environ, **cli_env(api.url, tmp_path / "clihome")}
    return subprocess.run(
        [sys.executable, "-m", "agentsearch.cli", "episode", "-C", str(repo), "--proposer", "claude", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def sessions(repo: Path) -> dict[str, tuple[dict, AgentSession]]:
    ws = Workspace.open(repo)
    out = {}
    for e in HistoryLog(ws.state / "history.jsonl").entries():
        if e.kind == "proposal-created":
            s = AgentSession.of(e.data["meta"])
            assert s is not None
            out[e.data["title"]] = (e.data, s)
    return out


def test_parse_final():
    assert parse_final('done.\n{"title": "T", "rationale": "R", "category": "kernel"}')["category"] == "kernel"
    assert parse_final("nothing")["title"] == "agent proposal"


@pytest.mark.claude
def test_agents_experiment_on_the_workbench_and_the_episode_judges_what_they_made(tmp_path):
    repo = claude_target(tmp_path)
    with ScriptedMessagesAPI([WIN, BROKEN_THEN_FIXED, IDLE, LESSONS]) as api:
        proc = episode(repo, api, tmp_path, "--budget", "3", "--seed", "2", "--json")
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        # what the tools answered the agent, as the CLI sent it back to the model
        win_results = [r["content"] for r in api.tool_results(0)]
        fix_results = [r["content"] for r in api.tool_results(1)]
        prompts = [api.main_requests(i)[0] for i in range(3)]
        assert not api.outbound
    good, fixed, idle = out["proposals"]
    assert good["title"] == "Raise the speed factor" and good["verdict"] == "merge" and good["merged"]
    assert fixed["title"] == "Tidy the model constant" and fixed["verdict"] == "reject"
    assert idle["verdict"] == "reject" and "makes no change" in idle["reasons"][0]
    assert (repo / "speed.txt").read_text().strip() == "1.3"

    assert win_results[0].split("\t")[1].strip() == "1.0"  # read
    assert win_results[2].startswith("PASS")  # test
    assert (
        win_results[3].startswith("advisory — not the gate: speed speedup +") and "over 4 pairs" in win_results[3]
    )  # measure
    assert (
        "rms_norm" in win_results[4] or "IR op" in win_results[4] or "not" in win_results[4]
    )  # kernels_bench: no IR ops in a toy
    assert "+1.3" in win_results[5]  # changes
    assert fix_results[1].startswith("FAIL") and "SyntaxError" in fix_results[1] and fix_results[3].startswith("PASS")

    recorded = sessions(repo)
    meta, s = recorded["Raise the speed factor"]
    assert [c.tool for c in s.calls] == ["read", "edit", "test", "measure", "kernels_bench", "changes"]
    assert s.used("test", "measure", "kernels_bench") and [c.pairs for c in s.calls if c.tool == "measure"] == [4]
    assert (
        s.tokens_in == 7 * INPUT_TOKENS
        and s.tokens_out == 7 * OUTPUT_TOKENS
        and s.cost_usd > 0
        and meta["meta"]["cost_usd"] == s.cost_usd
    )
    assert s.tool_seconds > 0 and s.session_s >= s.tool_seconds and s.error == ""
    _, s2 = recorded["Tidy the model constant"]
    assert [c.ok for c in s2.calls if c.tool == "test"] == [False, True]
    # the prompt: the workbench, the workloads, the protected paths; later ones the earlier verdicts (untrusted)
    p0 = json.dumps(prompts[0])
    assert "`measure`" in p0 and "`speed`" in p0 and "bench/**" in p0
    assert "Raise the speed factor" in json.dumps(prompts[1]) and "untrusted-data-" in json.dumps(prompts[1])
    # the insights got an LLM pass: short lessons came back
    md = (Workspace.open(repo).state / "insights.md").read_text()
    assert "## Notes" in md and "- Raising the speed factor was a clear win." in md
    # what the sessions cost and bought: dollars and machine-seconds per merged percent
    ag = out["agents"]
    assert ag["sessions"] == 3 and ag["calls"]["test"] == 3 and ag["calls"]["measure"] == 1 and ag["merged_pct"] > 20
    assert (
        ag["usd_per_merged_pct"] == round(ag["cost_usd"] / ag["merged_pct"], 6) and ag["machine_s_per_merged_pct"] > 0
    )
    assert "## Agent sessions" in md and "per merged percent" in md
    hist = run_cli("history", "-C", str(repo))
    assert hist.returncode == 0 and "agents: 3 sessions" in hist.stdout and "per merged percent" in hist.stdout
    # the report shows what each session ran and what it cost
    rep = run_cli("report", "-C", str(repo), "001")
    assert rep.returncode == 0 and "agent session" in rep.stdout and "measure" in rep.stdout


@pytest.mark.claude
def test_two_agents_at_once_end_in_the_same_verdicts(tmp_path):
    verdicts = {}
    for agents in ("1", "2"):
        repo = claude_target(tmp_path / agents)
        # scripts routed by the session's label in its prompt (sessions 001 and 002), not by arrival order
        with ScriptedMessagesAPI(
            {"agent session 001-": WIN, "agent session 002-": IDLE, "Below are statistics": LESSONS}
        ) as api:
            proc = episode(repo, api, tmp_path / agents, "--budget", "2", "--seed", "5", "--agents", agents, "--json")
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        verdicts[agents] = sorted((p["title"], p["verdict"], p["merged"]) for p in out["proposals"])
        assert ("(2 in flight)" in proc.stderr) == (agents == "2")  # the second session started before the first ended
        assert len(sessions(repo)) == 2
        why = (
            [(p["title"], p["reasons"]) for p in out["proposals"]],
            {t: (s.error, [c.tool for c in s.calls]) for t, (_, s) in sessions(repo).items()},
        )
        assert verdicts[agents] == sorted(
            [("Raise the speed factor", "merge", True), ("Nothing to do", "reject", False)]
        ), (agents, why)
    assert (
        verdicts["1"]
        == verdicts["2"]
        == sorted([("Raise the speed factor", "merge", True), ("Nothing to do", "reject", False)])
    )


@pytest.mark.claude
def test_cost_budget_stops_the_episode(tmp_path):
    repo = claude_target(tmp_path)
    with ScriptedMessagesAPI([IDLE] * 9) as api:
        proc = episode(repo, api, tmp_path, "--budget", "9", "--cost-budget", "0.000001", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["judged"] == 1 and out["reason"].startswith("cost budget reached")


@pytest.mark.claude
def test_missing_credentials_is_one_line(tmp_path):
    repo = make_repo(
        tmp_path / "toy", {"agentsearch.toml": toy_config(timeout=5), "bench/bench.py": TOY_BENCH, "speed.txt": "1.0\n"}
    )
    assert run_cli("init", "-C", str(repo)).returncode == 0
    env = {k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN")}
    proc = subprocess.run(
        [sys.executable, "-m", "agentsearch.cli", "episode", "-C", str(repo), "--proposer", "claude"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "ANTHROPIC_API_KEY" in proc.stderr and proc.stderr.count("\n") == 1


@pytest.mark.claude
def test_a_rejected_proposal_is_revised_from_its_change_and_its_verdict(tmp_path):
    repo = claude_target(tmp_path, "revisions = 1\n")
    broken = [  # proposes a broken change without testing it: the gate's functional tests reject it
        {"tool": WB + "write", "input": {"path": "src/model.py", "content": "X = (\n"}},
        {"tool": WB + "edit", "input": {"path": "speed.txt", "old": "1.0", "new": "1.3"}},
        {"text": '{"title": "Faster, untested", "rationale": "speed factor and a model tweak", "category": "config"}'},
    ]
    revision = [  # starts from that change, sees what the gate said, fixes it
        {"tool": WB + "read", "input": {"path": "src/model.py"}},
        {"tool": WB + "write", "input": {"path": "src/model.py", "content": "X = 1\n"}},
        {"tool": WB + "test", "input": {}},
        {"text": '{"title": "Faster, fixed", "rationale": "the speed factor alone", "category": "config"}'},
    ]
    with ScriptedMessagesAPI([broken, revision, LESSONS]) as api:
        proc = episode(repo, api, tmp_path, "--budget", "2", "--json")
        assert proc.returncode == 0, proc.stderr
        prompt = json.dumps(api.main_requests(1)[0])
        read = api.tool_results(1)[0]["content"]
        tested = api.tool_results(1)[2]["content"]
    first, second = json.loads(proc.stdout)["proposals"]
    assert first["verdict"] == "reject" and "functional-tests" in first["reasons"][0]
    assert second["verdict"] == "merge" and second["merged"] and second["parent"] == first["proposal"]
    assert "You are revising proposal" in prompt and "functional-tests" in prompt and "Faster, untested" in prompt
    assert "X = (" in read and tested.startswith("PASS")
    assert (repo / "speed.txt").read_text().strip() == "1.3" and (repo / "src" / "model.py").read_text() == "X = 1\n"
    meta = sessions(repo)["Faster, fixed"][0]["meta"]
    assert meta["parent"] == first["proposal"] and meta["revision"] == 1
    rep = run_cli("report", "-C", str(repo), second["proposal"].split("/")[-1])
    assert rep.returncode == 0 and "A revision (number 1) of proposal" in rep.stdout


@pytest.mark.claude
def test_a_killed_episode_resumes_with_new_sessions_and_nothing_left_running(tmp_path):
    """SIGKILL during an agent session (its `run` still going): nothing of the session outlives the
    orchestrator, and `--resume` clears its workbench and starts a new session for the proposal not made."""
    import signal
    import time

    repo = claude_target(tmp_path)
    marker = f"sleep 7{time.time_ns() % 10000:04d}"
    slow = [
        {"tool": WB + "edit", "input": {"path": "speed.txt", "old": "1.0", "new": "1.3"}},
        {"tool": WB + "run", "input": {"command": marker, "timeout_s": 200}},
        WIN[-1],
    ]
    with ScriptedMessagesAPI([slow]) as api:
        env = {**os.environ, **cli_env(api.url, tmp_path / "clihome")}
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agentsearch.cli",
                "episode",
                "-C",
                str(repo),
                "--proposer",
                "claude",
                "--budget",
                "1",
                "--json",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        deadline = time.monotonic() + 120
        while subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode != 0:
            assert time.monotonic() < deadline and proc.poll() is None, (
                proc.stderr.read().decode() if proc.poll() is not None else "no run"
            )
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    ws = Workspace.open(repo)
    assert list(ws.worktrees.glob("agent-*"))  # the killed session's workbench, left behind
    time.sleep(2)
    assert subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 1  # its `run` died with it
    leftovers = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cwd_under(p, ws.common)]
    assert not leftovers, leftovers  # nor the CLI: nothing runs in the workbench any more
    with ScriptedMessagesAPI([WIN, LESSONS]) as api:
        env = {**os.environ, **cli_env(api.url, tmp_path / "clihome")}
        resumed = subprocess.run(
            [sys.executable, "-m", "agentsearch.cli", "episode", "-C", str(repo), "--resume", "--json"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert resumed.returncode == 0, resumed.stderr
    out = json.loads(resumed.stdout)
    assert [(p["title"], p["verdict"]) for p in out["proposals"]] == [("Raise the speed factor", "merge")]
    assert not list(ws.worktrees.glob("agent-*")) and not list((ws.state / "tmp").glob("agent-*"))


def _cwd_under(proc: Path, root: Path) -> bool:
    try:
        return str((proc / "cwd").resolve()).startswith(str(root.resolve()))
    except OSError:
        return False

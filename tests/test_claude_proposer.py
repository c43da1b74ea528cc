"""The Claude proposer through the real claude-agent-sdk code path, offline (scripted transport)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from agentsearch.proposers.claude import ToolGuard, parse_final
from agentsearch.workspace import Workspace
from history import HistoryLog

from .conftest import ROOT, TOY_BENCH, make_repo, run_cli, toy_config


def test_tool_guard_keeps_the_agent_inside_its_worktree(tmp_path):
    wt = tmp_path / "wt"
    (wt / "src").mkdir(parents=True)
    g = ToolGuard(wt, ("agentsearch.toml", "bench/**"))
    assert g.check("Edit", {"file_path": str(wt / "src" / "x.py")}) == ""
    assert g.check("Read", {"file_path": "src/x.py"}) == ""
    assert "outside" in g.check("Read", {"file_path": "/etc/passwd"})
    assert "outside" in g.check("Write", {"file_path": str(wt / ".." / "escape.txt")})
    assert "protected" in g.check("Edit", {"file_path": "bench/bench.py"})
    assert "protected" in g.check("Write", {"file_path": str(wt / "agentsearch.toml")})
    assert g.check("Read", {"file_path": "bench/bench.py"}) == ""  # reading the bench is fine
    assert "git directory" in g.check("Read", {"file_path": ".git/config"})
    assert "not available" in g.check("WebFetch", {"url": "https://example.com"})
    assert "not allowed" in g.check("Bash", {"command": "curl https://example.com"})
    assert "not allowed" in g.check("Bash", {"command": "git diff; rm -rf /"})
    assert g.check("Bash", {"command": "git diff"}) == ""
    assert parse_final('done.\n{"title": "T", "rationale": "R", "category": "kernel"}')["category"] == "kernel"
    assert parse_final("nothing")["title"] == "agent proposal"


SCRIPT = [
    [  # a real win: the agent reads, edits the speed factor, explains
        {"tool": "Read", "input": {"file_path": "speed.txt"}},
        {"tool": "Edit", "input": {"file_path": "speed.txt", "old_string": "1.0", "new_string": "1.3"}},
        {"text": 'Raised the engine speed factor.\n{"title": "Raise the speed factor", "rationale": "fewer steps per op", "category": "config"}'},
    ],
    [  # tries to cheat: edit the protected bench, write outside, read the system, use the network
        {"tool": "Edit", "input": {"file_path": "bench/bench.py", "old_string": "1000.0", "new_string": "9000.0"}},
        {"tool": "Write", "input": {"file_path": "../escape.txt", "content": "x"}},
        {"tool": "Read", "input": {"file_path": "/etc/hostname"}},
        {"tool": "Bash", "input": {"command": "curl https://example.com"}},
        {"text": '{"title": "Faster bench", "rationale": "changed the benchmark", "category": "other"}'},
    ],
    [  # finds nothing
        {"tool": "Read", "input": {"file_path": "src/model.py"}},
        {"text": '{"title": "Nothing to do", "rationale": "no opportunity found", "category": "other"}'},
    ],
    [  # the LLM pass over the insights at the end of the episode
        {"text": "Lessons:\n- Raising the speed factor was a clear win.\n- Editing the benchmark is refused; do not try."},
    ],
]


def test_claude_episode_through_the_sdk_merges_the_win_and_refuses_the_cheat(tmp_path):
    repo = make_repo(tmp_path / "toy", {"agentsearch.toml": toy_config(timeout=5), "bench/bench.py": TOY_BENCH, "speed.txt": "1.0\n", "src/model.py": "X = 1\n"})
    assert run_cli("init", "-C", str(repo)).returncode == 0
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    env = {**os.environ, "AGENTSEARCH_AGENT_TRANSPORT": "tests.scripted_agent:factory", "AGENTSEARCH_TEST_AGENT_SCRIPT": str(script)}
    env.pop("ANTHROPIC_API_KEY", None)
    proc = subprocess.run([sys.executable, "-m", "agentsearch.cli", "episode", "-C", str(repo), "--proposer", "claude", "--budget", "3",
                           "--seed", "2", "--json"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    good, cheat, idle = out["proposals"]
    assert good["title"] == "Raise the speed factor" and good["verdict"] == "merge" and good["merged"]
    assert cheat["verdict"] == "reject" and "makes no change" in cheat["reasons"][0]
    assert idle["verdict"] == "reject" and "makes no change" in idle["reasons"][0]
    assert "9000" not in (repo / "bench" / "bench.py").read_text() and not (tmp_path / "toy" / ".." / "escape.txt").exists()
    assert (repo / "speed.txt").read_text().strip() == "1.3"

    ws = Workspace.open(repo)
    created = {e.data["title"]: e.data for e in HistoryLog(ws.state / "history.jsonl").entries() if e.kind == "proposal-created"}
    meta = created["Raise the speed factor"]["meta"]
    assert meta["cost_usd"] == 0.0125 and meta["tokens_in"] == 1200 and meta["tokens_out"] == 340 and meta["denied"] == []
    assert created["Raise the speed factor"]["category"] == "config" and created["Raise the speed factor"]["proposer"] == "claude"
    denied = created["Faster bench"]["meta"]["denied"]
    assert any("protected" in d for d in denied) and any("outside" in d for d in denied)
    assert any(d.startswith("Bash") for d in denied) and len(denied) == 4
    # the prompt carried the workloads, the protected paths and, for later sessions, the earlier verdicts
    p0 = Path(str(script) + ".prompt0").read_text()
    assert "`speed`" in p0 and "bench/**" in p0 and '"category"' in p0
    p1 = Path(str(script) + ".prompt1").read_text()
    assert "Raise the speed factor" in p1 and "merge" in p1
    p2 = Path(str(script) + ".prompt2").read_text()
    assert "Faster bench" in p2 and "Recent rejections" in p2
    # the insights got an LLM pass: the statistics went in, short lessons came back
    assert "What worked" in Path(str(script) + ".prompt3").read_text()
    md = (ws.state / "insights.md").read_text()
    assert "## Notes" in md and "- Raising the speed factor was a clear win." in md


def test_cost_budget_stops_the_episode(tmp_path):
    repo = make_repo(tmp_path / "toy", {"agentsearch.toml": toy_config(timeout=5), "bench/bench.py": TOY_BENCH, "speed.txt": "1.0\n", "src/model.py": "X = 1\n"})
    assert run_cli("init", "-C", str(repo)).returncode == 0
    script = tmp_path / "script.json"
    script.write_text(json.dumps([SCRIPT[2]]))
    env = {**os.environ, "AGENTSEARCH_AGENT_TRANSPORT": "tests.scripted_agent:factory", "AGENTSEARCH_TEST_AGENT_SCRIPT": str(script)}
    proc = subprocess.run([sys.executable, "-m", "agentsearch.cli", "episode", "-C", str(repo), "--proposer", "claude", "--budget", "9",
                           "--cost-budget", "0.02", "--json"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["judged"] == 2 and out["reason"].startswith("cost budget reached")


def test_missing_credentials_is_one_line(tmp_path):
    repo = make_repo(tmp_path / "toy", {"agentsearch.toml": toy_config(timeout=5), "bench/bench.py": TOY_BENCH, "speed.txt": "1.0\n"})
    assert run_cli("init", "-C", str(repo)).returncode == 0
    env = {k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN", "AGENTSEARCH_AGENT_TRANSPORT")}
    proc = subprocess.run([sys.executable, "-m", "agentsearch.cli", "episode", "-C", str(repo), "--proposer", "claude"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "ANTHROPIC_API_KEY" in proc.stderr and proc.stderr.count("\n") == 1

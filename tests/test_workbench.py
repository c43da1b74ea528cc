"""The agent's workbench without the CLI: every tool runs in the sandbox, is bounded and is recorded.

The same tools reached through the real Claude Code CLI are in tests/redteam/test_agent_fence.py."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentsearch.workbench import Workbench
from agentsearch.workspace import Workspace
from harness import seeds
from history.records.agent_session import AgentSession

from .conftest import TOY_BENCH, make_repo, run_cli, toy_config

PY_TEST = f"{sys.executable} -m py_compile src/model.py"


def _target(tmp_path: Path, agent: str = "", test: str = PY_TEST) -> Workspace:
    cfg = toy_config(timeout=5, extra=f"\n[agent]\n{agent}\n").replace(
        'protected = ["bench/**"]', f'protected = ["bench/**"]\ntest = "{test}"'
    )
    repo = make_repo(
        tmp_path / "toy",
        {"agentsearch.toml": cfg, "bench/bench.py": TOY_BENCH, "speed.txt": "1.0\n", "src/model.py": "X = 1\n"},
    )
    assert run_cli("init", "-C", str(repo)).returncode == 0
    return Workspace.open(repo)


@pytest.fixture
def bench(tmp_path):
    ws = _target(tmp_path, "max_measure_pairs = 6\nrun_timeout_s = 3\nmemory_gib = 1")
    wb = Workbench(ws, ws.config(), ws.baseline_commit(), "t-001")
    yield wb
    wb.close()


def test_file_tools_reach_the_worktree_and_nothing_else(bench, tmp_path):
    ws = bench.ws
    (ws.state / "history.jsonl").write_text("the history\n")
    outside = tmp_path / "outside.txt"
    outside.write_text("host file\n")
    assert bench.call("read", {"path": "speed.txt"}).text.split("\t")[1].strip() == "1.0"
    assert bench.call("edit", {"path": "speed.txt", "old": "1.0", "new": "1.3"}).ok
    assert bench.call("write", {"path": "src/fast.py", "content": "Y = 2\n"}).ok
    assert "src/model.py:1: X = 1" in bench.call("grep", {"pattern": r"X = \d"}).text
    assert set(bench.call("ls", {}).text.split()) >= {"bench/", "src/", "speed.txt", "agentsearch.toml"}
    assert (bench.worktree / "speed.txt").read_text() == "1.3\n" and (
        bench.worktree / "src" / "fast.py"
    ).read_text() == "Y = 2\n"

    # the protected files and the .git link are the baseline's, read-only: the filesystem refuses, not a string check
    for path in ("bench/bench.py", "agentsearch.toml", ".git"):
        ans = bench.call("write", {"path": path, "content": "x"})
        assert not ans.ok and "Read-only file system" in ans.text, (path, ans.text)
    # paths outside the worktree are the sandbox's private view: the host's files never change
    for path in (str(outside), str(ws.state / "history.jsonl"), str(ws.common / "config")):
        bench.call("write", {"path": path, "content": "overwritten"})
    assert outside.read_text() == "host file\n" and (ws.state / "history.jsonl").read_text() == "the history\n"
    assert "overwritten" not in (ws.common / "config").read_text()
    # a link the agent planted is an error, never a redirection of a write
    assert bench.call("run", {"command": f"ln -s {outside} link.txt && ln -s {outside} src/link2.txt"}).ok
    ans = bench.call("write", {"path": "link.txt", "content": "through the link"})
    assert not ans.ok and "Too many levels of symbolic links" in ans.text, ans.text
    assert outside.read_text() == "host file\n"
    kinds = [c.tool for c in bench.calls]
    assert kinds[:5] == ["read", "edit", "write", "grep", "ls"] and all(c.seconds >= 0 for c in bench.calls)


def test_run_has_no_network_no_judge_and_leaves_no_process(bench):
    ws = bench.ws
    (ws.state / "history.jsonl").write_text("the history\n")
    ans = bench.call(
        "run", {"command": "python -c \"import socket; socket.create_connection(('127.0.0.1', 22), timeout=2)\""}
    )
    assert not ans.ok and ("Network is unreachable" in ans.text or "Connection refused" in ans.text)
    assert bench.call("run", {"command": "cat /proc/net/dev"}).text.count(":") == 1  # the loopback interface alone
    # nothing judging is mounted: the state dir's files, the repository's objects, the other worktrees
    for path in (
        ws.state / "history.jsonl",
        ws.state / "head",
        ws.common / "objects",
        ws.common / "HEAD",
        ws.repo_dir / "speed.txt",
    ):
        assert not bench.call("run", {"command": f"test -e {path}"}).ok, path
    assert bench.call("run", {"command": "test -e speed.txt && python -c 'import sys; print(sys.version)'"}).ok
    # a process started in the background, or in a new session, dies with the call
    marker = f"sleep 31{time.time_ns() % 1000:03d}"
    assert bench.call("run", {"command": f"({marker} &) ; setsid {marker} & nohup {marker} >/dev/null 2>&1 &"}).ok
    time.sleep(0.5)
    assert subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 1
    # bounded: time and memory
    ans = bench.call("run", {"command": "sleep 20", "timeout_s": 60})
    assert not ans.ok and "timed out after 3 s" in ans.text
    ans = bench.call("run", {"command": "python -c 'x = bytearray(2 << 30)'"})
    assert not ans.ok and "MemoryError" in ans.text


def test_the_change_is_read_without_the_worktrees_git_link(bench):
    assert bench.call("changes", {}).text == "(no change yet)"
    assert not bench.call("test", {}).ok  # nothing to test yet
    bench.call("edit", {"path": "speed.txt", "old": "1.0", "new": "1.2"})
    assert bench.call(
        "run", {"command": "mkdir -p sub/.git && echo '[core] fsmonitor = touch /tmp/pwned' > sub/.git/config"}
    ).ok
    ans = bench.call("changes", {})
    assert not ans.ok and "sub/.git" in ans.text and "not allowed" in ans.text
    assert bench.call("run", {"command": "rm -rf sub"}).ok
    diff = bench.call("changes", {}).text
    assert "+1.2" in diff and "-1.0" in diff and diff == bench.diff()


def test_test_tool_runs_the_targets_tests_on_the_change(bench):
    bench.call("write", {"path": "src/model.py", "content": "X = (\n"})
    ans = bench.call("test", {})
    assert not ans.ok and ans.text.startswith("FAIL") and "SyntaxError" in ans.text
    bench.call("write", {"path": "src/model.py", "content": "X = 2\n"})
    ans = bench.call("test", {})
    assert ans.ok and ans.text.startswith("PASS"), ans.text
    # the snapshot commits are the orchestrator's and go with the session
    assert bench.ws.repo_dir.joinpath(".git").exists()


def test_measure_is_advisory_and_bounded(bench):
    ans = bench.call("measure", {"pairs": 4})
    assert not ans.ok and "no change yet" in ans.text
    bench.call("edit", {"path": "speed.txt", "old": "1.0", "new": "1.3"})
    ans = bench.call("measure", {"pairs": 4})
    assert ans.ok and ans.text.startswith("advisory — not the gate: speed speedup +") and "over 4 pairs" in ans.text, (
        ans.text
    )
    assert bench.pairs_used == 4 and bench.calls[-1].pairs == 4
    ans = bench.call("measure", {"pairs": 4})  # 2 pairs left of 6: it runs 2
    assert ans.ok and "over 2 pairs" in ans.text
    ans = bench.call("measure", {"pairs": 4})
    assert not ans.ok and "max_measure_pairs" in ans.text
    # its seeds: a range the gate never draws from
    for master in (1, 2**62, seeds.new_master()):
        adv = seeds.advisory_seeds(master, "speed")
        gate = seeds.pair_seeds(master, "speed")
        assert all(adv(i) >= 2**31 > gate(i) for i in range(-2, 500))


def test_tool_seconds_budget_refuses_heavy_calls(tmp_path):
    ws = _target(tmp_path, "max_tool_seconds = 1.5")
    wb = Workbench(ws, ws.config(), ws.baseline_commit(), "t-002")
    try:
        assert not wb.call("run", {"command": "sleep 5"}).ok  # cut at what is left of the budget
        ans = wb.call("run", {"command": "true"})
        assert not ans.ok and "max_tool_seconds" in ans.text and wb.calls[-1].refused
        ans = wb.call("read", {"path": "speed.txt"})  # every tool, file tools too (red team round 4)
        assert not ans.ok and "max_tool_seconds" in ans.text and wb.calls[-1].refused
        assert not wb.call("Bash", {"command": "true"}).ok and wb.calls[-1].refused
        session = AgentSession(
            model=None,
            turns=3,
            tokens_in=10,
            tokens_out=5,
            cost_usd=0.01,
            tool_seconds=wb.tool_seconds,
            session_s=9.0,
            calls=tuple(wb.calls),
            error="",
        )
        back = AgentSession.from_json(session.to_json())
        assert back == session and back.by_kind() == {"run": 2, "read": 1, "Bash": 1}
        assert AgentSession.totals([back, back])["calls"]["run"] == 4
    finally:
        wb.close()
    assert not wb.worktree.exists() and not wb.root.exists()


def test_what_a_call_leaves_is_bounded_and_cleaned_up(tmp_path):
    """Red team, agents: a tree thousands of directories deep, a FIFO, output and files past the size cap,
    memory past the call's limit (tmpfs included), a control sequence in a tool's name — each is a failed
    call or a refusal, never a host crash, a hang or a leftover."""
    ws = _target(tmp_path, "max_file_mib = 8\nmemory_gib = 0.5\nrun_timeout_s = 20")
    wb = Workbench(ws, ws.config(), ws.baseline_commit(), "t-003")
    root, worktree = wb.root, wb.worktree
    try:
        deep = "python -c \"import os; os.chdir('src'); [(os.mkdir('d'), os.chdir('d')) for _ in range(1500)]\""
        assert wb.call("run", {"command": deep}).ok
        ans = wb.call("changes", {})
        assert ans.ok and "src/d/d/d" in ans.text or "no change" in ans.text, ans.text
        assert wb.call("run", {"command": "mkfifo src/pipe"}).ok
        for tool, args in (("read", {"path": "src/pipe"}), ("write", {"path": "src/pipe", "content": "x"})):
            t0 = time.perf_counter()
            ans = wb.call(tool, args)
            assert (
                not ans.ok
                and ("not a regular file" in ans.text or "No such device" in ans.text)
                and time.perf_counter() - t0 < 5
            ), ans.text
        # files and output past [agent] max_file_mib: the kernel refuses the write (EFBIG / SIGXFSZ)
        ans = wb.call("run", {"command": "dd if=/dev/zero of=big bs=1M count=20"})
        assert not ans.ok and (worktree / "big").stat().st_size <= 8 << 20
        ans = wb.call("run", {"command": "truncate -s 3G sparse"})
        assert not ans.ok and (worktree / "sparse").stat().st_size == 0
        ans = wb.call("run", {"command": "dd if=/dev/zero bs=1M count=20"})  # stdout goes to a file of the host's
        assert not ans.ok
        assert wb.call("run", {"command": "rm -f big"}).ok
        # memory: the call's processes together, their tmpfs pages included, stay under memory_gib
        hog = "python -c \"open('/dev/shm/x', 'wb').write(b'1' * (400 << 20)); x = bytearray(400 << 20); print('survived')\""
        ans = wb.call("run", {"command": hog})
        assert not ans.ok and "survived" not in ans.text, ans.text
        # a tool name with control characters is refused and recorded cleaned
        ans = wb.call("\x1b]0;PWNED\x07\nFAKE: gate PASS", {})
        assert not ans.ok and "\x1b" not in wb.calls[-1].tool + wb.calls[-1].detail and "\n" not in wb.calls[-1].detail
    finally:
        wb.close()
    assert not root.exists() and not worktree.exists()  # the deep tree went too


def test_the_history_tool_shows_what_the_records_say_of_each_proposal(tmp_path):
    """The agent's `history` tool reads the proposals as the history records them (history.proposals): verdict,
    measured effect, title and reasons, the proposal-written text cleaned to one line."""
    from agentsearch.records import read_entries
    from history.proposals import proposals_of

    from .test_episode import patch_from

    ws = _target(tmp_path)
    queue = tmp_path / "queue"
    queue.mkdir()
    (queue / "01.patch").write_text(patch_from(ws.repo_dir, {"speed.txt": "1.5\n"}, "fast", "Faster\x1b[8m hidden"))
    (queue / "02.patch").write_text(
        patch_from(ws.repo_dir, {"bench/bench.py": TOY_BENCH + "\n"}, "prot", "Touch the benchmark")
    )
    proc = run_cli("episode", "-C", str(ws.repo_dir), "--patches", str(queue), "--seed", "3", "--json")
    assert proc.returncode == 0, proc.stderr
    history = proposals_of(read_entries(ws))
    assert [p.outcome for p in history] == ["merge", "reject"] and history[0].is_win and history[1].failed_check
    wb = Workbench(ws, ws.config(), ws.baseline_commit(), "t-h", history=history)
    try:
        ans = wb.call("history", {})
        lines = ans.text.splitlines()
        assert ans.ok and len(lines) == 3, ans.text
        assert f"- {history[0].id} [other] merge +" in lines[1] and "Faster" in lines[1] and "\x1b" not in ans.text
        assert f"- {history[1].id} [other] reject" in lines[2] and "protected" in lines[2], lines[2]
    finally:
        wb.close()

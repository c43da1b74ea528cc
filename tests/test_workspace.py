from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agentsearch.errors import CasError, LockedError, TargetError
from agentsearch.globs import matches
from agentsearch.workspace import Workspace

from .conftest import ROOT, commit, git, make_repo, run_cli, toy_config, write


def test_glob_semantics():
    assert matches("bench/run.sh", "bench/**")
    assert matches("bench/a/b/c.py", "bench/**")
    assert not matches("benchmarks/x.py", "bench/**")
    assert matches("src/kernels/a.cu", "**/*.cu")
    assert matches("a.cu", "**/*.cu")
    assert not matches("src/a.py", "*.py")  # * does not cross directories
    assert matches("a.py", "*.py")
    assert matches("data/corpus.jsonl", "data")  # a directory protects everything below


def test_init_validates_target(tmp_path, toy_target):
    with pytest.raises(TargetError, match="not a git repository"):
        Workspace.init(tmp_path)
    write(toy_target, {"speed.txt": "2.0\n"})
    with pytest.raises(TargetError, match="uncommitted changes"):
        Workspace.init(toy_target)
    git(toy_target, "checkout", "-q", "--", "speed.txt")
    ws = Workspace.init(toy_target)
    assert ws.state == toy_target / ".git" / "agentsearch"
    assert (ws.state / "state.json").exists()
    # the state dir is outside every worktree
    assert not str(ws.state).startswith(str(ws.worktrees))


def test_init_needs_baseline_branch_and_config(tmp_path):
    repo = make_repo(
        tmp_path / "r", {"agentsearch.toml": toy_config().replace('baseline = "main"', 'baseline = "release"')}
    )
    with pytest.raises(TargetError, match="baseline branch 'release' does not exist"):
        Workspace.init(repo)
    bare = make_repo(tmp_path / "n", {"README": "x"})
    with pytest.raises(TargetError, match="no agentsearch.toml committed"):
        Workspace.init(bare)


def test_cli_non_git_target_one_line(tmp_path):
    proc = run_cli("init", "-C", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "not a git repository" in proc.stderr


def test_proposal_branch_worktree_and_trailers(toy_target):
    ws = Workspace.init(toy_target)
    base = ws.baseline_commit()
    p = ws.create_proposal("e1", 7, "Faster decode: fuse norm!")
    assert p.branch == "agentsearch/e1/007-faster-decode-fuse-norm"
    assert p.worktree.is_dir() and (p.worktree / "speed.txt").read_text() == "1.0\n"
    assert p.base == base
    assert ws.commit_proposal(p, "nothing") is None  # no change, no commit
    (p.worktree / "speed.txt").write_text("1.5\n")
    sha = ws.commit_proposal(p, "Faster decode", "because", proposer="patches")
    msg = git(toy_target, "log", "-1", "--format=%B", sha)
    assert "Agentsearch-Proposal: e1/007" in msg
    assert "Agentsearch-Episode: e1" in msg
    assert f"Agentsearch-Baseline: {base}" in msg
    assert git(toy_target, "rev-parse", p.branch).strip() == sha
    assert git(toy_target, "log", "-1", "--format=%an", sha).strip() == "agentsearch"
    ws.remove_worktree(p.worktree)
    assert not p.worktree.exists()
    assert str(p.worktree) not in git(toy_target, "worktree", "list")


@pytest.mark.parametrize(
    "change, expected",
    [
        (lambda r: write(r, {"bench/bench.py": "# cheat\n"}), [("bench/bench.py", "M")]),
        (lambda r: git(r, "rm", "-q", "bench/bench.py"), [("bench/bench.py", "D")]),
        (lambda r: git(r, "mv", "bench/bench.py", "fast.py"), [("bench/bench.py", "R")]),
        (lambda r: git(r, "mv", "src/model.py", "bench/model.py"), [("bench/model.py", "R")]),
        (lambda r: write(r, {"agentsearch.toml": "# gone\n"}), [("agentsearch.toml", "M")]),
        (lambda r: write(r, {"src/model.py": "X = 2\n"}), []),
    ],
)
def test_protected_path_detection(toy_target, change, expected):
    ws = Workspace.init(toy_target)
    base = ws.baseline_commit()
    git(toy_target, "checkout", "-q", "-b", "cand")
    change(toy_target)
    git(toy_target, "add", "-A")
    git(toy_target, "commit", "-q", "-m", "c")
    cand = git(toy_target, "rev-parse", "HEAD").strip()
    git(toy_target, "checkout", "-q", "main")
    got = sorted((v.path, v.status) for v in ws.protected_violations(base, cand))
    assert got == sorted(expected)


def test_cas_merge_and_moved_baseline(toy_target):
    ws = Workspace.init(toy_target)
    base = ws.baseline_commit()
    cand = commit(toy_target, {"speed.txt": "1.3\n"}, "fast", branch="fast")
    merged = ws.merge(cand, base, "agentsearch: merge fast\n\nspeedup +30%")
    assert ws.baseline_commit() == merged
    parents = git(toy_target, "log", "-1", "--format=%P", merged).split()
    assert parents == [base, cand]
    assert "speedup +30%" in git(toy_target, "log", "-1", "--format=%B", merged)
    # the checked-out main follows the merge (its files are updated, tree stays clean)
    assert (toy_target / "speed.txt").read_text() == "1.3\n"
    assert git(toy_target, "status", "--porcelain") == ""
    # a second candidate measured against the old baseline is refused: the baseline moved
    cand2 = commit(toy_target, {"src/model.py": "X = 3\n"}, "other", branch="other", start=merged)
    with pytest.raises(CasError, match="moved"):
        ws.merge(cand2, base, "stale")
    assert ws.baseline_commit() == merged
    # a candidate not containing the baseline is refused
    old = commit(toy_target, {"src/model.py": "X = 4\n"}, "old", branch="old", start=base)
    with pytest.raises(CasError, match="not based on the baseline"):
        ws.merge(old, merged, "x")


def test_lock_names_the_holder(toy_target):
    ws = Workspace.init(toy_target)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys,time; sys.path.insert(0, sys.argv[1]);"
            "from agentsearch.workspace.lock import WorkspaceLock; from pathlib import Path;"
            "l = WorkspaceLock(Path(sys.argv[2])).acquire(); print('held', flush=True); time.sleep(60)",
            str(ROOT),
            str(ws.state / "lock"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LockedError, match=f"locked by pid {holder.pid}"):
            ws.lock().acquire()
    finally:
        holder.kill()
        holder.wait()
    # released when the holder dies
    with ws.lock():
        pass


def test_cli_second_evaluation_is_locked(toy_target):
    ws = Workspace.init(toy_target)
    with ws.lock():
        proc = run_cli("evaluate", "-C", str(toy_target), "main")
    assert proc.returncode == 2
    assert "locked by pid" in proc.stderr and proc.stderr.strip().count("\n") == 0


def test_measurement_checkout_is_detached_and_cleaned(toy_target):
    ws = Workspace.init(toy_target)
    path = ws.add_measurement_worktree(ws.baseline_commit(), "m1")
    assert (path / "bench" / "bench.py").exists()
    assert git(path, "rev-parse", "--abbrev-ref", "HEAD").strip() == "HEAD"
    ws.remove_worktree(path)
    assert not Path(path).exists()


def test_bare_repository_refused_in_one_line(tmp_path):
    bare = tmp_path / "b.git"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
    with pytest.raises(TargetError, match="without a working tree") as err:
        Workspace.init(bare)
    assert "\n" not in str(err.value)

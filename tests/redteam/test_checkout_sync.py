"""The user's checkout of the baseline never silently lags a merge.

A merge refuses a checked-out baseline with uncommitted changes (the branch stays where it
was); after the ref moves, every checkout of the baseline (any worktree) follows; a checkout
left behind by a cut-off update is brought along on `episode --resume`, or warned about.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ..conftest import git, run_cli
from ..test_episode import make_target
from .toy import FAST, copy_target, fast_queue, isolated_env, records, verify

DIRTY = "# a local edit\n"


def episode(repo: Path, *args: str):
    return run_cli("episode", "-C", str(repo), "--json", *args, timeout=900)


@pytest.fixture(scope="module")
def refused(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An episode stopped at its merge by a dirty checkout (verdict merge recorded, baseline unmoved), then cleaned."""
    root = tmp_path_factory.mktemp("refused")
    with pytest.MonkeyPatch.context() as mp:
        isolated_env(mp, root)
        repo = make_target(root / "toy")
        queue = fast_queue(repo, root / "queue")
        before = git(repo, "rev-parse", "main").strip()
        (repo / "src" / "__init__.py").write_text(DIRTY)
        proc = episode(repo, "--patches", str(queue), "--seed", "7")
        line = proc.stderr.strip().splitlines()[-1]  # after the episode's progress lines
        assert "Traceback" not in proc.stderr and line.startswith("agentsearch: error: "), proc.stderr[-3000:]
        assert proc.returncode == 2 and "uncommitted changes" in line and "not moved" in line and str(repo) in line, (
            proc.stderr
        )
        assert git(repo, "rev-parse", "main").strip() == before  # the branch did not move
        assert (repo / "src" / "__init__.py").read_text() == DIRTY  # the edit is untouched
        git(repo, "checkout", "-q", "--", "src/__init__.py")
        return repo


@pytest.fixture
def repo(refused: Path, tmp_path: Path) -> Path:
    return copy_target(refused, tmp_path / "toy")


def verdict_of(repo: Path) -> dict:
    return next(r["data"] for r in records(repo) if r["kind"] == "verdict")


def test_dirty_checkout_refused_the_merge_and_resume_completes_it(repo: Path) -> None:
    v = verdict_of(repo)
    assert v["verdict"] == "merge" and not [r for r in records(repo) if r["kind"] == "merge"]
    assert git(repo, "rev-parse", "main").strip() == v["baseline"]
    proc = episode(repo, "--resume")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["merged"] == 1
    assert "SPEED = 1.3" in (repo / "src" / "engine.py").read_text()
    assert git(repo, "status", "--porcelain", "--untracked-files=no") == ""
    assert verify(repo).returncode == 0


def _cut_off_merge(repo: Path) -> str:
    """What a crash between the ref update and the checkout sync leaves: the branch at the merge,
    the checkout's index and files at the old baseline."""
    v = verdict_of(repo)
    cand, base = v["candidate"], v["baseline"]
    merge = git(
        repo, "commit-tree", f"{cand}^{{tree}}", "-p", base, "-p", cand, "-m", "agentsearch: merge (cut off)"
    ).strip()
    git(repo, "update-ref", "refs/heads/main", merge, base)
    assert "SPEED = 1.0" in (repo / "src" / "engine.py").read_text()
    assert git(repo, "status", "--porcelain", "--untracked-files=no") != ""  # git sees the merge 'undone'
    return merge


def test_a_cut_off_checkout_sync_is_repaired_on_resume(repo: Path) -> None:
    merge = _cut_off_merge(repo)
    proc = episode(repo, "--resume")
    assert proc.returncode == 0, proc.stderr
    assert "brought the checkout" in proc.stderr and str(repo) in proc.stderr
    assert (repo / "src" / "engine.py").read_text() == FAST
    assert git(repo, "status", "--porcelain", "--untracked-files=no") == ""
    assert git(repo, "rev-parse", "main").strip() == merge
    merges = [r["data"] for r in records(repo) if r["kind"] == "merge"]
    assert len(merges) == 1 and merges[0]["ok"] and merges[0]["new"] == merge
    assert verify(repo).returncode == 0


def test_a_lagging_checkout_with_edits_is_warned_about_not_overwritten(repo: Path) -> None:
    _cut_off_merge(repo)
    (repo / "src" / "__init__.py").write_text(DIRTY)
    proc = episode(repo, "--resume")
    assert proc.returncode == 0, proc.stderr
    warnings = [ln for ln in proc.stderr.splitlines() if "warning:" in ln]
    assert warnings and "still has the files of" in warnings[0] and "read-tree -m -u" in warnings[0]
    assert "SPEED = 1.0" in (repo / "src" / "engine.py").read_text()  # left alone ...
    assert (repo / "src" / "__init__.py").read_text() == DIRTY  # ... with the user's edit


def test_a_baseline_checked_out_in_a_linked_worktree_is_guarded_and_follows(tmp_path: Path) -> None:
    repo = make_target(tmp_path / "toy")
    queue = fast_queue(repo, tmp_path / "queue")
    git(repo, "checkout", "-q", "-b", "side")
    wt = tmp_path / "wt"
    git(repo, "worktree", "add", "-q", str(wt), "main")
    (wt / "src" / "__init__.py").write_text(DIRTY)
    before = git(repo, "rev-parse", "main").strip()
    proc = episode(repo, "--patches", str(queue), "--seed", "7")
    assert proc.returncode == 2 and "uncommitted changes" in proc.stderr and str(wt) in proc.stderr
    assert git(repo, "rev-parse", "main").strip() == before
    git(wt, "checkout", "-q", "--", "src/__init__.py")
    proc = episode(repo, "--resume")
    assert proc.returncode == 0 and json.loads(proc.stdout)["merged"] == 1, proc.stderr
    assert (wt / "src" / "engine.py").read_text() == FAST and git(wt, "status", "--porcelain") == ""
    assert "SPEED = 1.0" in (repo / "src" / "engine.py").read_text()  # the other branch's checkout is not touched


def test_revert_refuses_a_dirty_checkout_and_brings_a_clean_one_along(tmp_path: Path) -> None:
    from .toy import merged_target

    repo = merged_target(tmp_path)
    tip = git(repo, "rev-parse", "main").strip()
    (repo / "src" / "__init__.py").write_text(DIRTY)
    proc = run_cli("revert", "-C", str(repo), "001")
    assert proc.returncode == 2 and "uncommitted changes" in proc.stderr and "Traceback" not in proc.stderr
    assert git(repo, "rev-parse", "main").strip() == tip
    git(repo, "checkout", "-q", "--", "src/__init__.py")
    proc = run_cli("revert", "-C", str(repo), "001")
    assert proc.returncode == 0, proc.stderr
    assert "SPEED = 1.0" in (repo / "src" / "engine.py").read_text()
    assert git(repo, "status", "--porcelain", "--untracked-files=no") == ""
    assert verify(repo).returncode == 0

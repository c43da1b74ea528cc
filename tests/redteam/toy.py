"""Shared set-up for the red-team tests: a toy target after one real episode that merged."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ..conftest import git, run_cli
from ..test_episode import ENGINE, episode_json, make_target, patch_from

HEAD_REF = "refs/agentsearch/history-head"
FAST = ENGINE.replace("SPEED = 1.0", "SPEED = 1.3")


def fast_queue(repo: Path, queue: Path) -> Path:
    """A patch queue with one real win (the engine 30% faster)."""
    queue.mkdir()
    (queue / "01-fast.patch").write_text(
        patch_from(repo, {"src/engine.py": FAST}, "fast", "Make the engine 30% faster")
    )
    return queue


def merged_target(root: Path) -> Path:
    """A toy target whose baseline got one merge from a finished episode."""
    repo = make_target(root / "toy")
    rc, out = episode_json(repo, "--patches", str(fast_queue(repo, root / "queue")), "--seed", "7")
    assert rc == 0 and out["merged"] == 1, out
    return repo


def copy_target(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest, symlinks=True)
    return dest


def history_file(repo: Path) -> Path:
    return repo / ".git" / "agentsearch" / "history.jsonl"


def records(repo: Path) -> list[dict]:
    path = history_file(repo)
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def head(repo: Path) -> dict | None:
    if not git(repo, "for-each-ref", HEAD_REF).strip():
        return None
    return json.loads(git(repo, "cat-file", "blob", HEAD_REF))


def verify(repo: Path):
    return run_cli("history", "verify", "-C", str(repo))


def one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def isolated_env(mp, root: Path) -> None:
    """What the autouse ``_isolate`` fixture does, for module-scoped set-ups that run before it."""
    import os

    mp.setenv("AGENTSEARCH_LOG_DIR", str(root))
    (root / "home").mkdir(exist_ok=True)
    mp.setenv("HOME", str(root / "home"))
    for k in list(os.environ):
        if k.startswith("GIT_"):
            mp.delenv(k)

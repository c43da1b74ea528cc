"""The toy command target (its bench and config), shared by the tests (tests/conftest.py) and the benchmarks: it reads a
speed factor (and failure modes) from the worktree and adds real random noise (``TOY_CV``)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TOY_BENCH = """
import json, os, random, sys, time
seed, out = int(sys.argv[1]), sys.argv[2]
mode = open("mode.txt").read().strip() if os.path.exists("mode.txt") else ""
if mode == "crash":
    sys.stderr.write("Traceback: ZeroDivisionError: division by zero\\n")
    sys.exit(1)
if mode == "hang":
    time.sleep(3600)
factor = float(open("speed.txt").read())
rng = random.Random()
cv = float(os.environ.get("TOY_CV", "0.02"))
json.dump({"ops_s": 1000.0 * factor * rng.gauss(1.0, cv), "seed": seed}, open(out, "w"))
"""

TOY_CONFIG = """
[target]
baseline = "main"
protected = ["bench/**"]

[target.env]
TOY_CV = "0.02"

[[workload]]
name = "speed"
command = "{python} bench/bench.py {{seed}} {{out}}"
metric = "ops_s"
higher_is_better = true
timeout_s = {timeout}
"""


def toy_config(timeout: float = 10, extra: str = "") -> str:
    return TOY_CONFIG.format(python=sys.executable, timeout=timeout) + extra


GIT_ENV = {
    "GIT_AUTHOR_NAME": "Test",
    "GIT_AUTHOR_EMAIL": "test@example.com",
    "GIT_COMMITTER_NAME": "Test",
    "GIT_COMMITTER_EMAIL": "test@example.com",
}


def git(repo: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")} | GIT_ENV
    proc = subprocess.run(
        ["git", "-c", "commit.gpgsign=false", *args], cwd=repo, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, f"git {args} failed: {proc.stderr}"
    return proc.stdout


def write(repo: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = repo / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))


def commit(
    repo: Path, files: dict[str, str] | None = None, msg: str = "change", branch: str | None = None, start: str = "main"
) -> str:
    """Commit ``files`` on ``branch`` (created from ``start`` if new); returns the sha."""
    if branch:
        existing = git(repo, "branch", "--list", branch).strip()
        git(repo, "checkout", "-q", branch if existing else "-b", *([] if existing else [branch, start]))
    if files:
        write(repo, files)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", msg)
    sha = git(repo, "rev-parse", "HEAD").strip()
    if branch:
        git(repo, "checkout", "-q", "main")
    return sha


def make_repo(path: Path, files: dict[str, str]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    commit(path, files, "baseline")
    return path


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the real console entry point in a child process."""
    return subprocess.run(
        [sys.executable, "-m", "agentsearch.cli", *args],
        cwd=cwd or ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )

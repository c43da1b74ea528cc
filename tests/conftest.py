"""Fixtures: real temporary git repositories as targets, real child processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks.toy import TOY_BENCH, TOY_CONFIG, toy_config  # noqa: F401 (the toy target, shared with the benchmarks)

ROOT = Path(__file__).resolve().parents[1]
# the tiny model is built once per checkout and shared by all tests (git-ignored)
os.environ.setdefault("AGENTSEARCH_CACHE", str(ROOT / ".cache"))
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


# A toy command target (benchmarks/toy.py, shared with the benchmarks): the bench reads a speed factor (and
# failure modes) from the worktree and adds real random noise. Protected: bench/** and agentsearch.toml.


@pytest.fixture
def toy_target(tmp_path: Path) -> Path:
    return make_repo(
        tmp_path / "toy",
        {
            "agentsearch.toml": toy_config(),
            "bench/bench.py": TOY_BENCH,
            "speed.txt": "1.0\n",
            "src/model.py": "X = 1\n",
        },
    )


@pytest.fixture(autouse=True)
def _isolate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Error logs go to the test's temp dir; a real home is never touched."""
    monkeypatch.setenv("AGENTSEARCH_LOG_DIR", str(tmp_path))
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for k in list(os.environ):
        if k.startswith("GIT_"):
            monkeypatch.delenv(k)


def evaluation_record(**fields):
    """An ``evaluation`` record with the fields a test sets; workload summaries may name only what matters (the rest:
    what a short comparison records)."""
    from history.records import Evaluation

    def summary(name, w):
        return {"name": name, "max_pairs": 12, "winsorized": 0, "calibrated": False, "reason": "", "pairs": 0, **w}

    data = {"ref": "x", "seed": 0, "checks": [], "reasons": [], "baseline": "a" * 40, "candidate": "c" * 40, **fields}
    data["workloads"] = {n: summary(n, w) for n, w in (fields.get("workloads") or {}).items()}
    if fields.get("confirmation"):
        data["confirmation"] = summary(fields["confirmation"].get("name", "objective"), fields["confirmation"])
    return Evaluation.of(data)


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the real console entry point in a child process."""
    return subprocess.run(
        [sys.executable, "-m", "agentsearch.cli", *args],
        cwd=cwd or ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# the slowest modules first: with `pytest -n 2 --dist loadfile --no-loadscope-reorder` (what .ci/run does)
# a module runs on one worker, so the long real-engine modules must start early or they become the run's
# tail. xdist hands each worker one module, then the next one when it has at most 2 tests left: the second
# module here starts at once on the other worker, so it is never queued behind the engine module's tail.
# Without --no-loadscope-reorder xdist (3.x) ignores this order and queues modules by their number of
# tests, most first: the engine modules (few, long tests) then ran last and made CI 10 minutes longer.
SLOW_FIRST = (
    "test_vllm_integration.py",
    "test_vllm_distribution.py",
    "test_vllm_serving.py",
    "test_vllm_reference.py",
    "test_workbench_vllm.py",
    "test_ray_executor.py",
    "test_engine_placement.py",
    "test_kernel_cheats.py",
    "test_models.py",
    "test_report.py",
    "test_engine_cheats.py",
    "test_round2.py",
    "test_escapes.py",
    "test_kernels.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return SLOW_FIRST.index(name) if name in SLOW_FIRST else len(SLOW_FIRST)

    items.sort(key=rank)  # stable: the order inside a module is kept

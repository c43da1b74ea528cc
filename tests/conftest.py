"""Fixtures: real temporary git repositories as targets, real child processes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks.toy import (  # noqa: F401 (the toy target and real git repositories, shared with the benchmarks)
    GIT_ENV,
    TOY_BENCH,
    TOY_CONFIG,
    commit,
    git,
    make_repo,
    run_cli,
    toy_config,
    write,
)

ROOT = Path(__file__).resolve().parents[1]
# the tiny model is built once per checkout and shared by all tests (git-ignored)
os.environ.setdefault("AGENTSEARCH_CACHE", str(ROOT / ".cache"))
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
    "test_upstream_corpus.py",
    "test_resolve_attacks.py",
    "test_ray_executor.py",
    "test_engine_placement.py",
    "test_kernel_cheats.py",
    "test_micro_round4b.py",
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
    from tests.markers import unmarked

    missing = unmarked(items)
    if missing:
        raise pytest.UsageError(
            "tests that start slow machinery without its marker (the fast tier would run them):\n  "
            + "\n  ".join(missing)
        )

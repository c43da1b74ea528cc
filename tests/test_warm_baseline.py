"""The kept baseline across an episode's rejections ([engine] baseline_reuse), on the toy vLLM fork
(benchmarks/toy_engine.py: the harness's real warm worker, sandbox, parking and gate; an engine that starts in
milliseconds). The real vLLM engine parked, reused and replaced after it died is in
tests/test_vllm_integration.py."""

from __future__ import annotations

import json

import pytest

from agentsearch.workspace import Workspace
from benchmarks.toy_engine import target
from history import HistoryLog

from .conftest import commit, git, run_cli
from .test_vllm_integration import workers_alive

pytestmark = pytest.mark.timeout(300)


def test_an_episode_keeps_the_baseline_warm_across_rejections_for_at_most_reuse_evaluations(tmp_path):
    """Three losers in one episode (baseline_reuse 2): the second evaluation measures the baseline on the first
    one's engine (the same instance: its start-up time recorded with every trial is the same), the third on a fresh
    baseline engine (one instance serves at most 2 evaluations) in the kept worktree; every candidate starts fresh;
    nothing is left running or on disk after the episode."""
    fork = target(tmp_path, engine="baseline_reuse = 2")
    for i, cost in enumerate(("0.0024", "0.0020", "0.0016")):  # 2-3x the baseline's work per token: clear losers
        commit(fork, {"cost.txt": cost + "\n"}, f"{cost} s per token", branch=f"slow/{i}")
    git(fork, "checkout", "-q", "main")
    proc = run_cli("episode", "-C", str(fork), "--branches", "slow/*", "--seed", "3", "--json", timeout=280)
    out = json.loads(proc.stdout)
    assert proc.returncode == 0 and out["merged"] == 0, out
    log = HistoryLog(Workspace.open(fork).state / "history.jsonl")
    verdicts = sorted((e.record for e in log.entries() if e.kind == "verdict"), key=lambda v: v.number)
    assert [v.verdict for v in verdicts] == ["reject"] * 3, [v.reasons for v in verdicts]
    assert [(v.baseline_side, v.baseline_engines_reused) for v in verdicts] == [("fresh", 0), ("warm", 1), ("warm", 0)]
    startup: dict[tuple[int, str], set[float]] = {}
    for t in (e.record for e in log.entries() if e.kind == "trial"):
        if t.ok:
            startup.setdefault((t.number, t.side), set()).add(t.metrics["engine_startup_s"])
    assert all(len(s) == 1 for s in startup.values()), startup  # one engine per side and evaluation
    assert startup[(1, "baseline")] == startup[(2, "baseline")] != startup[(3, "baseline")]
    assert len({next(iter(startup[(n, "candidate")])) for n in (1, 2, 3)}) == 3
    assert not workers_alive(fork)
    assert len(git(fork, "worktree", "list").splitlines()) == 1
    assert not list((Workspace.open(fork).state / "tmp").glob("warm-*"))

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


def episode_of_losers(fork, branches: str, seed: int):
    """An episode of the branches ``branches`` that merges none: its history and its verdicts in order."""
    git(fork, "checkout", "-q", "main")
    proc = run_cli("episode", "-C", str(fork), "--branches", branches, "--seed", str(seed), "--json", timeout=280)
    out = json.loads(proc.stdout)
    assert proc.returncode == 0 and out["merged"] == 0, out
    log = HistoryLog(Workspace.open(fork).state / "history.jsonl")
    return log, sorted((e.record for e in log.entries() if e.kind == "verdict"), key=lambda v: v.number)


def test_an_episode_keeps_the_baseline_warm_across_rejections_for_at_most_reuse_evaluations(tmp_path):
    """Three losers in one episode (baseline_reuse 2): the second evaluation measures the baseline on the first
    one's engine (the same instance: its start-up time recorded with every trial is the same), the third on a fresh
    baseline engine (one instance serves at most 2 evaluations) in the kept worktree; every candidate starts fresh;
    nothing is left running or on disk after the episode."""
    fork = target(tmp_path, engine="baseline_reuse = 2")
    for i, cost in enumerate(("0.0024", "0.0020", "0.0016")):  # 2-3x the baseline's work per token: clear losers
        commit(fork, {"cost.txt": cost + "\n"}, f"{cost} s per token", branch=f"slow/{i}")
    log, verdicts = episode_of_losers(fork, "slow/*", 3)
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


SHORT_GUARD = """
[[workload]]
name = "short"
kind = "vllm-throughput"
model = "{model}"
metric = "output_tok_s"
higher_is_better = true
timeout_s = 60
restarts = 1
params = {{ prompts = 16, input_len = 16, output_len = 8, vary_lengths = false }}
"""


def test_a_guards_re_measure_starts_fresh_engines_per_session_and_keeps_none_for_the_next_proposal(tmp_path):
    """Issue #43: a guard's regression is measured again over GUARD_CHECK_SESSIONS fresh engine sessions. Those
    engines are shut down when the re-measure ends (under shared placement a session's engines stay up, frozen,
    until retired: 8 more engines on a 24 GiB machine), so a kept baseline hands none of them to the next proposal,
    whose re-measure starts fresh ones again. Two proposals, each 2x faster on long outputs and 30% slower on short
    ones: both rejected by the short-output guard, each re-measure on engines no other measurement used."""
    from benchmarks.toy_engine import THROUGHPUT, TOY_VLLM
    from harness.gate_defaults import GUARD_CHECK_SESSIONS

    fork = target(tmp_path, engine="baseline_reuse = 2")
    config = (fork / "agentsearch.toml").read_text()
    commit(
        fork,
        {"agentsearch.toml": config.replace("\n[gate]", SHORT_GUARD.format(model=THROUGHPUT["model"]) + "\n[gate]")},
        "a short-output guard",
    )
    slow_short = TOY_VLLM.replace(
        "time.sleep(self.cost * sp.max_tokens)",
        "time.sleep(self.cost * sp.max_tokens * (0.5 if sp.max_tokens > 8 else 1.3))",
    )
    assert slow_short != TOY_VLLM
    for i in range(2):
        commit(fork, {"vllm/__init__.py": slow_short + f"# {i}\n"}, f"long outputs faster {i}", branch=f"trade/{i}")
    log, verdicts = episode_of_losers(fork, "trade/*", 4)
    assert [v.verdict for v in verdicts] == ["reject"] * 2, [v.reasons for v in verdicts]
    assert all("short: the regression held on fresh engines" in v.reasons[0] for v in verdicts), verdicts[0].reasons
    engines: dict[tuple[int, str], set[float]] = {}  # (proposal, phase) -> the baseline engines it measured on
    for t in (e.record for e in log.entries() if e.kind == "trial"):
        if t.ok and t.side == "baseline":
            engines.setdefault((t.number, t.phase), set()).add(t.metrics["engine_startup_s"])
    # a fresh baseline engine per session of the re-measure, none the first run's
    for n in (1, 2):
        assert len(engines[(n, "guard-check")]) == GUARD_CHECK_SESSIONS, engines
        assert not engines[(n, "guard-check")] & (engines[(n, "objective")] | engines[(n, "guard")])
    # the kept baseline: the second proposal's objective on the first one's engine, its re-measure on fresh ones
    assert engines[(2, "objective")] == engines[(1, "objective")]
    assert not engines[(2, "guard-check")] & engines[(1, "guard-check")], engines
    assert not workers_alive(fork)

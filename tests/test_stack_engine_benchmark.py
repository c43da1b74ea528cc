"""benchmarks/stack_engine.py plants #39's cases in vLLM's scheduler: each commit of a case's chain must run the costs
it claims to (on the objective's engines and on the guard's), and each merge must revert on its own as leave-one-out
needs. Checked on a scheduler-shaped module, executed, and in a real git repository."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from agentsearch.commands.starter import starter_config
from agentsearch.config import load_config_text
from benchmarks.stack_engine import BISECT_CULPRIT, COSTS, GUARD_LEN, GUARD_US, chain, config, expected, planted_start

from .conftest import git

SCHEDULER = '''"""a scheduler-shaped module"""
import time


class Scheduler:
    def __init__(self, max_model_len):
        self.max_model_len = max_model_len

    def schedule(self, throttle_prefills: bool = False) -> dict:
        return {"scheduled": 1}
'''


def spins(source: str, max_model_len: int) -> list[int]:
    """The busy-waits one ``schedule()`` step runs, in microseconds, on an engine with ``max_model_len``."""
    ns: dict = {"__name__": "scheduler"}
    exec(compile(source, "scheduler.py", "exec"), ns)
    seen: list[int] = []
    ns["_stack_spin"] = seen.append  # the module's own name, looked up when schedule() runs
    assert ns["Scheduler"](max_model_len).schedule() == {"scheduled": 1}
    return seen


def states(case: str) -> list[str]:
    src = [planted_start(SCHEDULER, COSTS[case])]
    for _, change in chain(case):
        src.append(change(src[-1]))  # type: ignore[operator]
    return src


def test_the_config_keeps_the_starters_objective_and_gate_and_sets_the_case():
    starter = tomllib.loads(starter_config(Path("/site")))
    for case in ("compose", "passenger", "bystander"):
        got = tomllib.loads(config(starter_config(Path("/site")), case, loo=True))
        assert [w["name"] for w in got["workload"]] == ["throughput"]
        assert got["workload"][0] == starter["workload"][0]
        assert got["stack"] == {"check": "end", "leave_one_out": True} and "verify" not in got
        assert got["gate"]["confirm_pairs"] == starter["gate"]["confirm_pairs"] == 4
    assert tomllib.loads(config(starter_config(Path("/site")), "compose", loo=False))["stack"]["leave_one_out"] is False
    b = tomllib.loads(config(starter_config(Path("/site")), "bisect", loo=False))
    assert [w["name"] for w in b["workload"]] == ["throughput", "single"]
    assert b["workload"][1]["engine"]["max_model_len"] == GUARD_LEN != b["workload"][0]["engine"]["max_model_len"]
    assert b["gate"]["max_regression"] == 0.5 and b["gate"]["min_pairs"] == 6 and b["stack"] == {"check": "off"}
    # agentsearch's own loader takes each case's config as the run will
    loaded = load_config_text(config(starter_config(Path("/site")), "bisect", loo=False))
    assert loaded.objective.name == "throughput" and loaded.stack.check == "off" and loaded.gate.max_regression == 0.5
    assert load_config_text(config(starter_config(Path("/site")), "passenger", loo=True)).stack.leave_one_out


def test_compose_removes_one_cost_per_merge_and_the_guards_engines_run_none():
    s = states("compose")
    assert [spins(x, 1024) for x in s] == [[600, 450], [450], []]
    assert all(spins(x, GUARD_LEN) == [] for x in s)


def test_the_passenger_cases_rewrite_drops_the_cost_merge_1_removed():
    start, first, second = states("passenger")
    assert spins(first, 1024) == [450] and spins(second, 1024) == []
    # the rewrite alone (merge 1 undone: its flag back) still runs no cost A: merge 1 is a passenger today
    undone = second.replace("PLANTED_A_REMOVED = True", "PLANTED_A_REMOVED = False")
    assert spins(undone, 1024) == []


def test_the_bystander_case_adds_an_independent_merge_to_the_passenger_case():
    start, first, second, third = states("bystander")
    assert spins(start, 1024) == [600, 500, 500] and spins(second, 1024) == [500] and spins(third, 1024) == []
    # merge 1 undone at the tip: still no cost (a passenger); merge 3 undone alone, or with merge 1: only cost C back
    assert spins(third.replace("PLANTED_A_REMOVED = True", "PLANTED_A_REMOVED = False"), 1024) == []
    assert spins(third.replace("PLANTED_C_REMOVED = True", "PLANTED_C_REMOVED = False"), 1024) == [500]
    both = third.replace("PLANTED_A_REMOVED = True", "PLANTED_A_REMOVED = False")
    assert spins(both.replace("PLANTED_C_REMOVED = True", "PLANTED_C_REMOVED = False"), 1024) == [500]
    assert all(spins(x, GUARD_LEN) == [] for x in (start, first, second, third))


def test_bisect_plants_the_guard_regression_in_merge_3_only():
    s = states("bisect")
    assert len(s) == 7
    assert [len(spins(x, 1024)) for x in s] == [6, 5, 4, 3, 2, 1, 0]  # the objective gains at every merge
    assert [spins(x, GUARD_LEN) for x in s] == [[]] * BISECT_CULPRIT + [[GUARD_US]] * (7 - BISECT_CULPRIT)


@pytest.mark.parametrize("case", ["compose", "passenger", "bystander"])
def test_each_merge_and_both_revert_cleanly_on_the_tip(tmp_path, case):
    """What leave-one-out and the interference test do (git revert of one merge, then of two, on the tip)."""
    repo = tmp_path / "r"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    s = states(case)
    for i, src in enumerate(s):
        (repo / "scheduler.py").write_text(src)
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", f"state {i}")
    merges = git(repo, "rev-list", "--reverse", f"HEAD~{len(s) - 1}..HEAD").split()
    for m in merges:
        git(repo, "revert", "--no-edit", m)
        git(repo, "reset", "-q", "--hard", "HEAD~1")
    for a, b in ((0, 1), (0, 2))[: len(merges) - 1]:  # the pairs the passenger points to
        git(repo, "revert", "--no-edit", merges[b])
        git(repo, "revert", "--no-edit", merges[a])
        git(repo, "reset", "-q", "--hard", "HEAD~2")
    for m in reversed(merges):
        git(repo, "revert", "--no-edit", m)
    assert (repo / "scheduler.py").read_text() == s[0]


def test_the_expected_verdicts_are_the_cases_names():
    merged = [{"verdict": "merge"}, {"verdict": "merge"}]
    stack = {"verdict": "delivers", "removals": [{"decision": "passenger"}, {"decision": "contributes"}]}
    assert expected("passenger", {"proposals": merged, "loo": True, "stack": {**stack, "interfering": [[1, 2]]}})[0]
    assert not expected("passenger", {"proposals": merged, "loo": True, "stack": {**stack, "interfering": []}})[0]
    assert not expected("compose", {"proposals": merged, "loo": True, "stack": {**stack, "interfering": []}})[0]
    assert expected("compose", {"proposals": merged, "loo": False, "stack": {"verdict": "delivers"}})[0]
    assert not expected("compose", {"proposals": merged[:1] + [{"verdict": "reject"}], "loo": False})[0]
    three = {**stack, "removals": [*stack["removals"], {"decision": "contributes"}], "pairs_tested": [[1, 2], [1, 3]]}
    assert expected(
        "bystander", {"proposals": [{"verdict": "merge"}] * 3, "loo": True, "stack": {**three, "interfering": [[1, 2]]}}
    )[0]
    for wrong in ([[1, 2], [1, 3]], [[1, 3]], []):  # the independent pair flagged, or the real one missed
        assert not expected(
            "bystander",
            {"proposals": [{"verdict": "merge"}] * 3, "loo": True, "stack": {**three, "interfering": wrong}},
        )[0]
    six = [{"verdict": "merge"}] * 6
    assert expected("bisect", {"proposals": six, "bisect": {"culprit_index": 3, "steps": [{}] * 4}})[0]
    assert not expected("bisect", {"proposals": six, "bisect": {"culprit_index": 3, "steps": [{}] * 5}})[0]
    assert not expected("bisect", {"proposals": six, "bisect": {"culprit_index": 4, "steps": [{}] * 3}})[0]

"""The comparison behind the `takes-effect` check (agentsearch/takes_effect.py): what differs between two resolved
engine configurations, what the serving file changed, and which variables only the runtime reads. The check on the
real engine is tests/test_vllm_integration.py (a variable vLLM does not read: no effect, no engine started) and
tests/test_engine_placement.py (max_num_seqs 1 -> 32: takes effect, then measured)."""

from __future__ import annotations

from agentsearch.takes_effect import differences, named_first, runtime_env, serving_changes


def test_differences_walk_both_configurations_key_by_key() -> None:
    base = {"scheduler_config": {"max_num_seqs": 4, "policy": "fcfs"}, "cache_config": {"block_size": 16}}
    cand = {"scheduler_config": {"max_num_seqs": 32, "policy": "fcfs"}, "cache_config": {"block_size": 16, "x": 1}}
    assert differences(base, cand) == ["cache_config.x: null -> 1", "scheduler_config.max_num_seqs: 4 -> 32"]
    assert differences(base, base) == []
    long = differences({"a": "x" * 500}, {"a": "\x1b[2J" + "y" * 500})
    assert len(long) == 1 and "\x1b" not in long[0] and len(long[0]) < 140  # a proposal's value: cleaned and capped


def test_the_serving_files_changes_are_named_with_their_defaults() -> None:
    base = {"engine": {"max_num_seqs": 4}, "env": {}}
    cand = {
        "engine": {"max_num_seqs": 4, "enable_prefix_caching": True},
        "env": {"VLLM_X": "1", "OMP_NUM_THREADS": "2"},
    }
    assert serving_changes(base, cand) == [
        "engine.enable_prefix_caching: default -> true",
        "env.OMP_NUM_THREADS: default -> 2",
        "env.VLLM_X: default -> 1",
    ]
    assert serving_changes(base, {"engine": [], "env": {}}) == ["engine: rewritten"]


def test_variables_vllm_does_not_parse_are_the_runtimes() -> None:
    assert runtime_env({"env": {"VLLM_X": "1", "OMP_NUM_THREADS": "2", "KMP_AFFINITY": "x"}}) == {
        "OMP_NUM_THREADS": "2",
        "KMP_AFFINITY": "x",
    }
    assert runtime_env({"env": ["nonsense"]}) == {}


def test_the_detail_names_what_the_change_set_before_what_vllm_derived() -> None:
    changed = serving_changes({"engine": {"max_num_seqs": 1}}, {"engine": {"max_num_seqs": 32}})
    diffs = differences(
        {"compilation_config": {"a": 1, "b": 2}, "scheduler_config": {"max_num_seqs": 1}},
        {"compilation_config": {"a": 2, "b": 3}, "scheduler_config": {"max_num_seqs": 32}},
    )
    assert named_first(diffs, changed) == [
        "scheduler_config.max_num_seqs: 1 -> 32",
        "compilation_config.a: 1 -> 2",
        "compilation_config.b: 2 -> 3",
    ]

"""The model-based proposer (`episode --proposer optimize`, issue #58) on the hidden-optimum toy of
benchmarks/knob_optimum.py: real episodes, the real gate, real git; Optuna's TPE told the gate's estimates."""

from __future__ import annotations

import difflib
import json
import math
import sys

import pytest

from agentsearch.proposers.base import Context
from agentsearch.proposers.optimize import UNSET, Optimize
from agentsearch.workspace import Workspace, git
from history import HistoryLog
from history.proposals import proposals_of

from .conftest import ROOT, run_cli

sys.path.insert(0, str(ROOT))
from benchmarks.knob_optimum import KNOBS, START, make_target, merges, speed  # noqa: E402


def episode(repo, *args: str) -> dict:
    proc = run_cli("episode", "-C", str(repo), "--proposer", "optimize", "--json", *args, timeout=900)
    assert proc.returncode == 0 and proc.stdout, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def context(repo, seed: int, number: int) -> tuple[Optimize, Context]:
    ws = Workspace.open(repo)
    base = ws.baseline_commit()
    history = proposals_of(HistoryLog(ws.state / "history.jsonl").entries())
    ctx = Context(lambda p: git.show_file(ws.repo_dir, base, p), history, None, number, seed)
    return Optimize(ws.config().sweep), ctx


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """An optimize episode of 8 proposals on the hidden-optimum toy."""
    repo = make_target(tmp_path_factory.mktemp("optimize") / "toy")
    return repo, episode(repo, "--budget", "8", "--seed", "11")


def test_an_optimize_episode_proposes_whole_configurations_and_merges_only_true_wins(searched):
    repo, out = searched
    rows = out["proposals"]
    assert len(rows) == 8 and len({r["title"] for r in rows}) == 8, [r["title"] for r in rows]
    history = proposals_of(HistoryLog(Workspace.open(repo).state / "history.jsonl").entries())
    assert all(p.proposer == "optimize" and set(p.meta["config"]) == set(KNOBS) for p in history)
    assert max(len(p.knobs) for p in history) >= 2  # several knobs at once: what the sweep never proposes
    for before, after in merges(repo):  # the gate's noise is 2%: every merge is a true improvement
        assert speed(after) > speed(before), (before, after)
    assert speed({**START, **json.loads(git.show_file(repo, "main", "serving.json"))["engine"]}) > speed(START)


def test_the_optimizer_is_told_each_estimate_re_anchored_to_the_first_main(searched):
    """A judged configuration's value is log(speedup) plus the log speed of the main it was measured on (the sum of
    the merged estimates before it); the values track the true speeds."""
    repo, _ = searched
    opt, ctx = context(repo, 11, 9)
    told = opt.observations(ctx.history)
    assert len(told) == len([p for p in ctx.history if p.speedup is not None or p.is_failure])
    anchor = 0.0
    for (config, value), p in zip(told, [p for p in ctx.history if p.speedup is not None], strict=False):
        assert config == p.meta["config"] and value == pytest.approx(anchor + math.log(p.speedup))
        if p.merged:
            anchor += math.log(p.speedup)
    # re-anchored values against the truth: the order of log speeds agrees (noise 2%, effects of 5% and more)
    truth = [math.log(speed(c) / speed(START)) for c, v in told if v is not None]
    measured = [v for _, v in told if v is not None]
    for (t1, m1), (t2, m2) in zip(
        zip(truth, measured, strict=True), zip(truth[1:], measured[1:], strict=True), strict=False
    ):
        if abs(t1 - t2) > 0.1:
            assert (t1 < t2) == (m1 < m2), (truth, measured)


def test_the_next_proposal_is_a_function_of_the_history_and_the_seed(searched):
    """Nothing beside the history: the same history and seed ask the same configuration (what --resume relies on);
    another seed may ask another."""
    repo, _ = searched
    opt, ctx = context(repo, 11, 9)
    again, ctx2 = context(repo, 11, 9)
    first, second = opt.next(set(), ctx), again.next(set(), ctx2)
    assert first is not None and first.key == second.key and first.patch == second.patch
    assert first.key not in {p.key for p in ctx.history}
    config = first.meta["config"]
    assert set(config) == set(KNOBS) and all(config[n] in [*KNOBS[n], UNSET] for n in KNOBS)


def test_a_crash_is_told_as_a_penalty_below_every_measurement(tmp_path):
    """A configuration whose benchmark crashes is a failure: told below the worst measured value, never as a win."""
    repo = make_target(tmp_path / "toy")
    bench = (
        (repo / "bench" / "bench.py")
        .read_text()
        .replace(
            'c = json.load(open("serving.json"))["engine"]',
            'c = json.load(open("serving.json"))["engine"]\nif c["chunk"] >= 128:\n    sys.exit(3)',
        )
    )
    (repo / "bench" / "bench.py").write_text(bench)
    git.run_git("commit", "-qam", "chunks of 128 and more crash", cwd=repo)
    assert run_cli("init", "-C", str(repo)).returncode == 0
    episode(repo, "--budget", "6", "--seed", "2")
    opt, ctx = context(repo, 2, 7)
    told = opt.observations(ctx.history)
    crashed = [c for c, v in told if v is None]
    assert all(c["chunk"] >= 128 for c in crashed)
    assert all(c["chunk"] < 128 for c, v in told if v is not None)
    assert crashed, told  # this seed's episode proposed a crashing configuration
    study, _ = opt._study(ctx, {n: opt.choices(k, START[n]) for n, k in opt.knobs.items()}, told)
    values = sorted(t.value for t in study.trials)
    assert values[0] < min(v for _, v in told if v is not None) - 0.5  # the penalty, under every measured value


def test_sampler_applies_to_the_optimizer_only(tmp_path):
    repo = make_target(tmp_path / "toy")
    proc = run_cli("episode", "-C", str(repo), "--proposer", "sweep", "--sampler", "random")
    said = [ln for ln in proc.stderr.splitlines() if ln.startswith("agentsearch:")]
    assert proc.returncode == 2 and len(said) == 1 and "--sampler applies to --proposer optimize" in said[0]


def test_the_agents_prompt_carries_what_the_optimizer_measured(searched):
    """Agents and the optimizer together: a Claude session's prompt gets the optimizer's measurements per knob value
    and its best configuration, as data (from the history; re-anchored like the optimizer's own)."""
    from agentsearch.proposers.claude import render_prompt
    from agentsearch.proposers.knob_model import summary

    repo, _ = searched
    ws = Workspace.open(repo)
    opt, ctx = context(repo, 11, 9)
    ctx = Context(ctx.read_file, ctx.history, None, 9, 11, {"config": ws.config()})
    text = summary(ctx.history, list(KNOBS))
    told = opt.observations(ctx.history)
    assert text.startswith(f"The knob-space optimizer judged {len(told)} configurations")
    assert all(f"- {k}: " in text for k in KNOBS) and "Best measured: " in text
    best = max((v, c) for c, v in told if v is not None)
    assert f"Best measured: {math.exp(best[0]) - 1:+.1%} with batch={json.dumps(best[1]['batch'])}" in text
    prompt = render_prompt(ctx, ())
    assert "## What the knob-space optimizer measured (data)" in prompt and text in prompt
    assert summary([], list(KNOBS)) == ""  # no optimizer history: no section


def test_simpler_wins_ties_among_configurations_within_the_measured_noise(searched):
    """Issue #58, 'simpler wins ties': the recommended configuration is the one with the fewest overrides among those
    within the gate's noise of the fastest; outside the noise the fastest wins; a failure is never recommended. The
    noise is the gate's own interval, read from the history."""
    from agentsearch.proposers.knob_model import Observation, observed, recommendation, recommended

    repo, _ = searched
    opt, ctx = context(repo, 11, 9)
    seen = observed(ctx.history, list(KNOBS))
    measured = [o for o in seen if o.value is not None]
    assert measured and all(o.noise > 0 for o in measured)  # each measured in pairs: an interval of its own
    # the toy's configurations set every knob: equal overrides, so the fastest is recommended
    pick, top = recommended(seen)
    assert pick is top and top.value == max(o.value for o in measured)

    fast = {"batch": 8, "chunk": 64, "spec": False, "graphs": True, "layout": "tiles"}
    simple = {**fast, "spec": UNSET, "layout": UNSET}  # two knobs left at the engine's default
    knobs = list(KNOBS)
    within = [Observation(fast, math.log(1.30), 0.02), Observation(simple, math.log(1.29), 0.015)]
    pick, top = recommended(within)
    assert pick.config == simple and top.config == fast and pick.overrides == 3 and top.overrides == 5
    line = recommendation(within, knobs)
    assert line.startswith("Best measured: +29.0% with batch=8, chunk=64, spec=default, graphs=true, layout=default")
    assert "simpler wins ties: 2 fewer overrides than the fastest, +30.0%" in line, line
    beyond = [Observation(fast, math.log(1.30), 0.005), Observation(simple, math.log(1.25), 0.005)]
    assert recommended(beyond)[0].config == fast and "simpler wins ties" not in recommendation(beyond, knobs)
    failed = [Observation(simple, None), Observation(fast, math.log(1.1), 0.01)]
    assert recommended(failed)[0].config == fast and recommended([Observation(simple, None)]) is None
    # the optimizer's own rationale says which it recommends, from the real history
    c = opt.next(set(), ctx)
    assert c is not None and recommendation(seen, knobs) in c.rationale, c.rationale


def test_the_trust_region_takes_the_simpler_of_two_equally_drawn_steps():
    import random

    from agentsearch.proposers.optimize import trust_region

    main = dict(START)
    two = {**main, "batch": 8, "chunk": 64}  # one draw of a two-knob step
    one = {**main, "graphs": True}  # one draw of a one-knob step: the same weight
    for seed in range(5):
        steps = trust_region([two, one], main, 2, random.Random(seed))
        assert steps[0] == one and steps[1] == two, steps


def test_grid_search_walks_the_declared_grid_once_in_the_episodes_seeded_order(tmp_path):
    """The grid baseline of the benchmark: every combination of the declared values, each once, in an order fixed by
    the episode's seed (so --resume asks the same), never main's own configuration."""
    from agentsearch.proposers.optimize import grid

    pts = list(grid(KNOBS, 7))
    assert len(pts) == math.prod(len(v) for v in KNOBS.values()) == len({json.dumps(p, sort_keys=True) for p in pts})
    assert pts == list(grid(KNOBS, 7)) and pts != list(grid(KNOBS, 8))
    repo = make_target(tmp_path / "toy")
    out = episode(repo, "--sampler", "grid", "--budget", "3", "--seed", "7")
    history = proposals_of(HistoryLog(Workspace.open(repo).state / "history.jsonl").entries())
    configs = [p.meta["config"] for p in history]
    assert len(out["proposals"]) == 3 and all(p.meta["sampler"] == "grid" for p in history)
    # the first proposal is the grid's first point that is not the start (each later one: the next point not judged)
    first = next(p for p in pts if p != START)
    assert configs[0] == first, (configs[0], first)


def test_a_config_only_change_by_another_proposer_is_told_to_the_optimizer(tmp_path):
    """Agents and the optimizer together (#58): a proposal of another proposer (here a patch queue, as an agent's
    change arrives) that changes only the knobs' file is recorded with the configuration it made, and the optimizer
    is told its measurement; a change that touches another file too is not."""
    from agentsearch.proposers.knob_model import FROM_FILES, observed

    repo = make_target(tmp_path / "toy")
    queue = tmp_path / "queue"
    queue.mkdir()
    start = json.loads(git.show_file(repo, "main", "serving.json"))
    better = {"engine": {**start["engine"], "batch": 8, "chunk": 64}}
    old, new = json.dumps(start, indent=2) + "\n", json.dumps(better, indent=2) + "\n"
    assert git.show_file(repo, "main", "serving.json") == old
    diff = "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), "a/serving.json", "b/serving.json"))
    (queue / "01-knobs.patch").write_text(diff)
    (queue / "02-knobs-and-notes.patch").write_text(
        diff + "--- /dev/null\n+++ b/NOTES.md\n@@ -0,0 +1 @@\n+batch 8, chunk 64\n"
    )
    # the knobs' file, and in it something the knob space does not describe: not one of its configurations (first,
    # so that it is judged on the start, where the others apply too; it is no faster and is not merged)
    other = {**start, "engine": {**start["engine"], "unlisted": 1}}
    (queue / "00-more-than-knobs.patch").write_text(
        "".join(
            difflib.unified_diff(
                old.splitlines(True),
                (json.dumps(other, indent=2) + "\n").splitlines(True),
                "a/serving.json",
                "b/serving.json",
            )
        )
    )
    proc = run_cli("episode", "-C", str(repo), "--patches", str(queue), "--seed", "5", "--json", timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    history = proposals_of(HistoryLog(Workspace.open(repo).state / "history.jsonl").entries())
    with_more, knobs_only, with_notes = history
    assert knobs_only.proposer == "patches" and knobs_only.meta["config_from"] == FROM_FILES
    assert knobs_only.meta["config"] == {**START, "batch": 8, "chunk": 64}
    assert "config" not in with_notes.meta  # code (or anything else) beside the knobs: not a configuration
    assert with_more.files == ("serving.json",) and "config" not in with_more.meta  # the file, beyond the knobs'
    assert [p.judged for p in history] == [True, True, True]
    seen = observed(history, list(KNOBS))
    assert [o.config for o in seen] == [knobs_only.meta["config"]]
    assert seen[0].value == pytest.approx(math.log(knobs_only.speedup))
    # the optimizer's next proposal was asked after that one judged configuration
    out = episode(repo, "--budget", "1", "--seed", "5")
    assert len(out["proposals"]) == 1
    (last,) = proposals_of(HistoryLog(Workspace.open(repo).state / "history.jsonl").entries())[3:]
    assert "asked after 1 judged configuration" in last.rationale, last.rationale

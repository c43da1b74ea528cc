"""The sweep proposer and insights on a toy target with hidden good and bad knob settings."""

from __future__ import annotations

import json

from agentsearch.config import load_config_text
from agentsearch.proposers import Context
from agentsearch.proposers.sweep import Sweep
from agentsearch.workspace import Workspace
from benchmarks.toy_knobs import files
from history import HistoryLog

from .conftest import make_repo, run_cli

GOOD = {"k1": [2, 0.3]}
BAD = {"k0": 1}


def target(tmp_path, name="toy"):
    repo = make_repo(tmp_path / name, files(3, GOOD, BAD))
    assert run_cli("init", "-C", str(repo)).returncode == 0
    return repo


def test_sweep_episode_finds_the_win_records_failures_and_writes_insights(tmp_path):
    repo = target(tmp_path)
    proc = run_cli(
        "episode", "-C", str(repo), "--proposer", "sweep", "--budget", "9", "--seed", "4", "--json", timeout=900
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    titles = [r["title"] for r in out["proposals"]]
    assert len(titles) == len(set(titles)) == 9  # 3 knobs x 3 other values, each once
    merged = [r for r in out["proposals"] if r["merged"]]
    assert [r["title"] for r in merged] == ["k1: 0 -> 2"]
    crash = [r for r in out["proposals"] if r["title"] == "k0: 0 -> 1"][0]
    assert crash["verdict"] == "reject" and any("not supported" in x for x in crash["reasons"])
    ws = Workspace.open(repo)
    assert json.loads((repo / "params.json").read_text())["k1"] == 2  # the checkout follows the merge
    md = (ws.state / "insights.md").read_text()
    assert "## What worked" in md and "k1: 0 -> 2" in md and "## What to avoid" in md and "k0: 0 -> 1" in md
    ins = [e.data for e in HistoryLog(ws.state / "history.jsonl").entries() if e.kind == "insight"][-1]
    assert ins["knobs"]["k1"]["wins"] == 1 and ins["knobs"]["k1"]["best_value"] == 2
    assert ins["knobs"]["k0"]["failures"] >= 1
    assert ins["by_category"] and ins["proposals"] == 9
    # a second episode never re-proposes a judged configuration; with nothing left it stops at once
    proc = run_cli("episode", "-C", str(repo), "--proposer", "sweep", "--budget", "5", "--json", timeout=900)
    out2 = json.loads(proc.stdout)
    seen = {r["title"] for r in out["proposals"]}
    assert all(r["title"] not in seen or r["title"].startswith("k1") for r in out2["proposals"])
    proc = run_cli("insights", "-C", str(repo), "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["merged"] >= 1


def test_sweep_order_is_deterministic_and_follows_insights(tmp_path):
    repo = target(tmp_path)
    ws = Workspace.open(repo)
    config = ws.config()
    base = ws.baseline_commit()
    from agentsearch.workspace import git

    def ctx(insights=None, history=()):
        return Context(
            read_file=lambda p: git.show_file(repo, base, p), history=list(history), insights=insights, number=1, seed=9
        )

    sweep = Sweep(config.sweep)
    a, b = sweep.next(set(), ctx()), sweep.next(set(), ctx())
    assert a == b  # same history + seed: same proposal (what --resume relies on)
    insights = {
        "knobs": {
            "k1": {"tries": 3, "wins": 1, "failures": 0, "best_value": 2, "up_wins": 1, "down_wins": 0},
            "k0": {"tries": 3, "wins": 0, "failures": 2},
            "k2": {"tries": 3, "wins": 0, "failures": 0},
        }
    }
    firsts = {Sweep(config.sweep).next(set(), Context(ctx().read_file, [], insights, n, 9)).title for n in range(1, 6)}
    assert firsts == {"k1: 0 -> 2"}  # the prior makes the known winner come first
    c = sweep.next(set(), ctx(insights))
    assert c.meta["knobs"] == {"k1": [0, 2]} and c.category == "scheduling"
    assert "+" in c.patch and '"k1": 2' in c.patch


def test_bad_sweep_config_is_one_line(tmp_path):
    bad = files(1, {}, {})["agentsearch.toml"].replace('values = [0, 1, 2, 3]', 'values = [0, "a"]')
    try:
        load_config_text(bad, "agentsearch.toml")
    except Exception as exc:  # noqa: BLE001
        assert "[[sweep.knob]] #1 values" in str(exc) and "one type" in str(exc)
    else:
        raise AssertionError("mixed-type values must be refused")
    repo = make_repo(
        tmp_path / "plain",
        {**files(1, {}, {}), "agentsearch.toml": files(1, {}, {})["agentsearch.toml"].split("[[sweep.knob]]")[0]},
    )
    assert run_cli("init", "-C", str(repo)).returncode == 0
    proc = run_cli("episode", "-C", str(repo), "--proposer", "sweep")
    assert proc.returncode == 2 and "no [[sweep.knob]]" in proc.stderr

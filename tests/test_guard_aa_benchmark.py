"""benchmarks/guard_aa_engine.py measures the demo's own guards: its config must keep them as the starter writes them."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from agentsearch.commands.starter import starter_config
from benchmarks.guard_aa_engine import (
    GUARDS,
    baseline_e2e_ms,
    delayed,
    demo_guards_config,
    pair_log_ratios,
    plant,
    power_config,
    summary,
)
from benchmarks.serving_guard_engine import ANCHOR


def test_the_benchmark_keeps_the_starters_guards_and_gate_behind_a_toy_objective():
    starter = tomllib.loads(starter_config(Path("/site")))
    ours = tomllib.loads(demo_guards_config(starter_config(Path("/site"))))
    assert [w["name"] for w in ours["workload"]] == ["speed", *GUARDS]
    for g in GUARDS:
        assert next(w for w in ours["workload"] if w["name"] == g) == next(
            w for w in starter["workload"] if w["name"] == g
        )
    assert ours["gate"] == starter["gate"] and ours["target"] == starter["target"]
    assert "verify" not in ours and "sweep" not in ours
    # a power run (--slow-ms) turns only the coverage check off: the toy objective runs no scheduler line
    power = tomllib.loads(power_config(demo_guards_config(starter_config(Path("/site")))))
    assert power["gate"] == {**starter["gate"], "coverage": False} and power["workload"] == ours["workload"]


def test_an_aa_candidate_changes_a_comment_and_a_slow_one_sleeps_in_every_scheduler_step():
    src = (
        "class Scheduler:\n    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:\n        x = 1\n"
    )
    aa = plant(src, 0, "run 3")
    assert aa.replace("        # run 3\n", "") == src and "sleep" not in aa
    assert "sleep(0.002)" in plant(src, 2, "run 3")
    with pytest.raises(SystemExit):
        plant("def other(): pass\n", 0, "x")


def test_a_delayed_candidate_waits_before_every_request_it_serves():
    src = f"    async def create_completion(self, request):\n        x = 1\n{ANCHOR}self._inner(request))\n"
    got = delayed(src, 12)
    assert got.count("asyncio').sleep(0.012)") == 1 and got.index("sleep(0.012)") < got.index(ANCHOR)
    assert "zlib" not in got  # every request, not one in fifty
    with pytest.raises(SystemExit):
        delayed("async def other(): pass\n", 12)


def test_the_summary_counts_first_calls_and_confirmed_rejections_apart(capsys):
    def row(hour, c1, c1_fresh=None, verdict="merge"):
        return {
            "hour": hour,
            "slow_ms": 0.0,
            "minutes": 5.0,
            "verdict": verdict,
            "guards": {"serve-c1": {"decision": c1, "fresh": c1_fresh}, "serve-c8": {"decision": "ok"}},
        }

    summary(
        [
            row(1, "ok"),
            row(1, "unconfirmed", "ok"),
            row(5, "regressed", "regressed", "reject"),
            {"error": "x"},
            {**row(2, "regressed", "regressed", "reject"), "delay_ms": 12.0},
        ]
    )
    # a power row names the share of serve-c1 it planted (d / (e2e + d)) only where its baseline latency was recorded
    powered = {**row(3, "regressed", "regressed", "reject"), "delay_ms": 15.0, "guard_check": [16, 4]}
    powered["guards"]["serve-c1"]["baseline_e2e_ms"] = 135.0
    out = capsys.readouterr().out
    assert "A/A, re-measure 4 pairs/1 sessions: 3 evaluations over 2 hours" in out  # rows from before "guard_check"
    assert "serve-c1: first call 2, rejected after fresh engines 1" in out
    assert "merged 2" in out and "1 runs ended in the run's error" in out
    assert (
        "delay 12 ms/request, re-measure 4 pairs/1 sessions: 1 evaluations over 1 hours; serve-c1: first call 1, "
        "rejected after fresh engines 1" in out
    )
    assert "planted" not in out
    summary([powered])
    out = capsys.readouterr().out
    assert "delay 15 ms/request, re-measure 16 pairs/4 sessions: 1 evaluations" in out
    assert "(serve-c1 planted 10.0%-10.0% slower: baseline requests 135-135 ms, 1 runs)" in out


def test_a_run_records_the_baselines_request_latency_a_planted_delay_is_a_share_of():
    def t(side, e2e, workload="serve-c1", ok=True):
        return {"workload": workload, "side": side, "ok": ok, "metrics": {"e2e_p50_ms": e2e}}

    trials = [t("baseline", 100.0), t("baseline", 120.0), t("baseline", 110.0), t("candidate", 500.0)]
    trials += [t("baseline", 900.0, "serve-c8"), t("baseline", 5.0, ok=False), {"workload": "serve-c1", "side": "x"}]
    assert baseline_e2e_ms(trials, "serve-c1") == 110.0 and baseline_e2e_ms(trials, "serve-c8") == 900.0
    assert baseline_e2e_ms([], "serve-c1") is None


def test_a_run_keeps_each_pairs_log_ratio_per_session_first_run_and_fresh_engines_apart():
    def t(side, value, pair, phase="guard", session=0, ok=True):
        return {
            "workload": "serve-c1",
            "side": side,
            "value": value,
            "pair": pair,
            "phase": phase,
            "session": session,
            "ok": ok,
        }

    trials = [t("baseline", 100.0, 0), t("candidate", 90.0, 0), t("candidate", 80.0, 1), t("baseline", 100.0, 1)]
    trials += [t("baseline", 100.0, 2), t("candidate", 1.0, 2, ok=False)]  # an incomplete pair is left out
    trials += [t("baseline", 50.0, 0, "guard-check", 2000), t("candidate", 55.0, 0, "guard-check", 2000)]
    trials += [t("baseline", 100.0, -1), t("candidate", 1.0, -1)]  # a failed warm-up round is no pair
    assert pair_log_ratios(trials, "serve-c1", "guard") == [[0, -0.1054], [0, -0.2231]]
    assert pair_log_ratios(trials, "serve-c1", "guard-check") == [[2000, 0.0953]]
    assert pair_log_ratios(trials, "serve-c8", "guard") == []

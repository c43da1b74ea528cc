"""The one-line verdict (agentsearch.headline): number and unit, the same everywhere."""

from __future__ import annotations

import pytest

from agentsearch.headline import ci_text, decision_label, headline, measured, number, unit
from history.records import WorkloadSummary

from .conftest import evaluation_record


@pytest.mark.parametrize(
    "metric, want",
    [
        ("output_tok_s", "tok/s"),
        ("total_tok_s", "tok/s"),
        ("tok_s", "tok/s"),
        ("tokens_per_s", "tok/s"),
        ("requests_s", "req/s"),
        ("req_s", "req/s"),
        ("qps", "req/s"),
        ("ttft_p50_ms", "ms"),
        ("median_itl_ms", "ms"),
        ("p99_tpot_ms", "ms"),
        ("kernel_us", "µs"),
        ("latency_mean_s", "s"),
        ("latency_p99_s", "s"),
        ("elapsed_s", "s"),
        ("wall_s", "s"),
        ("latency", "s"),
        ("ops_s", "ops/s"),
        ("images_s", "images/s"),
        ("score", ""),
        ("", ""),
    ],
)
def test_unit_from_the_metric_name(metric, want):
    assert unit(metric) == want


def test_configured_unit_wins():
    assert unit("score", "points") == "points"
    assert unit("output_tok_s", "tokens/s") == "tokens/s"


def test_numbers_are_short_and_separated():
    assert number(780.63) == "780.6"
    assert number(1393.2) == "1,393"
    assert number(123456.7) == "123,457"
    assert number(0.012345) == "0.01235"
    assert number(None) == "—"
    assert ci_text([1.176, 2.238]) == "+17.6…+123.8%"
    assert ci_text([0.97, 1.05]) == "-3.0…+5.0%"


def summary(w, name="throughput"):
    """A typed workload summary from the fields a test sets (the rest: what a short comparison records)."""
    return WorkloadSummary.from_json({"name": name, "max_pairs": 12, "winsorized": 0, "calibrated": False, **w})


def typed(rec):
    """The evaluation record a headline reads, from a test's dict of the fields that matter."""
    rec = dict(rec)
    if rec.get("confirmation"):
        rec["confirmation"] = {"name": "throughput", **rec["confirmation"]}
    return evaluation_record(**rec)


def workload(role, speedup, decision, **kw):
    base = {
        "role": role,
        "speedup": speedup,
        "decision": decision,
        "ci": kw.pop("ci", None),
        "p_value": kw.pop("p", None),
        "pairs": kw.pop("pairs", 12),
        "baseline_median": kw.pop("base", None),
        "candidate_median": kw.pop("cand", None),
        "reason": kw.pop("reason", ""),
    }
    base.update(kw)
    return base


def merge_record():
    return {
        "verdict": "merge",
        "reasons": [],
        "objective": "throughput",
        "baseline": "a" * 40,
        "candidate": "b" * 40,
        "workloads": {
            "throughput": workload(
                "objective",
                1.622,
                "win",
                ci=[1.176, 2.238],
                p=0.0035,
                base=780.6,
                cand=1393.2,
                metric="output_tok_s",
                unit="tok/s",
                higher_is_better=True,
            ),
            "serve-c1": workload("guard", 0.982, "ok", pairs=3),
        },
        "confirmation": workload("confirmation", 2.14, "ok", pairs=4),
    }


def test_merge_headline_has_number_unit_ci_p_pairs_guards_confirmation():
    assert headline(typed(merge_record())) == (
        "MERGE — output_tok_s 780.6 → 1,266 tok/s (+62.2%, 95% CI +17.6…+123.8%, p=0.0035, 12 pairs), "
        "guards ok, confirmed +114.0%"
    )


def test_the_arrow_moves_the_baseline_by_the_paired_estimate_so_it_agrees_with_the_percentage():
    rec = merge_record()
    rec.update(verdict="reject", confirmation=None)
    # the main job's KV-cache proposal: side medians 660.5 and 657.3 (-0.5%), the paired estimate +0.5%
    rec["workloads"]["throughput"].update(decision="lose", speedup=1.005, baseline_median=660.5, candidate_median=657.3)
    assert headline(typed(rec)).startswith("REJECT — output_tok_s 660.5 → 663.8 tok/s (+0.5%")
    latency = workload("objective", 1.25, "win", base=100.0, cand=81.0, metric="ttft_ms", higher_is_better=False)
    assert measured(summary(latency, "ttft")).startswith(
        "ttft_ms 100 → 80 ms (+25.0%"
    )  # speedup = base / cand for a latency
    del rec["workloads"]["throughput"]["higher_is_better"]  # a record from before the direction was kept
    assert headline(typed(rec)).startswith("REJECT — output_tok_s 660.5 → 657.3 tok/s (+0.5%")


def test_old_records_without_metric_fall_back_to_the_workload_name_and_given_units():
    rec = merge_record()
    for key in ("metric", "unit"):
        del rec["workloads"]["throughput"][key]
    assert headline(typed(rec)).startswith("MERGE — throughput 780.6 → 1,266 (+62.2%")
    assert headline(typed(rec), units={"throughput": "tok/s"}).startswith(
        "MERGE — throughput 780.6 → 1,266 tok/s (+62.2%"
    )


def test_futility_stop_reads_as_no_gain_not_lose():
    rec = merge_record()
    rec.update(verdict="reject", confirmation=None, reasons=["objective: throughput: no worthwhile speedup: ..."])
    rec["workloads"] = {
        "throughput": workload(
            "objective",
            1.004,
            "lose",
            ci=[0.98, 1.03],
            p=0.4,
            pairs=5,
            base=780.0,
            cand=783.1,
            metric="output_tok_s",
            reason="no worthwhile speedup: speedup +0.40% ...",
        )
    }
    line = headline(typed(rec))
    assert line == (
        "REJECT — output_tok_s 780 → 783.1 tok/s (+0.4%, 95% CI -2.0…+3.0%, p=0.4, 5 pairs), "
        "no worthwhile speedup, stopped early"
    )
    assert "lose" not in line
    assert decision_label(summary(rec["workloads"]["throughput"])) == "no gain (stopped)"
    slower = workload("objective", 0.8, "lose", reason="slower: speedup -20%")
    assert decision_label(summary(slower)) == "slower (stopped)"


def test_no_op_is_said():
    rec = merge_record()
    rec.update(verdict="reject", candidate="a" * 40, confirmation=None)
    rec["workloads"]["throughput"].update(decision="lose", speedup=1.0)
    line = headline(typed(rec))
    assert line.endswith("no worthwhile speedup, stopped early, no change: the candidate is the baseline")


def test_later_failures_name_the_check():
    rec = merge_record()
    rec.update(verdict="reject", reasons=["distribution: prefill: max KL 0.4 above the floor " + "x" * 300])
    line = headline(typed(rec))
    assert line.startswith("REJECT — output_tok_s 780.6 → 1,266 tok/s (+62.2%")
    assert ", distribution: prefill: max KL 0.4" in line and line.endswith("…") and len(line) < 260
    rec["workloads"]["serve-c1"].update(decision="regressed", speedup=0.95)
    rec["reasons"] = ["guard-workloads: serve-c1: regressed"]
    assert headline(typed(rec)).endswith("guard serve-c1 regressed -5.0%")
    rec["workloads"]["serve-c1"].update(decision="ok")
    rec["confirmation"].update(decision="not-confirmed", speedup=0.99)
    assert headline(typed(rec)).endswith("not confirmed on fresh seeds (-1.0%)")


def test_a_failed_objective_says_what_failed_not_measurement_failed():
    """The demo of 2026-12-06 05:00: a compiled model's greedy tokens differed in pair 6; the headline said
    "measurement failed", as if the instrument broke. It names the objective's own reason."""
    rec = merge_record()
    why = "objective: the sides' outputs differ (throughput, pair 6, seed 1175202740): outputs check: " + "x" * 200
    rec.update(verdict="reject", confirmation=None, reasons=[why])
    rec["workloads"]["throughput"].update(decision="failed", pairs=5)
    line = headline(typed(rec))
    assert ", objective: the sides' outputs differ (throughput, pair 6" in line and line.endswith("…"), line
    assert "measurement failed" not in line


def test_nothing_measured_gives_the_first_reason():
    rec = {"verdict": "reject", "reasons": ["patch-applies: the patch makes no change to the baseline"], "checks": []}
    assert headline(typed(rec)) == "REJECT — patch-applies: the patch makes no change to the baseline"
    assert headline(typed({"verdict": "review", "reasons": []})) == "REVIEW"

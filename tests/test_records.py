"""Typed history records: validation on load (file:line), the schema-1 upgrade against a log
written by the code before typed records, and failure kinds instead of English."""

from __future__ import annotations

import dataclasses
import json
import tarfile
from pathlib import Path

import pytest

from harness.trials import TRIAL_FAILURES
from history import HistoryError, HistoryLog, verify
from history import records as rec
from history.insights import distill, knob_table
from history.proposals import proposals_of

from .conftest import ROOT, run_cli

FIXTURE = ROOT / "tests" / "fixtures" / "schema1-target.tar.gz"
# every released history format, as the code of its time wrote it (tests/fixtures/make_schema1_history.py, run
# from that code's checkout): 0.1.0 as of 2026-11-30 11:34 (010faf8) and as of its early days (before
# 09d6235: insights did not count reverts yet, and GitPython was a dependency), 0.2.0, 0.3.0, 0.4.0 (with a stack
# check and a bisection), 0.5.0, 0.6.0 (a stack check with its guards), 0.7.0 and 0.8.0
FIXTURES = {
    "0.1.0": FIXTURE,
    "0.1.0-early": ROOT / "tests" / "fixtures" / "history-0.1.0-early.tar.gz",
    "0.2.0": ROOT / "tests" / "fixtures" / "history-0.2.0.tar.gz",
    "0.3.0": ROOT / "tests" / "fixtures" / "history-0.3.0.tar.gz",
    "0.4.0": ROOT / "tests" / "fixtures" / "history-0.4.0.tar.gz",
    "0.5.0": ROOT / "tests" / "fixtures" / "history-0.5.0.tar.gz",
    "0.6.0": ROOT / "tests" / "fixtures" / "history-0.6.0.tar.gz",
    "0.7.0": ROOT / "tests" / "fixtures" / "history-0.7.0.tar.gz",
    "0.8.0": ROOT / "tests" / "fixtures" / "history-0.8.0.tar.gz",
}
WROTE_SCHEMA = {
    "0.1.0": 1,
    "0.1.0-early": 1,
    "0.2.0": 2,
    "0.3.0": 2,
    "0.4.0": 2,
    "0.5.0": 2,
    "0.6.0": 2,
    "0.7.0": 2,
    "0.8.0": 2,
}


def unpack(fixture: Path, into: Path) -> Path:
    with tarfile.open(fixture) as tar:
        tar.extractall(into, filter="data")
    return into / "toy"


@pytest.fixture
def schema1(tmp_path: Path) -> Path:
    """A copy of the toy target whose history the schema-1 code wrote (tests/fixtures/make_schema1_history.py)."""
    return unpack(FIXTURE, tmp_path)


@pytest.fixture(params=sorted(FIXTURES))
def released(request, tmp_path: Path) -> tuple[Path, int]:
    """A copy of a toy target whose history a released version wrote, and the schema it wrote."""
    return unpack(FIXTURES[request.param], tmp_path), WROTE_SCHEMA[request.param]


def history_file(repo: Path) -> Path:
    return repo / ".git" / "agentsearch" / "history.jsonl"


def test_every_kind_has_one_class_and_trial_failures_are_failure_kinds():
    assert set(rec.KINDS) == {c.KIND for c in rec.CLASSES} and len(rec.KINDS) == len(rec.CLASSES)
    assert {rec.FailureKind(f) for f in TRIAL_FAILURES}  # the harness's words are record words
    from history.records.checks import DEFAULT_FAILURE

    assert all(c in DEFAULT_FAILURE for c in rec.CheckName)  # every check has a failure kind
    from agentsearch.gate import REQUIRED_CHECKS

    assert set(REQUIRED_CHECKS) <= {c.value for c in rec.CheckName}


def test_every_released_history_loads_verifies_reports_and_resumes(released: tuple[Path, int]):
    schema1, wrote = released
    lines = [json.loads(ln) for ln in history_file(schema1).read_text().splitlines()]
    assert {ln["v"] for ln in lines} == {wrote}  # written by that release's code, never rewritten
    entries = list(HistoryLog(history_file(schema1)).entries())
    kinds = {e.kind for e in entries}
    assert {
        "episode-started",
        "proposal-created",
        "trial",
        "statistic",
        "verdict",
        "merge",
        "insight",
        "episode-finished",
        "evaluation",
        "recheck",
        "revert",
    } <= kinds
    assert all(isinstance(e.record, rec.BY_KIND[e.kind]) for e in entries)
    by_title = {r.title: r for r in proposals_of(entries)}
    # the upgrader derived the failure kinds from the check names and recorded decisions
    assert by_title["Speed up the benchmark"].failures == (rec.FailureKind.PROTECTED_PATH,)
    assert by_title["03-stale"].failed_check == "patch-applies"
    assert by_title["03-stale"].failures == (rec.FailureKind.PATCH_FAILED,)
    assert by_title["Reword a comment"].failures == (rec.FailureKind.NO_EFFECT,)
    fast = by_title["Make it 50% faster"]
    assert fast.reverted and fast.merged and not fast.is_win and fast.effect is not None and fast.effect > 0.3

    proc = run_cli("history", "verify", "-C", str(schema1))
    assert proc.returncode == 0 and f"ok, {len(lines)} records" in proc.stdout, proc.stderr
    proc = run_cli("history", "-C", str(schema1), "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["evaluations"]
    assert [r["verdict"] for r in rows] == ["merge", "reject", "reject", "reject", "reject"]
    proc = run_cli("report", "-C", str(schema1), "001", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["verdict"] == "merge" and report["reverted"] and "Make it 50% faster" in report["text"]
    proc = run_cli("review", "-C", str(schema1), "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["merges"][0]["reverted"] is True, proc.stderr
    if "stack-check" in kinds:  # 0.4.0 on: its stack check's leave-one-out is what review shows of the merge
        assert "stack-bisect" in kinds
        (check,) = [e.record for e in entries if e.kind == "stack-check"]
        assert isinstance(check, rec.BY_KIND["stack-check"])
        assert json.loads(proc.stdout)["merges"][0]["today"] is not None

    proc = run_cli("episode", "-C", str(schema1), "--resume", "--json", timeout=300)
    assert proc.returncode in (0, 4), proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["judged"] == 1 and summary["proposals"][0]["verdict"] == "reject"
    assert summary["proposals"][0]["reasons"][0].startswith("patch-applies: does not apply")
    after = [json.loads(ln) for ln in history_file(schema1).read_text().splitlines()]
    assert after[: len(lines)] == lines  # the old lines are kept as written
    assert [ln["v"] for ln in after[len(lines) :]] == [rec.SCHEMA_VERSION] * (len(after) - len(lines))
    assert [ln["kind"] for ln in after[len(lines) :]] == [
        "episode-resumed",
        "proposal-created",
        "verdict",
        "insight",
        "episode-finished",
    ]
    verdict = after[len(lines) + 2]["data"]
    assert verdict["failed_check"] == "patch-applies" and verdict["failure"] == "patch-failed"
    assert verdict["checks"][0]["failure"] == "patch-failed" and verdict["schema_version"] == rec.SCHEMA_VERSION
    assert verify(history_file(schema1)).ok
    assert run_cli("history", "verify", "-C", str(schema1)).returncode == 0


def _rewrite(path: Path, line: int, change) -> None:
    """Edit one record's data and re-seal the chain from there (a well-formed log with a bad record)."""
    from history.log import _digest

    rows = [json.loads(ln) for ln in path.read_text().splitlines()]
    change(rows[line - 1]["data"])
    prev = rows[line - 2]["hash"] if line > 1 else "0" * 64
    for r in rows[line - 1 :]:
        r["prev"] = prev
        body = {k: v for k, v in r.items() if k != "hash"}
        r["hash"] = prev = _digest(body)
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


@pytest.mark.parametrize(
    "change, says",
    [
        (lambda d: d.pop("merge"), "missing field 'merge'"),
        (lambda d: d.update(new=7), "revert.new: expected str, got 7"),
        (lambda d: d.update(surprise=1), "unknown field surprise"),
    ],
)
def test_a_record_that_does_not_fit_its_class_is_one_line_naming_file_and_line(schema1: Path, change, says):
    path = history_file(schema1)
    n = next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if json.loads(ln)["kind"] == "revert")
    _rewrite(path, n, change)
    with pytest.raises(HistoryError) as info:
        list(HistoryLog(path).entries())
    msg = str(info.value)
    assert f"history.jsonl:{n}: invalid revert record" in msg and says in msg and "\n" not in msg
    rep = verify(path)
    assert not rep.ok and rep.bad_line == n and says in rep.reason
    proc = run_cli("history", "-C", str(schema1))
    assert (
        proc.returncode != 0 and f"history.jsonl:{n}" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    ), proc.stderr


def test_entries_are_read_again_from_where_the_file_changed(schema1: Path):
    path = history_file(schema1)
    log = HistoryLog(path)
    first = list(log.entries())
    again = list(log.entries())
    assert [e.hash for e in again] == [e.hash for e in first] and again[0] is first[0]  # parsed once
    _rewrite(path, 3, lambda d: d.update(value=123.5))  # rewritten under the reader: read again, validated again
    assert [e.record.value for e in log.entries() if e.seq == 3] == [123.5]
    _rewrite(path, 3, lambda d: d.update(value=-1.0))  # a successful trial's value is positive: the line is refused
    with pytest.raises(
        HistoryError, match=r"history.jsonl:3: invalid trial record: .*a successful trial needs a positive"
    ):
        list(log.entries())
    _rewrite(path, 3, lambda d: d.update(value=123.5))
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:5]))
    assert len(list(log.entries())) == 5


def test_a_newer_schema_is_refused_with_the_version(tmp_path: Path):
    path = tmp_path / "h.jsonl"
    with HistoryLog(path) as log:
        log.append(rec.Repair(note="x"), None, None)
    _rewrite_v = [json.loads(ln) for ln in path.read_text().splitlines()]
    _rewrite_v[0]["v"] = rec.SCHEMA_VERSION + 1
    path.write_text(json.dumps(_rewrite_v[0]) + "\n")
    with pytest.raises(HistoryError, match=r"h.jsonl:1: unsupported schema version 3"):
        list(HistoryLog(path).entries())


def test_writing_an_invalid_record_is_refused(tmp_path: Path):
    with HistoryLog(tmp_path / "h.jsonl") as log:
        with pytest.raises(HistoryError, match="missing field 'old'"):
            log.append("revert", None, None, {"merge": "a", "new": "b"})
        with pytest.raises(rec.RecordError, match="expected a number"):
            rec.Trial.of(
                {
                    "number": 1,
                    "candidate": "c",
                    "baseline": "b",
                    "measurement": "m",
                    "workload": "w",
                    "side": "candidate",
                    "seed": 1,
                    "pair": 0,
                    "position": 0,
                    "order": "AB",
                    "session": 0,
                    "ok": True,
                    "value": "fast",
                }
            )
    rt = rec.Revert(merge="a", old="b", new="c")
    assert rec.Revert.from_json(rt.to_json()) == rt and rt.to_json()["schema_version"] == rec.SCHEMA_VERSION


def _reworded(entries: list, word: str) -> list:
    """The same entries with every English reason and check detail replaced (the structure kept)."""
    out = []
    for e in entries:
        r = e.record
        if isinstance(r, rec.Verdict):
            r = dataclasses.replace(
                r,
                reasons=tuple(f"{word} {i}" for i, _ in enumerate(r.reasons)),
                checks=tuple(dataclasses.replace(c, detail=f"{word}") for c in r.checks),
            )
            e = dataclasses.replace(e, data=r.to_json(), record=r)
        out.append(e)
    return out


def _without_quotes(ins: dict) -> dict:
    """Insights minus the time stamp and the reasons quoted for people in the lessons."""
    ins = {k: v for k, v in ins.items() if k != "generated_ts"}
    ins["lessons"] = {k: [x.split(":", 1)[0] for x in v] for k, v in ins["lessons"].items()}
    return ins


def test_insights_and_the_bandit_read_failure_kinds_not_english(schema1: Path):
    entries = list(HistoryLog(history_file(schema1)).entries())
    # knobs on the fixture's proposals, so the bandit's table has something to count
    knobbed = []
    for i, e in enumerate(entries):
        if isinstance(e.record, rec.ProposalCreated):
            r = dataclasses.replace(e.record, meta={"knobs": {"k": [1, 1 + i]}})
            e = dataclasses.replace(e, data=r.to_json(), record=r)
        knobbed.append(e)
    # and one crashed candidate, to count as a failure
    crash = next(e for e in knobbed if isinstance(e.record, rec.Verdict) and e.record.failed_check == "protected-paths")
    crashed = dataclasses.replace(
        crash.record,
        failed_check="objective",
        failure=rec.FailureKind.CRASH,
        checks=(rec.CheckResult("objective", "fail", "it fell over", rec.FailureKind.CRASH),),
    )
    knobbed = [dataclasses.replace(e, record=crashed, data=crashed.to_json()) if e is crash else e for e in knobbed]

    before = distill(knobbed)
    for word in ("Traceback: timed out, exited with status 1; build: engine error", "all fine"):
        after = distill(_reworded(knobbed, word))
        assert _without_quotes(after) == _without_quotes(before)
        assert knob_table(proposals_of(_reworded(knobbed, word))) == knob_table(proposals_of(knobbed))
    assert before["reasons"] == {"objective": 2, "patch-applies": 1, "reverted": 1}
    assert before["knobs"]["k"]["failures"] == 1 and before["by_category"]["other"]["failures"] == 1
    assert any("broke the workload" in x for x in before["lessons"]["avoid"])


def test_a_trial_record_is_the_harness_trial_and_where_it_belongs():
    """One class per trial (issue #38): the harness's TrialRecord is the record's base, validated the same."""
    t = rec.TrialRecord("w", "baseline", 7, 0, 1, "BA", 0, True, 12.5, {"cpu_s": 0.1}, 0.3, phase="guard")
    r = rec.Trial.of_run(t, number=2, candidate="c" * 40, baseline="b" * 40, measurement="k", extra={"node": "n1"})
    assert isinstance(r, rec.TrialRecord) and (r.workload, r.seed, r.phase, r.value) == ("w", 7, "guard", 12.5)
    assert r.number == 2 and r.extra == {"node": "n1"} and r.schema_version == rec.SCHEMA_VERSION
    assert rec.Trial.from_json(r.to_json()) == r and r.to_json()["node"] == "n1"
    for bad, says in (
        ({"side": "both"}, "side must be baseline or candidate"),
        ({"value": -1.0}, "a successful trial needs a positive, finite value"),
        ({"value": float("nan")}, "a successful trial needs a positive, finite value"),
        ({"ok": False, "value": None}, "a failed trial needs an error"),
    ):
        with pytest.raises(rec.RecordError, match=says):
            dataclasses.replace(t, **bad)


def test_a_distribution_check_is_typed_down_to_its_reference_regimes():
    """The distribution check as verify writes it (schema 3): the reference comparison and its regimes are classes,
    a wrong type inside is one line naming the field, and records from before the reference (schema 2) still load."""
    stats = {"passed": True, "positions": 40, "kl_mean": 1e-8, "kl_p99": 2e-8, "kl_max": 3e-8, "same_top_pct": 99.0}
    worse = {**stats, "kl_max": 9e-8, "same_top_pct": 97.5}
    data = {
        "number": 3,
        "schema_version": 3,
        "verdict": "fail",
        "reasons": ["main already diverges from the reference 0123456789 at max_num_seqs=32"],
        "mode": "tight",
        "public": {"prefill": stats},
        "holdout": {"prefill": stats},
        "public_size": 42,
        "holdout_size": 14,
        "reference": {
            "commit": "0123456789abcdef",
            "budget": "[verify] drift_budget kl_max 1e-07",
            "mode": "approx",
            "caps": {"kl_max": 1e-7},
            "passed": False,
            "against_main": True,
            "regimes": [
                {
                    "regime": {},
                    "label": "the baseline's regime",
                    "own": True,
                    "passed": True,
                    "against_main": True,
                    "sets": {"public": {"prefill": stats}, "holdout": {"prefill": worse}},
                },
                {
                    "regime": {"max_num_seqs": 32},
                    "label": "max_num_seqs=32",
                    "own": False,
                    "passed": False,
                    "against_main": True,
                    "sets": {"public": {"prefill": worse}},
                },
            ],
            "main": [
                {
                    "regime": {"max_num_seqs": 32},
                    "label": "max_num_seqs=32",
                    "passed": False,
                    "sets": {"public": {"prefill": worse}},
                }
            ],
            "reused": 1,
            "collected": 0,
            "wall_s": 12.5,
        },
        "blame": "main",
    }
    d = rec.Distribution.of(data)
    assert d.number == 3 and d.blame == "main" and d.reference is not None
    ref = d.reference
    assert [r.label for r in ref.regimes] == ["the baseline's regime", "max_num_seqs=32"]
    assert ref.regimes[1].regime == {"max_num_seqs": 32} and ref.main[0].against_main is None
    worst = ref.worst_by_regime()
    assert worst["the baseline's regime"]["prefill"]["kl_max"] == 9e-8  # the worse of public and holdout
    assert worst["the baseline's regime"]["prefill"]["same_top_pct"] == 97.5  # the lowest share is the worst
    back = d.to_json()["reference"]
    assert {k: v for k, v in back.items() if k != "main"} == {k: v for k, v in data["reference"].items() if k != "main"}
    assert data["reference"]["main"][0].items() <= back["main"][0].items()  # main's rows gain their defaults
    assert d.sets() == {"public": {"prefill": stats}, "holdout": {"prefill": stats}}
    # the same check inside an evaluation record is the same class
    ev = rec.Evaluation.of(
        {
            "verdict": "reject",
            "reasons": [],
            "ref": "x",
            "baseline": "a",
            "candidate": "b",
            "seed": 1,
            "checks": [],
            "distribution": {k: v for k, v in data.items() if k != "number"},
        }
    )
    assert isinstance(ev.distribution, rec.DistributionCheck) and ev.distribution.reference == ref
    bad = {**data, "reference": {**data["reference"], "regimes": [{"label": "x", "passed": "yes"}]}}
    with pytest.raises(rec.RecordError, match=r"reference\.regimes\[0\]\.passed: expected bool"):
        rec.Distribution.of(bad)
    before = rec.Distribution.of({k: v for k, v in data.items() if k not in ("reference", "blame")})
    assert before.reference is None and before.blame is None

"""Provenance on every number (issue #59): each figure a report, a PR body, a review comment or `--json` shows says how
it was obtained, and a figure that was not run reads "not run", never a number. ``assert_provenance`` is the check
the report, forge and upstream tests run on real output; here its rules, and the not-run case on every format."""

from __future__ import annotations

import math
import re

import pytest

from agentsearch.provenance import WORDS, Figure, How
from agentsearch.report import Evidence, render, render_pr, render_upstream_pr, to_json

from .conftest import evaluation_record

# a figure in a table cell: a number, a percentage, a scientific value (a commit's hex or a name's digits are not)
NUMBER = re.compile(r"(?<![\w.#/-])[+-]?\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?\s?(?:%|s\b|ops/s|nats)?(?![\w.])")
VOCABULARY = (*WORDS.values(), "measured in ", "seconds measured once")
# tables that hold no measurement: the checks (each detail says what it measured, in words), the environment (facts),
# the duplicate searches (pull request numbers)
NO_FIGURES = ("check", "", "search (open pull requests)")


def md_tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines[:-1]):
        if line.startswith("|") and re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", lines[i + 1].strip()):
            header = cells(line)
            rows = []
            for row in lines[i + 2 :]:
                if not row.startswith("|"):
                    break
                rows.append(cells(row))
            out.append((header, rows))
    return out


def cells(row: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", row.strip())[1:-1]]


def assert_provenance(text: str, fmt: str = "md") -> int:
    """Every table of figures has a *measured* column and every row of it says how (from the vocabulary); returns
    the number of such tables."""
    seen = 0
    if fmt == "html":
        for attrs, body in re.findall(r"<table([^>]*)>(.*?)</table>", text, re.S):
            if 'id="checks"' in attrs or 'id="environment"' in attrs:
                continue
            tds = re.findall(r"<td[^>]*>(.*?)</td>", body, re.S)
            if not any(NUMBER.search(re.sub(r"<[^>]+>", "", td)) for td in tds):
                continue
            assert "<th>measured</th>" in body, body[:300]
            measured = re.findall(r'<td class="measured">(.*?)</td>', body, re.S)
            rows = len(re.findall(r"<tr>(?!<th>)", body))
            assert len(measured) == rows and all(m.startswith(VOCABULARY) for m in measured), body[:500]
            seen += 1
        return seen
    for header, rows in md_tables(text):
        if header[:1] and header[0] in NO_FIGURES or not rows:
            continue
        if not any(NUMBER.search(c) for r in rows for c in r):
            continue
        assert "measured" in header, header
        i = header.index("measured")
        for r in rows:
            assert len(r) == len(header) and r[i].startswith(VOCABULARY), (header, r)
        seen += 1
    return seen


def test_a_figure_has_a_value_exactly_when_it_was_run() -> None:
    assert Figure.of("x", 1.5, "s", How.PAIRED, True, "4 pairs").words() == "measured in 4 pairs"
    for bad in (None, math.nan, math.inf, "1.5", True):
        f = Figure.of("x", bad, "s", How.PAIRED, True, "4 pairs")
        assert f.how is How.NOT_RUN and f.value is None and f.words() == "not run" and f.advisory
    with pytest.raises(ValueError, match="not run"):
        Figure("x", 0.0, "s", How.NOT_RUN)  # a zero is a measurement: "not run" has none
    with pytest.raises(ValueError, match="not run"):
        Figure("x", None, "s", How.ONCE)
    assert Figure.of("x", 2, "s", How.ONCE).to_json() == {
        "name": "x",
        "value": 2,
        "unit": "s",
        "provenance": "once",
        "advisory": True,
        "detail": None,
    }


def test_the_checker_fails_a_table_of_figures_without_provenance() -> None:
    """The check itself can fail: a table of numbers without the column, or with a row that says nothing."""
    bare = "| workload | change |\n|---|---|\n| speed | +3.1% |\n"
    with pytest.raises(AssertionError):
        assert_provenance(bare)
    silent = "| workload | change | measured |\n|---|---|---|\n| speed | +3.1% | |\n"
    with pytest.raises(AssertionError):
        assert_provenance(silent)
    assert assert_provenance(silent.replace("| |\n", "| measured in 4 pairs |\n")) == 1
    assert assert_provenance("| check | status | detail |\n|---|---|---|\n| coverage | pass | 3/4 lines |\n") == 0
    html = '<table id="w"><tr><th>change</th></tr><tr><td>+3.1%</td></tr></table>'
    with pytest.raises(AssertionError):
        assert_provenance(html, "html")


def not_run_evidence() -> Evidence:
    """An evaluation whose guard never ran (the objective lost first): its figures are not run."""
    record = evaluation_record(
        verdict="reject",
        reasons=["speed: slower"],
        workloads={
            "speed": {
                "role": "objective",
                "pairs": 6,
                "decision": "lose",
                "speedup": 0.9,
                "ci": [0.85, 0.95],
                "p_value": 0.001,
                "baseline_median": 100.0,
                "candidate_median": 90.0,
                "unit": "ops/s",
                "metric": "ops_s",
            },
            "latency": {
                "role": "guard",
                "pairs": 0,
                "decision": "not-run",
                "speedup": None,
                "ci": None,
                "p_value": None,
                "baseline_median": None,
                "candidate_median": None,
            },
        },
    )
    return Evidence("x", "evaluation", record, [], directions={"speed": True, "latency": False})


def test_a_workload_that_did_not_run_reads_not_run_in_every_format() -> None:
    ev = not_run_evidence()
    md = render(ev, "md")[0]
    html = render(ev, "html")[0]
    body = render_pr(ev, {})
    for text, fmt in ((md, "md"), (html, "html"), (body, "md")):
        assert assert_provenance(text, fmt) >= 1
    row = next(ln for ln in md.splitlines() if ln.startswith("| latency |"))
    assert cells(row)[3:8] == ["not run"] * 5 and cells(row)[-1] == "not run", row
    prow = next(ln for ln in body.splitlines() if ln.startswith("| latency (guard) |"))
    assert cells(prow)[1:6] == ["not run"] * 5 and cells(prow)[-1] == "not run", prow
    assert "<td>not run</td><td>not run</td>" in html
    figures = to_json(ev)["figures"]
    latency = [f for f in figures if f["name"].startswith("workload.latency.")]
    assert latency and all(f["value"] is None and f["provenance"] == "not run" for f in latency)
    speed = [f for f in figures if f["name"].startswith("workload.speed.")]
    assert {f["provenance"] for f in speed} == {"paired"} and not any(f["advisory"] for f in speed)
    assert next(f for f in speed if f["name"].endswith(".change"))["value"] == pytest.approx(-0.1)
    # the distribution check did not run either: one figure says so, and no number stands for it
    assert [f for f in figures if f["name"] == "distribution"] == [
        {"name": "distribution", "value": None, "unit": "", "provenance": "not run", "advisory": True, "detail": None}
    ]
    upstream = render_upstream_pr(
        ev,
        "pr_vllm.md.j2",
        owner="A <a@b.c>",
        searches=[],
        not_duplicate="",
        coauthor="x <x@y.z>",
        model=None,
        prompt_sha=None,
        judged_tree="0" * 40,
        repo="acme/vllm",
        signoff=True,
    )
    assert assert_provenance(upstream) >= 1 and "Model evaluation: **not run**." in upstream


def assert_json_figures(got: dict) -> None:
    """`--json`: every figure carries a provenance state from the vocabulary; not run has no value."""
    assert got["figures"], got.keys()
    for f in got["figures"]:
        assert f["provenance"] in {h.value for h in How}, f
        assert (f["value"] is None) == (f["provenance"] == "not run"), f
        assert isinstance(f["advisory"], bool)


def test_a_candidate_that_failed_its_first_pair_still_gets_its_report() -> None:
    """The baseline's trial ran, the candidate's never completed a pair: no figure measured the change, so the row
    reads "not run" (the baseline's lone median is no measurement of it), and nothing crashes."""
    record = evaluation_record(
        verdict="reject",
        reasons=["speed: the candidate crashed"],
        workloads={
            "speed": {
                "role": "objective",
                "pairs": 0,
                "decision": "failed",
                "speedup": None,
                "ci": None,
                "p_value": None,
                "baseline_median": 100.0,
                "candidate_median": None,
            }
        },
    )
    ev = Evidence("x", "evaluation", record, [], directions={"speed": True})
    md, html, body = render(ev, "md")[0], render(ev, "html")[0], render_pr(ev, {})
    row = next(ln for ln in md.splitlines() if ln.startswith("| speed |"))
    assert cells(row)[3:8] == ["not run"] * 5 and "100" not in row, row
    assert assert_provenance(md) >= 1 and assert_provenance(html, "html") >= 1 and assert_provenance(body) >= 1
    figures = to_json(ev)["figures"]
    assert all(f["value"] is None for f in figures if f["name"].startswith("workload."))

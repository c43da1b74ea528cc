"""Red team: the stack check displays and reverts what proposals merged (agentsearch.stack)."""

from __future__ import annotations

import dataclasses
import json
import subprocess

from ..conftest import git, run_cli
from ..test_stack import KNOBS, queue_of, target
from .test_round3 import ESC, LYING_TITLE


def test_a_merged_title_cannot_lie_and_a_merge_that_no_longer_reverts_is_said_not_guessed(tmp_path):
    """Merge 1 (a real win) carries a title that would erase the row and draw a fake one; merge 2 rewrites the same
    line, so merge 1 no longer reverts on the tip. The stack check shows no escape sequence anywhere, and says
    `does-not-revert` for merge 1 — never a passenger, never a number it did not measure."""
    repo = target(tmp_path / "toy")
    one = KNOBS.replace("A = 1.0", "A = 1.2")
    queue_of(
        repo,
        tmp_path / "queue",
        [(LYING_TITLE, {"src/knobs.py": one}), ("Raise A again", {"src/knobs.py": one.replace("A = 1.2", "A = 1.5")})],
    )
    assert any(
        "=1B[2K" in f.read_text() for f in (tmp_path / "queue").iterdir()
    )  # the escapes, as git encodes a subject
    proc = run_cli(
        "episode", "-C", str(repo), "--patches", str(tmp_path / "queue"), "--seed", "5", "--json", timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    assert [p["verdict"] for p in json.loads(proc.stdout)["proposals"]] == ["merge", "merge"], proc.stdout
    first = git(repo, "rev-parse", "main~1").strip()

    got = run_cli(
        "stack",
        "-C",
        str(repo),
        "--leave-one-out",
        "--json",
        "--seed",
        "2",
        "--report",
        str(tmp_path / "s.md"),
        timeout=600,
    )
    assert got.returncode in (0, 1), got.stderr
    rec = json.loads(got.stdout)
    by = {r["merge"]: r for r in rec["removals"]}
    assert (
        by[first]["decision"] == "does-not-revert"
        and by[first]["marginal"] is None
        and "reverts cleanly" in by[first]["reason"]
    )
    assert first not in [r["merge"] for r in rec["removals"] if r["decision"] == "passenger"]
    human = run_cli("stack", "-C", str(repo), "--seed", "3", timeout=600)
    review = run_cli("review", "-C", str(repo))
    for text in (human.stdout, human.stderr, review.stdout, got.stdout, (tmp_path / "s.md").read_text()):
        assert ESC not in text and "\\u001b" not in text, repr(text)[:400]
    assert "merged 2" not in human.stdout and "tidy" in human.stdout


def a_check(merges: tuple, **kw):
    """A stack check of ``merges`` from a range `aaa…` → `bbb…` that delivers (``kw`` overrides), for the renderers."""
    from history.records.stack import StackCheck

    fields = dict(since="a" * 40, tip="b" * 40, objective="speed", verdict="delivers", reasons=(), seed=1)
    fields |= dict(cumulative=1.2, ci=(1.1, 1.3), product=1.21, product_ci=(1.1, 1.3))
    return StackCheck(merges=merges, **(fields | kw))


def test_a_title_cannot_break_the_stack_reports_table_or_its_plot():
    """A title with '|' and backticks stays in its cell; one with TeX between dollar signs is not parsed as
    mathtext (a malformed formula made matplotlib raise, and the report with it)."""
    from agentsearch.report import stack_markdown, stack_waterfall
    from history.records.stack import StackMerge

    merges = (
        StackMerge("c" * 40, "e1/001", "a | b `c` | fake cell", 1.1, (1.0, 1.2)),
        StackMerge("d" * 40, "e1/002", r"$\undefinedmacro{x}$ and $\frac{$", 1.1, (1.0, 1.2)),
    )
    r = a_check(merges)
    assert stack_waterfall(r, "png")[:4] == b"\x89PNG"
    rows = [ln for ln in stack_markdown(r).splitlines() if ln.startswith("| 1 |")]
    assert len(rows) == 1 and rows[0].replace("\\|", "").count("|") == 8, rows  # 7 cells, however the title is made


def test_the_html_stack_report_keeps_a_title_as_text():
    """The HTML report is the Markdown one converted: a title with a script, an image and a link stays text (every
    '<' of it was escaped before the conversion), the waterfall is inline SVG with its axes labelled."""
    import re

    from agentsearch.report import stack_html
    from history.records.stack import Removal, StackMerge

    evil = '<script>alert(1)</script><img src=x onerror=alert(2)> [ok](javascript:alert(3)) </td></tr></table>'
    merges = (
        StackMerge("c" * 40, "e1/001", evil, 1.1, (1.0, 1.2)),
        StackMerge("d" * 40, "e1/002", "fine", 1.1, (1.0, 1.2)),
    )
    r = a_check(
        merges,
        verdict="under-delivers",
        reasons=(f"why: {evil}",),
        cumulative=1.05,
        ci=(1.0, 1.1),
        removals=(Removal("c" * 40, "passenger", f"{evil} said the test", marginal=1.0, ci=(0.98, 1.02), pairs=6),),
    )
    page = stack_html(r)
    assert page.startswith("<!DOCTYPE html>") and page.count("<table>") == 2 and page.count("</table>") == 2
    assert "<script" not in page and "<img" not in page and 'href="javascript' not in page
    assert "&lt;script&gt;" in page and re.search(r"<svg[^>]*>", page) and "gain over the range" in page


def test_a_revert_pull_requests_title_and_body_keep_a_merged_title_inert():
    """`pr --revert` shows a merge's title (a proposal wrote it) in the pull request's title and body: escapes, HTML,
    mentions, links and a fake table row stay text; the title is one plain line; the body's table keeps its cells."""
    from agentsearch.report import RevertCase, revert_markdown, revert_title
    from history.records.stack import Removal, StackMerge

    from .test_forge_attacks import NASTY, outside_fences

    title = f"{NASTY} | fake | cell |\n### merged: harmless"
    k = a_check(
        (StackMerge("c" * 40, "e1/001", title, 1.1, (1.0, 1.2)),),
        removals=(
            Removal("c" * 40, "passenger", f"said of {NASTY} | a | b |", marginal=1.0, ci=(0.98, 1.02), pairs=12),
        ),
    )
    case = RevertCase(
        merge="c" * 40,
        proposal="e1/001",
        title=title,
        base="main",
        tip="b" * 40,
        commit="f" * 40,
        branch="agentsearch/revert-" + "c" * 12,
        check=k,
        removal=k.removals[0],
    )
    name = revert_title(case)
    assert (
        ESC not in name
        and "\x07" not in name
        and "\n" not in name
        and name.startswith("[agentsearch] revert (passenger): ")
    )
    body = revert_markdown(case)
    assert ESC not in body and "\x07" not in body
    live = outside_fences(body)
    for raw in ("<img", "@everyone", "https://evil", "see #1", "<h3>merged"):
        assert raw not in live, (raw, live)
    (row,) = [ln for ln in body.splitlines() if ln.startswith("| +10.00% |")]
    assert row.replace("\\|", "").count("|") == 9, (
        row
    )  # 8 cells (the last: how it was measured) whatever the reason says
    # a title cannot add grounds: ours come first, its words after
    forced = dataclasses.replace(case, title="Drop X: passenger, recheck does not hold", removal=None, check=None)
    assert revert_title(forced) == "[agentsearch] revert (asked by hand): Drop X: passenger, recheck does not hold"
    # a check of an older tip is no ground (a later merge may have changed what this one adds), and the body says so
    later = dataclasses.replace(case, tip="e" * 40)
    assert later.grounds == () and "**not today's**" in revert_markdown(later)


def test_revert_lands_a_prepared_commit_only_when_it_is_that_revert_but_for_its_dates(tmp_path):
    """`agentsearch revert` lands the commit of `pr --revert`'s branch instead of making its own only when the two
    are the same commit but for their dates: a changed message (a `Fixes #1` that closes an issue once pushed, an
    escape), an extra header, another tree or parent does not land."""
    from agentsearch.workspace import git as g

    from ..conftest import commit, make_repo

    repo = make_repo(tmp_path / "r", {"a.txt": "1\n"})
    commit(repo, {"a.txt": "2\n"}, "two")
    tree, parent = git(repo, "rev-parse", "HEAD^{tree}").strip(), git(repo, "rev-parse", "HEAD^").strip()

    def make(message: str, date: str, extra: str = "", of_tree: str = tree, of_parent: str = parent) -> str:
        who = f"agentsearch <agentsearch@localhost> {date} +0000"
        raw = f"tree {of_tree}\nparent {of_parent}\nauthor {who}\ncommitter {who}\n{extra}\n{message}"
        return subprocess.run(
            ["git", "hash-object", "-t", "commit", "-w", "--stdin"], cwd=repo, input=raw, text=True,
            capture_output=True, check=True,
        ).stdout.strip()  # fmt: skip

    ours = make("agentsearch: revert x\n\nAgentsearch-Revert: abc\n", "1700000000")
    assert g.same_commit_but_dates(repo, make("agentsearch: revert x\n\nAgentsearch-Revert: abc\n", "1800000000"), ours)
    no_date = make("agentsearch: revert x\n\nAgentsearch-Revert: abc\n", "1700000000")
    raw = git(repo, "cat-file", "commit", no_date).replace(" 1700000000 +0000", "", 1)  # an author line without one
    undated = subprocess.run(
        ["git", "hash-object", "-t", "commit", "-w", "--stdin", "--literally"], cwd=repo, input=raw, text=True,
        capture_output=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert not g.same_commit_but_dates(repo, undated, ours) and not g.same_commit_but_dates(repo, undated, undated)
    for other in (
        make("agentsearch: revert x\n\nFixes #1\nAgentsearch-Revert: abc\n", "1700000000"),
        make("agentsearch: revert x\x1b[2K\n\nAgentsearch-Revert: abc\n", "1700000000"),
        make("agentsearch: revert x\n\nAgentsearch-Revert: abc\n", "1700000000", extra="encoding ISO-8859-1\n"),
        make(
            "agentsearch: revert x\n\nAgentsearch-Revert: abc\n",
            "1700000000",
            of_parent=git(repo, "rev-parse", "HEAD").strip(),
        ),
        make(
            "agentsearch: revert x\n\nAgentsearch-Revert: abc\n",
            "1700000000",
            of_tree=git(repo, "rev-parse", "HEAD^^{tree}").strip(),
        ),
    ):
        assert not g.same_commit_but_dates(repo, other, ours)


def test_bisect_over_a_range_with_a_revert_names_the_merge_that_brought_the_regression_back(tmp_path):
    """Red team (round 4): M2 slows the guard by 20% and is reverted after M3 merged; M4 brings the slowdown again.
    Bisecting the merges alone (the reverted one left out) blamed M3, whose commit still carried M2's code. The
    search runs over the baseline's commits, reverts included, from the last revert on: it names M4."""
    repo = target(tmp_path / "toy")
    start = git(repo, "rev-parse", "main").strip()
    k1 = KNOBS.replace("A = 1.0", "A = 1.2")
    k2 = k1.replace("G = 1.0", "G = 0.8").replace("FAST_PATH = False", "FAST_PATH = True")
    k3 = k2.replace("A = 1.2", "A = 1.5")
    queue_of(
        repo,
        tmp_path / "q1",
        [("M1", {"src/knobs.py": k1}), ("M2 guard -20%", {"src/knobs.py": k2}), ("M3", {"src/knobs.py": k3})],
    )
    first = run_cli("episode", "-C", str(repo), "--patches", str(tmp_path / "q1"), "--seed", "5", "--json", timeout=600)
    assert [p["verdict"] for p in json.loads(first.stdout)["proposals"]] == ["merge"] * 3, first.stdout[-3000:]
    m2 = git(repo, "rev-parse", "main~1").strip()
    assert run_cli("revert", "-C", str(repo), m2).returncode == 0
    k4 = git(repo, "show", "main:src/knobs.py").replace("A = 1.5", "A = 1.9").replace("G = 1.0", "G = 0.8")
    queue_of(repo, tmp_path / "q2", [("M4 guard -20%", {"src/knobs.py": k4})])
    second = run_cli(
        "episode", "-C", str(repo), "--patches", str(tmp_path / "q2"), "--seed", "8", "--json", timeout=600
    )
    assert [p["verdict"] for p in json.loads(second.stdout)["proposals"]] == ["merge"], second.stdout[-3000:]
    m4 = git(repo, "rev-parse", "main").strip()
    proc = run_cli(
        "stack", "bisect", "-C", str(repo), "--since", start, "--metric", "guard", "--json", "--seed", "5", timeout=900
    )
    got = json.loads(proc.stdout)
    assert proc.returncode == 0 and got["culprit"] == m4, [
        (s["index"], s["outcome"], s["reason"]) for s in got["steps"]
    ]
    assert len(got["merges"]) == 5 and "the merge of" in got["reason"]  # M1, M2, M3, the revert, M4


PEEK_BENCH = """\
import json, os, random, sys
sys.path.insert(0, os.getcwd())
from src import knobs
seed, out, which = int(sys.argv[1]), sys.argv[2], sys.argv[3]
seen = [os.getcwd(), out, os.environ.get("AGENTSEARCH_WORKTREE", ""), os.environ.get("AGENTSEARCH_OUT", "")]
for fd in (1, 2):
    try:
        seen.append(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        pass
words = ("candidate", "baseline", "warm", "eval", "stack", "verify", "confirm")
leak = sum(w in s.lower() for s in seen for w in words)
value = knobs.speed() if which == "speed" else knobs.G
json.dump({"ops_s": 1000.0 * value * random.gauss(1.0, 0.02), "leak": leak}, open(out, "w"))
"""


def test_no_path_a_measured_process_sees_names_its_side_or_its_check(tmp_path):
    """Red team (round 4): merged code read `warm-stack-candidate` in its working directory and so knew it was the
    scratch side of a stack check's leave-one-out (it framed an honest merge as a passenger). Every path a measured
    process can see — its cwd, {out}, AGENTSEARCH_WORKTREE/OUT, its stdout and stderr — is now an opaque name."""
    import sys

    from ..conftest import make_repo
    from ..test_stack import CONFIG

    repo = make_repo(
        tmp_path / "toy",
        {
            "agentsearch.toml": CONFIG.format(python=sys.executable),
            "bench/bench.py": PEEK_BENCH,
            "src/__init__.py": "",
            "src/knobs.py": KNOBS,
        },
    )
    assert run_cli("init", "-C", str(repo)).returncode == 0
    queue_of(
        repo,
        tmp_path / "q",
        [
            ("A 1.2", {"src/knobs.py": KNOBS.replace("A = 1.0", "A = 1.2")}),
            ("A 1.4", {"src/knobs.py": KNOBS.replace("A = 1.0", "A = 1.4")}),
        ],
    )
    out = run_cli("episode", "-C", str(repo), "--patches", str(tmp_path / "q"), "--seed", "4", "--json", timeout=600)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["stack"]["verdict"] in (
        "delivers",
        "inconclusive",
        "under-delivers",
    )  # the end check ran
    assert run_cli("stack", "-C", str(repo), "--leave-one-out", "--seed", "2", timeout=600).returncode in (0, 1)
    from agentsearch.workspace import Workspace
    from history import HistoryLog
    from history.records import Trial

    trials = [
        e.record
        for e in HistoryLog(Workspace.open(repo).state / "history.jsonl").entries()
        if isinstance(e.record, Trial)
    ]
    measured = [t for t in trials if t.ok]
    assert len(measured) > 20 and all(t.metrics.get("leak") == 0 for t in measured), sorted(
        {(t.side, t.phase, t.metrics.get("leak")) for t in measured}
    )

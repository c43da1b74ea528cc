"""Red team: the stack check displays and reverts what proposals merged (agentsearch.stack)."""

from __future__ import annotations

import json

from ..conftest import git, run_cli
from ..test_stack import KNOBS, queue_of, target
from .test_round3 import ESC, LYING_TITLE


def test_a_merged_title_cannot_lie_and_a_merge_that_no_longer_reverts_is_said_not_guessed(tmp_path):
    """Merge 1 (a real win) carries a title that would erase the row and draw a fake one; merge 2 rewrites the same
    line, so merge 1 no longer reverts on the tip. The stack check shows no escape sequence anywhere, and says
    `does-not-revert` for merge 1 — never a passenger, never a number it did not measure."""
    repo = target(tmp_path / "toy")
    one = KNOBS.replace("A = 1.0", "A = 1.2")
    queue_of(repo, tmp_path / "queue", [(LYING_TITLE, {"src/knobs.py": one}), ("Raise A again", {"src/knobs.py": one.replace("A = 1.2", "A = 1.5")})])
    assert any("=1B[2K" in f.read_text() for f in (tmp_path / "queue").iterdir())  # the escapes, as git encodes a subject
    proc = run_cli("episode", "-C", str(repo), "--patches", str(tmp_path / "queue"), "--seed", "5", "--json", timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert [p["verdict"] for p in json.loads(proc.stdout)["proposals"]] == ["merge", "merge"], proc.stdout
    first = git(repo, "rev-parse", "main~1").strip()

    got = run_cli("stack", "-C", str(repo), "--leave-one-out", "--json", "--seed", "2", "--report", str(tmp_path / "s.md"), timeout=600)
    assert got.returncode in (0, 1), got.stderr
    rec = json.loads(got.stdout)
    by = {r["merge"]: r for r in rec["removals"]}
    assert by[first]["decision"] == "does-not-revert" and by[first]["marginal"] is None and "reverts cleanly" in by[first]["reason"]
    assert first not in [r["merge"] for r in rec["removals"] if r["decision"] == "passenger"]
    human = run_cli("stack", "-C", str(repo), "--seed", "3", timeout=600)
    review = run_cli("review", "-C", str(repo))
    for text in (human.stdout, human.stderr, review.stdout, got.stdout, (tmp_path / "s.md").read_text()):
        assert ESC not in text and "\\u001b" not in text, repr(text)[:400]
    assert "merged 2" not in human.stdout and "tidy" in human.stdout


def test_a_title_cannot_break_the_stack_reports_table_or_its_plot():
    """A title with '|' and backticks stays in its cell; one with TeX between dollar signs is not parsed as
    mathtext (a malformed formula made matplotlib raise, and the report with it)."""
    from agentsearch.report import stack_markdown, stack_waterfall
    from history.records.stack import StackCheck, StackMerge

    merges = (StackMerge("c" * 40, "e1/001", "a | b `c` | fake cell", 1.1, (1.0, 1.2)),
              StackMerge("d" * 40, "e1/002", r"$\undefinedmacro{x}$ and $\frac{$", 1.1, (1.0, 1.2)))
    r = StackCheck(since="a" * 40, tip="b" * 40, objective="speed", merges=merges, verdict="delivers", reasons=(), seed=1,
                   cumulative=1.2, ci=(1.1, 1.3), product=1.21, product_ci=(1.1, 1.3))
    assert stack_waterfall(r, "png")[:4] == b"\x89PNG"
    rows = [ln for ln in stack_markdown(r).splitlines() if ln.startswith("| 1 |")]
    assert len(rows) == 1 and rows[0].replace("\\|", "").count("|") == 8, rows  # 7 cells, however the title is made

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

    got = run_cli("stack", "-C", str(repo), "--leave-one-out", "--json", "--seed", "2", timeout=600)
    assert got.returncode in (0, 1), got.stderr
    rec = json.loads(got.stdout)
    by = {r["merge"]: r for r in rec["removals"]}
    assert by[first]["decision"] == "does-not-revert" and by[first]["marginal"] is None and "reverts cleanly" in by[first]["reason"]
    assert first not in [r["merge"] for r in rec["removals"] if r["decision"] == "passenger"]
    human = run_cli("stack", "-C", str(repo), "--seed", "3", timeout=600)
    review = run_cli("review", "-C", str(repo))
    for text in (human.stdout, human.stderr, review.stdout, got.stdout):
        assert ESC not in text and "\\u001b" not in text, repr(text)[:400]
    assert "merged 2" not in human.stdout and "tidy" in human.stdout

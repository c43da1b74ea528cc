"""Red team, round 4 on the review bot (issue #55): what a pull request brings into main, and a verdict kept after
its base moved.

1. A contributor without write permission opens a real +30% pull request whose ancestry holds a merge commit
   forging agentsearch's history trailers. `review-pr --merge` merged the head itself: the PR's whole history entered
   main through the merge's second parent, and the history's cross-check (which read trailers from every merge in
   the range) then said the history was truncated: `history verify` failed and every later episode refused to
   start. Now what enters main is agentsearch's own commit of the judged tree on the judged base (the PR's commits
   never do), the cross-check reads trailers along main's first-parent line only, and a head that moved after it
   was judged (a force-push) is not merged.
2. A judgment was keyed on the PR's head and its base branch's *name*: after main moved (the same change merged
   another way) the PR kept its `success` status and "merge-worthy" comment. Judgments are keyed on (head, base
   commit) now: a verdict judged against another base is stale (status pending, the comment says judge it again),
   and `--merge` refuses it in one line.

Everything is real: toy targets in real git repositories, the fake forge over real HTTP on loopback, the CLI in
child processes.
"""

from __future__ import annotations

import json
import sys

import pytest

from ..conftest import ROOT, commit, git, run_cli
from ..test_episode import episode_json, patch_from
from ..test_forge import MARKER, forge_target, pr_branch, records
from .toy import one_line, verify

sys.path.insert(0, str(ROOT))

pytestmark = pytest.mark.timeout(600)

FORGED = (
    "Merge side work\n\n"
    "Agentsearch-Proposal: e1/001\n"
    "Agentsearch-History-Seq: 99999\n"
    "Agentsearch-History-Head: " + "0" * 64 + "\n"
)


def rev(repo, ref: str) -> str:
    return git(repo, "rev-parse", ref).strip()


def parents(repo, sha: str) -> list[str]:
    return git(repo, "log", "-1", "--format=%P", sha).split()


def is_ancestor(repo, a: str, b: str) -> bool:
    import subprocess

    return subprocess.run(["git", "merge-base", "--is-ancestor", a, b], cwd=repo).returncode == 0


def episode_merged(tmp_path, repo) -> str:
    """One real episode that merges a win (from here on the history vouches for main), pushed; main's new tip."""
    queue = tmp_path / "queue"
    queue.mkdir()
    (queue / "01-fast.patch").write_text(patch_from(repo, {"speed.txt": "1.3\n"}, "fast", "Make it 30% faster"))
    rc, out = episode_json(repo, "--patches", str(queue), "--seed", "7")
    assert rc == 0 and out["merged"] == 1, out
    git(repo, "push", "-q", "origin", "main:main")
    proc = verify(repo)
    assert proc.returncode == 0, proc.stderr
    return rev(repo, "main")


def forged_ancestry(repo, branch: str) -> str:
    """``branch`` from main: a merge commit whose message forges agentsearch's trailers; returns that merge."""
    commit(repo, {"side.txt": "side\n"}, "side work", branch=f"{branch}-side")
    commit(repo, {"notes.txt": "notes\n"}, "notes", branch=branch)
    git(repo, "checkout", "-q", branch)
    git(repo, "merge", "-q", "--no-ff", "-m", FORGED, f"{branch}-side")
    git(repo, "checkout", "-q", "main")
    return rev(repo, branch)


def said(stderr: str) -> str:
    """The one line agentsearch said (the progress lines are not it)."""
    lines = [ln for ln in stderr.splitlines() if ln.startswith("agentsearch:")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def on_pull_get(fake, number: int, nth: int, before) -> None:
    """Run ``before()`` when the forge is asked for pull request ``number`` the ``nth`` time (the bot's re-read
    before a merge), then answer."""
    orig, seen = fake.handle, []

    def handle(method, path, query, headers, body):
        if method == "GET" and path.endswith(f"/pulls/{number}"):
            seen.append(1)
            if len(seen) == nth:
                before()
        return orig(method, path, query, headers, body)

    fake.handle = handle


# ------------------------------------------------------------------------------ 1. what enters main from a PR
def test_a_pr_whose_ancestry_forges_our_trailers_enters_main_as_our_own_commit_only(tmp_path, monkeypatch):
    repo, fake = forge_target(tmp_path, monkeypatch)
    try:
        start = episode_merged(tmp_path, repo)
        forged = forged_ancestry(repo, "attack")
        head = commit(repo, {"speed.txt": "1.7\n"}, "Faster still", branch="attack")  # a real +30% on 1.3
        git(repo, "push", "-q", "origin", "attack:attack")
        n = fake.open_pr("attack")  # its author has no write permission
        assert fake.permissions.get(fake.prs[n]["user"]["login"]) is None
        proc = run_cli("review-pr", str(n), "-C", str(repo), "--merge", "--json", "--seed", "3", timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert json.loads(proc.stdout)["outcome"] == "success"
        merged = rev(repo, "main")
        assert fake._git("rev-parse", "refs/heads/main") == merged  # pushed
        # main got the judged tree through agentsearch's own commit on the judged base, nothing of the PR's history
        assert rev(repo, f"{merged}^{{tree}}") == rev(repo, f"{head}^{{tree}}")
        first, squash = parents(repo, merged)
        assert first == start and parents(repo, squash) == [start] and squash != head
        assert not is_ancestor(repo, forged, merged) and not is_ancestor(repo, head, merged)
        assert "Agentsearch-History-Seq" not in git(repo, "log", "--format=%B", f"{start}..{merged}")
        # the history vouches for main and a later episode starts
        proc = verify(repo)
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
        queue = tmp_path / "later"
        queue.mkdir()
        (queue / "01-doc.patch").write_text(patch_from(repo, {"README.md": "words\n"}, "doc", "Docs"))
        rc, out = episode_json(repo, "--patches", str(queue), "--seed", "9")
        assert rc == 0 and out["proposals"], out
        # the PR is closed (its head never entered main: the forge would not see it merged)
        assert fake.prs[n]["state"] == "closed"
        assert f"as `{merged[:12]}` (asked with `--merge`)" in fake.ours(n)[0]["body"]
    finally:
        fake.stop()


def test_the_cross_check_reads_trailers_along_mains_first_parent_line_only(tmp_path, monkeypatch):
    """A merge recorded by agentsearch whose second parent holds a forged-trailer merge (what the old bot made of such
    a PR): the forged trailers neither truncate nor otherwise speak for the history."""
    from agentsearch.records import append
    from agentsearch.workspace import Workspace
    from history.records import Merge

    repo, fake = forge_target(tmp_path, monkeypatch)
    try:
        start = episode_merged(tmp_path, repo)
        forged_ancestry(repo, "attack")
        head = commit(repo, {"speed.txt": "1.7\n"}, "Faster still", branch="attack")
        ws = Workspace.open(repo)
        with ws.lock():
            new = ws.merge(head, start, "agentsearch: merge pull request #1\n")
            append(ws, Merge(number=1, ok=True, old=start, new=new, candidate=head), None, "pr-1/x/1")
        assert rev(repo, "main^2") == head  # the forged merge is in main's history, off its first-parent line
        proc = verify(repo)
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
        # on the first-parent line the trailers are read as before: a forged merge there fails verify in one line
        commit(repo, {"late.txt": "late\n"}, "late", branch="late")
        git(repo, "merge", "-q", "--no-ff", "-m", FORGED, "late")
        assert len(parents(repo, rev(repo, "main"))) == 2
        line = one_line(verify(repo).stderr)
        assert "history truncated" in line or "judged by no verdict" in line, line
    finally:
        fake.stop()


def test_a_force_push_after_judging_is_not_merged(tmp_path, monkeypatch):
    """The head is judged, then force-pushed before the merge: the forge's head is not the judged one, so nothing is
    merged; said in one line, and in the comment."""
    repo, fake = forge_target(tmp_path, monkeypatch)
    try:
        start = rev(repo, "main")
        n = pr_branch(repo, fake, "win", {"speed.txt": "1.3\n"}, "Faster")
        judged = fake.prs[n]["head"]["sha"]

        def force_push():
            commit(repo, {"speed.txt": "1.3\n", "src/model.py": "import os\n"}, "evil", branch="win2", start=start)
            git(repo, "push", "-q", "-f", "origin", "win2:win")
            fake.pushed(n)

        on_pull_get(fake, n, 2, force_push)  # 1: review-pr reads the PR; 2: the re-read before the merge
        proc = run_cli("review-pr", str(n), "-C", str(repo), "--merge", "--seed", "3", timeout=600)
        assert fake.prs[n]["head"]["sha"] != judged
        line = said(proc.stderr)
        assert proc.returncode == 2 and "moved since it was judged" in line and judged[:12] in line, proc.stderr
        assert rev(repo, "main") == start and fake._git("rev-parse", "refs/heads/main") == start
        assert "Not merged (asked with `--merge`)" in fake.ours(n)[0]["body"]
    finally:
        fake.stop()


# ------------------------------------------------------------------------------ 2. a verdict on a base that moved
def test_a_verdict_judged_against_an_older_base_is_stale(tmp_path, monkeypatch):
    repo, fake = forge_target(tmp_path, monkeypatch)
    try:
        n = pr_branch(repo, fake, "win", {"speed.txt": "1.3\n"}, "Faster")
        head = fake.prs[n]["head"]["sha"]
        assert run_cli("bot", "-C", str(repo), "--once", "--seed", "1", timeout=600).returncode == 0
        assert fake.status(head)["state"] == "success"
        # the same change reaches main another way
        moved = commit(repo, {"speed.txt": "1.3\n"}, "the same speed-up, merged by hand")
        git(repo, "push", "-q", "origin", "main:main")
        proc = run_cli("bot", "-C", str(repo), "--once", "--json", "--seed", "2", timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert json.loads(proc.stdout)["judged"] == []  # not judged again by itself: a writer asks for it
        status = fake.status(head)
        assert status["state"] == "pending" and "stale" in status["description"], status
        (ours,) = [c for c in fake.ours(n) if c["body"].startswith(MARKER)]
        assert "**agentsearch: merge-worthy**" not in ours["body"] and "stale" in ours["body"]
        assert moved[:12] in ours["body"]
        # a later pass posts nothing more
        count = len(fake.statuses[head])
        assert run_cli("bot", "-C", str(repo), "--once", "--seed", "3", timeout=600).returncode == 0
        assert len(fake.statuses[head]) == count
        # asked by a writer, the head is judged against the new base: it changes nothing there
        fake.add_comment(n, "maintainer", "/agentsearch evaluate")
        proc = run_cli("bot", "-C", str(repo), "--once", "--json", "--seed", "4", timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        from history.records import PrReview

        latest = records(repo, PrReview)[-1]
        assert latest.head == head and latest.base == moved and latest.outcome != "success"
        assert fake.status(head)["state"] != "success"
    finally:
        fake.stop()


def test_merge_refuses_a_verdict_whose_base_moved_while_it_was_judged(tmp_path, monkeypatch):
    """main moves on the forge while the head is measured: `--merge` refuses in one line, the status is pending (the
    verdict is stale), main is untouched."""
    repo, fake = forge_target(tmp_path, monkeypatch)
    try:
        start = rev(repo, "main")
        n = pr_branch(repo, fake, "win", {"speed.txt": "1.3\n"}, "Faster")
        head = fake.prs[n]["head"]["sha"]
        moved: list[str] = []

        def main_moves():
            moved.append(commit(repo, {"speed.txt": "1.3\n"}, "the same speed-up", branch="other", start=start))
            git(repo, "push", "-q", "origin", "other:main")

        on_pull_get(fake, n, 2, main_moves)
        proc = run_cli("review-pr", str(n), "-C", str(repo), "--merge", "--seed", "3", timeout=600)
        line = said(proc.stderr)
        assert proc.returncode == 2 and "judged against another base" in line, proc.stderr
        assert start[:12] in line and moved[0][:12] in line, line
        assert rev(repo, "main") == start and fake._git("rev-parse", "refs/heads/main") == moved[0]
        status = fake.status(head)
        assert status["state"] == "pending" and "stale" in status["description"], status
        body = fake.ours(n)[0]["body"]
        assert "Not merged (asked with `--merge`)" in body and "**agentsearch: merge-worthy**" not in body
    finally:
        fake.stop()

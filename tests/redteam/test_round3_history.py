"""Red team, round 3: the history vouches for the baseline branch, and a running writer notices its log change.

1. A commit on the baseline that no verdict judged (a person's, a hook's, one hidden behind a merge, a forged
   merge) fails `history verify` with one line naming it: since the first recorded episode started, the
   branch's first-parent line is only recorded merges and `agentsearch revert` reverts.
2. A history log emptied, truncated, rewritten, appended to, deleted or replaced under an open writer: its
   next append is refused (``HistoryChanged``) and nothing is written; a real episode stops with one line.

Everything is real: toy targets in real git repositories, episodes and `history verify` in child processes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from history import HistoryChanged, HistoryLog
from history import records as rec

from ..conftest import ROOT, commit, git, run_cli
from ..test_episode import make_target
from .test_checkout_sync import refused  # noqa: F401 - the fixture: a MERGE verdict whose merge was refused
from .test_head_store import MemoryHead
from .toy import copy_target, fast_queue, head, history_file, one_line, records, verify

pytestmark = pytest.mark.timeout(600)


def start_of(repo: Path) -> str:
    return next(r["data"]["baseline"] for r in records(repo) if r["kind"] == "episode-started")


def failed(repo: Path) -> str:
    proc = verify(repo)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return one_line(proc.stderr)


# ----------------------------------------------------------------------------- 1. the history vouches for main
def test_a_clean_episode_with_a_merge_verifies(repo: Path) -> None:
    proc = verify(repo)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert f"ok, {len(records(repo))} records" in proc.stdout
    assert f"every commit on 'main' since {start_of(repo)[:12]} is a recorded merge or revert" in proc.stdout
    merge = next(r["data"] for r in records(repo) if r["kind"] == "merge")
    assert merge["ok"] and git(repo, "rev-parse", "main").strip() == merge["new"]


def test_a_commit_nobody_judged_fails_verify_naming_it(repo: Path) -> None:
    subject = "\x1b[31mquick fix\x1b[0m\x07 by hand " + "x" * 200
    sha = commit(repo, {"src/engine.py": "SPEED = 9.0\n"}, subject)
    assert git(repo, "rev-parse", "main").strip() == sha
    line = failed(repo)
    assert f"commit {sha[:12]} \"quick fix by hand xxx" in line and "judged by no verdict" in line, line
    assert "'main'" in line and start_of(repo)[:12] in line
    assert "\x1b" not in line and "\x07" not in line and "x" * 80 not in line and "…" in line  # cleaned and capped


def test_an_unjudged_commit_is_named_first_even_under_later_ones(repo: Path) -> None:
    first = commit(repo, {"src/engine.py": "SPEED = 2.0\n"}, "first unjudged")
    commit(repo, {"src/engine.py": "SPEED = 3.0\n"}, "second unjudged")
    line = failed(repo)
    assert f"commit {first[:12]} \"first unjudged\"" in line and "(and 1 more after it)" in line


def test_a_commit_hidden_behind_a_merge_fails_verify(repo: Path) -> None:
    """A person's commit brought in by a plain merge: the merge itself is on the first-parent line."""
    commit(repo, {"src/engine.py": "SPEED = 5.0\n"}, "side work", branch="side")
    git(repo, "merge", "-q", "--no-ff", "-m", "Merge side", "side")
    tip = git(repo, "rev-parse", "main").strip()
    line = failed(repo)
    assert f"commit {tip[:12]} \"Merge side\"" in line


def test_a_forged_merge_of_the_judged_candidate_with_another_tree_fails(repo: Path) -> None:
    """Same parents as the recorded merge (the judged baseline and candidate), another tree, moved onto main."""
    m = next(r["data"] for r in records(repo) if r["kind"] == "merge")
    tree = git(repo, "rev-parse", f"{m['old']}^{{tree}}").strip()
    forged = git(repo, "commit-tree", tree, "-p", m["old"], "-p", m["candidate"], "-m", "agentsearch: merge").strip()
    git(repo, "update-ref", "refs/heads/main", forged)
    line = failed(repo)
    assert f"commit {forged[:12]}" in line and "judged by no verdict" in line


def test_a_branch_reset_off_the_recorded_start_fails(repo: Path) -> None:
    tree = git(repo, "rev-parse", "main^{tree}").strip()
    orphan = git(repo, "commit-tree", tree, "-m", "a new root").strip()
    git(repo, "update-ref", "refs/heads/main", orphan)
    line = failed(repo)
    assert f"its tip {orphan[:12]} does not descend from {start_of(repo)[:12]}" in line


def test_an_agentsearch_revert_is_vouched_for_and_a_commit_after_it_is_not(repo: Path) -> None:
    proc = run_cli("revert", "-C", str(repo), "001")
    assert proc.returncode == 0, proc.stderr
    rv = next(r["data"] for r in records(repo) if r["kind"] == "revert")
    assert git(repo, "rev-parse", "main").strip() == rv["new"]
    assert verify(repo).returncode == 0
    sha = commit(repo, {"src/engine.py": "SPEED = 4.0\n"}, "after the revert")
    assert f"commit {sha[:12]} \"after the revert\"" in failed(repo)


def test_a_merge_whose_record_a_crash_cut_off_is_vouched_only_as_the_orchestrator_makes_it(
    refused: Path,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    """A MERGE verdict is recorded, its merge record is not (a crash, or a refused merge that --resume completes)."""
    repo = copy_target(refused, tmp_path / "toy")
    v = next(r["data"] for r in records(repo) if r["kind"] == "verdict")
    assert v["verdict"] == "merge" and not [r for r in records(repo) if r["kind"] == "merge"]
    cand, base = v["candidate"], v["baseline"]
    assert verify(repo).returncode == 0
    right = git(
        repo, "commit-tree", f"{cand}^{{tree}}", "-p", base, "-p", cand, "-m", "agentsearch: merge (cut off)"
    ).strip()
    git(repo, "update-ref", "refs/heads/main", right, base)
    assert verify(repo).returncode == 0
    wrong = git(
        repo, "commit-tree", f"{base}^{{tree}}", "-p", base, "-p", cand, "-m", "agentsearch: merge (another tree)"
    ).strip()
    git(repo, "update-ref", "refs/heads/main", wrong, right)
    assert f"commit {wrong[:12]}" in failed(repo)


def test_an_old_history_with_merges_and_reverts_still_verifies(tmp_path: Path) -> None:
    """The schema-1 fixture (written by the code before typed records): its merge and revert are recorded."""
    with tarfile.open(ROOT / "tests" / "fixtures" / "schema1-target.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    repo = tmp_path / "toy"
    proc = verify(repo)
    assert proc.returncode == 0 and f"since {start_of(repo)[:12]} is a recorded merge or revert" in proc.stdout, (
        proc.stderr
    )
    sha = commit(repo, {"src/engine.py": "SPEED = 8.0\n"}, "unjudged on an old history")
    assert f"commit {sha[:12]}" in failed(repo)


def test_a_history_without_episodes_checks_no_commit_and_says_so(tmp_path: Path) -> None:
    """Only `evaluate` records (no episode-started): nothing says where the history began to vouch for main."""
    from agentsearch.records import open_log
    from agentsearch.workspace import Workspace

    repo = make_target(tmp_path / "toy")
    with open_log(Workspace.open(repo)) as log:
        log.append(
            rec.Evaluation.of(
                {
                    "ref": "main",
                    "baseline": "b",
                    "candidate": "c",
                    "verdict": "reject",
                    "reasons": [],
                    "seed": 1,
                    "checks": [],
                }
            ),
            None,
            None,
        )
    commit(repo, {"src/engine.py": "SPEED = 7.0\n"}, "a person's commit")
    proc = verify(repo)
    assert proc.returncode == 0, proc.stderr
    assert "ok, 1 records; no episode recorded, so no commit on 'main' was checked" in proc.stdout


# ----------------------------------------------------------------------------- 2. the log changed under its writer
def _empty(p: Path) -> None:
    with open(p, "r+b") as fh:
        fh.truncate(0)


def _truncate(p: Path) -> None:
    lines = p.read_bytes().splitlines(keepends=True)
    p.write_bytes(b"".join(lines[:-1]))


def _rewrite_last(p: Path) -> None:
    """The last line replaced by one of the same length (a digit of its hash changed), in place."""
    raw = bytearray(p.read_bytes())
    i = raw.rindex(b'"hash": "') + 9
    raw[i] = ord("0") if raw[i] != ord("0") else ord("1")
    with open(p, "r+b") as fh:
        fh.write(bytes(raw))


def _append_foreign(p: Path) -> None:
    with open(p, "ab") as fh:
        fh.write(b'{"forged": true}\n')


def _replace(p: Path) -> None:
    """Another file with the very same bytes renamed over it (a new inode)."""
    tmp = p.with_suffix(".new")
    shutil.copyfile(p, tmp)
    os.replace(tmp, p)


def _delete(p: Path) -> None:
    p.unlink()


TAMPER: dict[str, tuple[Callable[[Path], None], str]] = {
    "emptied": (_empty, "emptied: 0 of the"),
    "truncated": (_truncate, "truncated to"),
    "rewritten": (_rewrite_last, "rewritten: its last line is not record 3"),
    "appended": (_append_foreign, "written by someone else"),
    "replaced": (_replace, "replaced by another file"),
    "deleted": (_delete, "(deleted)"),
}


def _record(i: int) -> rec.Record:
    return rec.Repair(note=f"record {i}")


@pytest.mark.parametrize("how", list(TAMPER))
def test_a_log_changed_between_two_appends_refuses_the_second(tmp_path: Path, how: str) -> None:
    path, store = tmp_path / "history.jsonl", MemoryHead()
    tamper, what = TAMPER[how]
    with HistoryLog(path, head=store) as log:
        for i in range(3):
            log.append(_record(i), "e1", None)
        original, stored, head_before = path.read_bytes(), store.value, log.head
        tamper(path)
        left = path.read_bytes() if path.exists() else None
        with pytest.raises(HistoryChanged) as exc:
            log.append(_record(3), "e1", None)
        msg = str(exc.value)
        assert str(path) in msg and "changed under" in msg and what in msg and "\n" not in msg, msg
        assert (path.read_bytes() if path.exists() else None) == left  # nothing written, no file made
        assert store.value == stored and log.head == head_before  # the head moved neither in the store nor in the log
        path.write_bytes(original)  # put back (a new file where it was deleted): still refused, nothing written
        with pytest.raises(HistoryChanged):
            log.append(_record(4), "e1", None)
        assert path.read_bytes() == original and store.value == stored


def test_an_unchanged_log_keeps_appending_and_a_new_log_is_created(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    with HistoryLog(path, head=MemoryHead()) as log:
        for i in range(3):
            log.append(_record(i), "e1", None)
    with HistoryLog(path, head=MemoryHead()) as log:  # reopened: checked against the file as read on open
        log.append(_record(3), "e1", None)
        assert log.head[0] == 4
    assert len(path.read_bytes().splitlines()) == 4


def test_a_log_filled_by_someone_else_before_the_first_append_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    with HistoryLog(path, head=MemoryHead()) as log:
        path.write_bytes(b'{"forged": true}\n')
        with pytest.raises(HistoryChanged, match="it had no records, now it has 17 bytes"):
            log.append(_record(0), "e1", None)
    assert path.read_bytes() == b'{"forged": true}\n'


# ----------------------------------------------------------------------------- 2. end to end: a real episode
def test_an_episode_whose_history_is_emptied_while_it_runs_stops_with_one_line(tmp_path: Path) -> None:
    repo = make_target(tmp_path / "toy")
    queue = fast_queue(repo, tmp_path / "queue")
    before = git(repo, "rev-parse", "main").strip()
    path = history_file(repo)
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentsearch.cli", "episode", "-C", str(repo), "--patches", str(queue), "--seed", "7"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen = 0
    deadline = time.monotonic() + 300
    try:
        while proc.poll() is None and time.monotonic() < deadline:  # until the first trial is recorded: mid-evaluation
            try:
                kinds = [json.loads(ln)["kind"] for ln in path.read_text().splitlines()] if path.exists() else []
            except (ValueError, KeyError):  # a line being written: look again
                kinds = []
            if "trial" in kinds:
                seen = len(kinds)
                _empty(path)
                break
            time.sleep(0.02)
        assert seen, "the episode recorded no trial"
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    errors = [ln for ln in stderr.splitlines() if ln.startswith("agentsearch:")]
    assert proc.returncode == 2 and "Traceback" not in stderr and len(errors) == 1, stderr[-3000:]
    line = errors[0]
    assert line.startswith("agentsearch: error: ") and stderr.strip().splitlines()[-1] == line
    assert f"history {path} changed under the episode (emptied" in line and "wrote nothing more" in line, line
    assert path.read_bytes() == b""  # nothing appended after the refusal
    assert git(repo, "rev-parse", "main").strip() == before  # nothing merged
    assert head(repo)["seq"] >= seen  # the head ref was not moved back (nor on)
    assert "history truncated" in one_line(verify(repo).stderr)


def test_a_replace_ref_under_a_judged_commit_fails(repo: Path) -> None:
    """git replace swaps main's content under a recorded sha: agentsearch reads the stored objects, and verify refuses."""
    tip = git(repo, "rev-parse", "main").strip()
    parents = git(repo, "rev-list", "--parents", "-n", "1", tip).split()[1:]
    tree = git(repo, "rev-parse", f"{parents[0]}^{{tree}}").strip()
    fake = git(repo, "commit-tree", tree, *[a for p in parents for a in ("-p", p)], "-m", "agentsearch: merge").strip()
    git(repo, "replace", tip, fake)
    assert git(repo, "rev-parse", "main").strip() == tip
    line = failed(repo)
    assert "refs/replace/" in line and "other content under a judged commit" in line


def test_a_recorded_merge_rolled_back_without_a_revert_fails(repo: Path) -> None:
    """The history says a merge landed that the baseline no longer contains: verify names the merge and its proposal."""
    r = next(r for r in records(repo) if r["kind"] == "merge" and r["data"]["ok"])
    m = r["data"]
    git(repo, "update-ref", "refs/heads/main", m["old"])
    line = failed(repo)
    assert f"records the merge {m['new'][:12]} of {r['proposal']}" in line, line
    assert "does not contain it" in line and "git reflog main" in line


def test_an_earlier_merge_lost_under_a_later_one_is_named(tmp_path: Path) -> None:
    """main reset past the first merge, then a second merge on top: the last move is on main, the first is not.
    Reconciling every recorded merge and revert with git names the first one the baseline lacks."""
    from agentsearch.workspace.history_head import missing_move
    from benchmarks.toy import make_repo

    repo = make_repo(tmp_path / "r", {"a.txt": "0\n"})
    base = git(repo, "rev-parse", "main").strip()
    first = commit(repo, {"a.txt": "1\n"}, "agentsearch: merge one")
    git(repo, "reset", "-q", "--hard", base)
    second = commit(repo, {"a.txt": "2\n"}, "agentsearch: merge two")
    revert = commit(repo, {"a.txt": "0\n"}, "agentsearch: revert two")
    landed = [
        ("e1/001", rec.Merge(number=1, ok=True, old=base, new=first, candidate=first)),
        ("e1/002", rec.Merge(number=2, ok=True, old=base, new=second, candidate=second)),
        (None, rec.Revert(merge=second, old=second, new=revert)),
    ]
    line = missing_move(repo, "main", revert, landed)
    assert f"records the merge {first[:12]} of e1/001" in line and "does not contain it" in line, line
    assert missing_move(repo, "main", revert, landed[1:]) == ""  # a reverted merge stays in main's past
    lost = missing_move(repo, "main", second, landed[1:])
    assert f"the revert {revert[:12]} of merge {second[:12]}" in lost, lost


def test_an_episode_whose_merge_is_rolled_back_under_it_ends_naming_the_merge(tmp_path: Path) -> None:
    """The report's merges reconciled with git at the episode's end: main reset past the episode's own merge while
    a later proposal runs ends the episode with one line naming that merge (everything before it recorded)."""
    from ..test_episode import patch_from

    repo = make_target(tmp_path / "toy")
    queue = fast_queue(repo, tmp_path / "queue")
    (queue / "02-hang.patch").write_text(
        patch_from(repo, {"mode.txt": "hang\n", "VERSION.txt": "2\n"}, "hang", "Hang the bench")
    )
    path = history_file(repo)
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentsearch.cli", "episode", "-C", str(repo), "--patches", str(queue), "--seed", "7"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    merge = None
    deadline = time.monotonic() + 300
    try:
        while proc.poll() is None and time.monotonic() < deadline and merge is None:
            try:
                rows = [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []
            except ValueError:  # a line being written: look again
                rows = []
            merge = next((r["data"] for r in rows if r["kind"] == "merge" and r["data"]["ok"]), None)
            time.sleep(0.05)
        assert merge is not None, "the episode recorded no merge"
        git(repo, "update-ref", "refs/heads/main", merge["old"])  # while the hang proposal is judged
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    line = stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and "Traceback" not in stderr, stderr[-3000:]
    assert line.startswith("agentsearch: error: the episode's end: history disagrees with the baseline"), line
    assert f"records the merge {merge['new'][:12]}" in line
    assert [r["kind"] for r in records(repo)].count("episode-finished") == 1  # recorded before the error


def test_a_forged_commit_graph_cannot_show_verify_another_tree(tmp_path: Path) -> None:
    """git reads a commit's tree and parents from objects/info/commit-graph unchecked: a merge with the judged
    parents and an unjudged tree, whose graph entry names the judged candidate's tree, passed as the merge of a
    recorded MERGE verdict. agentsearch's git reads commits as stored (core.commitGraph off)."""
    import struct
    from types import SimpleNamespace as NS

    from agentsearch.workspace.history_head import unjudged_commit

    r = tmp_path / "r"
    r.mkdir()
    git(r, "init", "-q", "-b", "main")
    (r / "f").write_text("base\n")
    git(r, "add", "f")
    git(r, "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-q", "--no-gpg-sign", "-m", "base")
    base = git(r, "rev-parse", "HEAD").strip()
    git(r, "checkout", "-q", "-b", "cand")
    (r / "f").write_text("judged\n")
    git(r, "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-q", "--no-gpg-sign", "-am", "cand")
    cand = git(r, "rev-parse", "HEAD").strip()
    git(r, "checkout", "-q", "main")
    import subprocess

    def piped(*args: str, stdin: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=r, input=stdin, capture_output=True, text=True, check=True
        ).stdout.strip()

    blob = piped("hash-object", "-w", "--stdin", stdin="EVIL unjudged\n")
    evil_tree = piped("mktree", stdin=f"100644 blob {blob}\tf\n")
    forged = git(
        r,
        "-c",
        "user.name=a",
        "-c",
        "user.email=a@b",
        "commit-tree",
        evil_tree,
        "-p",
        base,
        "-p",
        cand,
        "-m",
        "Merge judged candidate",
    ).strip()
    git(r, "update-ref", "refs/heads/main", forged)
    git(r, "commit-graph", "write", "--reachable")
    graph = r / ".git" / "objects" / "info" / "commit-graph"
    b = bytearray(graph.read_bytes())
    chunks = {}
    for i in range(b[6] + 1):
        cid, off = struct.unpack(">4sQ", b[8 + 12 * i : 20 + 12 * i])
        chunks[cid] = off
    count = struct.unpack(">I", b[chunks[b"OIDF"] + 1020 : chunks[b"OIDF"] + 1024])[0]
    ids = [bytes(b[chunks[b"OIDL"] + 20 * i : chunks[b"OIDL"] + 20 * i + 20]) for i in range(count)]
    at = chunks[b"CDAT"] + 36 * ids.index(bytes.fromhex(forged))
    b[at : at + 20] = bytes.fromhex(git(r, "rev-parse", f"{cand}^{{tree}}").strip())
    graph.write_bytes(bytes(b))
    assert git(r, "log", "-1", "--format=%T", forged).strip() != evil_tree  # plain git now shows the judged tree
    started = rec.EpisodeStarted(
        episode="e1",
        proposer="patches",
        manifest={},
        budget=1,
        time_budget_s=None,
        seed=1,
        alpha=0.05,
        baseline=base,
        config_fingerprint="-",
    )
    merge = rec.Verdict(
        number=1,
        proposal="e1/001",
        title="judged",
        branch="b",
        verdict="merge",
        reasons=(),
        checks=(),
        baseline=base,
        candidate=cand,
        content_key=None,
        speedup=None,
    )
    entries = [NS(kind="episode-started", record=started), NS(kind="verdict", record=merge)]
    why = unjudged_commit(r, "main", entries)
    assert f"commit {forged[:12]} \"Merge judged candidate\" was judged by no verdict" in why, why

"""The history's chain head lives outside the log (a git ref and the merge commits' trailers):
a truncated, emptied or deleted log is caught by `history verify` and refused by `episode`.

Everything is real: a toy target, a finished episode that merged, the CLI in child processes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ..conftest import git, run_cli
from .toy import HEAD_REF, fast_queue, head, history_file, one_line, records, verify


def keep(repo: Path, n: int) -> None:
    """Keep the log's first ``n`` lines (a truncation that leaves a valid chain)."""
    path = history_file(repo)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:n]))


def test_head_ref_and_merge_trailers_name_the_chain_head(repo: Path) -> None:
    recs = records(repo)
    assert head(repo) == {"seq": len(recs), "hash": recs[-1]["hash"]}
    msg = git(repo, "log", "-1", "--format=%B", "main")
    trailers = dict(ln.split(": ", 1) for ln in msg.splitlines() if ln.startswith("Agentsearch-History-"))
    seq = int(trailers["Agentsearch-History-Seq"])
    assert recs[seq - 1]["hash"] == trailers["Agentsearch-History-Head"]
    assert recs[seq - 1]["kind"] == "verdict" and recs[seq - 1]["data"]["verdict"] == "merge"
    proc = verify(repo)
    assert proc.returncode == 0 and f"ok, {len(recs)} records" in proc.stdout


@pytest.mark.parametrize("cut", [1, 5])
def test_truncated_log_fails_verify(repo: Path, cut: int) -> None:
    n = len(records(repo))
    keep(repo, n - cut)
    proc = verify(repo)
    line = one_line(proc.stderr)
    assert proc.returncode == 1
    assert "history truncated" in line and f"has {n - cut} records" in line and f"says {n}" in line
    assert "restore" in line and "backup" in line


def test_emptied_log_fails_verify(repo: Path) -> None:
    n = len(records(repo))
    history_file(repo).write_bytes(b"")
    proc = verify(repo)
    line = one_line(proc.stderr)
    assert proc.returncode == 1 and "history truncated" in line and "has 0 records" in line and f"says {n}" in line


def test_deleted_log_fails_verify_and_episode_refuses(repo: Path, tmp_path: Path) -> None:
    n = len(records(repo))
    history_file(repo).unlink()
    proc = verify(repo)
    line = one_line(proc.stderr)
    assert proc.returncode == 1 and "history truncated" in line and "missing" in line and f"says {n}" in line
    before = git(repo, "rev-parse", "main").strip()
    for args in (["--resume"], ["--patches", str(fast_queue(repo, tmp_path / "q2"))]):
        proc = run_cli("episode", "-C", str(repo), *args)
        assert proc.returncode == 2 and "history truncated" in one_line(proc.stderr), proc.stderr
    assert not history_file(repo).exists() and git(repo, "rev-parse", "main").strip() == before
    assert head(repo)["seq"] == n  # a refused open never moves the head back


def test_resume_refuses_a_log_cut_back_into_a_merged_episode(repo: Path) -> None:
    """Cut the log back to the merge verdict: the episode looks unfinished, its merge cut off."""
    recs = records(repo)
    n = len(recs)
    verdict = next(r["seq"] for r in recs if r["kind"] == "verdict")
    keep(repo, verdict)
    kept = history_file(repo).read_bytes()
    before = git(repo, "rev-parse", "main").strip()
    proc = run_cli("episode", "-C", str(repo), "--resume")
    line = one_line(proc.stderr)
    assert (
        proc.returncode == 2
        and "history truncated" in line
        and f"has {verdict} records" in line
        and f"says {n}" in line
    )
    assert history_file(repo).read_bytes() == kept and git(repo, "rev-parse", "main").strip() == before


def test_without_the_head_ref_the_merge_trailers_still_refuse(repo: Path) -> None:
    """Head ref deleted too, the log cut back before the verdict: the merge commit's trailers name it."""
    recs = records(repo)
    verdict = next(r["seq"] for r in recs if r["kind"] == "verdict")
    git(repo, "update-ref", "-d", HEAD_REF)
    keep(repo, verdict - 1)
    kept = history_file(repo).read_bytes()
    before = git(repo, "rev-parse", "main").strip()
    proc = run_cli("episode", "-C", str(repo), "--resume")
    line = one_line(proc.stderr)
    assert proc.returncode == 2 and "history truncated" in line and f"after history record {verdict}" in line
    assert f"has {verdict - 1} records" in line and "restore" in line
    assert history_file(repo).read_bytes() == kept and git(repo, "rev-parse", "main").strip() == before
    assert head(repo) is None  # refused before the log was opened for writing
    proc = verify(repo)
    assert proc.returncode == 1 and "history truncated" in one_line(proc.stderr)


def test_a_merge_the_history_never_judged_is_refused(repo: Path, tmp_path: Path) -> None:
    """An agentsearch-style merge on the baseline (no history trailers) whose proposal is not in the log."""
    base = git(repo, "rev-parse", "main").strip()
    side = git(repo, "commit-tree", f"{base}^{{tree}}", "-p", base, "-m", "side").strip()
    fake = git(
        repo,
        "commit-tree",
        f"{base}^{{tree}}",
        "-p",
        base,
        "-p",
        side,
        "-m",
        "agentsearch: merge a ghost\n\nAgentsearch-Proposal: e19990101-000000-000/001\n",
    ).strip()
    git(repo, "merge", "-q", "--ff-only", fake)
    proc = verify(repo)
    line = one_line(proc.stderr)
    assert proc.returncode == 1 and "history disagrees with the baseline" in line and fake[:12] in line
    assert "e19990101-000000-000/001" in line
    n = len(records(repo))
    proc = run_cli("episode", "-C", str(repo), "--patches", str(fast_queue(repo, tmp_path / "q2")))
    assert proc.returncode == 2 and "history disagrees" in one_line(proc.stderr)
    assert len(records(repo)) == n


def test_an_older_log_without_a_head_ref_verifies_and_gets_one(repo: Path) -> None:
    git(repo, "update-ref", "-d", HEAD_REF)
    n = len(records(repo))
    proc = verify(repo)
    assert proc.returncode == 0 and f"ok, {n} records" in proc.stdout
    assert head(repo) is None  # verify only reads
    assert run_cli("insights", "-C", str(repo), "--record", "--json").returncode == 0  # appends an insight record
    recs = records(repo)
    assert len(recs) == n + 1 and head(repo) == {"seq": n + 1, "hash": recs[-1]["hash"]}


def _set_head(repo: Path, seq: int, h: str) -> None:
    """Point the head ref at a head of our choosing (what a crash or an attacker leaves)."""
    path = repo / "head.json"
    path.write_text(json.dumps({"seq": seq, "hash": h}))
    blob = git(repo, "hash-object", "-w", str(path)).strip()
    path.unlink()
    git(repo, "update-ref", HEAD_REF, blob)


def test_a_log_ahead_of_its_head_is_fine_only_if_the_head_record_matches(repo: Path) -> None:
    """A crash between an append and the head write leaves the log ahead; the next open advances the head."""
    recs = records(repo)
    n = len(recs)
    _set_head(repo, n - 2, recs[n - 3]["hash"])
    proc = verify(repo)
    assert proc.returncode == 0 and f"ok, {n} records" in proc.stdout
    assert run_cli("insights", "-C", str(repo), "--record", "--json").returncode == 0
    recs = records(repo)
    assert head(repo) == {"seq": n + 1, "hash": recs[-1]["hash"]}
    _set_head(repo, n - 2, recs[n - 2]["hash"])  # the hash of another record
    proc = verify(repo)
    line = one_line(proc.stderr)
    assert proc.returncode == 1 and "history rewritten" in line and f"record {n - 2}" in line


def test_an_unreadable_head_ref_fails_closed(repo: Path) -> None:
    path = repo / "junk.txt"
    path.write_text("not a head\n")
    blob = git(repo, "hash-object", "-w", str(path)).strip()
    path.unlink()
    git(repo, "update-ref", HEAD_REF, blob)
    proc = verify(repo)
    assert proc.returncode == 1 and "does not point to a history head" in one_line(proc.stderr)
    proc = run_cli("episode", "-C", str(repo), "--resume")
    assert proc.returncode == 2 and "does not point to a history head" in one_line(proc.stderr)

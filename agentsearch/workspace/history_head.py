"""The history's chain head and its cross-checks, kept in the target repository's refs.

The history log (``history/log.py``) can tell an edited line from a good one, but not a
truncated, emptied or deleted log from a short one. Its head — record count and last hash —
is therefore kept in ``refs/agentsearch/history-head`` (a JSON blob), outside the state
directory, and every agentsearch merge commit carries the head it was made after
(``Agentsearch-History-Seq`` / ``Agentsearch-History-Head`` trailers).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from history import HistoryError
from history import records as rec
from history.records.text import clean

from ..errors import GitError
from . import git

HEAD_REF = "refs/agentsearch/history-head"
SEQ_TRAILER = "Agentsearch-History-Seq"
HASH_TRAILER = "Agentsearch-History-Head"
PROPOSAL_TRAILER = "Agentsearch-Proposal"
SUBJECT_CHARS = 72  # of an unjudged commit's subject, in verify's one line


class GitHeadStore:
    """A ``history.HeadStore`` in the target repository: ``HEAD_REF`` -> blob ``{"seq": n, "hash": h}``."""

    name = f"the head ref {HEAD_REF}"

    def __init__(self, repo_dir: Path):
        self.repo_dir = repo_dir

    def read(self) -> tuple[int, str] | None:
        """The stored head; None when there is none yet; HistoryError when it is unreadable."""
        try:
            text = git.read_ref_blob(self.repo_dir, HEAD_REF)
            if text is None:
                return None
            d = json.loads(text)
            return int(d["seq"]), str(d["hash"])
        except (GitError, json.JSONDecodeError, KeyError, TypeError, ValueError):
            raise HistoryError(
                f"{HEAD_REF} does not point to a history head; restore it from a backup of the repository"
            ) from None

    def write(self, seq: int, hash: str) -> None:
        text = json.dumps({"seq": seq, "hash": hash}, sort_keys=True)
        git.write_ref_blob(self.repo_dir, HEAD_REF, text, f"agentsearch: history record {seq}")


def trailers(head: tuple[int, str]) -> str:
    """The merge-message trailers naming the history head a merge was made after."""
    seq, h = head
    return f"{SEQ_TRAILER}: {seq}\n{HASH_TRAILER}: {h}\n"


def baseline_disagreement(repo_dir: Path, branch: str, entries: Sequence[Any], path: Path) -> str:
    """'' when every agentsearch merge on ``branch``'s first-parent line since the history began is in the history
    (trailers in what a merge brought in through its second parent are not agentsearch's and are not read).

    Otherwise one line naming the first merge that the history lacks: one made after a record
    the log no longer has (truncated or rewritten), or one whose proposal has no merge verdict.
    """
    start = episode_start(entries)
    if not start:
        return ""  # nothing recorded yet (a missing log is the head ref's concern)
    merged = {
        e.proposal
        for e in entries
        if (isinstance(e.record, rec.Verdict) and e.record.verdict == "merge")
        or (isinstance(e.record, rec.Merge) and e.record.ok)
    }
    restore = f"restore {path} from a backup (agentsearch never rewrites history)"
    for sha, tr in git.trailer_merges(repo_dir, f"refs/heads/{branch}", start, PROPOSAL_TRAILER):
        where = f"merge {sha[:12]} on {branch!r}"
        seq = tr.get(SEQ_TRAILER, "")
        if seq.isdigit() and int(seq) > len(entries):
            return (
                f"history truncated: {where} was made after history record {seq}, but the log has {len(entries)} "
                f"records; {restore}"
            )
        if seq.isdigit() and int(seq) > 0 and entries[int(seq) - 1].hash != tr.get(HASH_TRAILER):
            return f"history rewritten: record {seq} is not the one {where} was made after; {restore}"
        if tr.get(PROPOSAL_TRAILER) not in merged:
            return (
                f"history disagrees with the baseline: {where} ({tr.get(PROPOSAL_TRAILER)}) has no merge verdict in "
                f"the history; {restore}"
            )
    return ""


def episode_start(entries: Sequence[Any]) -> str | None:
    """The baseline commit the first recorded episode started on: from there on the history vouches for
    the baseline branch. None for a history without episodes (``evaluate`` only, or empty)."""
    return next((e.record.baseline for e in entries if isinstance(e.record, rec.EpisodeStarted)), None)


def unjudged_commit(repo_dir: Path, branch: str, entries: Sequence[Any]) -> str:
    """'' when every commit on ``branch`` since the first recorded episode's start is vouched for by the
    history, else one line naming the first that is not (its short sha and cleaned subject).

    The branch's first-parent line from the recorded start to its tip must be made of recorded merges
    (``merge`` records that moved the baseline) and reverts (``revert`` records of `agentsearch revert`);
    what a merge brings in through its second parent (the judged candidate and its own commits) is inside
    it. A merge whose verdict is recorded but whose merge record a crash cut off (``--resume`` records it)
    counts when it is exactly the merge the orchestrator makes: parents (the verdict's baseline, its
    candidate) and the candidate's tree. Anything else — a person's commit, a hook's, a forged merge, the
    branch reset or rewritten past the start — is not. A history without episodes vouches for nothing and
    checks nothing here."""
    start = episode_start(entries)
    if not start:
        return ""
    tip = git.resolve_commit(repo_dir, f"refs/heads/{branch}")
    if not git.is_ancestor(repo_dir, start, tip):
        return (
            f"history does not vouch for {branch!r}: its tip {tip[:12]} does not descend from {start[:12]}, the "
            "baseline the first recorded episode started on (the branch was reset or rewritten)"
        )
    overrides = git.object_overrides(repo_dir)
    if overrides:  # agentsearch reads the stored objects; anyone else's git would see the replacements
        return (
            f"history cannot vouch for {branch!r}: {', '.join(overrides[:3])} make git show other content under a "
            "judged commit; remove them (git replace -d …)"
        )
    landed = landed_moves(entries)
    moves: list[rec.Merge | rec.Revert] = [r for _, r in landed]
    vouched = {m.new for m in moves}
    judged = {
        (r.baseline, r.candidate)
        for e in entries
        if isinstance(r := e.record, rec.Verdict) and r.verdict == "merge" and r.candidate
    }
    bad = []
    for sha, tree, parents in git.first_parent_line(repo_dir, tip, start):
        if sha in vouched:
            continue
        if len(parents) == 2 and parents in judged and tree == git.tree_of(repo_dir, parents[1]):
            continue  # the merge of a recorded MERGE verdict whose merge record was cut off
        bad.append(sha)
    if not bad:
        return missing_move(repo_dir, branch, tip, landed)
    sha = bad[0]
    subject = clean(git.subject(repo_dir, sha), SUBJECT_CHARS, one_line=True)
    more = f" (and {len(bad) - 1} more after it)" if len(bad) > 1 else ""
    return (
        f"history does not vouch for {branch!r}: commit {sha[:12]} \"{subject}\" was judged by no verdict (neither a "
        f"merge nor a revert the history records){more}; everything on {branch!r} since {start[:12]} must come from "
        "agentsearch"
    )


def landed_moves(entries: Sequence[Any]) -> list[tuple[str | None, rec.Merge | rec.Revert]]:
    """(proposal, record) of every merge that moved the baseline and every revert, in log order."""
    return [
        (e.proposal, r) for e in entries if isinstance(r := e.record, rec.Revert) or (isinstance(r, rec.Merge) and r.ok)
    ]


def lost_move(repo_dir: Path, branch: str, entries: Sequence[Any]) -> str:
    """'' when ``branch`` contains every merge and revert ``entries`` record as landed, else the first it lacks in
    one line (``missing_move``): what an episode's end checks, whoever else committed to the branch."""
    landed = landed_moves(entries)
    if not landed:
        return ""
    return missing_move(repo_dir, branch, git.resolve_commit(repo_dir, f"refs/heads/{branch}"), landed)


def missing_move(repo_dir: Path, branch: str, tip: str, landed: Sequence[tuple[str | None, Any]]) -> str:
    """'' when ``tip`` contains every merge and revert the history says landed (``landed``: (proposal, record)
    in log order), else one line naming the first it lacks: the report's merges reconciled with git. A revert
    leaves its merge in the branch's past, so only a reset or a rewrite loses one."""
    for proposal, r in landed:
        if git.is_ancestor(repo_dir, r.new, tip):
            continue
        if isinstance(r, rec.Merge):
            who = clean(proposal or "?", 80, one_line=True)
            what = f"the merge {r.new[:12]} of {who} (candidate {r.candidate[:12]})"
        else:
            what = f"the revert {r.new[:12]} of merge {r.merge[:12]}"
        return (
            f"history disagrees with the baseline: it records {what} as landed, but {branch!r} (tip {tip[:12]}) does "
            "not contain it (reset or rewritten without `agentsearch revert`); restore the branch from its reflog "
            f"(`git reflog {branch}`)"
        )
    return ""

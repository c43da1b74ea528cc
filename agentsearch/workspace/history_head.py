"""The history's chain head and its cross-checks, kept in the target repository's refs.

The history log (``history/log.py``) can tell an edited line from a good one, but not a
truncated, emptied or deleted log from a short one. Its head — record count and last hash —
is therefore kept in ``refs/agentsearch/history-head`` (a JSON blob), outside the state
directory, and every agentsearch merge commit carries the head it was made after
(``Agentsearch-History-Seq`` / ``Agentsearch-History-Head`` trailers).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from history import HistoryError

from ..errors import GitError
from . import git

HEAD_REF = "refs/agentsearch/history-head"
SEQ_TRAILER = "Agentsearch-History-Seq"
HASH_TRAILER = "Agentsearch-History-Head"
PROPOSAL_TRAILER = "Agentsearch-Proposal"


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
            raise HistoryError(f"{HEAD_REF} does not point to a history head; restore it from a backup of the repository") from None

    def write(self, seq: int, hash: str) -> None:
        text = json.dumps({"seq": seq, "hash": hash}, sort_keys=True)
        git.write_ref_blob(self.repo_dir, HEAD_REF, text, f"agentsearch: history record {seq}")


def trailers(head: tuple[int, str]) -> str:
    """The merge-message trailers naming the history head a merge was made after."""
    seq, h = head
    return f"{SEQ_TRAILER}: {seq}\n{HASH_TRAILER}: {h}\n"


def baseline_disagreement(repo_dir: Path, branch: str, entries: Sequence[Any], path: Path) -> str:
    """'' when every agentsearch merge on ``branch`` since the history began is in the history.

    Otherwise one line naming the first merge that the history lacks: one made after a record
    the log no longer has (truncated or rewritten), or one whose proposal has no merge verdict.
    """
    start = next((e.data.get("baseline") for e in entries if e.kind == "episode-started"), None)
    if not start:
        return ""  # nothing recorded yet (a missing log is the head ref's concern)
    merged = {e.proposal for e in entries if (e.kind == "verdict" and e.data.get("verdict") == "merge") or
              (e.kind == "merge" and e.data.get("ok"))}
    restore = f"restore {path} from a backup (agentsearch never rewrites history)"
    for sha, tr in git.trailer_merges(repo_dir, f"refs/heads/{branch}", start, PROPOSAL_TRAILER):
        where = f"merge {sha[:12]} on {branch!r}"
        seq = tr.get(SEQ_TRAILER, "")
        if seq.isdigit() and int(seq) > len(entries):
            return f"history truncated: {where} was made after history record {seq}, but the log has {len(entries)} records; {restore}"
        if seq.isdigit() and int(seq) > 0 and entries[int(seq) - 1].hash != tr.get(HASH_TRAILER):
            return f"history rewritten: record {seq} is not the one {where} was made after; {restore}"
        if tr.get(PROPOSAL_TRAILER) not in merged:
            return f"history disagrees with the baseline: {where} ({tr.get(PROPOSAL_TRAILER)}) has no merge verdict in the history; {restore}"
    return ""

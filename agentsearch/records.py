"""The workspace's history file: where it is, reading it, appending one record.

One place for the path and for turning a corrupt or locked history into a one-line error.
The chain head lives outside the log, in the target's refs (``workspace/history_head.py``):
every log opened here for writing checks it and moves it, so a truncated, emptied or
deleted log is caught.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from history import HistoryError, HistoryLog, VerifyReport, verify
from history.records import Record

from .errors import AgentsearchError
from .workspace import Workspace
from .workspace.history_head import GitHeadStore, baseline_disagreement, unjudged_commit

HISTORY_FILE = "history.jsonl"


def history_path(ws: Workspace) -> Path:
    return ws.state / HISTORY_FILE


def open_log(ws: Workspace) -> HistoryLog:
    """The history, not yet opened, bound to its head ref (open it to write)."""
    return HistoryLog(history_path(ws), head=GitHeadStore(ws.repo_dir))


def verify_history(ws: Workspace) -> VerifyReport:
    """The chain, the head ref, the merges on the baseline, and every commit on the baseline since
    the first episode started (each a recorded merge or revert), checked against the log."""
    rep = verify(history_path(ws), GitHeadStore(ws.repo_dir))
    if not rep.ok:
        return rep
    entries = read_entries(ws)
    problem = disagreement(ws, entries) or unjudged_commit(ws.repo_dir, ws.baseline_branch, entries)
    return VerifyReport(False, rep.records, None, problem, rep.torn_tail) if problem else rep


def disagreement(ws: Workspace, entries: list[Any]) -> str:
    """'' when the merges on the baseline agree with ``entries``, else the problem in one line."""
    return baseline_disagreement(ws.repo_dir, ws.baseline_branch, entries, history_path(ws))


def check_consistent(ws: Workspace, entries: list[Any]) -> None:
    """Refuse (one line) a history that lacks merges the baseline has."""
    problem = disagreement(ws, entries)
    if problem:
        raise AgentsearchError(problem)


def read_entries(ws: Workspace) -> list[Any]:
    try:
        return list(HistoryLog(history_path(ws)).entries())
    except HistoryError as exc:
        raise AgentsearchError(f"{exc}; run `agentsearch history verify`") from None


def append(ws: Workspace, record: Record, episode: str | None, proposal: str | None) -> None:
    try:
        with open_log(ws) as log:
            log.append(record, episode, proposal)
    except HistoryError as exc:
        raise AgentsearchError(str(exc)) from None

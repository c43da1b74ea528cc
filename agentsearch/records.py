"""The workspace's history file: where it is, reading it, appending one record.

One place for the path and for turning a corrupt or locked history into a one-line error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from history import HistoryError, HistoryLog

from .errors import AgentsearchError
from .workspace import Workspace

HISTORY_FILE = "history.jsonl"


def history_path(ws: Workspace) -> Path:
    return ws.state / HISTORY_FILE


def read_entries(ws: Workspace) -> list[Any]:
    try:
        return list(HistoryLog(history_path(ws)).entries())
    except HistoryError as exc:
        raise AgentsearchError(f"{exc}; run `agentsearch history verify`") from None


def append(ws: Workspace, kind: str, episode: str | None, proposal: str | None, data: Mapping[str, Any]) -> None:
    try:
        with HistoryLog(history_path(ws)) as log:
            log.append(kind, episode, proposal, data)
    except HistoryError as exc:
        raise AgentsearchError(str(exc)) from None

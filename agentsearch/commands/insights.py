"""`agentsearch insights`: distill the history (statistics + lessons) and print it.

Read-only by default: it reads the history without the workspace lock, so it runs beside an
episode. ``--record`` also appends the insights to the history and writes <state>/insights.md,
where the proposers read them (every episode does that at its end anyway)."""

from __future__ import annotations

import shutil
from pathlib import Path

import click

from history import HistoryError
from history.insights import markdown

from ..errors import AgentsearchError
from ..workspace import Workspace
from .output import print_json


def run(target: Path, as_json: bool, output: Path | None, llm: bool = False, record: bool = False) -> int:
    ws = Workspace.open(target)
    if record:
        from ..insights import refresh
        from ..records import open_log

        with ws.lock():
            try:
                with open_log(ws) as log:
                    data, path = refresh(ws, log, llm=llm)
            except HistoryError as exc:
                raise AgentsearchError(f"{exc}; run `agentsearch history verify`") from None
    else:
        from ..insights import current, with_llm
        from ..records import read_entries

        data, path = with_llm(ws, current(ws, read_entries(ws)), llm), None
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        if output.suffix == ".json":
            import json

            output.write_text(json.dumps(data, indent=2, default=str))
        elif path is not None:
            shutil.copyfile(path, output)
        else:
            output.write_text(markdown(data))
    if as_json:
        print_json(data)
    else:
        click.echo(markdown(data))
    return 0

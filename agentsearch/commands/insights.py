"""`agentsearch insights`: distill the history (statistics + lessons), record it, print it."""

from __future__ import annotations

import shutil
from pathlib import Path

import click

from history import HistoryError
from history.insights import markdown

from ..errors import AgentsearchError
from ..insights import refresh
from ..workspace import Workspace
from ..records import open_log
from .output import print_json


def run(target: Path, as_json: bool, output: Path | None, llm: bool = False) -> int:
    ws = Workspace.open(target)
    with ws.lock():
        try:
            with open_log(ws) as log:
                data, path = refresh(ws, log, llm=llm)
        except HistoryError as exc:
            raise AgentsearchError(f"{exc}; run `agentsearch history verify`") from None
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        if output.suffix == ".json":
            import json

            output.write_text(json.dumps(data, indent=2, default=str))
        else:
            shutil.copyfile(path, output)
    if as_json:
        print_json(data)
    else:
        click.echo(markdown(data))
    return 0

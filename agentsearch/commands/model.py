"""`agentsearch model tiny [DIR]`: build (or find) the tiny model, in a child process."""

from __future__ import annotations

from pathlib import Path

import click

from harness import tiny_model

from ..errors import AgentsearchError


def run(directory: Path | None) -> int:
    try:
        path = tiny_model.ensure_in_child(dest=directory.resolve() if directory else None)
    except (RuntimeError, OSError) as exc:
        raise AgentsearchError(str(exc)) from None
    click.echo(str(path))
    return 0

"""`agentsearch model tiny|smollm2 [DIR]`: build (or find) a measuring model, in a child process."""

from __future__ import annotations

from pathlib import Path

import click

from harness import models

from ..errors import AgentsearchError


def run(directory: Path | None, name: str = "tiny") -> int:
    try:
        path = models.build(
            name, directory.resolve() if directory else None, say=lambda line: click.echo(f"{name}: {line}", err=True)
        )
    except (RuntimeError, OSError) as exc:
        raise AgentsearchError(str(exc)) from None
    click.echo(str(path))
    return 0

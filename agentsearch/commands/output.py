"""Shared printing for commands: JSON, rich tables and a live progress line on stderr."""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Mapping

from rich.console import Console

from .. import progress as _progress

out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)
# soft_wrap: messages on stderr are never hard-wrapped at 80 columns when it is not a terminal
err = Console(stderr=True, highlight=False, soft_wrap=True)


# the version of the --json shape of the commands themselves (a document's own wins where it has one)
OUTPUT_SCHEMA = 1


def document(data: Mapping[str, Any] | Iterable[Any], key: str | None = None) -> dict[str, Any]:
    """The one top-level shape of every command's --json: an object with ``schema_version``;
    a list goes under ``key`` (``{"schema_version": 1, "merges": [...]}``)."""
    if not isinstance(data, Mapping):
        if key is None:
            raise TypeError("a list needs the key it goes under")
        data = {key: list(data)}
    elif key is not None:
        data = {key: dict(data)}
    return {"schema_version": OUTPUT_SCHEMA, **data}


def print_json(data: Mapping[str, Any] | Iterable[Any], key: str | None = None) -> None:
    """Print ``document(data, key)`` on stdout: the only thing a --json command writes there."""
    sys.stdout.write(json.dumps(document(data, key), indent=2, default=str) + "\n")


@contextmanager
def progress(enabled: bool = True, milestones: bool = False) -> Iterator[Any]:
    """Progress on stderr: yields ``say(stage, detail)`` (see ``agentsearch.progress``): a live
    line with elapsed time on a terminal, plain timestamped lines elsewhere, nothing with --quiet."""
    with _progress.progress(err, enabled=enabled, milestones=milestones) as say:
        yield say

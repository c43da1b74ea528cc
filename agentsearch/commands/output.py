"""Shared printing for commands: JSON, rich tables and a live progress line on stderr."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.markup import escape

from history.records.text import clean

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


def safe(text: object) -> str:
    """Text a proposal may control, ready for ``out.print``: no escape sequence or control character (they
    redrew rows of ``history`` once) and no rich markup tag."""
    return escape(clean(text))


def fit(text: str, width: int) -> str:
    """One line of at most ``width`` characters, ellipsized, control characters removed."""
    return clean(text, max(1, width), one_line=True)


def compact_table(
    title: str,
    heads: list[str],
    rows: list[list[str]],
    width: int,
    right: tuple[int, ...] = (),
    styles: list[list[str]] | None = None,
) -> Any:
    """A table of one line per row that fits ``width`` columns (rich only shrinks by wrapping or
    cutting every column): all columns keep their width but the last two (say title and reason),
    which share what is left, a third and two thirds, ellipsized. ``styles``: rich style per cell."""
    from rich.table import Table

    fixed = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(heads[:-2])]
    left = max(24, width - sum(fixed) - len(heads) + 1)
    first = min(max([len(heads[-2])] + [len(r[-2]) for r in rows]), max(8, left // 3))
    last = max(10, left - first - 1)
    t = Table(box=None, pad_edge=False, padding=(0, 1, 0, 0), header_style="bold", title=title, title_justify="left")
    for i, h in enumerate(heads):
        t.add_column(h, no_wrap=True, justify="right" if i in right else "left")
    for n, r in enumerate(rows):
        cells = [*r[:-2], fit(r[-2], first), fit(r[-1], last)]
        style = (styles or [[]] * len(rows))[n]
        t.add_row(
            *[f"[{style[i]}]{safe(c)}[/]" if i < len(style) and style[i] else safe(c) for i, c in enumerate(cells)]
        )
    return t


@contextmanager
def progress(enabled: bool = True, milestones: bool = False) -> Iterator[Any]:
    """Progress on stderr: yields ``say(stage, detail)`` (see ``agentsearch.progress``): a live
    line with elapsed time on a terminal, plain timestamped lines elsewhere, nothing with --quiet."""
    with _progress.progress(err, enabled=enabled, milestones=milestones) as say:
        yield say

"""Shared printing for commands: JSON, rich tables and a live progress line on stderr."""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from typing import Any, Iterator

from rich.console import Console

from .. import progress as _progress

out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)
# soft_wrap: messages on stderr are never hard-wrapped at 80 columns when it is not a terminal
err = Console(stderr=True, highlight=False, soft_wrap=True)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


@contextmanager
def progress(enabled: bool = True, milestones: bool = False) -> Iterator[Any]:
    """Progress on stderr: yields ``say(stage, detail)`` (see ``agentsearch.progress``): a live
    line with elapsed time on a terminal, plain timestamped lines elsewhere, nothing with --quiet."""
    with _progress.progress(err, enabled=enabled, milestones=milestones) as say:
        yield say

"""Shared printing for commands: JSON, rich tables and a live progress line on stderr."""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from typing import Any, Iterator

from rich.console import Console

out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, highlight=False)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


@contextmanager
def progress(enabled: bool = True) -> Iterator[Any]:
    """A live status line: yields ``say(stage, detail)``."""
    if not enabled or not err.is_terminal:
        def quiet(stage: str, detail: str) -> None:
            return None
        yield quiet
        return
    with err.status("starting") as status:
        def say(stage: str, detail: str) -> None:
            status.update(f"[bold]{stage}[/bold] {detail}")
        yield say

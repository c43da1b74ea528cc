"""Progress on stderr for long commands (evaluate, calibrate, episode, verify, profile, review).

Every stage reports through one callback, ``say(stage, detail)``. Where it goes depends on
stderr: on a terminal a live line (spinner, elapsed time, the latest stage) with permanent
lines for milestones; anywhere else (CI, ``| tee``, nohup, a log file) one plain line per
stage change and per pair, ``[06:41:07 +12.3s] stage: detail``, never wrapped. ``--quiet``
(``set_quiet``) turns it off. Progress never goes to stdout, so ``--json`` stays valid.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from history.records.text import clean

Say = Callable[[str, str], None]

_quiet = False


def set_quiet(quiet: bool) -> None:
    """Process-wide switch: the CLI sets it from --quiet before running a command."""
    global _quiet
    _quiet = quiet


def is_quiet() -> bool:
    return _quiet


def _one_line(text: str) -> str:
    """One line of progress, cleaned: details carry proposal-controlled text (a check's detail names the variables
    and files a proposal wrote), and no escape sequence or invisible character of it reaches a terminal or a log."""
    return clean(text, 100_000, one_line=True)


def stamp(start: float, now: float | None = None) -> str:
    """``[HH:MM:SS +12.3s]``: wall clock (local) and seconds since ``start`` (monotonic)."""
    elapsed = (time.monotonic() if now is None else now) - start
    return f"[{time.strftime('%H:%M:%S')} +{elapsed:.1f}s]"


_PAIR = re.compile(r"\bpair (\d+)/(\d+)\b")


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


class PairClock:
    """The ETA of a stage that reports ``pair i/n``: the mean time per pair since the stage's first
    pair line, times the pairs left. An upper bound (the sequential test may stop early), said so."""

    def __init__(self) -> None:
        self.first: dict[str, tuple[float, int]] = {}

    def annotate(self, stage: str, detail: str, now: float | None = None) -> str:
        m = _PAIR.search(detail)
        if not m:
            return detail
        now = time.monotonic() if now is None else now
        i, n = int(m.group(1)), int(m.group(2))
        first = self.first.get(stage)
        if first is None or i <= first[1]:
            self.first[stage] = (now, i)
            return detail
        if i >= n:
            return detail
        per_pair = (now - first[0]) / (i - first[1])
        return f"{detail}, at most ~{_duration(per_pair * (n - i))} left"


def is_milestone(stage: str) -> bool:
    """Episode convention: a stage without a space (a proposal id) is a milestone worth a
    permanent line; ``"<proposal> <stage>"`` is a step inside it."""
    return " " not in stage


class PlainProgress:
    """One plain, timestamped line per call (consecutive repeats dropped), written straight to
    the stream so nothing wraps it."""

    def __init__(self, stream: Any = None):
        self.stream = stream
        self.start = time.monotonic()
        self.last: tuple[str, str] | None = None
        self.clock = PairClock()

    def __call__(self, stage: str, detail: str) -> None:
        stage, detail = _one_line(stage), _one_line(detail)
        if (stage, detail) == self.last:
            return
        self.last = (stage, detail)
        detail = self.clock.annotate(stage, detail)
        stream = self.stream or sys.stderr
        text = f"{stage}: {detail}" if detail else stage
        try:
            stream.write(f"{stamp(self.start)} {text}\n")
            stream.flush()
        except (OSError, ValueError):  # a closed pipe must not fail the measurement
            pass


class LiveProgress:
    """A rich live line on a terminal: spinner, elapsed time, the latest stage and detail;
    milestones (see ``is_milestone``) also print a permanent line with their time."""

    def __init__(self, console: Any, milestones: bool):
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.console = console
        self.milestones = milestones
        self.start = time.monotonic()
        self.bar = Progress(
            SpinnerColumn(), TimeElapsedColumn(), TextColumn("{task.description}"), console=console, transient=True
        )
        self.task = self.bar.add_task("starting", total=None)
        self.clock = PairClock()

    def __enter__(self) -> LiveProgress:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.bar.__exit__(*exc)

    def __call__(self, stage: str, detail: str) -> None:
        from rich.markup import escape

        stage, detail = _one_line(stage), _one_line(detail)
        detail = self.clock.annotate(stage, detail)
        text = f"[bold]{escape(stage)}[/bold] {escape(detail)}"
        if self.milestones and is_milestone(stage):
            self.bar.console.print(f"[dim]{stamp(self.start)}[/dim] {text}", soft_wrap=True)
        else:
            self.bar.update(self.task, description=text)


def _quiet_say(stage: str, detail: str) -> None:
    return None


@contextmanager
def progress(console: Any = None, enabled: bool = True, milestones: bool = False) -> Iterator[Say]:
    """Yields ``say(stage, detail)``: live on a terminal, plain timestamped lines elsewhere,
    nothing when quiet or not ``enabled``. Plain lines start with the first ``say``, so an error
    before any work stays the only line on stderr."""
    if not enabled or _quiet:
        yield _quiet_say
        return
    if console is None:
        from rich.console import Console

        console = Console(stderr=True, highlight=False, soft_wrap=True)
    if not console.is_terminal:
        yield PlainProgress(console.file)
        return
    with LiveProgress(console, milestones) as live:
        yield live

"""``run-error``: the run itself failed while judging a proposal (preflight, a broken baseline); never a verdict."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import Record


@dataclass(frozen=True)
class RunError(Record):
    KIND: ClassVar[str] = "run-error"

    number: int
    proposal: str
    error: str  # the one-line error
    kind: str  # the exception class (RunError, BaselineBroken, ...)
    baseline: str

"""``merge``: the compare-and-swap of the baseline to a merged candidate (or why it did not happen)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import Record


@dataclass(frozen=True)
class Merge(Record):
    KIND: ClassVar[str] = "merge"

    number: int
    ok: bool  # the baseline moved
    old: str  # the baseline the verdict was made on
    new: str  # the merge commit (ok) or the baseline found instead (not ok)
    candidate: str
    error: str = ""  # why not (the baseline moved under it)

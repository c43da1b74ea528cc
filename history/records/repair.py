"""``repair``: opening the log removed a torn last line (a crash mid-write)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import Record


@dataclass(frozen=True)
class Repair(Record):
    KIND: ClassVar[str] = "repair"

    note: str

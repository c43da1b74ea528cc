"""``recheck``: `agentsearch review MERGE --recheck` measured a merge against its parent again."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import Record
from .checks import FailureKind


@dataclass(frozen=True)
class Recheck(Record):
    KIND: ClassVar[str] = "recheck"

    merge: str
    parent: str
    proposal: str | None
    holds: bool  # the gate would merge it again
    verdict: str  # merge | reject | review
    reasons: tuple[str, ...]
    seed: int
    speedup: float | None
    failed_check: str | None = None  # the first failed check (a CheckName value); None when it holds or older
    failure: FailureKind | None = None

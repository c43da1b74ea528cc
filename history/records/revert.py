"""``revert``: `agentsearch revert` undid a merge on the baseline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import Record


@dataclass(frozen=True)
class Revert(Record):
    KIND: ClassVar[str] = "revert"

    merge: str  # the reverted merge commit
    old: str  # baseline before
    new: str  # the revert commit

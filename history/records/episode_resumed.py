"""``episode-resumed``: a later session continues an unfinished episode."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import Record


@dataclass(frozen=True)
class EpisodeResumed(Record):
    KIND: ClassVar[str] = "episode-resumed"

    session: int  # 2 for the first resume
    used_s: float  # wall time of the earlier sessions
    judged: int  # proposals with a verdict when it resumed

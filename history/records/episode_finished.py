"""``episode-finished``: why an episode stopped and what it did (or that it was abandoned)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from .base import Record


@dataclass(frozen=True)
class EpisodeFinished(Record):
    KIND: ClassVar[str] = "episode-finished"

    episode: str
    reason: str  # "queue empty", "proposal budget reached (10)", "abandoned", ...
    judged: int | None = None  # None when abandoned
    merged: int | None = None
    baseline_before: str | None = None
    baseline_after: str | None = None
    elapsed_s: float | None = None
    insights: str | None = None  # path of the insights.md written at the end
    # what the judge spent and bought (history.proposals.judge_costs): decisions/hour, machine-s per merged %; 0.8 on
    judge: Mapping[str, Any] | None = None

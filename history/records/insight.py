"""``insight``: the distilled statistics and lessons of the history (history.insights.distill)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .base import Record


@dataclass(frozen=True)
class Insight(Record):
    KIND: ClassVar[str] = "insight"
    OPEN: ClassVar[bool] = True  # an LLM pass adds ``llm``; kept in ``extra``

    generated_ts: float
    proposals: int  # judged
    merged: int  # and still merged
    reverted: int
    win_rate: float | None
    by_category: Mapping[str, Mapping[str, Any]]
    by_file: Mapping[str, Mapping[str, Any]]
    by_workload: Mapping[str, Mapping[str, Any]]
    reasons: Mapping[str, int]  # rejections by first failed check
    knobs: Mapping[str, Mapping[str, Any]]
    lessons: Mapping[str, tuple[str, ...]]  # worked, ineffective, avoid
    notes: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict, kw_only=True)

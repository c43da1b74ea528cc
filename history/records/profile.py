"""``profile``: where one workload's time goes (agentsearch.profiling.profile)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .base import Record


@dataclass(frozen=True)
class Profile(Record):
    KIND: ClassVar[str] = "profile"
    OPEN: ClassVar[bool] = True  # the tables (by_phase, by_op, by_module, wall_s, ...) are kept in ``extra``

    ref: str
    commit: str
    workload: str
    kind: str  # the workload's kind
    device: str | None = None
    metric: Mapping[str, Any] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict, kw_only=True)

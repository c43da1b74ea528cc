"""Where an evaluation's wall time went (agentsearch.evaluation.Evaluation.timing): the parts add up to the wall."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from .base import Part


@dataclass(frozen=True)
class Timing(Part):
    """An evaluation's wall time split into engine start-up and shutdown, measurement, distribution checks, and the
    rest (build, tests, orchestration), in seconds."""

    OPEN: ClassVar[bool] = True  # a later version's parts are kept by an older reader

    wall_s: float = 0.0
    engine_s: float = 0.0
    verify_s: float = 0.0
    measurement_s: float = 0.0
    overhead_s: float = 0.0
    overhead_pct: float = 0.0  # of the wall time
    engine_starts: int | None = None  # engines started for this decision (None: recorded before 0.8)
    extra: Mapping[str, object] = field(default_factory=dict, kw_only=True)

    @property
    def measured(self) -> bool:
        """Anything was measured (an instant rejection measured nothing)."""
        return bool(self.measurement_s or self.engine_s or self.verify_s)

    def line(self) -> str:
        """The split in one line for people."""
        if not self.measured:
            return f"time: {self.wall_s:.1f} s, nothing measured (stopped before the first trial)"
        parts = [f"engines {self.engine_s:.1f} s", f"measurement {self.measurement_s:.1f} s"]
        if self.verify_s:
            parts.append(f"distribution checks {self.verify_s:.1f} s")
        parts.append(f"build, tests and orchestration {self.overhead_s:.1f} s ({self.overhead_pct:.1f}%)")
        starts = f"; {self.engine_starts} engine start(s)" if self.engine_starts is not None else ""
        return f"time: {self.wall_s:.1f} s = " + " + ".join(parts) + starts

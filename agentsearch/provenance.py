"""How each figure a report, a comment or `--json` shows was obtained (issue #59: provenance on every number).

Peers published speedups for kernels they never timed (``isolated_speedup 0.0``) and self-reported micro speedups as
wins. Here every figure says how it came to be — measured in interleaved pairs, measured once, carried from an
earlier check, reported by the proposal — or that it was not run, and then it is no number at all: ``Figure`` holds
no value exactly when it was not run, and its text is "not run". The gate decides on paired measurements (and the
distribution check's own rule); every other figure is advisory, and says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Any


class How(str, Enum):
    PAIRED = "paired"  # interleaved baseline/candidate pairs on the same machine (what the gate decides on)
    ONCE = "once"  # one run per side, not paired (a distribution check's dumps, a wall time)
    CARRIED = "carried"  # from an earlier check (a baseline's dumps reused, main's run standing for the candidate's)
    REPORTED = "reported"  # the proposal's or its agent's own claim: never vouched for
    NOT_RUN = "not run"  # no measurement: shown as "not run", never as a number


WORDS = {
    How.PAIRED: "measured in pairs",
    How.ONCE: "measured once",
    How.CARRIED: "carried from an earlier check",
    How.REPORTED: "reported by the proposal",
    How.NOT_RUN: "not run",
}
NOT_RUN = WORDS[How.NOT_RUN]


@dataclass(frozen=True)
class Figure:
    """One number as shown: its name (``workload.speed.change``), value, unit, how it was obtained, whether the
    verdict was decided on it, and a detail (``14 pairs``)."""

    name: str
    value: float | int | None
    unit: str
    how: How
    decides: bool = False
    detail: str = ""

    def __post_init__(self) -> None:
        if (self.value is None) != (self.how is How.NOT_RUN):
            raise ValueError(f"{self.name}: a figure has no value exactly when it was not run ({self.how.value})")
        if isinstance(self.value, float) and not math.isfinite(self.value):
            raise ValueError(f"{self.name}: {self.value} is no measurement")

    @classmethod
    def of(cls, name: str, value: Any, unit: str, how: How, decides: bool = False, detail: str = "") -> Figure:
        """``value`` None (or not finite) makes the figure not run, whatever ``how`` says; ``how`` not run drops any
        value given (a baseline's median from a trial whose pair never completed is no measurement of the change)."""
        ok = (
            how is not How.NOT_RUN
            and isinstance(value, int | float)
            and not isinstance(value, bool)
            and math.isfinite(value)
        )
        return cls(name, value if ok else None, unit, how if ok else How.NOT_RUN, decides and ok, detail)

    @property
    def advisory(self) -> bool:
        return not self.decides

    def words(self) -> str:
        """How it was obtained, for a table's *measured* column (``measured in pairs (14)``)."""
        base = WORDS[self.how]
        if self.how is How.PAIRED and self.detail.endswith(" pairs"):
            return f"measured in {self.detail}"
        return f"{base} ({self.detail})" if self.detail and self.how is not How.NOT_RUN else base

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": self.value,
            "unit": self.unit,
            "provenance": self.how.value,
            "advisory": self.advisory,
            "detail": self.detail or None,
        }

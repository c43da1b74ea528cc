"""The coverage pass's result: did the candidate's changed lines run (harness.coverage measures it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from .base import Part

COVERAGE_SCHEMA = 1


@dataclass(frozen=True)
class CoverageReport(Part):
    """How many of the patch's executable changed lines ran in one untimed, traced candidate trial, per file."""

    OPEN: ClassVar[bool] = True  # a later version's fields are kept by an older reader

    changed: int  # executable changed lines
    ran: int
    files: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # relative path -> (changed, ran)
    schema_version: int = COVERAGE_SCHEMA
    extra: Mapping[str, object] = field(default_factory=dict, kw_only=True)

    def summary(self) -> str:
        per = ", ".join(f"{p} {r}/{c}" for p, (c, r) in sorted(self.files.items()))
        return f"{self.ran}/{self.changed} changed executable lines ran ({per})"

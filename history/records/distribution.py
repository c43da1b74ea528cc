"""``distribution``: the logprob comparison of a candidate (agentsearch.verify.VerifyResult)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .base import Record


@dataclass(frozen=True)
class Distribution(Record):
    KIND: ClassVar[str] = "distribution"
    OPEN: ClassVar[bool] = True  # the statistics' fields (public, holdout, draws, ...) are kept in ``extra``

    number: int
    verdict: str  # pass | fail | skipped
    reasons: tuple[str, ...] = ()
    mode: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict, kw_only=True)

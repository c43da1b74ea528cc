"""``proposal-created``: a proposal, applied (or not) on a branch of the baseline."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .base import Record

# what a proposal is about (a proposer's and a [[sweep.knob]]'s ``category``)
CATEGORIES = ("config", "scheduling", "kernel", "graph/launch", "memory", "other")


@dataclass(frozen=True)
class ProposalCreated(Record):
    KIND: ClassVar[str] = "proposal-created"

    number: int  # 1-based, within the episode
    proposal: str  # "<episode>/<number:03d>"
    key: str  # the proposer's key (never proposed twice)
    title: str
    rationale: str
    category: str
    proposer: str
    branch: str | None  # the proposal branch (None when creating it failed)
    base: str | None  # the baseline commit it was applied on
    commit: str | None  # None when the patch did not apply or made no change
    applied: bool
    apply_error: str  # '' when applied
    files: tuple[str, ...]  # paths the commit changes
    diff_hash: str  # sha256 of the patch
    patch: str  # the full patch text (resume re-applies it)
    meta: Mapping[str, Any] = field(default_factory=dict)  # the proposer's extras (knobs, cost_usd, error, ...)

    def __post_init__(self) -> None:
        if self.category not in CATEGORIES:
            raise ValueError(f"category must be one of {', '.join(CATEGORIES)}, got {self.category!r}")

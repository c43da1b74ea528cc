"""``episode-started``: what an episode was started with (its plan); ``--resume`` rebuilds from it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from .base import Record


@dataclass(frozen=True)
class EpisodeStarted(Record):
    KIND: ClassVar[str] = "episode-started"

    episode: str  # the episode id (e20261130-122815-981)
    proposer: str  # the proposer's registry name (patches, sweep, claude)
    manifest: Mapping[str, Any]  # everything the proposer needs to be rebuilt on resume
    budget: int  # proposals to judge at most
    time_budget_s: float | None  # stop starting proposals after this long
    seed: int  # master seed of the episode
    alpha: float  # false-merge level per proposal (Bonferroni over the episode)
    baseline: str  # baseline commit at the start
    config_fingerprint: str
    insights: Mapping[str, Any] | None = None  # imported with --insights (else the history's latest)
    cost_budget_usd: float | None = None  # agent proposers: stop when spent

"""The proposer contract: what a proposer offers (``Candidate``), what it may know (``Context``), and
its interface. The registry that builds a concrete proposer is ``registry``; this module imports none."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from history.proposals import Proposal
from history.records import CATEGORIES, text

from ..errors import AgentsearchError

CANDIDATE_SCHEMA = 1


class ProposerError(AgentsearchError):
    """A proposer cannot start (bad patch directory, no matching branch...)."""


@dataclass(frozen=True)
class Candidate:
    """One proposal before it is applied: identity in the queue, description, and the change."""

    key: str  # stable across resumes: a judged key is never offered again
    title: str
    rationale: str
    category: str
    proposer: str
    patch: str  # unified diff applied (three-way) on the current baseline
    meta: Mapping[str, Any] = field(default_factory=dict)  # proposer-specific facts (knobs, tokens, cost)
    schema_version: int = CANDIDATE_SCHEMA

    def __post_init__(self) -> None:
        if self.category not in CATEGORIES:
            raise ValueError(f"category must be one of {', '.join(CATEGORIES)}, got {self.category!r}")
        # proposal-controlled text is data from here on: one line of title, no control characters, capped
        object.__setattr__(self, "title", text.title(self.title))
        object.__setattr__(self, "rationale", text.clean(self.rationale))


@dataclass(frozen=True)
class Context:
    """What a proposer may know when it proposes: the current baseline's files (read-only),
    the target's history of proposals (all episodes), the distilled insights, and where it is."""

    read_file: Callable[[str], str | None]
    history: Sequence[Proposal]  # every proposal of the target so far (all episodes), as its records say
    insights: Mapping[str, Any] | None
    number: int  # the proposal about to be created
    seed: int  # the episode's master seed
    extra: Mapping[str, Any] = field(default_factory=dict)  # e.g. profiles, workload descriptions


class Proposer(Protocol):
    name: str

    def manifest(self) -> dict[str, Any]:
        """Everything needed to rebuild this proposer on resume (recorded in the history)."""
        ...

    def next(self, judged: set[str], ctx: Context) -> Candidate | None:
        """The next candidate whose key is not in ``judged``; None when the queue is empty."""
        ...

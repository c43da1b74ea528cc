"""The proposer contract and the registry that builds one from options or a manifest."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Protocol

from ..errors import AgentsearchError

CANDIDATE_SCHEMA = 1
CATEGORIES = ("config", "scheduling", "kernel", "graph/launch", "memory", "other")


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
    schema_version: int = CANDIDATE_SCHEMA

    def __post_init__(self) -> None:
        if self.category not in CATEGORIES:
            raise ValueError(f"category must be one of {', '.join(CATEGORIES)}, got {self.category!r}")


class Proposer(Protocol):
    name: str

    def manifest(self) -> dict[str, Any]:
        """Everything needed to rebuild this proposer on resume (recorded in the history)."""
        ...

    def next(self, judged: set[str]) -> Candidate | None:
        """The next candidate whose key is not in ``judged``; None when the queue is empty."""
        ...


def build(name: str, options: Mapping[str, Any], repo_dir: Path) -> Proposer:
    if name == "patches":
        from .patches import PatchQueue

        return PatchQueue.from_options(options, repo_dir)
    raise ProposerError(f"unknown proposer {name!r}; use --proposer patches")


def rebuild(name: str, manifest: Mapping[str, Any]) -> Proposer:
    if name == "patches":
        from .patches import PatchQueue

        return PatchQueue.from_manifest(manifest)
    raise ProposerError(f"the history names proposer {name!r}, which this version cannot resume")

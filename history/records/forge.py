"""``pr-review``, ``pr-posted`` and ``pr-command``: the review bot on the forge (`agentsearch review-pr`, `bot`).

A pull request's head is judged like any candidate (its evaluation is an ``evaluation`` record whose proposal id
is the review's ``evaluation``); the verdict is recorded (``pr-review``) before anything is posted, and each
post that reached the forge is recorded (``pr-posted``: the comment kept current and the commit status). A
comment command is recorded once (``pr-command``) before it runs, so a killed bot neither loses nor repeats it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import Record

PR_OUTCOMES = (
    "success",
    "failure",
    "neutral",
    "error",
)  # the commit status: merge-worthy | regression or failed check |
#                                                           inconclusive or held for review | the run could not judge
COMMAND_ACTIONS = ("run", "ignored")


@dataclass(frozen=True)
class PrReview(Record):
    KIND: ClassVar[str] = "pr-review"

    forge: str  # the repository on its forge: "kind url owner/name"
    number: int
    head: str  # the commit judged
    base: str  # the commit it was measured against (the base branch's tip when fetched)
    base_ref: str  # the base branch
    evaluation: str  # the proposal id of its evaluation record (`agentsearch report ID`)
    verdict: str  # merge | reject | review
    outcome: str  # success | failure | neutral | error (PR_OUTCOMES)
    headline: str  # the one-line verdict with its number
    seed: int
    trigger: str = "review-pr"  # review-pr | bot | command:<comment id>
    supersedes: str | None = None  # the head judged before on this pull request (a new push)

    def __post_init__(self) -> None:
        if self.outcome not in PR_OUTCOMES:
            raise ValueError(f"pull request #{self.number}: unknown outcome {self.outcome!r}")


@dataclass(frozen=True)
class PrPosted(Record):
    KIND: ClassVar[str] = "pr-posted"

    forge: str
    number: int
    head: str
    evaluation: str  # the review whose verdict the comment and the status carry
    comment_id: int  # the one comment kept current on this pull request
    comment_url: str
    outcome: str  # the status set on the head; "stale": pending, the verdict was judged against another base
    base: str | None = None  # the base branch's tip when posted (stale: the one the verdict was not judged on)


@dataclass(frozen=True)
class PrCommand(Record):
    KIND: ClassVar[str] = "pr-command"

    forge: str
    number: int
    comment_id: int  # the comment that asked
    author: str
    command: str  # the command word as asked (cleaned), e.g. recheck
    action: str  # run | ignored
    reason: str  # why it was ignored, or what it ran

    def __post_init__(self) -> None:
        if self.action not in COMMAND_ACTIONS:
            raise ValueError(f"pull request #{self.number}: unknown command action {self.action!r}")

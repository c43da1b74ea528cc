"""An agent session's account: what the agent ran on its workbench and what the session cost.

Carried in a ``proposal-created`` record's ``meta["session"]`` (the proposal the session produced),
summed per episode by ``AgentSession.totals``. Text here came from the agent (tool arguments, command
lines, the tail of an error): it is cleaned and capped when recorded and shown only as untrusted text.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .base import Part

# the workbench's tools (agentsearch.workbench); "refused" counts calls to anything else
TOOL_KINDS = (
    "read",
    "write",
    "edit",
    "ls",
    "grep",
    "run",
    "changes",
    "test",
    "kernels_bench",
    "measure",
    "profile",
    "check_outputs",
    "history",
    "insights",
)


@dataclass(frozen=True)
class ToolCall(Part):
    tool: str  # one of TOOL_KINDS, or the name of a tool the agent may not use
    args: str  # what it was asked (one line, cleaned, capped)
    seconds: float  # wall seconds, counted against [agent] max_tool_seconds
    ok: bool  # the tool did what was asked (a failing test is ok=False; a refusal is too)
    detail: str  # one line: exit status, verdict, estimate or why it was refused
    pairs: int = 0  # advisory pairs measured (measure)
    refused: bool = False  # never ran: a budget, the fence, an unknown tool


@dataclass(frozen=True)
class AgentSession(Part):
    model: str | None
    turns: int
    tokens_in: int
    tokens_out: int
    cost_usd: float
    tool_seconds: float  # the workbench calls' wall seconds
    session_s: float  # the whole session's wall seconds (the model's time included)
    calls: tuple[ToolCall, ...]
    error: str  # '' when the session ended normally

    def by_kind(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.calls:
            out[c.tool] = out.get(c.tool, 0) + 1
        return out

    def used(self, *tools: str) -> bool:
        return any(c.tool in tools and not c.refused for c in self.calls)

    @staticmethod
    def of(meta: Mapping[str, Any] | None) -> AgentSession | None:
        raw = (meta or {}).get("session")
        return AgentSession.from_json(raw, "session") if isinstance(raw, Mapping) else None

    @staticmethod
    def totals(sessions: Iterable[AgentSession]) -> dict[str, Any]:
        """Dollars, tokens, machine seconds and calls by kind over ``sessions``."""
        tot: dict[str, Any] = {
            "sessions": 0,
            "cost_usd": 0.0,
            "tokens_in": 0,
            "tokens_out": 0,
            "tool_seconds": 0.0,
            "session_s": 0.0,
            "calls": {},
        }
        for s in sessions:
            tot["sessions"] += 1
            tot["cost_usd"] += s.cost_usd
            tot["tokens_in"] += s.tokens_in
            tot["tokens_out"] += s.tokens_out
            tot["tool_seconds"] += s.tool_seconds
            tot["session_s"] += s.session_s
            for k, n in s.by_kind().items():
                tot["calls"][k] = tot["calls"].get(k, 0) + n
        return tot

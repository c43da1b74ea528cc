"""The agent session: one claude-agent-sdk conversation, every tool call decided by a guard.

Used by the Claude proposer (an agent that edits a scratch worktree) and by the LLM pass of the
insights (an agent with no tools). ``ToolGuard`` makes the worktree the agent's whole world:
paths are resolved and must stay inside it, outside ``.git`` and (for edits) outside the
protected globs; no web tools or sub-agents; shell commands only from a short allowlist.

``AGENTSEARCH_AGENT_TRANSPORT=module:factory`` replaces the Claude Code CLI with another SDK
``Transport`` (the tests' scripted, offline agent); everything else is the real SDK path.
"""

from __future__ import annotations

import importlib
import os
import shlex
from pathlib import Path
from typing import Any, Callable, Mapping

from .errors import AgentsearchError
from .globs import first_match

EDIT_TOOLS = ("Edit", "Write", "MultiEdit", "NotebookEdit")
READ_TOOLS = ("Read", "Glob", "Grep", "LS")
ALLOWED_COMMANDS = ("git diff", "git status", "git log", "python -m py_compile", "python -m compileall", "ls", "cat", "grep", "wc")
PATH_KEYS = ("file_path", "path", "notebook_path")
TRANSPORT_ENV = "AGENTSEARCH_AGENT_TRANSPORT"


class AgentError(AgentsearchError):
    """The agent session cannot be set up (a bad transport factory)."""


def credentials() -> bool:
    """Whether the environment holds credentials for the Claude Code CLI."""
    return bool(os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("CLAUDE_CODE_OAUTH_TOKEN"))


def load_transport_factory() -> Callable[..., Any] | None:
    spec = os.environ.get(TRANSPORT_ENV)
    if not spec:
        return None
    mod, _, attr = spec.partition(":")
    try:
        return getattr(importlib.import_module(mod), attr or "factory")
    except (ImportError, AttributeError) as exc:
        raise AgentError(f"{TRANSPORT_ENV}={spec}: cannot load the transport factory ({exc})") from None


class ToolGuard:
    """Decides every tool call of the agent: the worktree is the whole world."""

    def __init__(self, worktree: Path, protected: tuple[str, ...]):
        self.root = Path(os.path.realpath(worktree))
        self.protected = protected
        self.denied: list[str] = []

    def check(self, tool: str, args: Mapping[str, Any]) -> str:
        """'' to allow, else why not."""
        if tool in ("WebFetch", "WebSearch", "Task", "Agent"):
            return f"{tool} is not available: no network and no sub-agents in a proposal session"
        if tool == "Bash":
            cmd = str(args.get("command", "")).strip()
            if any(ch in cmd for ch in ";|&`$<>\n") or not any(cmd == c or cmd.startswith(c + " ") for c in ALLOWED_COMMANDS):
                return f"command not allowed: {cmd[:80]!r} (allowed: {', '.join(ALLOWED_COMMANDS)})"
            for tok in shlex.split(cmd)[1:]:
                if tok.startswith("/") or ".." in tok:
                    reason = self._path_reason(tok, write=False)
                    if reason:
                        return reason
            return ""
        if tool not in EDIT_TOOLS + READ_TOOLS:
            return f"tool {tool} is not available in a proposal session"
        paths = [str(args[k]) for k in PATH_KEYS if args.get(k)]
        for p in paths:
            reason = self._path_reason(p, write=tool in EDIT_TOOLS)
            if reason:
                return reason
        return ""

    def _path_reason(self, raw: str, write: bool) -> str:
        path = Path(raw)
        full = Path(os.path.realpath(path if path.is_absolute() else self.root / path))
        if full != self.root and self.root not in full.parents:
            return f"{raw} is outside the proposal's worktree"
        rel = full.relative_to(self.root).as_posix() if full != self.root else "."
        if rel == ".git" or rel.startswith(".git/"):
            return f"{raw}: the git directory is off limits"
        if write:
            hit = first_match(rel, self.protected)
            if hit:
                return f"{rel} is protected (matches {hit!r}); change something else"
        return ""


def run_session(prompt: str, worktree: Path, guard: ToolGuard, model: str | None, max_turns: int, transport: Any,
                tools: list[str] | None = None) -> dict[str, Any]:
    """One agent session through the SDK; never raises (an error is part of the outcome)."""
    import anyio

    out: dict[str, Any] = {"text": "", "cost_usd": 0.0, "tokens_in": 0, "tokens_out": 0, "turns": 0, "error": ""}

    async def main() -> None:
        from claude_agent_sdk import (AssistantMessage, ClaudeAgentOptions, ClaudeSDKClient, PermissionResultAllow,
                                      PermissionResultDeny, ResultMessage, TextBlock)

        async def can_use_tool(tool: str, args: dict[str, Any], _context: Any) -> Any:
            reason = guard.check(tool, args)
            if reason:
                guard.denied.append(f"{tool}: {reason}")
                return PermissionResultDeny(message=reason)
            return PermissionResultAllow()

        options = ClaudeAgentOptions(
            cwd=str(worktree), can_use_tool=can_use_tool, permission_mode="default", max_turns=max_turns, model=model,
            tools=[*READ_TOOLS[:3], *EDIT_TOOLS[:3], "Bash"] if tools is None else tools, disallowed_tools=["WebFetch", "WebSearch", "Task"],
            setting_sources=[],
        )
        texts: list[str] = []
        async with ClaudeSDKClient(options=options, transport=transport) as client:
            await client.query(prompt)
            async for msg in client.receive_response():
                if isinstance(msg, AssistantMessage):
                    texts.extend(b.text for b in msg.content if isinstance(b, TextBlock))
                elif isinstance(msg, ResultMessage):
                    usage = msg.usage or {}
                    out.update(cost_usd=float(msg.total_cost_usd or 0.0), turns=msg.num_turns,
                               tokens_in=int(usage.get("input_tokens", 0)) + int(usage.get("cache_read_input_tokens", 0)),
                               tokens_out=int(usage.get("output_tokens", 0)))
                    if msg.is_error:
                        out["error"] = str(msg.result or msg.subtype)
                    if msg.result:
                        texts.append(str(msg.result))
        out["text"] = "\n".join(texts)

    try:
        anyio.run(main)
    except Exception as exc:  # noqa: BLE001 - the SDK, the CLI or the network: the proposal ends with no change
        out["error"] = f"{type(exc).__name__}: {exc}"[:400]
    return out

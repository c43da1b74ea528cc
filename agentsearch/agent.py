"""The agent session: one claude-agent-sdk conversation with the real Claude Code CLI, fenced.

Used by the Claude proposer (an agent with a workbench, ``agentsearch.workbench``) and by the LLM
pass of the insights (an agent with no tools). The fence is not a filter on what the CLI may do:

- the CLI's built-in tools are switched off (``--tools ""``: no Bash, no file tools, no web, no
  sub-agents); the agent's only tools are the workbench's, served from this process through the
  SDK's in-process MCP server, and each of them runs its work inside the project's sandbox;
- ``can_use_tool`` refuses (and records) any call that is not a workbench tool, should the CLI ever
  offer one;
- the CLI runs in an empty working directory with a private ``$HOME`` and config directory, loads no
  settings, hooks, skills, plugins or MCP configuration from anywhere (``setting_sources=[]``,
  ``strict_mcp_config``), so nothing a proposal wrote can steer it;
- turns and dollars are bounded by the CLI (``[agent] max_turns``, ``max_cost_usd``), tool seconds,
  calls and advisory pairs by the workbench; a PreToolUse hook asks the workbench (``Workbench.admit``)
  before each of its calls runs, with the model turn that made it (the id of the model's message that
  holds the call's tool_use block), so one turn that batches many calls is cut at ``max_calls_per_turn``.

The Anthropic API is whatever ``ANTHROPIC_BASE_URL`` names (the tests: a scripted Messages API on
loopback, ``tests/messages_api.py``); nothing else replaces the CLI.
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path
from typing import Any

from harness import reaper

from .errors import AgentsearchError

SERVER = "workbench"


class AgentError(AgentsearchError):
    """The agent session cannot be set up."""


def credentials() -> bool:
    """Whether the environment holds credentials for the Claude Code CLI."""
    return bool(os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("CLAUDE_CODE_OAUTH_TOKEN"))


def cli_env(home: Path) -> dict[str, str]:
    """The CLI's environment on top of ours: a private home, config and temporary directory (the CLI keeps
    a per-user directory under $TMPDIR, shared by every session at once and never cleaned, otherwise), no
    auto-update, no telemetry or other traffic than the API's."""
    return reaper.marked(
        {
            "HOME": str(home),
            "CLAUDE_CONFIG_DIR": str(home / ".claude"),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "TMPDIR": str(home / "tmp"),
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
        }
    )  # dies with us


def cli_launcher(home: Path) -> str | None:
    """A launcher for the bundled CLI that dies with the orchestrator: ``setpriv --pdeathsig KILL`` (util-linux)
    before the CLI's exec — killed, the orchestrator would otherwise leave the CLI running on for seconds. None
    (the SDK finds the CLI itself) where there is no bundled CLI or no setpriv."""
    import shlex
    import shutil

    import claude_agent_sdk

    cli = Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude"
    setpriv = shutil.which("setpriv")
    if not cli.is_file() or setpriv is None:
        return None
    path = home / "claude"
    path.write_text(f'#!/bin/sh\nexec {shlex.quote(setpriv)} --pdeathsig KILL -- {shlex.quote(str(cli))} "$@"\n')
    path.chmod(0o755)
    return str(path)


def tool_names(bench: Any) -> list[str]:
    return [f"mcp__{SERVER}__{name}" for name in bench.TOOLS]


def _server(bench: Any) -> Any:
    """The in-process MCP server of ``bench``'s tools (``bench.TOOLS``: name -> (description, JSON schema)):
    each call runs in a worker thread (the SDK's loop keeps answering the CLI meanwhile) through ``bench.call``."""
    import anyio
    from claude_agent_sdk import SdkMcpTool, create_sdk_mcp_server

    def handler(name: str) -> Any:
        async def run(args: dict[str, Any]) -> dict[str, Any]:
            ans = await anyio.to_thread.run_sync(bench.call, name, dict(args or {}))
            return {"content": [{"type": "text", "text": ans.text}], "is_error": not ans.ok}

        return run

    tools = [
        SdkMcpTool(name=name, description=desc, input_schema=schema, handler=handler(name))
        for name, (desc, schema) in bench.TOOLS.items()
    ]
    return create_sdk_mcp_server(SERVER, tools=tools)


def _outcome() -> dict[str, Any]:
    """A session's outcome before it runs: no text, nothing spent, no error."""
    return {
        "text": "",
        "cost_usd": 0.0,
        "tokens_in": 0,
        "tokens_out": 0,
        "turns": 0,
        "error": "",
        "session_s": 0.0,
    }


class _Fence:
    """The session's side of the fence: the tools the agent has, the model turn that made each call, and the
    workbench's per-turn cap and record of refusals (``bench`` None: no tools at all)."""

    def __init__(self, bench: Any) -> None:
        self.bench = bench
        self.allowed = tool_names(bench) if bench is not None else []
        self.turn_of: dict[str, str] = {}  # tool_use id -> the model turn (message id) that made it

    async def pre_tool_use(self, data: Any, tool_use_id: str | None, _context: Any) -> Any:
        """The workbench's per-turn cap, before a call runs: the CLI writes the model's message before it
        asks this hook, so its id is known here after at most a few passes of the event loop."""
        import anyio

        tool = str((data or {}).get("tool_name") or "")
        if self.bench is None or tool not in self.allowed:
            return {}
        key = str(tool_use_id or (data or {}).get("tool_use_id") or "")
        for _ in range(1000):  # ~5 s at most; unknown then: refused
            if key in self.turn_of:
                break
            await anyio.sleep(0.005)
        args = (data or {}).get("tool_input")
        why = await anyio.to_thread.run_sync(
            self.bench.admit,
            self.turn_of.get(key, ""),
            tool[len(f"mcp__{SERVER}__") :],
            args if isinstance(args, dict) else {},
        )
        if not why:
            return {}
        return {
            "hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": "deny",
                "permissionDecisionReason": why,
            }
        }

    async def can_use_tool(self, tool: str, args: dict[str, Any], _context: Any) -> Any:
        from claude_agent_sdk import PermissionResultAllow, PermissionResultDeny

        if tool in self.allowed:
            return PermissionResultAllow()
        why = f"{tool} is not available: the agent's only tools are the workbench's"
        if self.bench is not None:
            self.bench.refused(tool, args, why)
        return PermissionResultDeny(message=why)

    def saw_calls(self, msg: Any) -> None:
        """An assistant message's tool calls: the turn each belongs to, and a record of any call of a tool the
        session does not have."""
        from claude_agent_sdk import ToolUseBlock

        for b in msg.content:
            if isinstance(b, ToolUseBlock):  # the turn's id; none: its calls are refused
                self.turn_of[b.id] = msg.message_id or ""
        for b in msg.content:  # a call of a tool the session does not have: the CLI refuses it, we record it
            if isinstance(b, ToolUseBlock) and b.name not in self.allowed and self.bench is not None:
                self.bench.refused(
                    b.name,
                    b.input if isinstance(b.input, dict) else {},
                    f"{b.name} is not a tool of this session",
                )


def _options(fence: _Fence, home: Path, model: str | None, max_turns: int, max_cost_usd: float | None) -> Any:
    """The CLI's options: the fence's tools only, nothing loaded from anywhere, the session's bounds."""
    from claude_agent_sdk import ClaudeAgentOptions, HookMatcher

    bench = fence.bench
    return ClaudeAgentOptions(
        cwd=str(home / "cli"),
        env=cli_env(home / "home"),
        tools=[],
        allowed_tools=fence.allowed,
        mcp_servers={SERVER: _server(bench)} if bench is not None else {},
        strict_mcp_config=True,
        setting_sources=[],
        can_use_tool=fence.can_use_tool,
        hooks={"PreToolUse": [HookMatcher(matcher=None, hooks=[fence.pre_tool_use])]} if bench is not None else None,
        permission_mode="default",
        max_turns=max_turns,
        model=model,
        max_budget_usd=max_cost_usd,
        cli_path=cli_launcher(home),
    )


def _take_result(msg: Any, out: dict[str, Any], texts: list[str]) -> None:
    """The session's closing message: what it cost, its turns and tokens, its error and its last text."""
    usage = msg.usage or {}
    out.update(
        cost_usd=float(msg.total_cost_usd or 0.0),
        turns=msg.num_turns,
        tokens_in=int(usage.get("input_tokens", 0))
        + int(usage.get("cache_read_input_tokens", 0))
        + int(usage.get("cache_creation_input_tokens", 0)),
        tokens_out=int(usage.get("output_tokens", 0)),
    )
    if msg.is_error:
        out["error"] = str(msg.result or msg.subtype)
    if msg.result:
        texts.append(str(msg.result))


async def _converse(prompt: str, options: Any, fence: _Fence, out: dict[str, Any]) -> None:
    """Send the prompt and read the response to its end into ``out`` (the text only once the response ended)."""
    from claude_agent_sdk import AssistantMessage, ClaudeSDKClient, ResultMessage, TextBlock

    texts: list[str] = []
    async with ClaudeSDKClient(options=options) as client:
        await client.query(prompt)
        async for msg in client.receive_response():
            if isinstance(msg, AssistantMessage):
                texts.extend(b.text for b in msg.content if isinstance(b, TextBlock))
                fence.saw_calls(msg)
            elif isinstance(msg, ResultMessage):
                _take_result(msg, out, texts)
    out["text"] = "\n".join(texts)


def run_session(
    prompt: str, home: Path, model: str | None, max_turns: int, max_cost_usd: float | None = None, bench: Any = None
) -> dict[str, Any]:
    """One agent session through the SDK and the CLI; never raises (an error is part of the outcome).
    ``home``: the session's private directory (the CLI's cwd is ``home/cli``, its $HOME ``home/home``).
    ``bench``: the workbench whose tools the agent gets (None: no tools at all)."""
    import anyio

    out = _outcome()
    cwd, cli_home = home / "cli", home / "home"
    for d in (cwd, cli_home, cli_home / "tmp"):
        d.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    async def main() -> None:
        fence = _Fence(bench)
        await _converse(prompt, _options(fence, home, model, max_turns, max_cost_usd), fence, out)

    try:
        with warnings.catch_warnings():
            # the workbench's tools are allowed outright (each call is fenced and recorded by the workbench itself);
            # can_use_tool still sees, refuses and records anything else
            warnings.simplefilter("ignore", category=UserWarning)
            anyio.run(main)
    except Exception as exc:  # noqa: BLE001 - the SDK, the CLI or the network: the proposal ends with no change
        out["error"] = f"{type(exc).__name__}: {exc}"[:400]
    out["session_s"] = time.perf_counter() - t0
    return out

"""The Claude agent proposer: one claude-agent-sdk session per proposal, inside a scratch
worktree of the current baseline.

The agent may read and edit files only inside that worktree (every tool call goes through
``can_use_tool``: paths are resolved and must stay inside the worktree, outside ``.git`` and
outside the protected globs; no web tools; shell commands only from a short allowlist). The
state directory, history, harness and corpus live outside the worktree, so they are out of
reach. Its prompt is rendered from ``templates/agent_prompt.md.j2`` with the target, the
workloads, recent profiles and measurements, the insights and recent rejections. It ends
with a JSON line (title, rationale, category); the orchestrator — not the agent — turns the
worktree's diff into the proposal and commits it. Tokens and cost are recorded per proposal.

``AGENTSEARCH_AGENT_TRANSPORT=module:factory`` replaces the Claude Code CLI with another
SDK ``Transport`` (the tests' scripted, offline agent); everything else is the real SDK path.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shlex
from pathlib import Path
from typing import Any, Callable, Mapping

import jinja2

import templates as _templates

from ..workspace.glob import first_match
from .base import CATEGORIES, Candidate, Context, ProposerError

EDIT_TOOLS = ("Edit", "Write", "MultiEdit", "NotebookEdit")
READ_TOOLS = ("Read", "Glob", "Grep", "LS")
ALLOWED_COMMANDS = ("git diff", "git status", "git log", "python -m py_compile", "python -m compileall", "ls", "cat", "grep", "wc")
PATH_KEYS = ("file_path", "path", "notebook_path")
TRANSPORT_ENV = "AGENTSEARCH_AGENT_TRANSPORT"


def load_transport_factory() -> Callable[..., Any] | None:
    spec = os.environ.get(TRANSPORT_ENV)
    if not spec:
        return None
    mod, _, attr = spec.partition(":")
    try:
        return getattr(importlib.import_module(mod), attr or "factory")
    except (ImportError, AttributeError) as exc:
        raise ProposerError(f"{TRANSPORT_ENV}={spec}: cannot load the transport factory ({exc})") from None


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


def parse_final(text: str) -> dict[str, str]:
    """The agent's closing JSON object (title, rationale, category); defaults when absent."""
    found: dict[str, Any] = {}
    for m in re.finditer(r"\{[^{}]*\}", text or ""):
        try:
            obj = json.loads(m.group(0))
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and ("rationale" in obj or "title" in obj):
            found = obj
    category = str(found.get("category", "other")).lower()
    return {
        "title": str(found.get("title") or "agent proposal").strip()[:120],
        "rationale": str(found.get("rationale") or (text or "").strip()[-600:]).strip(),
        "category": category if category in CATEGORIES else "other",
    }


def render_prompt(ctx: Context, protected: tuple[str, ...]) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(Path(_templates.__file__).parent)), undefined=jinja2.ChainableUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    config = ctx.extra.get("config")
    recent = [h for h in ctx.history if h.get("verdict")][-12:]
    insights_md = ""
    if ctx.insights:
        from history.insights import markdown

        try:
            insights_md = markdown(ctx.insights)
        except (KeyError, TypeError):
            insights_md = ""
    return env.get_template("agent_prompt.md.j2").render(
        config=config, workloads=list(config.workloads) if config else [], objective=config.objective.name if config else "",
        protected=protected, recent=recent, rejections=[h for h in recent if h["verdict"] != "merge"][-6:],
        insights=insights_md, profiles=ctx.extra.get("profiles") or [], categories=CATEGORIES, commands=ALLOWED_COMMANDS,
    )


class ClaudeProposer:
    name = "claude"

    def __init__(self, model: str | None = None, max_turns: int = 30, transport_factory: Callable[..., Any] | None = None):
        self.model = model
        self.max_turns = max_turns
        self.transport_factory = transport_factory

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> "ClaudeProposer":
        try:
            import claude_agent_sdk  # noqa: F401
        except ImportError:
            raise ProposerError("the Claude proposer needs claude-agent-sdk: pip install 'agentsearch[agent]'") from None
        factory = load_transport_factory()
        if factory is None and not (os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("CLAUDE_CODE_OAUTH_TOKEN")):
            raise ProposerError("the Claude proposer needs ANTHROPIC_API_KEY (or CLAUDE_CODE_OAUTH_TOKEN) in the environment")
        return cls(options.get("model"), int(options.get("max_turns") or 30), factory)

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any]) -> "ClaudeProposer":
        return cls(manifest.get("model"), int(manifest.get("max_turns", 30)), load_transport_factory())

    def manifest(self) -> dict[str, Any]:
        return {"model": self.model, "max_turns": self.max_turns}

    def next(self, judged: set[str], ctx: Context) -> Candidate | None:
        make, diff, remove = ctx.extra["scratch_worktree"], ctx.extra["worktree_diff"], ctx.extra["remove_worktree"]
        config = ctx.extra["config"]
        protected = ("agentsearch.toml", *config.target.protected)
        key = f"claude:{ctx.extra.get('episode')}:{ctx.number:03d}"
        worktree = make(f"agent-{ctx.number:03d}")
        try:
            guard = ToolGuard(worktree, protected)
            prompt = render_prompt(ctx, protected)
            outcome = run_session(prompt, worktree, guard, self.model, self.max_turns,
                                  self.transport_factory(worktree=worktree) if self.transport_factory else None)
            patch = diff(worktree)
        finally:
            remove(worktree)
        final = parse_final(outcome["text"])
        meta = {"cost_usd": outcome["cost_usd"], "tokens_in": outcome["tokens_in"], "tokens_out": outcome["tokens_out"],
                "turns": outcome["turns"], "denied": guard.denied, "error": outcome["error"], "model": self.model}
        rationale = final["rationale"] + (f"\n\n(agent session error: {outcome['error']})" if outcome["error"] else "")
        return Candidate(key, final["title"], rationale, final["category"], self.name, patch, meta)


def llm_lessons(insights_markdown: str, scratch: Path, model: str | None = None) -> tuple[list[str], str]:
    """An LLM pass over the statistical insights: short lessons, one per line. ([], why) when
    no agent is available or the session fails — the statistical summary then stands alone."""
    factory = load_transport_factory()
    if factory is None and not (os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("CLAUDE_CODE_OAUTH_TOKEN")):
        return [], "no agent available (set ANTHROPIC_API_KEY)"
    scratch.mkdir(parents=True, exist_ok=True)
    prompt = ("Below are statistics of proposals made to speed up an LLM-serving stack, with their verdicts.\n"
              "Write 3 to 6 short lessons for the next proposals, one per line, each starting with '- ': "
              "what worked, what was ineffective and why, what to avoid.\n\n" + insights_markdown)
    out = run_session(prompt, scratch, ToolGuard(scratch, ("**",)), model, 2, factory(worktree=scratch) if factory else None, tools=[])
    lines = [l[2:].strip() for l in out["text"].splitlines() if l.strip().startswith("- ")]
    return lines[:8], out["error"]


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

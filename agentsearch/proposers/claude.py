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

The session itself (the SDK client, the tool guard, the offline transport) is ``agentsearch.agent``.
"""

from __future__ import annotations

import json
import re
import secrets
from pathlib import Path
from typing import Any, Callable, Mapping

import jinja2

import templates as _templates
from history.records import text

from ..agent import ALLOWED_COMMANDS, ToolGuard, credentials, load_transport_factory, run_session
from .base import CATEGORIES, Candidate, Context, ProposerError

__all__ = ["ClaudeProposer", "ToolGuard", "parse_final", "render_prompt"]


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
    # what earlier proposals wrote reaches the agent only cleaned, capped and inside a block whose markers carry
    # a nonce drawn now: no text in it can close the block or pose as the tool's own instructions
    nonce = secrets.token_hex(8)
    env.filters["untrusted"] = lambda s, limit=200: text.clean("" if s is None else s, limit, one_line=True).replace(nonce, "")
    env.filters["untrusted_block"] = lambda s, limit=6000: text.clean("" if s is None else s, limit).replace(nonce, "")
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
        kernels=kernel_context(ctx), nonce=nonce,
    )


def kernel_context(ctx: Context) -> dict | None:
    """The fork's IR ops and an example from the kernel library, when the target has the IR-op seam."""
    from kernels import catalog
    from kernels import fork as kfork

    if ctx.read_file(kfork.KERNELS_INIT) is None:
        return None
    example = catalog.provider("rms_norm", "agentsearch_cpu")
    return {"ops": list(catalog.OPS.values()), "library": catalog.PROVIDERS,
            "example_path": kfork.module_path(example), "example": kfork.module_text(example)}


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
        if factory is None and not credentials():
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

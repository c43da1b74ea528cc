"""The Claude agent proposer: one session of the real Claude Code CLI per proposal, on a fenced
workbench (``agentsearch.workbench``) around a scratch worktree of the current baseline.

The agent's only tools are the workbench's — read/write/edit/ls/grep its worktree, ``run`` a command,
``test``, ``kernels_bench``, an advisory ``measure``, ``profile``, ``check_outputs``, read-only
``history`` and ``insights`` — and each runs in the sandbox with a candidate trial's policy. Its prompt
is rendered from ``templates/agent_prompt.md.j2`` with the target, the workloads, recent profiles and
measurements, the insights and recent rejections (earlier proposals' text only inside a marked,
untrusted block). It ends with a JSON line (title, rationale, category); the orchestrator — not the
agent — turns the worktree's diff into the proposal and commits it. What the session ran and cost
(``history.records.agent_session.AgentSession``) is recorded with the proposal.

The session itself (the SDK client, the CLI's fence) is ``agentsearch.agent``.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2

import templates as _templates
from history.proposals import Proposal
from history.records import text
from history.records.agent_session import AgentSession

from ..agent import credentials, run_session
from ..workbench import TOOLS, Workbench, WorkbenchError, sandbox_available
from . import knob_model
from .base import CATEGORIES, Candidate, Context, ProposerError

__all__ = ["ClaudeProposer", "parse_final", "render_prompt"]


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


def render_prompt(
    ctx: Context,
    protected: tuple[str, ...],
    session: str = "",
    agents: int = 1,
    revising: Mapping[str, Any] | None = None,
) -> str:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(Path(_templates.__file__).parent)),
        undefined=jinja2.ChainableUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    # what earlier proposals wrote reaches the agent only cleaned, capped and inside a block whose markers carry
    # a nonce drawn now: no text in it can close the block or pose as the tool's own instructions
    nonce = secrets.token_hex(8)
    env.filters["untrusted"] = lambda s, limit=200: text.clean("" if s is None else s, limit, one_line=True).replace(
        nonce, ""
    )
    env.filters["untrusted_block"] = lambda s, limit=6000: text.clean("" if s is None else s, limit).replace(nonce, "")
    config = ctx.extra.get("config")
    recent = [h for h in ctx.history if h.judged][-12:]
    insights_md = insights_markdown(ctx)
    return env.get_template("agent_prompt.md.j2").render(
        config=config,
        workloads=list(config.workloads) if config else [],
        objective=config.objective.name if config else "",
        protected=protected,
        recent=recent,
        rejections=[h for h in recent if h.outcome != "merge"][-6:],
        insights=insights_md,
        profiles=ctx.extra.get("profiles") or [],
        categories=CATEGORIES,
        tools=TOOLS,
        kernels=kernel_context(ctx),
        nonce=nonce,
        session=session,
        agents=agents,
        revising=revising,
        optimizer=knob_model.summary(ctx.history, [k.name for k in config.sweep.knobs]) if config else "",
    )


def insights_markdown(ctx: Context) -> str:
    """The insights the proposer was given, as Markdown ('' when none, or when they do not render)."""
    if not ctx.insights:
        return ""
    from history.insights import markdown

    try:
        return markdown(ctx.insights)
    except (KeyError, TypeError):
        return ""


def kernel_context(ctx: Context) -> dict | None:
    """The fork's IR ops and an example from the kernel library, when the target has the IR-op seam."""
    from kernels import catalog
    from kernels import fork as kfork

    if ctx.read_file(kfork.KERNELS_INIT) is None:
        return None
    example = catalog.provider("rms_norm", "agentsearch_cpu")
    return {
        "ops": list(catalog.OPS.values()),
        "library": catalog.PROVIDERS,
        "example_path": kfork.module_path(example),
        "example": kfork.module_text(example),
    }


class ClaudeProposer:
    name = "claude"

    def __init__(self, model: str | None = None, max_turns: int | None = None, agents: int = 1):
        self.model = model
        self.max_turns = max_turns  # None: [agent] max_turns
        self.agents = agents  # sessions at once (the episode runs them concurrently)
        self._claimed: set[str] = set()  # proposals a session of this run is revising (sessions run in threads)
        self._lock = threading.Lock()

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> ClaudeProposer:
        try:
            import claude_agent_sdk  # noqa: F401
        except ImportError:
            raise ProposerError(
                "the Claude proposer needs claude-agent-sdk: pip install 'agentsearch[agent]'"
            ) from None
        if not credentials():
            raise ProposerError(
                "the Claude proposer needs ANTHROPIC_API_KEY (or CLAUDE_CODE_OAUTH_TOKEN) in the environment"
            )
        ok, why = sandbox_available()
        if not ok:
            raise ProposerError(
                "the Claude proposer runs the agent's tools only in the sandbox, and this machine cannot sandbox: "
                f"{why}"
            )
        agents = int(options.get("agents") or 1)
        if agents < 1:
            raise ProposerError(f"--agents must be at least 1, got {agents}")
        return cls(options.get("model"), int(options["max_turns"]) if options.get("max_turns") else None, agents)

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any]) -> ClaudeProposer:
        turns = manifest.get("max_turns")
        return cls(manifest.get("model"), int(turns) if turns else None, int(manifest.get("agents") or 1))

    def manifest(self) -> dict[str, Any]:
        return {"model": self.model, "max_turns": self.max_turns, "agents": self.agents}

    def revision_parent(self, ctx: Context, limit: int) -> Proposal | None:
        """The latest rejected agent proposal of this episode that changed something, is fewer than ``limit``
        revisions deep and has no revision yet (claimed for this session); None when there is none. From the
        history alone, so a resumed episode picks up the same line of work."""
        if limit < 1:
            return None
        episode = ctx.extra.get("episode")
        rows = [h for h in ctx.history if h.episode == episode and h.proposer == self.name]
        revised = {h.parent for h in rows}
        with self._lock:
            for h in reversed(rows):
                if (
                    h.outcome == "reject"
                    and h.files
                    and h.revision < limit
                    and h.id not in revised
                    and h.id not in self._claimed
                ):
                    self._claimed.add(h.id)
                    return h
        return None

    def next(self, judged: set[str], ctx: Context) -> Candidate | None:
        config = ctx.extra["config"]
        parent = self.revision_parent(ctx, config.agent.revisions)
        start_from = ""
        if parent is not None:
            start_from = ctx.extra["proposal_patch"](parent.id) or ""
        protected = ("agentsearch.toml", *config.target.protected)
        # the session's label and a nonce: sessions that ran at once, or before a crash, never share a key or a worktree
        label = f"{ctx.number:03d}-{secrets.token_hex(3)}"
        key = f"claude:{ctx.extra.get('episode')}:{label}"
        try:
            bench = Workbench(
                ctx.extra["workspace"],
                config,
                ctx.extra["base"],
                f"{ctx.extra.get('episode')}-{label}",
                history=ctx.history,
                insights_md=insights_markdown(ctx),
                say=ctx.extra.get("say"),
                start_from=start_from,
            )
        except WorkbenchError as exc:
            raise ProposerError(str(exc)) from None
        patch, diff_error = "", ""
        try:
            revising = None
            if parent is not None:
                revising = {
                    "proposal": parent.id,
                    "title": parent.title,
                    "rationale": parent.rationale,
                    "reasons": list(parent.reasons),
                    "failed_checks": list(parent.failed_checks),
                    "workloads": dict(parent.workloads),
                    "applied": not bench.start_error,
                    "error": bench.start_error,
                    "revision": parent.revision + 1,
                }
            prompt = render_prompt(ctx, protected, label, self.agents, revising)
            outcome = run_session(
                prompt,
                bench.root,
                self.model,
                self.max_turns or config.agent.max_turns,
                config.agent.max_cost_usd,
                bench,
            )
            try:
                patch = bench.diff()
            except Exception as exc:  # noqa: BLE001 - a worktree the agent left unreadable: no change, said why
                diff_error = f"the worktree's change could not be read: {exc}"
        finally:
            bench.close()
        final = parse_final(outcome["text"])
        error = "; ".join(e for e in (outcome["error"], diff_error) if e)
        session = AgentSession(
            model=self.model,
            turns=int(outcome["turns"] or 0),
            tokens_in=outcome["tokens_in"],
            tokens_out=outcome["tokens_out"],
            cost_usd=outcome["cost_usd"],
            tool_seconds=round(bench.tool_seconds, 3),
            session_s=round(outcome["session_s"], 3),
            calls=tuple(bench.calls),
            error=text.clean(error, 400),
        )
        meta = {
            "cost_usd": outcome["cost_usd"],
            "tokens_in": outcome["tokens_in"],
            "tokens_out": outcome["tokens_out"],
            "turns": outcome["turns"],
            "error": session.error,
            "model": self.model,
            "prompt_sha256": hashlib.sha256(prompt.encode()).hexdigest(),  # the AI-assistance statement names it
            "session": session.to_json(),
        }
        if parent is not None:  # a revision: linked to its parent in the history and the report
            meta.update(parent=parent.id, revision=parent.revision + 1)
        rationale = final["rationale"] + (f"\n\n(agent session error: {session.error})" if session.error else "")
        return Candidate(key, final["title"], rationale, final["category"], self.name, patch, meta)

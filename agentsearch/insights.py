"""Distill the target's history into insights, record them, and write insights.md.

The statistics and lessons come from ``history.insights``; this module adds what only the
orchestrator knows (the knobs' value order from the config) and where the result goes: an
``insight`` record in the history and ``<state>/insights.md``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from history import HistoryLog
from history.insights import distill, markdown
from history.records import Insight

from .agent import credentials, run_session
from .workspace import Workspace

INSIGHTS_MD = "insights.md"


def knob_order(ws: Workspace) -> dict[str, list[Any]]:
    try:
        return {k.name: list(k.values) for k in ws.config().sweep.knobs}
    except Exception:  # noqa: BLE001 - a broken config must not block reading the history
        return {}


def current(ws: Workspace, entries: list[Any]) -> dict[str, Any]:
    """The insights of ``entries``, recording nothing (``agentsearch insights`` without --record)."""
    return distill(entries, knob_order(ws))


def with_llm(ws: Workspace, data: dict[str, Any], llm: bool) -> dict[str, Any]:
    """With ``llm``, an agent pass adds short lessons in prose (``notes``) when an agent is available."""
    if llm:
        notes, why = llm_lessons(markdown(data), ws.state / "tmp" / "insights-llm")
        data["notes"] = notes
        data["llm"] = "ok" if notes else (why or "no lessons returned")
    return data


def refresh(
    ws: Workspace, log: HistoryLog, episode: str | None = None, llm: bool = False
) -> tuple[dict[str, Any], Path]:
    """Distill, append an ``insight`` record (through the open ``log``) and write the Markdown.

    With ``llm``, an agent pass adds short lessons in prose (``notes``) when an agent is available."""
    data = with_llm(ws, distill(log.entries(), knob_order(ws)), llm)
    log.append(Insight.of(data), episode, None)
    path = ws.state / INSIGHTS_MD
    path.write_text(markdown(data))
    return data, path


def llm_lessons(insights_markdown: str, scratch: Path, model: str | None = None) -> tuple[list[str], str]:
    """An LLM pass over the statistical insights: short lessons, one per line. ([], why) when
    no agent is available or the session fails — the statistical summary then stands alone."""
    if not credentials():
        return [], "no agent available (set ANTHROPIC_API_KEY)"
    scratch.mkdir(parents=True, exist_ok=True)
    prompt = (
        "Below are statistics of proposals made to speed up an LLM-serving stack, with their verdicts.\n"
        "Write 3 to 6 short lessons for the next proposals, one per line, each starting with '- ': "
        "what worked, what was ineffective and why, what to avoid.\n\n" + insights_markdown
    )
    out = run_session(prompt, scratch, model, 2)
    lines = [ln[2:].strip() for ln in out["text"].splitlines() if ln.strip().startswith("- ")]
    return lines[:8], out["error"]

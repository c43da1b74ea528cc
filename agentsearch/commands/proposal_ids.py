"""Short proposal ids (``001``, ``1``) resolved git-style: refused when they are ambiguous."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from history import records as rec

from ..errors import AgentsearchError


def refuse_ambiguous(what: str, proposals: Iterable[str | None], exact: Iterable[str | None] = ()) -> None:
    """Raise (one line, exit 2) when ``what`` is a short id that matches proposals of several
    episodes (``e.../001`` twice) and names nothing exactly (a proposal, branch or ref)."""
    if "/" in what or what in {x for x in exact if x} or what in {p for p in proposals if p}:
        return
    suffix = "/" + what.zfill(3)
    hits = sorted({p for p in proposals if p and p.endswith(suffix)})
    if len(hits) > 1:
        raise AgentsearchError(
            f"ambiguous proposal {what!r}: {', '.join(hits)}; give the episode too (e.g. {hits[-1]})"
        )


def refuse_ambiguous_verdict(entries: list[Any], what: str) -> None:
    """For `report` / `pr`: ``what`` among the proposals with a recorded verdict or evaluation."""
    judged = [e for e in entries if e.kind in ("verdict", "evaluation")]
    exact = [e.proposal for e in judged] + [
        r.branch if isinstance(r := e.record, rec.Verdict) else r.ref if isinstance(r, rec.Evaluation) else None
        for e in judged
    ]
    refuse_ambiguous(what, [e.proposal for e in judged], exact)

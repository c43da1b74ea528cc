"""`agentsearch review-pr N` and `agentsearch bot --once | --watch SECONDS`: the review bot on the forge."""

from __future__ import annotations

import time
from pathlib import Path

from ..errors import EXIT_FAIL, EXIT_GATE_REJECT, AgentsearchError
from ..review_bot import reviewer
from ..workspace import Workspace
from .output import out, print_json, progress, safe


def run_review(target: Path, as_json: bool, number: int, seed: int | None, merge: bool) -> int:
    ws = Workspace.open(target)
    if number < 1:
        raise AgentsearchError(f"pull request number {number}: expected a positive integer")
    with ws.lock(), progress() as say:
        bot = reviewer(ws, say, merge=merge)
        try:
            review = bot.review(bot.forge.pull(number), seed=seed)
        finally:
            bot.forge.close()
    if as_json:
        print_json({"number": number, **review.to_json()})
    else:
        colour = {"success": "green", "failure": "red"}.get(review.outcome, "yellow")
        out.print(f"[{colour}]#{number} {review.outcome}[/] — {safe(review.headline)}")
        out.print(
            f"  head {review.head[:12]} against {safe(review.base_ref)} at {review.base[:12]}; "
            f"evidence: `agentsearch report {review.evaluation}`"
        )
    return 0 if review.outcome == "success" else EXIT_GATE_REJECT


def run_bot(target: Path, as_json: bool, watch: float | None, label: str | None, seed: int | None, merge: bool) -> int:
    ws = Workspace.open(target)
    if watch is not None and watch < 1:
        raise AgentsearchError(f"--watch {watch}: expected seconds between passes, at least 1")
    with progress(milestones=True) as say:
        bot = reviewer(ws, say, merge=merge)
        try:
            while True:
                try:
                    with ws.lock():  # per pass: another bot or evaluate may run between passes
                        summary = bot.once(label, seed=seed)
                except AgentsearchError as exc:
                    if watch is None:
                        raise
                    summary = {"judged": [], "errors": [{"number": None, "error": str(exc).splitlines()[0][:300]}]}
                if as_json:
                    print_json(summary)
                else:
                    for j in summary["judged"]:
                        out.print(f"#{j['number']} {j['outcome']} — {safe(j['headline'])}")
                    for e in summary["errors"]:
                        where = f"#{e['number']} not judged" if e["number"] is not None else "this pass"
                        out.print(f"[red]{where}[/]: {safe(e['error'])}")
                if watch is None:
                    return EXIT_FAIL if summary["errors"] else 0
                say("bot", f"next pass in {watch:g} s")
                time.sleep(watch)
        finally:
            bot.forge.close()

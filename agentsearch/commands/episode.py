"""`agentsearch episode`: run (or --resume) a search episode and print what it judged."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from history import HistoryError, HistoryLog
from history.proposals import judge_line
from history.records import EpisodeFinished

from .. import episode as ep
from .. import executors, preflight
from ..errors import AgentsearchError
from ..headline import pct
from ..loop import EpisodeLoop
from ..records import check_consistent, open_log, read_entries
from ..workspace import Workspace
from ..workspace.workspace import new_episode_id
from .output import compact_table, err, out, print_json, progress, safe

DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*$")


def parse_duration(text: str | None) -> float | None:
    if text is None:
        return None
    m = DURATION.match(text)
    if not m:
        raise AgentsearchError(
            f"--time-budget {text!r}: expected seconds or a number with s, m or h (e.g. 900, 30m, 2h)"
        )
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def load_insights(path: Path | None) -> dict[str, Any] | None:
    if path is None:
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise AgentsearchError(
            f"--insights {path}: not a readable insights JSON ({exc}); write one with `agentsearch insights --json`"
        ) from None
    if not isinstance(data, dict) or "knobs" not in data:
        raise AgentsearchError(
            f"--insights {path}: not an insights document (no 'knobs'); write one with `agentsearch insights --json`"
        )
    return data


def run(
    target: Path,
    as_json: bool,
    resume: bool,
    abandon: bool,
    proposer: str,
    patches: Path | None,
    branches: str | None,
    budget: int | None,
    time_budget: str | None,
    seed: int | None,
    insights_file: Path | None = None,
    cost_budget: float | None = None,
    agent_model: str | None = None,
    executor: str | None = None,
    parallel: int | None = None,
    address: str | None = None,
    agents: int | None = None,
    sampler: str | None = None,
) -> int:
    if agents is not None and proposer != "claude" and not resume:
        raise AgentsearchError("--agents applies to --proposer claude (agent sessions at once)")
    if sampler is not None and proposer != "optimize" and not resume:
        raise AgentsearchError("--sampler applies to --proposer optimize (tpe, random or grid)")
    ws = Workspace.open(target)
    placement = executors.settings(ws.config().executor, executor, parallel, address)
    seconds = parse_duration(time_budget)
    insights = load_insights(insights_file)
    with ws.lock(), _open_log(ws, check=not abandon) as log, progress(milestones=True) as say:
        ws.sync_checkouts()  # a checkout of the baseline left behind by a cut-off merge
        entries = list(log.entries())
        pending = ep.latest_unfinished(entries)
        if abandon:
            if pending is None:
                raise AgentsearchError("no unfinished episode to abandon")
            from ..stack import Journal

            Journal(ws.state, pending).clear()  # its stack check's progress, if a crash cut the check off
            log.append(EpisodeFinished(episode=pending, reason="abandoned"), pending, None)
            out.print(f"abandoned episode {pending}")
            return 0
        preflight.require(ws, say=say)  # seconds: a set-up error stops here, before anything is started or judged
        runner = (
            executors.build(placement, ep.RUN_ERRORS, say) if placement.kind == "ray" else None
        )  # joins the cluster
        if resume:
            if pending is None:
                raise AgentsearchError(
                    "no unfinished episode to resume; start one with `agentsearch episode --patches DIR`"
                )
            episode = ep.resume(ws, log, pending, entries)
        else:
            if pending is not None:
                raise AgentsearchError(
                    f"episode {pending} is unfinished: continue it with `agentsearch episode --resume` (or close it "
                    "with --abandon)"
                )
            options = {
                "patches": str(patches) if patches else None,
                "branches": branches,
                "model": agent_model,
                "agents": agents,
                "sampler": sampler,
            }
            episode = ep.start(
                ws, log, proposer, options, budget, seconds, seed, new_episode_id(), insights, cost_budget
            )
        episode.say = say
        summary = EpisodeLoop(episode, runner).run()  # runner None: in this process
    if as_json:
        print_json(summary)
    else:
        show(summary)
    return 0


class _open_log:
    """The history opened for writing; with ``check``, first refused (one line) when the baseline
    has agentsearch merges the history lacks — before opening moves the head ref."""

    def __init__(self, ws: Workspace, check: bool = True):
        self.ws, self.check = ws, check
        self.log = open_log(ws)

    def __enter__(self) -> HistoryLog:
        if self.check:
            check_consistent(self.ws, read_entries(self.ws))
        try:
            self.log.open()
        except HistoryError as exc:
            raise AgentsearchError(f"{exc}") from None
        if self.log.repaired:
            err.print(f"history: {self.log.repaired} (recorded)")
        return self.log

    def __exit__(self, *exc: object) -> None:
        self.log.close()


def show(summary: dict[str, Any]) -> None:
    """One line per proposal that fits the terminal (titles and reasons ellipsized), then the
    one-line verdict of every merge and the totals."""
    rows, styles = [], []
    for r in summary["proposals"]:
        verdict = r.get("verdict") or "—"
        state = "merged" if r.get("merged") else ("NOT merged" if verdict == "merge" else "")
        pairs = r.get("pairs")
        rows.append(
            [
                r["proposal"].split("/")[-1],
                verdict,
                state,
                pct(r.get("speedup")),
                "—" if pairs is None else str(int(pairs)),
                r.get("title") or "",
                "; ".join(r.get("reasons") or []) or (r.get("headline") or "—").split(" — ", 1)[-1],
            ]
        )
        styles.append(["", {"merge": "green", "reject": "red", "review": "yellow"}.get(verdict, "")])
    out.print(
        compact_table(
            f"episode {summary['episode']}: {summary['reason']}",
            ["#", "verdict", "state", "Δ obj.", "pairs", "title", "reason"],
            rows,
            out.width,
            right=(3, 4),
            styles=styles,
        )
    )
    for r in summary["proposals"]:
        if r.get("merged") and r.get("headline"):
            out.print(f"{r['proposal'].split('/')[-1]}: {safe(r['headline'])}")
    ag = summary.get("agents")
    if ag:
        per = (
            "no merged win"
            if ag.get("usd_per_merged_pct") is None
            else f"${ag['usd_per_merged_pct']:.4f} and {ag['machine_s_per_merged_pct']:.1f} machine-s per merged %"
        )
        out.print(
            f"agents: {ag['sessions']} sessions, ${ag['cost_usd']:.4f}, {ag['tool_seconds']:.0f} s of workbench calls; "
            f"{per}"
        )
    if summary.get("judge"):
        out.print(judge_line(summary["judge"]))
    out.print(
        f"{summary['judged']} judged, {summary['merged']} merged; baseline {summary['baseline_before'][:12]} -> "
        f"{summary['baseline_after'][:12]}; {summary['elapsed_s']:.0f} s"
    )

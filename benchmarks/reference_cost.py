"""What the comparison against the pinned reference costs a distribution check (issue #42).

Creates the embedded vLLM fork (starter config: tiny model, quick profile, sample path and draw test) and runs
`agentsearch verify` on benign proposals in the situations that decide the cost:

1. main is the reference (no merge yet), a proposal in main's regime: the baseline's runs are the reference's;
2. main has moved (a benign commit on main), the same kind of proposal, twice: the first check runs the reference
   (one more engine), the second reuses its kept runs;
3. a proposal that changes the regime (max_num_seqs 4 -> 32): the reference at 32 and the candidate at the old 4.

For each: verify wall, the reference part's wall (the reference's and main's runs and the comparisons), runs kept
or made, and the verdict (every one here must pass: a benign change may not be refused). Target: with kept
runs, at most 20% over the check without the reference.

    python benchmarks/reference_cost.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agentsearch.cli", *args], cwd=cwd or ROOT, capture_output=True, text=True
    )


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


def comment_on(repo: Path, branch: str, start: str, note: str) -> None:
    """A benign change: a comment line in a vLLM source file."""
    git(repo, "checkout", "-q", "-B", branch, start)
    f = repo / "vllm" / "v1" / "sample" / "sampler.py"
    f.write_text(f.read_text() + f"\n# {note}\n")
    git(repo, "commit", "-q", "-am", note)
    git(repo, "checkout", "-q", "main")


def check(repo: Path, ref: str, label: str) -> dict:
    t0 = time.perf_counter()
    proc = cli("verify", "-C", str(repo), ref, "--json")
    wall = time.perf_counter() - t0
    out = json.loads(proc.stdout)
    ref_part = out.get("reference") or {}
    row = {
        "case": label,
        "verdict": out["verdict"],
        "wall_s": round(wall, 1),
        "verify_s": out["wall_s"],
        "reference_s": ref_part.get("wall_s"),
        "reference_collected": ref_part.get("collected"),
        "reference_reused": ref_part.get("reused"),
        "regimes": [r["label"] for r in ref_part.get("regimes") or []],
        "reasons": out["reasons"][:2],
    }
    rs = row["reference_s"] or 0.0
    row["overhead_pct"] = round(100 * rs / max(out["wall_s"] - rs, 1e-9), 1)
    print(json.dumps(row), flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep", type=Path, help="create the fork here and keep it")
    args = ap.parse_args()
    repo = args.keep or Path(tempfile.mkdtemp(prefix="agentsearch-reference-")) / "fork"
    proc = cli("init", "--from-installed", "vllm", str(repo))
    if proc.returncode != 0:
        print(proc.stderr, file=sys.stderr)
        return 1
    rows = []
    comment_on(repo, "benign-1", "main", "a benign comment")
    rows.append(check(repo, "benign-1", "1. main is the reference, same regime"))
    comment_on(repo, "main", "main", "main moves: a benign merge")
    comment_on(repo, "benign-2", "main", "another benign comment")
    rows.append(check(repo, "benign-2", "2a. main moved: the reference runs (first check)"))
    rows.append(check(repo, "benign-2", "2b. main moved: the reference's runs kept"))
    serving = json.loads((repo / "serving.json").read_text())
    serving["engine"]["max_num_seqs"] = 32
    git(repo, "checkout", "-q", "-b", "seqs32")
    (repo / "serving.json").write_text(json.dumps(serving, indent=2) + "\n")
    git(repo, "commit", "-q", "-am", "max_num_seqs 32")
    git(repo, "checkout", "-q", "main")
    rows.append(check(repo, "seqs32", "3a. regime change 4 -> 32 (first check at 32)"))
    rows.append(check(repo, "seqs32", "3b. regime change 4 -> 32, kept runs"))
    print()
    print(
        "| case | verdict | verify s | reference part s | over the check without it "
        "| reference runs made / kept | regimes |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['case']} | {r['verdict']} | {r['verify_s']:.0f} | {r['reference_s'] or 0:.1f} "
            f"| {r['overhead_pct']:.1f}% | "
            f"{r['reference_collected']} / {r['reference_reused']} | {', '.join(r['regimes'])} |"
        )
    bad = [r for r in rows if r["verdict"] != "pass"]
    print(f"benign changes refused: {len(bad)} of {len(rows)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

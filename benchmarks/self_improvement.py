"""Does the history make the next episode smarter? Proposals-to-first-win and wins per 10
proposals of a sweep episode on a toy target with hidden good knob settings, with and without
the insights distilled from an earlier episode on another copy of the same target.

    .venv/bin/python benchmarks/self_improvement.py [--repeats 4] [--budget 10]

Each repeat: episode A (no insights, an exploring first episode with twice the budget) on
copy 1 -> its insights; then on fresh copies 2 and 3, episode B with A's insights and episode
C without (different seeds), both with the same budget. Everything is real:
git repositories, the gate, the statistics; only the target is a toy (a bench whose speed
depends on 8 JSON knobs: two have one good value each, one has a value that crashes).
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
sys.path.insert(0, str(ROOT))

from agentsearch.workspace import git  # noqa: E402
from benchmarks.toy_knobs import files  # noqa: E402

GOOD = {"k2": [3, 0.25], "k5": [1, 0.15]}
BAD = {"k0": 2}
KNOBS = 8


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agentsearch.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=1800
    )


def make_target(path: Path) -> Path:
    path.mkdir(parents=True)
    git.init_repo(path)
    for rel, text in files(KNOBS, GOOD, BAD).items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(text)
    git.commit_all(path, "toy")
    assert cli("init", "-C", str(path)).returncode == 0
    return path


def episode(repo: Path, budget: int, seed: int, insights: Path | None = None) -> dict:
    args = ["episode", "-C", str(repo), "--proposer", "sweep", "--budget", str(budget), "--seed", str(seed), "--json"]
    if insights:
        args += ["--insights", str(insights)]
    proc = cli(*args)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr)
    out = json.loads(proc.stdout)
    merged = [i for i, r in enumerate(out["proposals"], 1) if r["merged"]]
    return {"first_win": merged[0] if merged else None, "wins": len(merged), "judged": out["judged"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--budget", type=int, default=10)
    args = ap.parse_args()
    t0 = time.time()
    with_ins, without = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            a = make_target(Path(tmp) / f"a{r}")
            episode(a, 2 * args.budget, 100 + r)
            ins = Path(tmp) / f"insights{r}.json"
            assert cli("insights", "-C", str(a), "-o", str(ins)).returncode == 0
            b = episode(make_target(Path(tmp) / f"b{r}"), args.budget, 200 + r, ins)
            c = episode(make_target(Path(tmp) / f"c{r}"), args.budget, 300 + r)
            with_ins.append(b)
            without.append(c)
            print(
                f"repeat {r + 1}: with insights first win at {b['first_win']}, {b['wins']} wins; "
                f"without: first win at {c['first_win']}, {c['wins']} wins",
                flush=True,
            )

    def first(rows: list[dict]) -> float:
        # an episode without any win counts as budget + 1 proposals to the first win
        return sum((x["first_win"] or args.budget + 1) for x in rows) / len(rows)

    def per10(rows: list[dict]) -> float:
        return 10 * sum(x["wins"] for x in rows) / sum(x["judged"] for x in rows)

    fw, fo = first(with_ins), first(without)
    ww, wo = per10(with_ins), per10(without)
    print(f"\nproposals to first win: with insights {fw:.2f}, without {fo:.2f} ({fo / fw:.1f}x fewer)")
    print(
        f"wins per 10 proposals:  with insights {ww:.2f}, without {wo:.2f} ({(ww / wo if wo else float('inf')):.1f}x)"
    )
    ok = fo / fw >= 2
    print(
        f"target (with insights at least 2x as efficient to the first win): {'MET' if ok else 'NOT MET'}; "
        f"{time.time() - t0:.0f} s"
    )


if __name__ == "__main__":
    main()

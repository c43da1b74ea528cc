"""A toy target with a hidden optimum over five knobs, and the matched-budget comparison of proposers on it (#58).

The toy's speed is a known function of the knobs in its ``serving.json`` (``speed``), with what makes a knob space
hard for a one-knob-at-a-time search: an interaction (``batch`` pays only with enough ``chunk``), a plateau
(``batch`` 8 and 16 are equal), an optimum inside a range (``chunk`` 64), and a trap (``spec`` helps alone, +10%,
and hurts with ``graphs`` on, -15%, while ``graphs`` alone gives +20%). Its benchmark adds the gate's noise (CV 2%).

    python benchmarks/knob_optimum.py [--seeds 10] [--budget 12] [--time-budget S]
        [--methods optimize,random,grid,sweep] [--out DIR]

runs one episode per method and seed at the same budget of proposals (and prints the machine-seconds each used), or
with ``--time-budget`` at the same seconds (``--budget`` then caps the proposals: give it room),
then reads each final main's configuration and prints, per method: how often it ended within 5% of the optimum,
the mean final speed over the optimum, the evaluations used, and the false merges (a merge whose true effect, from
``speed``, was not positive). ``--plot FILE`` draws the final speeds per method.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.toy import make_repo, toy_config  # noqa: E402

KNOBS: dict[str, list[Any]] = {
    "batch": [1, 2, 4, 8, 16],
    "chunk": [16, 32, 64, 128, 256],
    "spec": [False, True],
    "graphs": [False, True],
    "layout": ["rows", "tiles", "blocks"],
}
START = {"batch": 1, "chunk": 16, "spec": False, "graphs": False, "layout": "rows"}


def speed(c: dict[str, Any]) -> float:
    """The toy's true speed (ops/s) for a configuration: the hidden function the search must find the top of."""
    batch = min(math.log2(c["batch"]), 3.0)  # a plateau from 8 on
    chunk_fit = 1.0 - 0.08 * (math.log2(c["chunk"]) - 6.0) ** 2  # best at 64
    s = 1000.0 * (1.0 + 0.10 * batch * (1.0 if c["chunk"] >= 64 else 0.3)) * chunk_fit  # batch pays with chunk
    if c["graphs"]:
        s *= 1.20
    if c["spec"]:
        s *= 0.85 if c["graphs"] else 1.10  # the trap: helps alone, hurts with graphs
    s *= {"rows": 1.0, "tiles": 1.05, "blocks": 0.97}[c["layout"]]
    return s


def optimum() -> tuple[dict[str, Any], float]:
    import itertools

    best = max((dict(zip(KNOBS, vals, strict=True)) for vals in itertools.product(*KNOBS.values())), key=speed)
    return best, speed(best)


BENCH = """\
import json, math, os, random, sys
seed, out = int(sys.argv[1]), sys.argv[2]
{speed}
c = json.load(open("serving.json"))["engine"]
cv = float(os.environ.get("TOY_CV", "0.02"))
json.dump({{"ops_s": speed(c) * random.gauss(1.0, cv), "seed": seed}}, open(out, "w"))
"""


def bench_text() -> str:
    """The toy's benchmark (a protected path): the speed function above, the noise, the metric."""
    src = Path(__file__).read_text()
    fn = src[src.index("def speed(") : src.index("def optimum(")].replace("dict[str, Any]", "dict").strip()
    return BENCH.format(speed=fn)


def config_text() -> str:
    """The toy's config: the toy target's (``benchmarks.toy``), a gate of 12 pairs, and the five knobs."""
    knobs = "".join(
        f'\n[[sweep.knob]]\nname = "{n}"\nwhere = "engine"\nvalues = {json.dumps(v)}\ncategory = "config"\n'
        for n, v in KNOBS.items()
    )
    return toy_config(10, "\n[gate]\nepisode_budget = 100\nmax_pairs = 12\nconfirm_pairs = 4\n" + knobs)


def make_target(path: Path) -> Path:
    """The toy in a fresh git repository, at ``START``."""
    repo = make_repo(
        path,
        {
            "agentsearch.toml": config_text(),
            "bench/bench.py": bench_text(),
            "serving.json": json.dumps({"engine": START}, indent=2) + "\n",
        },
    )
    proc = subprocess.run([sys.executable, "-m", "agentsearch.cli", "init", "-C", str(repo)], capture_output=True)
    assert proc.returncode == 0, proc.stderr
    return repo


def final_config(repo: Path) -> dict[str, Any]:
    text = subprocess.run(["git", "show", "main:serving.json"], cwd=repo, capture_output=True, text=True).stdout
    return {**START, **json.loads(text)["engine"]}


def merges(repo: Path) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(configuration before, after) of every merge on main's first-parent line, oldest first."""

    def at(rev: str) -> dict[str, Any]:
        text = subprocess.run(["git", "show", f"{rev}:serving.json"], cwd=repo, capture_output=True, text=True).stdout
        return {**START, **json.loads(text)["engine"]}

    log = subprocess.run(
        ["git", "rev-list", "--first-parent", "--parents", "--reverse", "main"],
        cwd=repo,
        capture_output=True,
        text=True,
    ).stdout.split("\n")
    return [(at(row.split()[1]), at(row.split()[0])) for row in log if len(row.split()) == 3]


def run_one(root: Path, method: str, seed: int, budget: int, seconds: float | None = None) -> dict[str, Any]:
    """One episode of ``method``: at most ``budget`` proposals, and with ``seconds`` no proposal started after that
    many seconds (the episode's ``--time-budget``: the same machine-seconds for every method)."""
    repo = make_target(root / f"{method}-{seed}" / "toy")
    args = ["episode", "-C", str(repo), "--budget", str(budget), "--seed", str(seed), "--json"]
    if seconds:
        args += ["--time-budget", str(int(seconds))]
    if method == "sweep":
        args += ["--proposer", "sweep"]
    else:
        args += ["--proposer", "optimize", "--sampler", "tpe" if method == "optimize" else method]
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "agentsearch.cli", *args], capture_output=True, text=True)
    took = time.monotonic() - t0
    if proc.returncode != 0 or not proc.stdout:
        raise SystemExit(f"{method} seed {seed}: the episode failed: {proc.stderr[-800:]}")
    out = json.loads(proc.stdout)
    false_merges = 0
    for before, after in merges(repo):
        if speed(after) <= speed(before):
            false_merges += 1
    final = final_config(repo)
    return {
        "method": method,
        "seed": seed,
        "judged": out.get("judged"),
        "merged": out.get("merged"),
        "seconds": round(took, 1),
        "final": final,
        "ratio": speed(final) / optimum()[1],
        "false_merges": false_merges,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--budget", type=int, default=12, help="proposals per episode (with --time-budget: at most)")
    ap.add_argument(
        "--time-budget", type=float, help="seconds per episode: no proposal starts after them (equal machine-seconds)"
    )
    ap.add_argument("--methods", default="optimize,random,grid,sweep")
    ap.add_argument("--out", type=Path, default=Path("/tmp/knob-optimum"))
    ap.add_argument("--plot", type=Path)
    a = ap.parse_args()
    best, top = optimum()
    print(f"optimum: {best} at {top:.1f} ops/s (start {speed(START):.1f} ops/s, {top / speed(START):.2f}x)")
    rows = []
    for seed in range(1, a.seeds + 1):
        for method in a.methods.split(","):
            r = run_one(a.out, method, seed, a.budget, a.time_budget)
            rows.append(r)
            print(
                f"{method:>9} seed {seed:>2}: {r['ratio']:.3f} of the optimum, {r['judged']} judged, {r['merged']} "
                f"merged, {r['false_merges']} false, {r['seconds']:.0f} s",
                flush=True,
            )
    (a.out / "results.json").write_text(json.dumps(rows, indent=1))
    print(f"\n{'method':>9} {'within 5%':>10} {'mean of optimum':>16} {'judged':>7} {'false merges':>13} {'s/run':>6}")
    for method in a.methods.split(","):
        mine = [r for r in rows if r["method"] == method]
        near = sum(r["ratio"] >= 0.95 for r in mine)
        print(
            f"{method:>9} {near:>4} of {len(mine):<3} {statistics.mean(r['ratio'] for r in mine):>16.3f} "
            f"{statistics.mean(r['judged'] for r in mine):>7.1f} {sum(r['false_merges'] for r in mine):>13} "
            f"{statistics.mean(r['seconds'] for r in mine):>6.0f}"
        )
    if a.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        methods = a.methods.split(",")
        ax.boxplot([[r["ratio"] for r in rows if r["method"] == m] for m in methods], tick_labels=methods)
        ax.axhline(0.95, ls="--", c="grey", lw=1)
        ax.set_ylabel("final main's speed / optimum (ratio)")
        per = f"{a.time_budget:.0f} s" if a.time_budget else f"{a.budget} proposals"
        ax.set_xlabel(f"proposer ({per} per episode, {a.seeds} seeds)")
        fig.tight_layout()
        fig.savefig(a.plot, dpi=120)
        print(f"wrote {a.plot}")


if __name__ == "__main__":
    main()

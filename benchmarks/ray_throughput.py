"""Proposals per hour of a parallel episode with 1, 2 and 4 Ray workers, and what merge order costs.

A local Ray cluster (a head without CPUs, four 1-CPU worker nodes, 100 MB object stores) judges
the same patch queue on a toy command target whose trials *sleep* (``--trial-s``, 0.3 s by
default), so wall time, not the two cores of a small machine, bounds an evaluation. The queue has
``--wins`` real speedups (+30 %, each merged) spread among no-op rewordings (rejected), so merges
move the baseline (each win in its own file, so all of them stack) while later proposals are in flight: those \
results are superseded (kept, never
merged on) and judged again, the price of parallel speculation. For every worker count the
verdicts and the final baseline tree must equal the local loop's (``--workers`` includes 0: the
local loop itself).

    python benchmarks/ray_throughput.py [--proposals 8] [--wins 2] [--workers 0,1,2,4] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentsearch.workspace import Workspace  # noqa: E402
from agentsearch.workspace.git import run_git  # noqa: E402
from history import HistoryLog  # noqa: E402

BENCH = """\
import json, os, random, sys, time
sys.path.insert(0, os.getcwd())
seed, out = int(sys.argv[1]), sys.argv[2]
import importlib
speed = 1.0
for name in sorted(os.listdir("src")):
    if name.startswith("k") and name.endswith(".py"):
        speed *= importlib.import_module("src." + name[:-3]).F
time.sleep(float(os.environ["TRIAL_S"]))
json.dump({"ops_s": 1000.0 * speed * random.gauss(1.0, 0.02), "seed": seed}, open(out, "w"))
"""

CONFIG = """\
[target]
baseline = "main"
protected = ["bench/**"]

[target.env]
TRIAL_S = "{trial_s}"

[[workload]]
name = "speed"
command = "{python} bench/bench.py {{seed}} {{out}}"
metric = "ops_s"
timeout_s = 30

[gate]
episode_budget = {budget}
min_pairs = 3
max_pairs = 6
confirm_pairs = 2
coverage = false
"""


def git(repo: Path, *args: str) -> str:
    return run_git(*args, cwd=repo)


def make_target(path: Path, n: int, wins: int, trial_s: float) -> tuple[Path, Path]:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    (path / "bench").mkdir()
    (path / "bench" / "bench.py").write_text(BENCH)
    (path / "src").mkdir()
    (path / "src" / "__init__.py").write_text("")
    for i in range(n):  # one file per proposal: patches made against the start still apply after merges
        (path / "src" / f"k{i:02d}.py").write_text("# a knob of the toy engine\nF = 1.0\nNOTE = 'x'\n")
    (path / "agentsearch.toml").write_text(CONFIG.format(trial_s=trial_s, python=sys.executable, budget=n))
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "baseline")
    subprocess.run(
        [sys.executable, "-m", "agentsearch.cli", "init", "-C", str(path)], check=True, capture_output=True, cwd=ROOT
    )
    queue = path.parent / "queue"
    queue.mkdir()
    every = max(1, n // max(wins, 1))
    win_at = {i for i in range(n) if wins and i % every == every // 2 and i // every < wins}
    for i in range(n):
        f = path / "src" / f"k{i:02d}.py"
        text = f.read_text()
        new = (
            text.replace("F = 1.0", "F = 1.3") if i in win_at else text.replace("NOTE = 'x'", "NOTE = 'y'")
        )  # +30 % or nothing
        git(path, "checkout", "-q", "-b", f"p{i}")
        f.write_text(new)
        git(path, "commit", "-q", "-am", f"{'win' if i in win_at else 'reword'} {i}")
        (queue / f"{i:02d}.patch").write_text(git(path, "format-patch", "--stdout", "main..HEAD"))
        git(path, "checkout", "-q", "main")
        git(path, "branch", "-q", "-D", f"p{i}")
    return path, queue


def final(repo: Path) -> tuple[dict[str, str], str, int]:
    entries = list(HistoryLog(Workspace.open(repo).state / "history.jsonl").entries())
    verdicts = {e.data["title"]: e.data["verdict"] for e in entries if e.kind == "verdict"}
    tree = git(repo, "rev-parse", f"{Workspace.open(repo).baseline_commit()}^{{tree}}").strip()
    return verdicts, tree, sum(1 for e in entries if e.kind == "superseded")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--proposals", type=int, default=8)
    ap.add_argument("--wins", type=int, default=2)
    ap.add_argument("--trial-s", type=float, default=0.3)
    ap.add_argument("--workers", default="0,1,2,4", help="worker counts (0: the local loop)")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    counts = [int(x) for x in args.workers.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="agentsearch-ray-bench-"))
    os.environ["AGENTSEARCH_NODE_CACHE"] = str(tmp / "node-cache")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    cluster = None
    rows = []
    try:
        if any(c > 0 for c in counts):
            from ray.cluster_utils import Cluster

            t0 = time.monotonic()
            store = 100 * 2**20
            cluster = Cluster(
                initialize_head=True,
                head_node_args={"num_cpus": 0, "object_store_memory": store, "include_dashboard": False},
            )
            for _ in range(max(counts)):
                cluster.add_node(num_cpus=1, object_store_memory=store)
            cluster.wait_for_nodes()
            print(f"ray cluster with {max(counts)} worker nodes up in {time.monotonic() - t0:.1f} s", file=sys.stderr)
        for w in counts:
            repo, queue = make_target(tmp / f"w{w}" / "toy", args.proposals, args.wins, args.trial_s)
            extra = ["--executor", "ray", "--address", cluster.address, "--parallel", str(w)] if w and cluster else []
            t0 = time.monotonic()
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "agentsearch.cli",
                    "-q",
                    "episode",
                    "-C",
                    str(repo),
                    "--json",
                    "--patches",
                    str(queue),
                    "--seed",
                    str(args.seed),
                    *extra,
                ],
                cwd=ROOT,
                capture_output=True,
                text=True,
            )
            wall = time.monotonic() - t0
            if proc.returncode != 0:
                print(proc.stderr, file=sys.stderr)
                return 1
            verdicts, tree, superseded = final(repo)
            rows.append(
                {
                    "workers": w,
                    "wall_s": round(wall, 1),
                    "proposals": len(verdicts),
                    "per_hour": round(3600 * len(verdicts) / wall, 1),
                    "merged": list(verdicts.values()).count("merge"),
                    "rejudged": superseded,
                    "tree": tree,
                    "verdicts": verdicts,
                }
            )
            print(
                f"{'local' if w == 0 else f'{w} worker(s)'}: {len(verdicts)} proposals in {wall:.1f} s = "
                f"{rows[-1]['per_hour']:.0f}/h, {rows[-1]['merged']} merged, {superseded} re-judged",
                file=sys.stderr,
            )
    finally:
        if cluster is not None:
            cluster.shutdown()
    same = all(r["verdicts"] == rows[0]["verdicts"] and r["tree"] == rows[0]["tree"] for r in rows)
    if args.json:
        print(
            json.dumps(
                {"rows": [{k: v for k, v in r.items() if k != "verdicts"} for r in rows], "same_end_state": same},
                indent=1,
            )
        )
    else:
        print(f"{'workers':>8} {'wall s':>8} {'props/h':>8} {'merged':>7} {'re-judged':>10}")
        for r in rows:
            print(
                f"{'local' if r['workers'] == 0 else r['workers']:>8} {r['wall_s']:>8} {r['per_hour']:>8} "
                f"{r['merged']:>7} {r['rejudged']:>10}"
            )
        print(f"same verdicts and final baseline tree for every worker count: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

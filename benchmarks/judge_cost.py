"""What one decision costs: seconds by stage, engine sessions and starts, pairs — from real histories (issue #56).

    .venv/bin/python benchmarks/judge_cost.py FORK [FORK ...] [--start-s 90] [--csv out.csv] [--plot out.png]
    .venv/bin/python benchmarks/judge_cost.py --run DIR [--reps 1] [--only slowdown]  # no-op, win, slowdown

Reads every judged proposal of each fork's history (``.git/agentsearch/history.jsonl``, any released version's) and
splits its wall time by stage, from the trials' own time stamps: *objective* (from the proposal's creation to its last
objective pair: build, engine starts, pairs), *guards* (to the last guard pair: the coverage pass, the guards' engines),
*guard check* (a guard's regression measured again on fresh engines), *confirmation* (fresh engines and seeds),
*verify* (the distribution checks) and the rest (the verdict). It counts the engine sessions the trials ran in (one per
side, phase, workload and restart: an upper bound on engine starts where workloads share an engine) and, for verdicts
recorded by 0.8 on, the engine starts the evaluation counted itself. ``--start-s`` turns engine starts into a GPU-side
estimate: starts x the start time of the model you serve (90 s: an 8B model on one H100 with warm compile caches,
vLLM's own figure for its V1 engine is 30-120 s; measure yours with ``benchmarks/engine_startup.py``).

``--run DIR`` makes the embedded fork in DIR (the installed vLLM, the tiny model) and judges three proposals with
``agentsearch evaluate`` (never merges), ``--reps`` times each: a no-op (``VLLM_CPU_KVCACHE_SPACE`` 1 -> 4 GiB), the
known win (``max_num_seqs`` 4 -> 32) and a slowdown (``max_num_seqs`` 4 -> 1); then prints the table of that fork.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STAGES = ("objective", "guards", "guard check", "confirmation", "verify", "rest")
PHASE_STAGE = {
    "objective": "objective",
    "guard": "guards",
    "guard-check": "guard check",
    "confirmation": "confirmation",
}
PROPOSALS = {  # --run: name -> (serving.json engine/env change, what it is)
    "no-op": ({"env": {"VLLM_CPU_KVCACHE_SPACE": "4"}}, "KV cache 1 -> 4 GiB (no effect on the tiny model)"),
    "win": ({"engine": {"max_num_seqs": 32}}, "max_num_seqs 4 -> 32 (the demo's known win, +30-40%)"),
    "slowdown": ({"engine": {"max_num_seqs": 1}}, "max_num_seqs 4 -> 1 (a large slowdown)"),
}


def decisions(fork: Path) -> list[dict]:
    """One row per judged proposal of ``fork``'s history: stage seconds, sessions, starts, pairs, verdict. Every second
    from the proposal's creation is the stage of the next thing recorded: a trial's phase, the distribution checks, the
    verdict (an engine's start-up counts for the stage whose first trial waited for it)."""
    path = fork / ".git" / "agentsearch" / "history.jsonl"
    rows: list[dict] = []
    cur: dict | None = None
    for line in path.read_text().splitlines():
        r = json.loads(line)
        kind, data, ts = r["kind"], r.get("data") or {}, float(r["ts"])
        if kind == "proposal-created":
            cur = {"proposal": r.get("proposal"), "title": data.get("title"), "t": ts, "created": ts}
            cur.update(secs=dict.fromkeys(STAGES, 0.0), sessions=set(), pairs=defaultdict(set))
            continue
        if cur is None or kind not in ("trial", "distribution", "verdict"):
            continue
        stage = {"distribution": "verify", "verdict": "rest"}.get(kind) or PHASE_STAGE.get(
            str(data.get("phase")), "objective"
        )
        cur["secs"][stage] += max(0.0, ts - cur["t"])
        cur["t"] = max(cur["t"], ts)
        if kind == "trial":
            cur["sessions"].add((data.get("phase"), data.get("workload"), data.get("session"), data.get("side")))
            cur["pairs"][stage].add((data.get("workload"), data.get("pair")))
        elif kind == "verdict":
            timing = data.get("timing") or {}
            pairs = cur["pairs"]
            rows.append(
                {
                    "proposal": cur["proposal"],
                    "title": cur["title"],
                    "fork": fork.name,
                    "verdict": data.get("verdict"),
                    "speedup": data.get("speedup"),
                    "wall_s": float(data.get("wall_s") or timing.get("wall_s") or ts - cur["created"]),
                    **{f"{s}_s": round(v, 1) for s, v in cur["secs"].items()},
                    "engine_sessions": len(cur["sessions"]),
                    "engine_starts": timing.get("engine_starts"),
                    "objective_pairs": len(pairs.get("objective", ())),
                    "guard_pairs": len(pairs.get("guards", ())) + len(pairs.get("guard check", ())),
                }
            )
            cur = None
    return rows


def kind_of(row: dict) -> str:
    """The row's kind of decision, for the summary: a merged win, a rejected no-op or slowdown, ..."""
    s = row.get("speedup")
    if row["verdict"] == "merge":
        return "win (merged)"
    if s is None:
        return "rejected before measuring"
    if s < 0.9:
        return "slowdown (rejected)"
    if s > 1.1:
        return "win (rejected)"
    return "no-op (rejected)"


def show(rows: list[dict], start_s: float) -> None:
    head = f"{'fork':14} {'#':>4} {'verdict':7} {'Δ':>7} {'wall s':>7} " + " ".join(f"{s[:8]:>8}" for s in STAGES)
    head += f" {'sessions':>8} {'starts':>6} {'pairs':>5} title"
    print(head)
    print("-" * len(head))
    for r in rows:
        d = "—" if r.get("speedup") is None else f"{r['speedup'] - 1:+.1%}"
        starts = "—" if r.get("engine_starts") is None else str(r["engine_starts"])
        print(
            f"{r['fork'][:14]:14} {str(r['proposal']).split('/')[-1]:>4} {r['verdict']:7} {d:>7} {r['wall_s']:>7.0f} "
            + " ".join(f"{r[f'{s}_s']:>8.0f}" for s in STAGES)
            + f" {r['engine_sessions']:>8} {starts:>6} {r['objective_pairs']:>5} {str(r.get('title'))[:40]}"
        )
    print(
        "\nby kind of decision (median seconds; engine sessions; GPU-side estimate = engine starts or sessions x "
        f"{start_s:g} s of start-up each):"
    )
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        groups[kind_of(r)].append(r)
    for k, g in sorted(groups.items()):
        walls = [r["wall_s"] for r in g]
        starts = [r["engine_starts"] if r.get("engine_starts") is not None else r["engine_sessions"] for r in g]
        print(
            f"  {k:26} n={len(g):2}  {statistics.median(walls):6.0f} s (min {min(walls):.0f}, max {max(walls):.0f})  "
            f"{statistics.median(starts):4.0f} engine starts  "
            f"-> GPU start-up alone ~{statistics.median(starts) * start_s / 60:.0f} min"
        )
    judged = sum(r["wall_s"] for r in rows)
    merged = sum((r["speedup"] - 1) * 100 for r in rows if r["verdict"] == "merge" and r.get("speedup"))
    rate = len(rows) / (judged / 3600) if judged else 0.0
    per = f"{judged / merged:,.0f} machine-s per merged percent" if merged > 0 else "no merged win"
    print(f"\n{len(rows)} decisions in {judged:,.0f} s of judging: {rate:.1f} decisions/hour; {per}")


def plot(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.5))
    labels = [f"{r['fork'][:12]} {str(r['proposal']).split('/')[-1]} {kind_of(r)}" for r in rows]
    left = [0.0] * len(rows)
    for s in STAGES:
        vals = [r[f"{s}_s"] for r in rows]
        ax.barh(labels, vals, left=left, label=s)
        left = [a + b for a, b in zip(left, vals, strict=True)]
    ax.set_xlabel("seconds per decision (2-core CPU, tiny model)")
    ax.invert_yaxis()
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def run(fork: Path, reps: int, only: list[str]) -> None:
    venv = Path(sys.executable).parent
    agentsearch = str(venv / "agentsearch")
    if not (fork / ".git").exists():
        subprocess.run([agentsearch, "init", "--from-installed", "vllm", str(fork)], check=True)
    subprocess.run([agentsearch, "model", "tiny"], check=True, capture_output=True)
    base = json.loads((fork / "serving.json").read_text())
    for name, (change, about) in PROPOSALS.items():
        if only and name not in only:
            continue
        serving = {
            **base,
            "engine": {**base["engine"], **change.get("engine", {})},
            "env": {**base.get("env", {}), **change.get("env", {})},
        }
        branch = f"cost-{name}"
        git = ["git", "-C", str(fork)]
        subprocess.run([*git, "switch", "-q", "-C", branch, "main"], check=True)
        (fork / "serving.json").write_text(json.dumps(serving, indent=2) + "\n")
        subprocess.run([*git, "commit", "-qam", f"{name}: {about}"], check=True)
        subprocess.run([*git, "switch", "-q", "main"], check=True)
        for i in range(reps):
            print(f"evaluating {name} ({about}), {i + 1} of {reps}", flush=True)
            subprocess.run([agentsearch, "evaluate", "-C", str(fork), branch], check=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("forks", nargs="*", type=Path, help="embedded forks whose histories to read")
    ap.add_argument("--run", type=Path, help="make a fork here and evaluate a no-op, the known win and a slowdown")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--only", action="append", default=[], choices=sorted(PROPOSALS), help="judge only these (repeat)")
    ap.add_argument("--start-s", type=float, default=90.0, help="an engine start on the GPU you serve on, seconds")
    ap.add_argument("--csv", type=Path)
    ap.add_argument("--plot", type=Path, help="a stacked bar chart of the stages (PNG)")
    args = ap.parse_args()
    forks = list(args.forks)
    if args.run:
        run(args.run, args.reps, args.only)
        forks.append(args.run)
    if not forks:
        ap.error("name at least one fork, or --run DIR")
    rows = []
    for fork in forks:
        if not (fork / ".git" / "agentsearch" / "history.jsonl").is_file():
            print(f"error: {fork} has no agentsearch history (.git/agentsearch/history.jsonl)", file=sys.stderr)
            return 2
        rows += decisions(fork)
    show(rows, args.start_s)
    if args.csv:
        with args.csv.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    if args.plot and rows:
        plot(rows, args.plot)
        print(f"figure: {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The CPU-share attack, measured: a larger share of a contended CPU is not a win.

The candidate splits the same work over two runnable processes (a daemon in its engine's tree). On a CPU another
process keeps busy the kernel shares the CPU per task, so the candidate's engine gets more of it than the
baseline's: a faster wall clock for the same work. The gate's answer (docs/design/gate.md, *contention*): a win
measured mostly under contention must be less work, its CPU time per trial falling by at least
``CPU_SHARE_OF_WIN`` of the wall-time win. This script evaluates, on the toy engine target of
benchmarks/toy_engine.py (a vLLM stand-in whose work is CPU time, sandbox on, engines pinned to CPU 1):

- the attack with a busy loop on CPU 1 (its verdict, the wall-time change, the CPU time per trial, the share of
  pairs whose engines waited for a CPU over a quarter of the trial);
- the control under the same load (a real 25% cut of the work per token: must merge);
- the attack on a quiet CPU (no gain to take).

    .venv/bin/python benchmarks/contention.py [--runs 3]

Each evaluation takes 15-40 s here. Prints one row per evaluation and the tally.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.toy import commit  # noqa: E402
from benchmarks.toy_engine import CPU_VLLM, DAEMON, Hog, evaluate, target  # noqa: E402


def cpu_per_trial(out: dict, side: str) -> float | None:
    vals = [t["metrics"]["cpu_s"] for t in out["trials"] if t["ok"] and t["pair"] >= 0 and t["side"] == side]
    return statistics.median(vals) if vals else None


def row(label: str, rc: int, out: dict, wall_s: float) -> dict:
    w = out.get("workloads", {}).get("throughput") or {}
    timed = [t for t in out.get("trials", []) if t["ok"] and t["pair"] >= 0]
    contended = [t for t in timed if t["metrics"].get("cpu_wait_s", 0) / t["wall_s"] > 0.25]
    b, c = cpu_per_trial(out, "baseline"), cpu_per_trial(out, "candidate")
    cpu = (c / b - 1) if b and c else None
    speed = w.get("speedup")
    first = next((r for r in out.get("reasons", []) if not r.startswith("objective")), "")
    print(
        f"{label:<22} {out.get('verdict', '?'):<7} wall {'' if speed is None else f'{speed - 1:+.1%}':>7}  "
        f"CPU/trial {'' if cpu is None else f'{cpu:+.1%}':>7}  contended pairs {len(contended)}/{len(timed):<3} "
        f"{wall_s:5.0f} s  {first[:90]}",
        flush=True,
    )
    return {"label": label, "verdict": out.get("verdict"), "rc": rc}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            repo = target(Path(tmp) / f"r{i}", engine='cpus = "1"', vllm=CPU_VLLM)
            commit(repo, {"vllm/__init__.py": CPU_VLLM + DAEMON}, "two runnable processes", branch="share")
            commit(repo, {"cost.txt": "0.0006\n"}, "less work per token", branch="faster")
            with Hog():
                for label, ref in (("attack, busy CPU", "share"), ("control, busy CPU", "faster")):
                    t0 = time.perf_counter()
                    rc, out = evaluate(repo, ref)
                    rows.append(row(label, rc, out, time.perf_counter() - t0))
            t0 = time.perf_counter()
            rc, out = evaluate(repo, "share")
            rows.append(row("attack, quiet CPU", rc, out, time.perf_counter() - t0))
    print()
    for label in ("attack, busy CPU", "control, busy CPU", "attack, quiet CPU"):
        got = [r["verdict"] for r in rows if r["label"] == label]
        print(f"{label:<22} merged {got.count('merge')}/{len(got)}")


if __name__ == "__main__":
    main()

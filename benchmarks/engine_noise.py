"""Where does the engine's trial-to-trial noise come from? One warm engine, the same input, many trials.

    flock /tmp/agentsearch-engine.lock .venv/bin/python benchmarks/engine_noise.py FORK [--trials 10]
        [--variant NAME:K=V,K=V ...] [--workload NAME] [--scale 1.0] [--second-engine]

For each variant (extra environment for the engine; ``default`` = none) one engine of the fork's
baseline is started the way an evaluation starts it (its worktree, sandbox, engine arguments and
``serving.json``), warmed up with one round, then measured ``--trials`` times on **one** seed (the same
requests every time: no input-shape variance). It prints, per variant, the per-trial log SD (the noise
of one trial), the SD a pair of two such trials would have (x sqrt 2, to compare with the gate's per-pair
SD), the median trial duration, the engine's start-up and the mean load average. ``--second-engine``
keeps a second, parked engine of the same code alive beside it (the ``shared`` placement's idle side).
``--scale`` multiplies the workload's prompts (longer trials).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentsearch.sides import built_sides  # noqa: E402
from agentsearch.workloads import session_factory  # noqa: E402
from agentsearch.workspace import Workspace  # noqa: E402
from harness.engine_session import EnginePool  # noqa: E402
from harness.trials import BASELINE, CANDIDATE  # noqa: E402


def run_variant(ws: Workspace, name: str, env: dict[str, str], args: argparse.Namespace) -> dict:
    config = ws.config()
    w = config.workload(args.workload) if args.workload else config.objective
    params = dict(w.params)
    if args.scale != 1.0:
        params["prompts"] = max(1, round(int(params.get("prompts", 32)) * args.scale))
    params["vary_lengths"] = False
    w = dataclasses.replace(w, env={**w.env, **env}, params=params)
    config = dataclasses.replace(config, workloads=tuple(w if x.name == w.name else x for x in config.workloads))
    base = ws.baseline_commit()
    pool = EnginePool()
    values, walls, loads = [], [], []
    sides = {BASELINE: base, CANDIDATE: base} if args.second_engine else {BASELINE: base}
    with built_sides(ws, config, sides, f"noise-{os.getpid()}-{name}", "engine noise") as sd:
        try:
            factory = session_factory(config, w, sd, pool)
            if args.second_engine:
                other = factory(CANDIDATE, 0)
                other.start()
            s = factory(BASELINE, 0)
            s.start()
            t0 = time.perf_counter()
            first = s.measure(args.seed)  # warm-up (and start-up)
            startup = time.perf_counter() - t0
            if not first.ok:
                raise SystemExit(f"{name}: warm-up failed: {first.error}")
            for i in range(args.trials):
                o = s.measure(args.seed)
                if not o.ok:
                    raise SystemExit(f"{name}: trial {i} failed: {o.error}")
                values.append(o.value)
                walls.append(o.wall_s)
                loads.append(os.getloadavg()[0])
                print(f"  {name} trial {i + 1}/{args.trials}: {o.value:.1f} {w.metric}, {o.wall_s:.2f} s", flush=True)
        finally:
            pool.close()
    logs = [math.log(v) for v in values]
    sd_trial = statistics.stdev(logs)
    return {"variant": name, "sd_trial": sd_trial, "sd_pair": sd_trial * math.sqrt(2), "median": statistics.median(values),
            "trial_s": statistics.median(walls), "startup_s": startup, "load": statistics.mean(loads)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("fork", type=Path)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--seed", type=int, default=12345)
    ap.add_argument("--workload", default="")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--second-engine", action="store_true")
    ap.add_argument("--variant", action="append", default=[], help="NAME:K=V,K=V (repeatable); default: one 'default' variant")
    args = ap.parse_args()
    ws = Workspace.open(args.fork)
    variants = []
    for v in args.variant or ["default:"]:
        name, _, kv = v.partition(":")
        variants.append((name, dict(x.split("=", 1) for x in kv.split(",") if x)))
    rows = [run_variant(ws, name, env, args) for name, env in variants]
    print(f"\n{'variant':<24}{'trial SD':>10}{'pair SD':>10}{'median':>10}{'trial s':>9}{'start s':>9}{'load':>7}")
    for r in rows:
        print(f"{r['variant']:<24}{r['sd_trial']:>10.4f}{r['sd_pair']:>10.4f}{r['median']:>10.1f}{r['trial_s']:>9.2f}"
              f"{r['startup_s']:>9.0f}{r['load']:>7.2f}")
    print(f"({args.trials} trials per variant on one seed; second engine {'parked beside it' if args.second_engine else 'none'}; "
          f"{os.cpu_count()} CPUs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

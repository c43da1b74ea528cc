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

``--pairs N`` measures what the gate sees instead: two engines of the baseline (an A/A), both warm, N
pairs on N seeds (lengths varied as in an evaluation), each pair once per ``--slices`` value: ``K`` slices
split the pair's prompts into K parts measured alternately on the two engines (A B B A ... — the halves
of a pair then run fractions of a second apart instead of a whole trial), a side's value being its
tokens over its summed walls. ``KxS`` splits S times the workload's prompts into K parts (more alternations at
the same part size: ``8,16x2``). ``--pin CPU[,CPU]`` pins both engines (every thread, after start-up) to
those CPUs, so both sides run on the same core(s); ``--sessions S``: S fresh engine pairs one after the
other (the SD of their means is the engine-instance effect); ``--variant`` (one): extra environment for
both engines; ``--parts-log FILE``: every measured part's wall time and tokens as JSON lines (where a pair's
noise comes from: a stall in one part, or a drift over many). Prints the per-pair SD of each slicing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
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
from harness import lengths  # noqa: E402
from harness.engine_pool import EnginePool
from harness.processes import descendants  # noqa: E402
from harness.seeds import batch_seed  # noqa: E402
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
    return {
        "variant": name,
        "sd_trial": sd_trial,
        "sd_pair": sd_trial * math.sqrt(2),
        "median": statistics.median(values),
        "trial_s": statistics.median(walls),
        "startup_s": startup,
        "load": statistics.mean(loads),
    }


def pin(eng, cpus: set[int]) -> None:
    """Pin every thread of an engine's process tree to ``cpus`` (threads started later inherit it)."""
    for pid in descendants(eng.proc.pid):
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                os.sched_setaffinity(int(tid), cpus)
            except OSError:
                pass


def run_pairs(ws: Workspace, args: argparse.Namespace, env: dict[str, str]) -> int:
    config = ws.config()
    w = config.workload(args.workload) if args.workload else config.objective
    if env:  # the variant's extra environment for both engines
        w = dataclasses.replace(w, env={**w.env, **env})
        config = dataclasses.replace(config, workloads=tuple(w if x.name == w.name else x for x in config.workloads))
    slicings = args.slices.split(",")  # "K" or "KxS": K slices over S times the workload's prompts
    for spec in slicings:
        k, _, scale = spec.partition("x")
        if not (
            k.isdigit() and int(k) >= 1 and (not scale or scale.replace(".", "", 1).isdigit() and float(scale) > 0)
        ):
            raise SystemExit(
                f"--slices {args.slices!r}: expected K or KxS per entry "
                "(K slices over S times the prompts), e.g. 8,16x2"
            )
    base = ws.baseline_commit()
    pool = EnginePool()
    ratios: dict[str, list[float]] = {k: [] for k in slicings}
    walls: dict[str, list[float]] = {k: [] for k in slicings}
    per = {k: [] for k in slicings}  # (session, log-ratio)
    parts_log = open(args.parts_log, "w") if args.parts_log else None  # one JSON line per measured part
    with built_sides(ws, config, {BASELINE: base, CANDIDATE: base}, f"noise-{os.getpid()}-pairs", "engine noise") as sd:
        factory = session_factory(config, w, sd, pool)
        for sess in range(args.sessions):
            try:
                sessions = [factory(BASELINE, sess), factory(CANDIDATE, sess)]
                for s in sessions:
                    s.start()
                t0 = time.perf_counter()
                for s in sessions:
                    first = s.measure(args.seed)
                    if not first.ok:
                        raise SystemExit(f"warm-up failed: {first.error}")
                print(
                    f"session {sess + 1}/{args.sessions}: engines up and warm in {time.perf_counter() - t0:.0f} s",
                    flush=True,
                )
                keys = list(pool.engines)
                if args.pin:
                    cpus = {int(c) for c in args.pin.split(",")}
                    for k in keys:
                        pool.engines[k].unpark()
                        pin(pool.engines[k], cpus)
                for p in range(args.pairs):
                    seed = 1000 + p + 100 * sess
                    params = lengths.vary(w.params, seed)
                    for spec in slicings if p % 2 == 0 else slicings[::-1]:
                        k, _, scale = spec.partition("x")
                        k, scale = int(k), float(scale or 1)
                        tok, wall = [0, 0], [0.0, 0.0]
                        sub = dict(params, prompts=max(1, round(int(params.get("prompts", 64)) * scale) // k))
                        for i in range(k):
                            for e in (0, 1) if (i + p + sess) % 2 == 0 else (1, 0):
                                pool.activate(keys[e])
                                o = pool.engines[keys[e]].measure(
                                    batch_seed(seed, i) if k > 1 else seed, w.kind, sub, w.metric
                                )
                                if not o.ok:
                                    raise SystemExit(f"pair {p} slices {k}: {o.error}")
                                tok[e] += o.metrics["output_tokens"]
                                wall[e] += o.metrics["elapsed_s"]
                                if parts_log is not None:
                                    parts_log.write(
                                        json.dumps(
                                            {
                                                "session": sess,
                                                "pair": p,
                                                "slices": spec,
                                                "part": i,
                                                "engine": e,
                                                "tokens": o.metrics["output_tokens"],
                                                "wall_s": o.metrics["elapsed_s"],
                                                "t": time.time(),
                                            }
                                        )
                                        + "\n"
                                    )
                        r = math.log((tok[1] / wall[1]) / (tok[0] / wall[0]))
                        ratios[spec].append(r)
                        per[spec].append((sess, r))
                        walls[spec].append(sum(wall) / 2)
                        print(
                            f"  session {sess + 1} pair {p + 1}/{args.pairs} slices {spec}: log-ratio {r:+.4f}, "
                            f"{sum(wall) / 2:.1f} s per side, "
                            f"load {os.getloadavg()[0]:.2f}",
                            flush=True,
                        )
            finally:
                pool.close()
    print(
        f"\n{'slices':<8}{'pair SD':>10}{'mean':>10}{'side s':>9}  "
        f"(A/A, {args.pairs} pairs, pinned: {args.pin or 'no'})"
    )
    for k in slicings:
        means = [statistics.mean(r for s, r in per[k] if s == sess) for sess in range(args.sessions)]
        within = (
            statistics.mean(statistics.stdev(r for s, r in per[k] if s == sess) for sess in range(args.sessions))
            if args.pairs > 1
            else float("nan")
        )
        between = statistics.stdev(means) if len(means) > 1 else float("nan")
        print(
            f"{k:<8}{statistics.stdev(ratios[k]):>10.4f}{statistics.mean(ratios[k]):>+10.4f}"
            f"{statistics.median(walls[k]):>9.1f}"
            f"   within-session SD {within:.4f}; session means {' '.join(f'{m:+.3f}' for m in means)} "
            f"(SD {between:.4f})"
        )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("fork", type=Path)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--seed", type=int, default=12345)
    ap.add_argument("--workload", default="")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--second-engine", action="store_true")
    ap.add_argument("--pairs", type=int, default=0, help="A/A pair mode: this many pairs")
    ap.add_argument("--slices", default="1,4", help="pair mode: slicings to compare")
    ap.add_argument("--sessions", type=int, default=1, help="pair mode: fresh engine pairs, one after the other")
    ap.add_argument("--pin", default="", help="pair mode: pin both engines to these CPUs")
    ap.add_argument(
        "--parts-log", default="", help="pair mode: write every measured part (wall, tokens) to this JSON-lines file"
    )
    ap.add_argument(
        "--variant", action="append", default=[], help="NAME:K=V,K=V (repeatable); default: one 'default' variant"
    )
    args = ap.parse_args()
    ws = Workspace.open(args.fork)
    variants = []
    for v in args.variant or ["default:"]:
        name, _, kv = v.partition(":")
        variants.append((name, dict(x.split("=", 1) for x in kv.split(",") if x)))
    if args.pairs:
        if len(variants) > 1:
            raise SystemExit("pair mode: one --variant at a time")
        return run_pairs(ws, args, variants[0][1])
    rows = [run_variant(ws, name, env, args) for name, env in variants]
    print(f"\n{'variant':<24}{'trial SD':>10}{'pair SD':>10}{'median':>10}{'trial s':>9}{'start s':>9}{'load':>7}")
    for r in rows:
        print(
            f"{r['variant']:<24}{r['sd_trial']:>10.4f}{r['sd_pair']:>10.4f}{r['median']:>10.1f}{r['trial_s']:>9.2f}"
            f"{r['startup_s']:>9.0f}{r['load']:>7.2f}"
        )
    print(
        f"({args.trials} trials per variant on one seed; "
        f"second engine {'parked beside it' if args.second_engine else 'none'}; "
        f"{os.cpu_count()} CPUs)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The machine's own per-pair SD floor: a pure-CPU loop in the gate's alternation, no engine at all.

    .venv/bin/python benchmarks/machine_noise.py [--cpus 1] [--seconds 120] [--part-s 0.25,0.5,1] [--slices 1,4,8,16,32]
        [--window 30] [--other-cpu 0]

A child pinned to ``--cpus`` runs the same work unit (about 20 ms) back to back for ``--seconds``
(``harness.machine_noise.speed_series``). The series is then replayed as A/A pairs of the gate's design:
each side's trial in ``slices`` parts of ``part_s`` seconds, measured alternately (A B B A ...). Printed per
part length and slicing: the per-pair SD of log(A / B) a perfectly stable program would show here, and the
SD of the machine's log-speed over one part. Run it with nothing else on the machine (take the engine lock).

``--window S``: the floor of the first part length and slicing in every consecutive S-second window of the
series, and the autocorrelation of its log from one window to the next (can a quiet window be waited
for?). ``--other-cpu C``: a second series on CPU C at the same time, and the correlation of the two CPUs'
log-speeds in bins of one part, levels and bin-to-bin changes (could a probe on the other CPU serve as a
covariate of the measured one?).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import math
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.machine_noise import pair_floor, speed_series  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpus", default="", help="CPU list to pin the probe to (default: unpinned)")
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--part-s", default="0.25,0.5,1")
    ap.add_argument("--slices", default="1,4,8,16,32")
    ap.add_argument("--window", type=float, default=0.0, help="also the floor per window of this many seconds")
    ap.add_argument("--other-cpu", type=int, help="a second series on this CPU at the same time: cross-CPU correlation")
    args = ap.parse_args()
    cpus = [int(c) for c in args.cpus.split(",") if c]
    if args.other_cpu is None:
        series = speed_series(cpus or None, args.seconds)
    else:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            mine, theirs = (
                pool.submit(speed_series, cpus or None, args.seconds),
                pool.submit(speed_series, [args.other_cpu], args.seconds),
            )
            series, other = mine.result(), theirs.result()
    unit = statistics.median(series)
    logs = [math.log(v) for v in series]
    print(
        f"{len(series)} units of {unit * 1000:.1f} ms (median) on CPUs {args.cpus or 'any'}; "
        f"unit log-speed SD {statistics.stdev(logs):.4f}, "
        f"slowest / median {max(series) / unit:.2f}"
    )
    print(f"\n{'part s':>7} {'speed SD':>9}  " + "  ".join(f"{'k=' + k:>13}" for k in args.slices.split(",")))
    for part in (float(p) for p in args.part_s.split(",")):
        cells, speed = [], float("nan")
        for k in (int(x) for x in args.slices.split(",")):
            f = pair_floor(series, part, k, cpus, args.seconds)
            if f is None:
                cells.append(f"{'-':>13}")
                continue
            speed = f.speed_sd
            cells.append(f"{f.pair_sd:>7.4f} ({f.pairs:>3})")
        print(f"{part:>7.2f} {speed:>9.4f}  " + "  ".join(cells))
    print(
        "\ncells: per-pair SD of an A/A on a perfectly stable program (disjoint pairs the series holds); "
        "k = parts per side"
    )
    part, k = float(args.part_s.split(",")[0]), int(args.slices.split(",")[0])
    if args.window > 0:
        floors = window_floors(series, args.window, part, k)
        if not floors:
            print(
                f"\n--window {args.window:g}: too short, a window must hold 3 pairs of {k} parts of {part:g} s a side "
                f"({6 * k * part:g} s of work at full speed; a slow stretch needs more)"
            )
        else:
            logs_f = np.log(floors)
            lag1 = float(np.corrcoef(logs_f[:-1], logs_f[1:])[0, 1]) if len(floors) > 2 else float("nan")
            print(
                f"\nfloor (part {part:g} s, k={k}) per {args.window:g} s window: median {np.median(floors):.4f}, "
                f"range {min(floors):.4f}-{max(floors):.4f} over {len(floors)} windows; "
                "autocorrelation of its log from one window "
                f"to the next {lag1:+.2f}"
            )
            print("  " + " ".join(f"{f:.3f}" for f in floors))
    if args.other_cpu is not None:
        a, b = binned_log_speed(series, part), binned_log_speed(other, part)
        n = min(len(a), len(b))
        level = float(np.corrcoef(a[:n], b[:n])[0, 1])
        change = float(np.corrcoef(np.diff(a[:n]), np.diff(b[:n]))[0, 1])
        print(
            f"\nCPUs {args.cpus or 'any'} and {args.other_cpu} at once, {n} bins of {part:g} s: "
            f"log-speed correlation {level:+.2f}, "
            f"of bin-to-bin changes {change:+.2f}"
        )
    return 0


def window_floors(series: list[float], window_s: float, part_s: float, slices: int) -> list[float]:
    """The floor (``pair_floor``) of each consecutive ``window_s``-second stretch of ``series`` that holds one."""
    out, chunk, elapsed = [], [], 0.0
    for d in series:
        chunk.append(d)
        elapsed += d
        if elapsed >= window_s:
            f = pair_floor(chunk, part_s, slices)
            if f is not None:
                out.append(f.pair_sd)
            chunk, elapsed = [], 0.0
    return out


def binned_log_speed(series: list[float], bin_s: float) -> np.ndarray:
    """log(work units per second) in consecutive bins of ``bin_s`` seconds of the series' own clock."""
    ends = np.cumsum(series)
    bins = int(ends[-1] // bin_s)
    counts = np.bincount((ends // bin_s).astype(int), minlength=bins + 1)[:bins]
    return np.log(np.maximum(counts, 1) / bin_s)


if __name__ == "__main__":
    raise SystemExit(main())

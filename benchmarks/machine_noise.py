"""The machine's own per-pair SD floor: a pure-CPU loop in the gate's alternation, no engine at all.

    .venv/bin/python benchmarks/machine_noise.py [--cpus 1] [--seconds 120] [--part-s 0.25,0.5,1] [--slices 1,4,8,16,32]

A child pinned to ``--cpus`` runs the same work unit (about 20 ms) back to back for ``--seconds``
(``harness.machine_noise.speed_series``). The series is then replayed as A/A pairs of the gate's design:
each side's trial in ``slices`` parts of ``part_s`` seconds, measured alternately (A B B A ...). Printed per
part length and slicing: the per-pair SD of log(A / B) a perfectly stable program would show here, and the
SD of the machine's log-speed over one part. Run it with nothing else on the machine (take the engine lock).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.machine_noise import pair_floor, speed_series  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpus", default="", help="CPU list to pin the probe to (default: unpinned)")
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--part-s", default="0.25,0.5,1")
    ap.add_argument("--slices", default="1,4,8,16,32")
    args = ap.parse_args()
    cpus = [int(c) for c in args.cpus.split(",") if c]
    series = speed_series(cpus or None, args.seconds)
    unit = statistics.median(series)
    logs = [math.log(v) for v in series]
    print(f"{len(series)} units of {unit * 1000:.1f} ms (median) on CPUs {args.cpus or 'any'}; unit log-speed SD {statistics.stdev(logs):.4f}, "
          f"slowest / median {max(series) / unit:.2f}")
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
    print("\ncells: per-pair SD of an A/A on a perfectly stable program (disjoint pairs the series holds); k = parts per side")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

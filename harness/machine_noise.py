"""The machine's own speed noise: how low can a per-pair SD go here, whatever the engine does?

On a shared virtual machine the speed of a vCPU drifts with the host's other tenants, invisibly to the
guest (no steal time shows; the process is charged the full CPU time). ``speed_series`` measures it: a
child process pinned to the given CPUs runs the same pure-CPU work unit over and over and reports each
unit's duration. ``pair_floor`` then replays the gate's design on that series — an A/A pair of two sides,
each side's trial split into ``slices`` parts measured alternately (A B B A ...), every part as long as
the engine's — and returns the per-pair SD of log(side A / side B): the noise a perfectly stable program
would show with that alternation on this machine at this hour. The engine's calibrated SD over this
floor says how much of the noise is the engine's own.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

CHUNK_S = 0.02  # one work unit: finer than any part the gate measures
_CHILD = r"""
import json, os, sys, time
cpus, seconds, chunk = json.loads(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
if cpus:
    os.sched_setaffinity(0, set(cpus))
def unit(n):
    s = 0
    for i in range(n):
        s += i * i % 7
    return s
def timed(n):
    t0 = time.perf_counter(); unit(n); return time.perf_counter() - t0
n, t = 1000, 0.0
while t < chunk / 4:  # size the unit to about ``chunk`` seconds (the fastest of three: a preempted run would shrink it)
    n *= 2
    t = min(timed(n) for _ in range(3))
n = max(1000, int(n * chunk / t))
out, end = [], time.perf_counter() + seconds
while time.perf_counter() < end:
    t0 = time.perf_counter(); unit(n); out.append(time.perf_counter() - t0)
print(json.dumps(out))
"""


class ProbeError(RuntimeError):
    pass


@dataclass(frozen=True)
class MachineFloor:
    """The machine's noise floor for one alternation design, from one ``speed_series``."""

    cpus: tuple[int, ...]  # where the series ran (empty: unpinned)
    seconds: float  # its length
    speed_sd: (
        float  # SD of log(speed) over consecutive windows of one part's length, across the whole series (its drift too)
    )
    slices: int
    part_s: float
    pair_sd: float  # per-pair SD of an A/A with this alternation on a perfectly stable program
    pairs: (
        int  # disjoint pairs the series holds (the floor's precision: an SD from n pairs is good to about ±1/sqrt(2n))
    )


def speed_series(
    cpus: Sequence[int] | None, seconds: float, chunk_s: float = CHUNK_S, timeout_s: float | None = None
) -> list[float]:
    """Durations of one fixed pure-CPU work unit, back to back for ``seconds``, in a child pinned to ``cpus``."""
    if seconds <= 0 or chunk_s <= 0:
        raise ValueError("need seconds > 0 and chunk_s > 0")
    args = [sys.executable, "-I", "-c", _CHILD, json.dumps(sorted(cpus or [])), str(seconds), str(chunk_s)]
    limit = timeout_s or seconds * 3 + 30
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        raise ProbeError(f"the machine probe did not finish within {limit:.0f} s") from None
    except OSError as exc:
        raise ProbeError(f"the machine probe could not start: {exc}") from None
    if done.returncode != 0:
        raise ProbeError(
            f"the machine probe failed: {(done.stderr.strip().splitlines() or [f'exit status {done.returncode}'])[-1]}"
        )
    try:
        values = json.loads(done.stdout)
    except ValueError:
        values = None
    if not isinstance(values, list) or not values or not all(isinstance(v, float) and v > 0 for v in values):
        raise ProbeError("the machine probe returned no durations")
    return values


def ab_pairs(chunks: Sequence[float], part_chunks: int, slices: int, stride: int | None = None) -> list[float]:
    """A/A log-ratios (A over B, as speeds) from runs of the series, ``slices`` parts of ``part_chunks`` units per
    side, part i in the pair's order when i is even and reversed when odd, pairs alternating AB / BA. A pair starts
    every ``stride`` units (default: where the last one ended; shorter strides reuse the series in overlapping
    pairs)."""
    if part_chunks < 1 or slices < 1:
        raise ValueError("need part_chunks >= 1 and slices >= 1")
    span = 2 * slices * part_chunks
    step = stride or span
    out = []
    for pair, start in enumerate(range(0, len(chunks) - span + 1, step)):
        t, i = [0.0, 0.0], start
        for part in range(slices):
            first = (part + pair) % 2
            for side in (first, 1 - first):
                t[side] += sum(chunks[i : i + part_chunks])
                i += part_chunks
        out.append(math.log(t[1] / t[0]))  # the same work on both sides: speed A / speed B = time B / time A
    return out


def pair_floor(
    chunks: Sequence[float], part_s: float, slices: int, cpus: Sequence[int] = (), seconds: float = 0.0
) -> MachineFloor | None:
    """The floor for parts of ``part_s`` seconds in ``slices`` alternations (None: the series is too short for 3
    pairs)."""
    if part_s <= 0:
        raise ValueError("need part_s > 0")
    unit = statistics.median(chunks)
    part_chunks = max(1, round(part_s / unit))
    disjoint = len(ab_pairs(chunks, part_chunks, slices))
    if disjoint < 3:
        return None
    # overlapping pairs (every start the series has) use all of it; neighbours share parts, so their spread around
    # their own mean underestimates the SD — around zero, an A/A's true mean here (the same work on both sides), it
    # does not
    pairs = ab_pairs(chunks, part_chunks, slices, stride=2 * part_chunks)
    windows = [math.log(sum(chunks[i : i + part_chunks])) for i in range(0, len(chunks) - part_chunks + 1, part_chunks)]
    return MachineFloor(
        cpus=tuple(sorted(cpus)),
        seconds=seconds or sum(chunks),
        speed_sd=statistics.stdev(windows),
        slices=slices,
        part_s=part_chunks * unit,
        pair_sd=math.sqrt(statistics.fmean(r * r for r in pairs)),
        pairs=disjoint,
    )

"""What a measurement ran on. Trials compare only within one environment fingerprint."""

from __future__ import annotations

import hashlib
import json
import os
import platform
from functools import lru_cache


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _gpu() -> str:
    try:
        import subprocess

        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return "none"


def _site_dirs() -> list[str]:
    import sys

    return sorted({p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and os.path.isdir(p)})


def packages() -> str:
    """Digest of the installed distributions: the site-packages listings (``*.dist-info`` names carry each
    distribution's version; an install, upgrade or removal changes them)."""
    listing = {d: sorted(os.listdir(d)) for d in _site_dirs()}
    return hashlib.sha256(json.dumps(listing, sort_keys=True).encode()).hexdigest()[:16]


NATIVE_DEPTH = 3  # package/sub/lib/x.so: where wheels keep their compiled extensions and libraries
_NO_NATIVE = {"__pycache__", "include", "tests", "test", "testing", "docs", "examples"}


def native_extensions() -> str:
    """Digest of the compiled extensions and libraries (``*.so*``) in site-packages, at most NATIVE_DEPTH
    directories deep: path, size and modification time of each (a rebuilt or replaced extension changes
    it; hashing the 1+ GB of libraries would cost seconds on every run)."""
    h = hashlib.sha256()
    for root in _site_dirs():
        base = root.rstrip(os.sep).count(os.sep)
        for dirpath, dirnames, filenames in os.walk(root):
            if dirpath.count(os.sep) - base >= NATIVE_DEPTH:
                dirnames[:] = []
            else:  # headers, tests and bytecode hold no extension (and most of the directories)
                dirnames[:] = sorted(d for d in dirnames if d not in _NO_NATIVE and not d.endswith(".dist-info"))
            for f in sorted(filenames):
                if f.endswith(".so") or ".so." in f:
                    try:
                        st = os.stat(os.path.join(dirpath, f))
                    except OSError:
                        continue
                    h.update(
                        f"{os.path.relpath(os.path.join(dirpath, f), root)}:{st.st_size}:{st.st_mtime_ns}\n".encode()
                    )
    return h.hexdigest()[:16]


def gpus() -> list[dict[str, str]]:
    """Per GPU: index, name, driver, memory, maximum SM / memory clocks (MHz); [] without nvidia-smi."""
    import subprocess

    keys = ("index", "name", "driver", "memory", "sm_max_mhz", "mem_max_mhz")
    try:
        out = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=index,name,driver_version,memory.total,clocks.max.sm,clocks.max.mem",
                "--format=csv,noheader,nounits",
            ],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    if out.returncode != 0:
        return []
    return [
        dict(zip(keys, (v.strip() for v in line.split(",")), strict=False))
        for line in out.stdout.splitlines()
        if line.strip()
    ]


def conditions() -> dict[str, str]:
    """What can change from run to run on the same machine (recorded, never fingerprinted): current CPU
    frequency and governor, load, current GPU clocks, temperature and power."""
    import subprocess

    from .quiet import cpu_mhz, load1

    out: dict[str, str] = {}
    mhz, la = cpu_mhz(), load1()
    if mhz is not None:
        out["cpu_mhz"] = f"{mhz:g}"
    if la is not None:
        out["load_avg_1m"] = f"{la:.2f}"
    try:
        with open("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor") as fh:
            out["cpu_governor"] = fh.read().strip()
    except OSError:
        pass
    try:
        q = subprocess.run(
            ["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if q.returncode == 0 and q.stdout.strip():
            out["gpu_clocks"] = "; ".join(line.strip() for line in q.stdout.splitlines())
    except (OSError, subprocess.SubprocessError):
        pass
    return out


@lru_cache(maxsize=1)
def describe() -> dict[str, str]:
    """Hardware and software facts that make two measurements comparable (or not): the machine, every GPU
    (name, driver, memory, maximum clocks), the installed distributions and the compiled extensions."""
    return {
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpus": str(os.cpu_count()),
        "gpu": _gpu(),
        "gpus": "; ".join(", ".join(g.values()) for g in gpus()) or "none",
        "system": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "packages": packages(),
        "native": native_extensions(),
    }


def record() -> dict[str, str]:
    """``describe()`` and the run's ``conditions()``: what a record of a measurement carries."""
    return {**describe(), **conditions()}


def same_devices(devices: list[str], table: list[dict[str, str]] | None = None) -> str:
    """'' when the CUDA devices ``devices`` are the same model, memory, driver and clocks; else why not
    (split placement compares a side on one device with a side on another)."""
    table = gpus() if table is None else table
    by_index = {g.get("index"): g for g in table}
    seen = [by_index.get(d) for d in devices]
    if any(g is None for g in seen):
        return f"GPU(s) {', '.join(d for d, g in zip(devices, seen, strict=True) if g is None)} not found by nvidia-smi"
    keys = ("name", "driver", "memory", "sm_max_mhz", "mem_max_mhz")
    first = {k: seen[0].get(k) for k in keys}  # type: ignore[union-attr]
    for d, g in zip(devices[1:], seen[1:], strict=True):
        other = {k: g.get(k) for k in keys}  # type: ignore[union-attr]
        if other != first:
            diff = ", ".join(f"{k} {first[k]} vs {other[k]}" for k in keys if first[k] != other[k])
            return f"GPU {devices[0]} and GPU {d} differ ({diff}): their numbers are not comparable"
    return ""


def fingerprint(env: dict[str, str] | None = None) -> str:
    blob = json.dumps(env or describe(), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]

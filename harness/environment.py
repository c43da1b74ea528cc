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
            capture_output=True, text=True, timeout=10,
        )
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return "none"


@lru_cache(maxsize=1)
def describe() -> dict[str, str]:
    """Hardware and software facts that make two measurements comparable (or not)."""
    return {
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpus": str(os.cpu_count()),
        "gpu": _gpu(),
        "system": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
    }


def fingerprint(env: dict[str, str] | None = None) -> str:
    blob = json.dumps(env or describe(), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]

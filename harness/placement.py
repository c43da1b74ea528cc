"""Where the two sides' engines run, and when: the placement of a comparison.

- ``shared``: both sides' engines are up for the whole evaluation (booted concurrently, the idle one
  frozen while the other is measured). On one GPU both live on the same device with the memory split
  (``gpu_memory_utilization`` = ``memory_split`` each; two default engines at 0.9 do not fit).
- ``alternate``: one engine at a time. Sessions are ordered A B | B A | A B ... with a fresh engine for
  every session; the idle side does not exist while the other is measured (no frozen memory, no
  competing threads). Pairs are formed across the two sessions of a round (same seeds, same order).
- ``split``: one device per side, the devices swapped between sessions (restarts) so that a device
  effect adds equal and opposite amounts and cancels, like the order effect of ABBA; needs two GPUs.

``auto`` resolves to: no GPU -> ``CPU_DEFAULT`` (the lower-noise mode measured on the CPU machine, see
docs/design/placement.md); one GPU -> ``alternate``; two or more -> ``split``. Pure functions: the device list is
an argument (``cuda_devices()`` reads it from the machine).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

from .trials import BASELINE, CANDIDATE

AUTO, SHARED, ALTERNATE, SPLIT = "auto", "shared", "alternate", "split"
PLACEMENTS = (AUTO, SHARED, ALTERNATE, SPLIT)
CPU_DEFAULT = SHARED  # measured on the 2-core machine: see docs/design/placement.md
# gpu_memory_utilization per engine when engines share one GPU: three fit (both sides' warm engines and
# the coverage pass's traced one; the distribution checks' two start after the measuring engines are shut down)
MEMORY_SPLIT = 0.3


class PlacementError(ValueError):
    """A placement the machine cannot give (e.g. split with fewer than two GPUs): the run's error."""


@dataclass(frozen=True)
class Placement:
    mode: str  # shared | alternate | split (never auto)
    devices: tuple[str, ...]  # CUDA device ids visible to the comparison ('' on a CPU machine)
    requested: str = AUTO
    memory_split: float = MEMORY_SPLIT

    @property
    def exclusive(self) -> bool:
        """One engine at a time: a session's engine is shut down when the session ends."""
        return self.mode == ALTERNATE

    def device_of(self, side: str, session: int) -> str | None:
        """The CUDA device (as CUDA_VISIBLE_DEVICES) of ``side`` in session ``session``; None on a CPU machine."""
        if not self.devices:
            return None
        if self.mode == SPLIT:
            i = (0 if side == BASELINE else 1) ^ (session % 2)  # swapped every session
            return self.devices[i]
        return self.devices[0]

    def env(self, side: str, session: int) -> dict[str, str]:
        dev = self.device_of(side, session)
        return {} if dev is None else {"CUDA_VISIBLE_DEVICES": dev}

    def engine_args(self, engine: dict) -> dict:
        """Engine arguments this placement needs: on a shared GPU each side gets ``memory_split`` of it at most."""
        if self.mode == SHARED and self.devices:
            cur = engine.get("gpu_memory_utilization")
            share = self.memory_split if not isinstance(cur, (int, float)) else min(float(cur), self.memory_split)
            return {**engine, "gpu_memory_utilization": share}
        return dict(engine)

    def logprob_engine(self, side: str, engine: dict) -> tuple[dict, dict[str, str]]:
        """(engine arguments, environment) of a side's logprob engine (the distribution checks keep both
        sides' engines up): split -> each side on its own device; one GPU -> both on it, memory split."""
        if not self.devices:
            return dict(engine), {}
        if self.mode == SPLIT:
            return dict(engine), self.env(side, 0)
        return {
            **engine,
            "gpu_memory_utilization": min(float(engine.get("gpu_memory_utilization", 1.0)), self.memory_split),
        }, self.env(side, 0)

    def describe(self) -> str:
        where = f"{len(self.devices)} GPU(s) {','.join(self.devices)}" if self.devices else "CPU"
        how = {
            SHARED: "both engines up, the idle one frozen"
            + (f", GPU memory {self.memory_split:g} each" if self.devices else ""),
            ALTERNATE: "one engine at a time, sessions A B | B A with fresh engines",
            SPLIT: "one device per side, swapped every session",
        }[self.mode]
        asked = "" if self.requested == self.mode else f" (from {self.requested})"
        return f"{self.mode}{asked} on {where}: {how}"


def resolve(requested: str, devices: tuple[str, ...], memory_split: float = MEMORY_SPLIT) -> Placement:
    """The concrete placement for ``requested`` on a machine with ``devices`` (CUDA ids; () = CPU)."""
    if requested not in PLACEMENTS:
        raise PlacementError(f"unknown placement {requested!r} (one of {', '.join(PLACEMENTS)})")
    mode = requested
    if requested == AUTO:
        mode = CPU_DEFAULT if not devices else (ALTERNATE if len(devices) == 1 else SPLIT)
    if mode == SPLIT and len(devices) < 2:
        raise PlacementError(
            f"placement \"split\" needs two GPUs (one per side); this machine has {len(devices)}: "
            "use \"alternate\" or \"shared\""
        )
    return Placement(
        mode=mode,
        devices=tuple(devices[:2]) if mode == SPLIT else tuple(devices[:1]),
        requested=requested,
        memory_split=memory_split,
    )


def parse_visible(value: str | None) -> tuple[str, ...] | None:
    """CUDA_VISIBLE_DEVICES as a device list (None when unset: every device is visible)."""
    if value is None:
        return None
    ids = tuple(v.strip() for v in value.split(",") if v.strip())
    out: list[str] = []
    for v in ids:
        if v.startswith("-"):
            break  # CUDA stops at the first invalid id
        out.append(v)
    return tuple(out)


def cuda_devices(env: dict[str, str] | None = None) -> tuple[str, ...]:
    """The CUDA devices this process may use: CUDA_VISIBLE_DEVICES when set, else ``nvidia-smi -L``."""
    e = os.environ if env is None else env
    visible = parse_visible(e.get("CUDA_VISIBLE_DEVICES"))
    if visible is not None:
        return visible
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ()
    if out.returncode != 0:
        return ()
    return tuple(str(i) for i, line in enumerate(out.stdout.splitlines()) if line.startswith("GPU "))


__all__ = ["PLACEMENTS", "Placement", "PlacementError", "resolve", "cuda_devices", "BASELINE", "CANDIDATE"]

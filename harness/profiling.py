"""Where the time goes: summaries of a profiled run (cProfile dump + PyTorch op list).

By op / kernel (PyTorch profiler, self time), by module (cProfile self time grouped by the
module a function lives in), and by engine phase (cumulative time of the functions that
implement scheduling, the model forward, sampling and detokenization; the rest of the wall
time is between-step gaps and overhead). Shares are of the profiled wall time.
"""

from __future__ import annotations

import pstats
from collections.abc import Mapping
from pathlib import Path
from typing import Any

PROFILE_SCHEMA = 1
# (phase, path fragment, function names): cumulative time of the outermost match
PHASES = (
    ("scheduling", "/core/sched/", ("schedule",)),
    ("model forward", "/model_executor/models/", ("forward",)),
    ("sampling", "/sample/sampler", ("forward", "sample")),
    ("detokenization", "/engine/detokenizer", ("update", "decode_next", "_protected_step")),
    ("detokenization", "/engine/output_processor", ("process_outputs",)),
)


def module_of(filename: str) -> str:
    """'vllm/v1/core/sched/scheduler.py' -> 'vllm.v1.core.sched.scheduler' (site-packages or worktree)."""
    if filename.startswith("~") or filename.startswith("<"):
        return "(builtins)"
    parts = Path(filename).with_suffix("").parts
    for anchor in ("site-packages", "dist-packages"):
        if anchor in parts:
            return ".".join(parts[parts.index(anchor) + 1 :]) or filename
    for top in ("vllm", "torch", "transformers", "src"):
        if top in parts:
            i = len(parts) - 1 - parts[::-1].index(top)
            return ".".join(parts[i:])
    return ".".join(parts[-2:])


def summarize(stats_file: Path, ops: list[Mapping[str, Any]], wall_s: float, depth: int = 4) -> dict[str, Any]:
    st = pstats.Stats(str(stats_file))
    by_module: dict[str, float] = {}
    phases: dict[str, float] = {}
    for (filename, _line, func), (_cc, _nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        mod = ".".join(module_of(filename).split(".")[:depth])
        by_module[mod] = by_module.get(mod, 0.0) + tt
        for phase, frag, names in PHASES:
            if frag in filename.replace("\\", "/") and func in names:
                phases[phase] = max(phases.get(phase, 0.0), ct)
    accounted = sum(phases.values())
    phases["between steps / other"] = max(0.0, wall_s - accounted)

    def rows(d: Mapping[str, float], group: str, n: int) -> list[dict[str, Any]]:
        items = sorted(d.items(), key=lambda kv: -kv[1])[:n]
        return [
            {
                "name": k,
                "group": group,
                "seconds": round(v, 4),
                "share_pct": round(100 * v / wall_s, 1) if wall_s else 0.0,
            }
            for k, v in items
        ]

    by_op = [
        {
            "name": o["name"],
            "group": "op",
            "seconds": round(float(o["seconds"]), 4),
            "calls": o.get("calls"),
            "share_pct": round(100 * float(o["seconds"]) / wall_s, 1) if wall_s else 0.0,
        }
        for o in ops[:20]
    ]
    by_phase = rows(phases, "phase", 10)
    top = sorted(by_phase + by_op[:10] + rows(by_module, "module", 10), key=lambda r: -r["seconds"])
    return {
        "schema_version": PROFILE_SCHEMA,
        "wall_s": round(wall_s, 3),
        "by_phase": by_phase,
        "by_op": by_op,
        "by_module": rows(by_module, "module", 15),
        "top": top[:20],
    }

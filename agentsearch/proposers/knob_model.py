"""What the knob-space optimizer has learned, as data: its observations (every judged configuration of the
``optimize`` proposer, re-anchored to the first main) and a summary for the agent's prompt (issue #58: agents and the
optimizer together). Below both the optimizer and the Claude proposer, which import it."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

OPTIMIZER = "optimize"  # the proposer whose configurations are recorded whole (meta "config")
NO_EFFECT_CHECK = "takes-effect"  # a configuration vLLM resolves to main's: no effect (agentsearch.takes_effect)


def observations(history: Sequence[Any], knobs: Sequence[str]) -> list[tuple[dict[str, Any], float | None]]:
    """(configuration, value) of every judged ``optimize`` proposal over exactly ``knobs``, in log order: the value
    is its log speed relative to the first main the history knows (the gate's estimate plus the log speed of the main
    it was measured on: the sum of the merged estimates before it), None for a failure. A proposal without a measured
    objective and no failure tells nothing."""
    anchor = 0.0
    out: list[tuple[dict[str, Any], float | None]] = []
    for p in history:
        if not p.judged:
            continue
        config = p.meta.get("config") if p.proposer == OPTIMIZER else None
        s = p.speedup
        measured = s is not None and s > 0 and math.isfinite(s)
        if isinstance(config, Mapping) and set(config) == set(knobs):
            if p.is_failure:
                out.append((dict(config), None))
            elif measured:
                out.append((dict(config), anchor + math.log(s)))
            elif p.failed_check == NO_EFFECT_CHECK:  # resolved to main's configuration: main's speed, unmeasured
                out.append((dict(config), anchor))
        if p.merged and not p.reverted and measured:
            anchor += math.log(s)
    return out


def summary(history: Sequence[Any], knobs: Sequence[str]) -> str:
    """The optimizer's observations for a prompt, in plain lines ('' when it judged none): per knob value the
    configurations measured with it and their mean speed over the first main, the failures, and the best."""
    told = observations(history, knobs)
    if not told:
        return ""
    measured = [(c, v) for c, v in told if v is not None]
    lines = [
        f"The knob-space optimizer judged {len(told)} configurations ({len(told) - len(measured)} failed a check); "
        "speeds are relative to the first main of the history (each estimate re-anchored across merges)."
    ]
    for k in knobs:
        by: dict[str, list[float]] = {}
        fails: dict[str, int] = {}
        for c, v in told:
            key = json.dumps(c[k])
            if v is None:
                fails[key] = fails.get(key, 0) + 1
            else:
                by.setdefault(key, []).append(v)
        parts = [
            f"{val}: {math.exp(sum(vs) / len(vs)) - 1:+.1%} mean over {len(vs)}"
            + (f", {fails[val]} failed" if val in fails else "")
            for val, vs in sorted(by.items(), key=lambda kv: -sum(kv[1]) / len(kv[1]))
        ] + [f"{val}: {n} failed" for val, n in fails.items() if val not in by]
        lines.append(f"- {k}: " + "; ".join(parts))
    if measured:
        best, value = max(measured, key=lambda cv: cv[1])
        lines.append(
            f"Best measured: {math.exp(value) - 1:+.1%} with " + ", ".join(f"{k}={json.dumps(best[k])}" for k in knobs)
        )
    return "\n".join(lines)

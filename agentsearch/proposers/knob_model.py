"""What the knob-space optimizer has learned, as data: its observations (every judged configuration of the
``optimize`` proposer, re-anchored to the first main, with the gate's noise on each), the configuration it would
recommend (simpler wins ties) and a summary for the agent's prompt (issue #58: agents and the optimizer together).
Below both the optimizer and the Claude proposer, which import it."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from history.records.statistic import objective_in

OPTIMIZER = "optimize"  # the proposer whose configurations are recorded whole (meta "config")
# another proposer's change of the knobs' files alone: the episode records the configuration it made (meta "config",
# read from its commit) and marks it so (meta "config_from"): told to the optimizer as its own would be
FROM_FILES = "files"
NO_EFFECT_CHECK = "takes-effect"  # a configuration vLLM resolves to main's: no effect (agentsearch.takes_effect)
UNSET = "(default)"  # a knob the file does not set (the engine's default): a choice like any other


@dataclass(frozen=True)
class Observation:
    """One judged configuration: its knobs' values (``UNSET`` where the file does not set one), its log speed over
    the first main (None: a failed check or a crash), and the gate's noise on it: half the width of the objective's
    interval on the log scale (0 when it was not measured in pairs: a no-effect configuration is main's own)."""

    config: dict[str, Any]
    value: float | None
    noise: float = 0.0

    @property
    def overrides(self) -> int:
        """Knobs the configuration sets explicitly (what a person reading the serving file must understand)."""
        return sum(v != UNSET for v in self.config.values())


def observed(history: Sequence[Any], knobs: Sequence[str]) -> list[Observation]:
    """Every judged ``optimize`` proposal, and every other proposal that changed only the knobs' files (an agent's
    config-only change: its recorded configuration), over ``knobs``, in log order: its value is its log speed relative
    to the first main the history knows (the gate's estimate plus the log speed of the main it was measured on: the
    sum of the merged estimates before it), None for a failure. A proposal without a measured objective and no
    failure tells nothing."""
    anchor = 0.0
    out: list[Observation] = []
    for p in history:
        if not p.judged:
            continue
        config = p.meta.get("config") if p.proposer == OPTIMIZER or p.meta.get("config_from") == FROM_FILES else None
        s = p.speedup
        measured = s is not None and s > 0 and math.isfinite(s)
        if isinstance(config, Mapping) and set(knobs) <= set(config):
            config = {k: config[k] for k in knobs}  # recorded over every declared knob: the ones searched here
            if p.is_failure:
                out.append(Observation(dict(config), None))
            elif measured:
                out.append(Observation(dict(config), anchor + math.log(s), _noise(p)))
            elif p.failed_check == NO_EFFECT_CHECK:  # resolved to main's configuration: main's speed, unmeasured
                out.append(Observation(dict(config), anchor))
        if p.merged and not p.reverted and measured:
            anchor += math.log(s)
    return out


def _noise(p: Any) -> float:
    """Half the width of the objective's interval on the log scale (0 without a usable interval)."""
    w = objective_in(p.workloads, None)
    ci = w.ci if w is not None else None
    if not ci or len(ci) != 2 or not all(isinstance(x, int | float) and x > 0 and math.isfinite(x) for x in ci):
        return 0.0
    return abs(math.log(ci[1]) - math.log(ci[0])) / 2


def recommended(told: Sequence[Observation]) -> tuple[Observation, Observation] | None:
    """(the configuration to recommend, the best measured) — **simpler wins ties**: among the measured
    configurations within the noise of the best one (their log speeds differ by no more than the larger of the two
    intervals' half-widths), the one with the fewest overrides, then the faster. None when nothing was measured."""
    measured = [o for o in told if o.value is not None]
    if not measured:
        return None
    top = max(measured, key=lambda o: o.value)  # type: ignore[arg-type, return-value]
    ties = [o for o in measured if top.value - o.value <= max(top.noise, o.noise)]  # type: ignore[operator]
    pick = min(ties, key=lambda o: (o.overrides, -o.value))  # type: ignore[operator]
    return pick, top


def recommendation(told: Sequence[Observation], knobs: Sequence[str]) -> str:
    """One line naming the recommended configuration and, when simpler won a tie, over which and why ('' when
    nothing was measured)."""
    got = recommended(told)
    if got is None:
        return ""
    pick, top = got
    line = f"Best measured: {_pct(pick.value)} with {_config(pick.config, knobs)}"
    if pick is not top:
        line += (
            f" (simpler wins ties: {top.overrides - pick.overrides} fewer override"
            f"{'s' if top.overrides - pick.overrides != 1 else ''} than the fastest, {_pct(top.value)} with "
            f"{_config(top.config, knobs)}, which is within the measurement's noise of it)"
        )
    return line + "."


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{math.exp(value) - 1:+.1%}"


def _config(config: Mapping[str, Any], knobs: Sequence[str]) -> str:
    return ", ".join(f"{k}={'default' if config[k] == UNSET else json.dumps(config[k])}" for k in knobs)


def observations(history: Sequence[Any], knobs: Sequence[str]) -> list[tuple[dict[str, Any], float | None]]:
    """(configuration, value) of every judged configuration (``observed`` without the noise): what the sampler is
    told."""
    return [(o.config, o.value) for o in observed(history, knobs)]


def summary(history: Sequence[Any], knobs: Sequence[str]) -> str:
    """The optimizer's observations for a prompt, in plain lines ('' when it judged none): per knob value the
    configurations measured with it and their mean speed over the first main, the failures, and the recommended
    configuration (simpler wins ties)."""
    seen = observed(history, knobs)
    if not seen:
        return ""
    told = [(o.config, o.value) for o in seen]
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
    if best := recommendation(seen, knobs):
        lines.append(best)
    return "\n".join(lines)

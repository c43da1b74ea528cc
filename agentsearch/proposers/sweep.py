"""The bounded configuration sweep: one proposal = one (or a few) knobs set to a new value.

The search space is typed and declared in the target's config (``[[sweep.knob]]``): an engine
argument or environment variable in the serving-config file, or a key of any JSON file.
Order: a Thompson-sampling bandit over knobs — Beta(1 + wins, 1 + non-wins + 2 x failures),
counting this target's history and, as a prior, the distilled insights — then, within the
chosen knob, the value the insights name as best, else (coarse to fine) the middle of the
range for a knob never tried, else the nearest untried value in the direction that won before.
A configuration already judged (same file contents, in any episode) is never proposed again.
Deterministic given the history and the episode seed, so ``--resume`` proposes exactly what the
interrupted run would have.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from harness import seeds
from history.insights import knob_table

from ..config import KnobConfig, SweepConfig
from . import kernel_knobs
from .base import Candidate, Context

EMPTY: Mapping[str, Any] = {"tries": 0, "wins": 0, "failures": 0, "mean_effect": None, "up_wins": 0, "down_wins": 0}


def get_dotted(data: Any, dotted: str) -> Any:
    cur = data
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def set_dotted(data: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    cur = data
    for part in parts[:-1]:
        cur = cur.setdefault(part, {})
    cur[parts[-1]] = value


def unified_diff(path: str, old: str | None, new: str) -> str:
    a = [] if old is None else old.splitlines(keepends=True)
    b = new.splitlines(keepends=True)
    lines = list(difflib.unified_diff(a, b, "/dev/null" if old is None else f"a/{path}", f"b/{path}", n=3))
    if old is None:
        return f"diff --git a/{path} b/{path}\nnew file mode 100644\n" + "".join(lines)
    return f"diff --git a/{path} b/{path}\n" + "".join(lines)


class Sweep:
    name = "sweep"

    def __init__(self, sweep: SweepConfig, gpu: bool = False, kernel_gpu: bool | None = None):
        self.sweep = sweep
        self.knobs = {k.name: k for k in sweep.knobs if gpu or not k.gpu_only}
        self.kernel_gpu = gpu if kernel_gpu is None else kernel_gpu  # Triton providers in the kernel knobs

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any]) -> Sweep:
        knobs = tuple(
            KnobConfig(**{**k, "values": tuple(k["values"])})
            for k in manifest["knobs"]
            if not k["name"].startswith(kernel_knobs.PREFIX)
        )  # derived from the baseline again
        return cls(
            SweepConfig(file=manifest["file"], knobs=knobs),
            gpu=True,
            kernel_gpu=bool(manifest.get("kernel_gpu", False)),
        )

    def manifest(self) -> dict[str, Any]:
        return {
            "file": self.sweep.file,
            "kernel_gpu": self.kernel_gpu,
            "knobs": [{**k.__dict__, "values": list(k.values)} for k in self.knobs.values()],
        }

    def _kernel_knobs(self, ctx: Context) -> None:
        """Add the ``ir_op_priority`` knobs over the providers the current baseline registers."""
        for k in kernel_knobs.knobs(ctx.read_file, self.sweep.file, self.kernel_gpu):
            self.knobs.setdefault(k.name, k)

    # ------------------------------------------------------------------ files
    def file_of(self, k: KnobConfig) -> str:
        return k.file or self.sweep.file

    def path_of(self, k: KnobConfig) -> str:
        if k.where == "engine":
            return f"engine.{k.name}"
        if k.where == "env":
            return f"env.{k.name}"
        return k.key or k.name

    def current(self, k: KnobConfig, ctx: Context) -> Any:
        text = ctx.read_file(self.file_of(k))
        if text is None:
            return None
        try:
            v = get_dotted(json.loads(text), self.path_of(k))
        except json.JSONDecodeError:
            return None
        if v is None and k.name.startswith(kernel_knobs.PREFIX):
            return list(kernel_knobs.DEFAULT)  # unset: the platform default
        if k.where == "env" and v is not None and k.values and not isinstance(k.values[0], str):
            for cand in k.values:
                if str(cand) == str(v):
                    return cand
        return v

    def candidate(self, k: KnobConfig, value: Any, ctx: Context, stats: Mapping[str, Any]) -> Candidate | None:
        path = self.file_of(k)
        old_text = ctx.read_file(path)
        try:
            data = json.loads(old_text) if old_text else {}
        except json.JSONDecodeError:
            return None
        if not isinstance(data, dict):
            return None
        cur = self.current(k, ctx)
        set_dotted(data, self.path_of(k), str(value) if k.where == "env" else value)
        new_text = json.dumps(data, indent=2) + "\n"
        key = "sweep:" + hashlib.sha256(f"{path}\0{json.dumps(data, sort_keys=True)}".encode()).hexdigest()[:20]
        shown = "default" if cur is None else json.dumps(cur)
        why = [f"Set {k.name} {shown} -> {json.dumps(value)} ({k.where} in {path})."]
        if k.rationale:
            why.append(k.rationale)
        if stats["tries"]:
            me = stats["mean_effect"]
            why.append(
                f"History: {stats['tries']} proposals changed {k.name}, {stats['wins']} merged, "
                f"{stats['failures']} failed" + (f", mean effect {me:+.1%}." if me is not None else ".")
            )
        return Candidate(
            key,
            f"{k.name}: {shown} -> {json.dumps(value)}",
            " ".join(why),
            k.category,
            self.name,
            unified_diff(path, old_text, new_text),
            {"knobs": {k.name: [cur, value]}, "file": path},
        )

    # ------------------------------------------------------------------ ordering
    def _prior(self, ctx: Context) -> dict[str, Mapping[str, Any]]:
        return dict((ctx.insights or {}).get("knobs") or {})

    def stats(self, ctx: Context) -> Mapping[str, Mapping[str, Any]]:
        return knob_table(ctx.history, {n: list(k.values) for n, k in self.knobs.items()})

    def order(self, ctx: Context) -> list[str]:
        stats = self.stats(ctx)
        prior = self._prior(ctx)
        rng = seeds.proposal_rng(ctx.seed, ctx.number)
        scored = []
        for name in self.knobs:
            st, p = stats.get(name, EMPTY), prior.get(name, EMPTY)
            wins = st["wins"] + float(p.get("wins", 0)) + self.knobs[name].prior_wins
            losses = (st["tries"] - st["wins"]) + float(p.get("tries", 0)) - float(p.get("wins", 0))
            failures = st["failures"] + float(p.get("failures", 0))
            scored.append((rng.betavariate(1 + wins, max(1 + losses + 2 * failures, 1e-3)), name))
        return [n for _, n in sorted(scored, reverse=True)]

    def values_for(self, k: KnobConfig, cur: Any, st: Mapping[str, Any], prior: Mapping[str, Any]) -> list[Any]:
        vals = [v for v in k.values if v != cur]
        idx = k.values.index(cur) if cur in k.values else None
        up = (st.get("up_wins", 0) + float(prior.get("up_wins", 0))) >= (
            st.get("down_wins", 0) + float(prior.get("down_wins", 0))
        )
        best = prior.get("best_value") if prior.get("best_value") is not None else st.get("best_value")

        tried = st.get("tries", 0) + float(prior.get("tries", 0))
        mid = (len(k.values) - 1) / 2

        def rank(v: Any) -> tuple:
            i = k.values.index(v)
            if not tried:  # coarse to fine: an untried knob is probed in the middle of its range first
                return (1, 0, abs(i - mid), -i)
            dist = abs(i - idx) if idx is not None else i
            direction = 0 if idx is None else (0 if (i > idx) == up else 1)
            return (0 if best is not None and v == best else 1, direction, dist, i)

        return sorted(vals, key=rank)

    def next(self, judged: set[str], ctx: Context) -> Candidate | None:
        self._kernel_knobs(ctx)
        seen = set(judged) | {h.key for h in ctx.history if h.key}
        stats = self.stats(ctx)
        prior = self._prior(ctx)
        for name in self.order(ctx):
            k = self.knobs[name]
            cur = self.current(k, ctx)
            for v in self.values_for(k, cur, stats.get(name, EMPTY), prior.get(name, EMPTY)):
                c = self.candidate(k, v, ctx, stats.get(name, EMPTY))
                if c is not None and c.key not in seen:
                    return c
        return None

"""A model-based search over the declared knob space (``[[sweep.knob]]``): Optuna's TPE sampler, asked for the next
whole configuration and told what the gate measured for every judged one (issue #58).

InferenceBench found matched-budget hyperparameter search (SMAC3, TPE, even random) beating every coding agent at
tuning vLLM: a search needs many well-chosen experiments, which the gate makes trustworthy. This proposer differs
from the sweep (one knob per proposal, a bandit over knobs) in three ways:

- **Whole configurations.** A proposal may set several knobs at once; the sampler models interactions
  (``multivariate`` TPE over every knob jointly).
- **Told the measurements.** Each judged configuration's value is the gate's paired estimate of the objective,
  re-anchored to the episode's start: an estimate is relative to the main it was measured on, and main moves with
  every merge (``log speed(config) = log speed(its main) + log speedup``, main's own log speed the sum of the merged
  estimates before it). A rejection for futility is a measurement like any other; a failed check or a crash
  (``Proposal.is_failure``) is told as a penalty below every measured value, so the sampler moves away from it.
- **Its state is the history.** Nothing is kept beside it: each ``next`` builds a fresh study from the target's
  history in log order and a seed derived from the episode's and the proposal's number, so ``--resume`` asks
  exactly what the interrupted run would have.

Optuna over SMAC3: its ask/tell interface takes told trials without running an objective, its TPE handles
categorical knobs and a few dozen trials well, and it installs as one pure-Python wheel (SMAC3 needs a random forest
stack, ConfigSpace and pyrfr's C++ build); see docs/guide/episodes.md, *The optimizer*.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from harness import seeds

from ..config import KnobConfig, SweepConfig
from . import knob_model
from .base import Candidate, Context, ProposerError
from .knob_model import UNSET
from .sweep import Sweep, get_dotted, set_dotted, unified_diff

SAMPLERS = ("tpe", "random", "grid")  # random and grid: the matched-budget baselines of the benchmark
STARTUP = 3  # random configurations before the model is used
PENALTY = 1.0  # nats below the worst measured value: what a failed check or a crash is told
ASKS = 64  # draws of the sampler per proposal
RADIUS = 2  # knobs a TPE proposal changes at most: a step from main the gate can judge (a trust region)


class Optimize:
    name = "optimize"

    def __init__(self, sweep: SweepConfig, sampler: str = "tpe", gpu: bool = False):
        if sampler not in SAMPLERS:
            raise ProposerError(f"unknown sampler {sampler!r}: expected one of {', '.join(SAMPLERS)}")
        self.sweep, self.sampler = sweep, sampler
        self.files = Sweep(sweep, gpu=gpu)  # the files and paths the knobs live in (one place for them)
        self.knobs = dict(self.files.knobs)

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any]) -> Optimize:
        knobs = tuple(KnobConfig(**{**k, "values": tuple(k["values"])}) for k in manifest["knobs"])
        return cls(SweepConfig(file=manifest["file"], knobs=knobs), manifest.get("sampler", "tpe"), gpu=True)

    def manifest(self) -> dict[str, Any]:
        return {
            "file": self.sweep.file,
            "sampler": self.sampler,
            "knobs": [{**k.__dict__, "values": list(k.values)} for k in self.knobs.values()],
        }

    # ------------------------------------------------------------------ the space
    def choices(self, k: KnobConfig, cur: Any) -> list[Any]:
        """The knob's declared values, and main's value when it is not one of them (``UNSET``: not set)."""
        vals = list(k.values)
        now = UNSET if cur is None else cur
        return vals if now in vals else [now, *vals]

    def configuration(self, ctx: Context) -> dict[str, Any]:
        """Main's value of every knob (``UNSET`` where the file does not set it)."""
        return {n: (UNSET if (v := self.files.current(k, ctx)) is None else v) for n, k in self.knobs.items()}

    # ------------------------------------------------------------------ what was measured
    def observations(self, history: Sequence[Any]) -> list[tuple[dict[str, Any], float | None]]:
        """(configuration, value) of every judged configuration of this proposer (``knob_model.observations``)."""
        return knob_model.observations(history, list(self.knobs))

    # ------------------------------------------------------------------ asking
    def _study(
        self, ctx: Context, space: Mapping[str, list[Any]], told: Sequence[tuple[dict[str, Any], float | None]]
    ) -> tuple[Any, dict[str, Any]]:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        seed = seeds.proposal_rng(ctx.seed, ctx.number).randrange(2**31)
        if self.sampler == "random":
            sampler: Any = optuna.samplers.RandomSampler(seed=seed)
        else:
            sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=STARTUP, multivariate=True)
        study = optuna.create_study(direction="maximize", sampler=sampler)
        dists: dict[str, optuna.distributions.BaseDistribution] = {
            n: optuna.distributions.CategoricalDistribution([_enc(v) for v in vals]) for n, vals in space.items()
        }
        measured = [v for _, v in told if v is not None]
        floor = (min(measured) if measured else 0.0) - PENALTY
        space_choices = {n: [_enc(v) for v in vals] for n, vals in space.items()}
        for config, value in told:
            params = {n: _enc(config[n]) for n in space}
            if all(params[n] in space_choices[n] for n in space):
                study.add_trial(
                    optuna.trial.create_trial(
                        params=params, distributions=dists, value=floor if value is None else value
                    )
                )
        return study, dists

    def next(self, judged: set[str], ctx: Context) -> Candidate | None:
        if not self.knobs:
            return None
        main = self.configuration(ctx)
        space = {n: self.choices(k, main[n]) for n, k in self.knobs.items()}
        seen = set(judged) | {h.key for h in ctx.history if h.key}
        told = self.observations(ctx.history)
        tried = {_config_key(c) for c, _ in told} | {_config_key(main)}
        if self.sampler == "grid":  # every point of the declared grid once, in the episode's seeded order
            for config in grid({n: list(k.values) for n, k in self.knobs.items()}, ctx.seed):
                c = self.candidate(config, main, ctx, told)
                if c is not None and c.key not in seen and _config_key(config) not in tried:
                    return c
            return None
        study, dists = self._study(ctx, space, told)
        drawn = []
        for _ in range(ASKS):
            trial = study.ask(dists)
            drawn.append({n: _dec(trial.params[n]) for n in space})
            study.tell(trial, state=_failed())  # asked, not measured: never told as a value
        if self.sampler == "random":  # the matched-budget baseline: plain random search over whole configurations
            order = drawn
        else:
            order = trust_region(drawn, main, RADIUS, seeds.proposal_rng(ctx.seed, ctx.number))
        for config in [*order, *_neighbours(main, space)]:  # the nearest untried when every draw was judged
            c = self.candidate(config, main, ctx, told)
            if c is not None and c.key not in seen and _config_key(config) not in tried:
                return c
        return None

    def candidate(
        self,
        config: Mapping[str, Any],
        main: Mapping[str, Any],
        ctx: Context,
        told: Sequence[tuple[dict[str, Any], float | None]],
    ) -> Candidate | None:
        """The patch setting every knob where ``config`` differs from ``main`` (None: no difference, or a file that
        is not a JSON object)."""
        changed = {n: (main[n], config[n]) for n in self.knobs if config[n] != main[n]}
        if not changed:
            return None
        texts: dict[str, tuple[str | None, dict[str, Any]]] = {}
        for n in changed:
            k = self.knobs[n]
            path = self.files.file_of(k)
            if path not in texts:
                old = ctx.read_file(path)
                try:
                    data = json.loads(old) if old else {}
                except json.JSONDecodeError:
                    return None
                if not isinstance(data, dict):
                    return None
                texts[path] = (old, data)
            value = config[n]
            dotted = self.files.path_of(k)
            if value == UNSET:
                _unset(texts[path][1], dotted)
            else:
                set_dotted(texts[path][1], dotted, str(value) if k.where == "env" else value)
        patch = "".join(unified_diff(p, old, json.dumps(d, indent=2) + "\n") for p, (old, d) in sorted(texts.items()))
        digest = json.dumps({p: d for p, (_, d) in sorted(texts.items())}, sort_keys=True)
        key = "optimize:" + hashlib.sha256(digest.encode()).hexdigest()[:20]
        shown = ", ".join(f"{n}: {_show(a)} -> {_show(b)}" for n, (a, b) in changed.items())
        n_told = len(told)
        why = [
            f"The {self.sampler} sampler's next configuration ({len(changed)} of {len(self.knobs)} knobs changed: "
            f"{shown}), asked after {n_told} judged configuration{'s' if n_told != 1 else ''}."
        ]
        if best := knob_model.recommendation(knob_model.observed(ctx.history, list(self.knobs)), list(self.knobs)):
            why.append(best + " (Speeds are over the first main.)")
        categories = {self.knobs[n].category for n in changed}
        return Candidate(
            key,
            "optimize: " + shown,
            " ".join(why),
            categories.pop() if len(categories) == 1 else "config",
            self.name,
            patch,
            {
                "knobs": {n: [None if a == UNSET else a, None if b == UNSET else b] for n, (a, b) in changed.items()},
                "config": dict(config),
                "file": self.sweep.file,
                "sampler": self.sampler,
                "told": n_told,
            },
        )


def configuration_of(sweep: SweepConfig, read_file: Callable[[str], str | None]) -> dict[str, Any]:
    """Every declared knob's value in the files ``read_file`` reads (``UNSET`` where the file does not set it): how
    the episode records the configuration of a proposal that changed nothing but the knobs' files (an agent's, the
    sweep's, a patch's), so that the optimizer is told it too (``knob_model.observed``)."""
    files = Sweep(sweep, gpu=True)  # every declared knob: the optimizer takes the ones its machine searches
    ctx = Context(read_file, (), None, 0, 0)
    return {n: (UNSET if (v := files.current(k, ctx)) is None else v) for n, k in files.knobs.items()}


def knob_files(sweep: SweepConfig) -> set[str]:
    """The files the declared knobs live in."""
    files = Sweep(sweep, gpu=True)
    return {files.file_of(k) for k in files.knobs.values()}


def knobs_only(sweep: SweepConfig, before: Callable[[str], str | None], after: Callable[[str], str | None]) -> bool:
    """Whether the knobs' files differ between ``before`` and ``after`` in the declared knobs' values alone: the
    same JSON once every knob's path is taken out of both (a change that also sets anything else made a configuration
    the knob space does not describe, and its measurement is not that configuration's)."""
    files = Sweep(sweep, gpu=True)
    paths: dict[str, list[str]] = {}
    for k in files.knobs.values():
        paths.setdefault(files.file_of(k), []).append(files.path_of(k))
    for path, dotted in paths.items():
        texts = [before(path), after(path)]
        try:
            data = [json.loads(t) if t else {} for t in texts]
        except json.JSONDecodeError:
            return False
        if not all(isinstance(d, dict) for d in data):
            return False
        for d in data:
            for name in dotted:
                _unset(d, name)
        if data[0] != data[1]:
            return False
    return True


def _enc(v: Any) -> Any:
    """A knob value as an Optuna choice (None, bool, int, float, str); lists and objects as their JSON text."""
    return v if v is None or isinstance(v, bool | int | float | str) else "json:" + json.dumps(v, sort_keys=True)


def _dec(v: Any) -> Any:
    return json.loads(v[5:]) if isinstance(v, str) and v.startswith("json:") else v


def _config_key(config: Mapping[str, Any]) -> str:
    return json.dumps({n: _enc(v) for n, v in sorted(config.items())}, sort_keys=True)


def _show(v: Any) -> str:
    return "default" if v == UNSET else json.dumps(v)


def _unset(data: dict[str, Any], dotted: str) -> None:
    parts = dotted.split(".")
    parent = get_dotted(data, ".".join(parts[:-1])) if len(parts) > 1 else data
    if isinstance(parent, dict):
        parent.pop(parts[-1], None)


def _failed() -> Any:
    import optuna

    return optuna.trial.TrialState.FAIL


def _neighbours(main: Mapping[str, Any], space: Mapping[str, list[Any]]) -> list[dict[str, Any]]:
    """Configurations one knob away from main, then two: the fallback when the sampler only draws judged ones."""
    ones = [{**main, n: v} for n, vals in space.items() for v in vals if v != main[n]]
    names = list(space)
    twos = [
        {**main, a: va, b: vb}
        for i, a in enumerate(names)
        for b in names[i + 1 :]
        for va in space[a]
        for vb in space[b]
        if va != main[a] and vb != main[b]
    ]
    return ones + twos


def grid(space: Mapping[str, list[Any]], seed: int | None) -> Iterator[dict[str, Any]]:
    """Grid search: every combination of the knobs' values, in an order shuffled once by the episode's seed (a budget
    smaller than the grid covers it evenly, not one corner; Optuna's GridSampler orders its grid the same way)."""
    import itertools
    import random

    names = list(space)
    order = list(itertools.product(*(range(len(space[n])) for n in names)))
    random.Random(f"grid:{seed}").shuffle(order)
    for idx in order:
        yield {n: space[n][i] for n, i in zip(names, idx, strict=True)}


def trust_region(
    drawn: Sequence[Mapping[str, Any]], main: Mapping[str, Any], radius: int, rng: Any
) -> list[dict[str, Any]]:
    """The sampler's draws as steps from main: each draw's changes, at most ``radius`` of them (every subset of that
    size, each weighted by one over their number), counted over all draws; the most drawn step first (the sampler's
    density over the better region stands for its expected improvement), among equals the one changing fewer knobs
    (simpler wins ties), then a seeded order. A whole-space jump from a good main is mostly worse than main, and the
    gate merges only what beats main: steps it can judge."""
    import itertools

    weight: dict[str, float] = {}
    step_of: dict[str, dict[str, Any]] = {}
    for config in drawn:
        changed = [n for n in config if config[n] != main[n]]
        if not changed:
            continue
        subsets = list(itertools.combinations(changed, min(radius, len(changed))))
        for sub in subsets:
            step = {**main, **{n: config[n] for n in sub}}
            key = _config_key(step)
            step_of[key] = step
            weight[key] = weight.get(key, 0.0) + 1.0 / len(subsets)
    keys = sorted(weight)
    rng.shuffle(keys)  # ties in a seeded order (a stable sort keeps it)
    # equally drawn steps: the one changing fewer knobs first (simpler wins ties)
    size = {k: sum(step_of[k][n] != main[n] for n in main) for k in keys}
    return [step_of[k] for k in sorted(keys, key=lambda k: (-weight[k], size[k]))]

"""Distribution checks of a candidate against the baseline: public corpus and hidden holdout.

Runs the baseline twice (corpus order, then shuffled: a different batch composition and order —
the noise floor) and the candidate once, compares per path (prefill, decode and, with the vLLM
worker, sample: the sampler's processed logprobs under several sampling settings), per set
(public, holdout) and per language, and passes only if every path passes on both sets. With the
vLLM worker a paired draw test (same seeds on both sides) checks the sampler's use of its random
numbers end to end.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness import corpus as corpus_mod
from harness import environment, models
from harness import lengths as lengths_mod
from harness import regimes as regimes_mod
from harness.distribution import DTYPE_FLOOR, MAX_DUMP_BYTES, PathStats, compare, judge_draws, judge_path
from harness.logprobs import (
    CommandLogprobs,
    LogprobError,
    VllmLogprobs,
    decode_lengths,
    write_prompts,
    write_sample_prompts,
)
from harness.safe_io import read_beneath
from harness.trials import BASELINE, CANDIDATE
from harness.worker_protocol import SERVING_FILE, WorkerError, read_serving
from history.records import ReferenceCheck, RegimeComparison

from . import __version__, baseline_dumps
from .config import Config, VerifyConfig
from .errors import AgentsearchError
from .progress import Say
from .workloads import placement_for
from .workspace import Workspace

if TYPE_CHECKING:
    from .sides import Sides

# 2: the sample path is processed logprobs per set (public/holdout "sample"), the draw test is "draws";
# every path has kl_mean_se, kl_percentiles, dp_rms, same_top_pct (version 1 records still load: the
# report shows what they have)
# 3: "reference" (the candidate against the pinned reference per regime: commit, budget, regimes, main) and "blame"
VERIFY_SCHEMA = 3
REFERENCE = "reference"
SECRET_FILE = "holdout.key"
PATHS = ("prefill", "decode")
# The sample path: each prompt is sampled under one of these settings (in turn), and the sampler's
# processed logprobs are compared: temperature, top-k, top-p, min-p and the penalties each move them.
SAMPLE_SETTINGS = [
    {"temperature": 0.7},
    {"temperature": 1.0, "top_k": 40},
    {"temperature": 0.9, "top_p": 0.9},
    {"temperature": 1.0, "min_p": 0.05},
    {"temperature": 0.8, "repetition_penalty": 1.3},
    {"temperature": 0.8, "top_k": 50, "top_p": 0.95, "presence_penalty": 0.5, "frequency_penalty": 0.3},
]
# The draw test's settings, and its seed ranges: setting j of a run with base seed s and n draws uses
# the seeds s + j*n ... s + (j+1)*n - 1 (vLLM gives child i of n = N, seed = s the seed s + i); the
# "unrelated" baseline run starts past every seed the paired runs use.
DRAW_SETTINGS = [{"temperature": 0.7, "top_p": 0.8}, {"temperature": 1.0, "top_k": 40, "top_p": 0.9}]
DRAW_SEED = 1_000_000


@dataclass(frozen=True)
class VerifyResult:
    verdict: str  # pass | fail
    reasons: tuple[str, ...]
    sets: dict[str, dict[str, Any]]  # public/holdout -> path -> stats
    languages: dict[str, dict[str, Any]]  # lang -> path -> stats (public prompts only)
    floor: dict[str, Any]
    holdout_size: int
    public_size: int
    mode: str
    wall_s: float
    positions: dict[str, list[float]] = field(default_factory=dict)  # per-position KL for plots
    draws: dict[str, Any] = field(default_factory=dict)  # the paired draw test (vLLM worker)
    corpus_size: int = 0  # prompts in the corpus before the profile's selection
    baseline_reused: int = 0  # the baseline's dumps reused from an earlier check (agentsearch.baseline_dumps)
    reference: ReferenceCheck | None = None  # the candidate against the pinned reference, per regime
    blame: str = (
        ""  # "" (passed) | candidate | main: main itself diverges from the reference where the candidate failed
    )
    schema_version: int = VERIFY_SCHEMA

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "verdict": self.verdict,
            "reasons": list(self.reasons),
            "mode": self.mode,
            "public": self.sets.get("public"),
            "holdout": self.sets.get("holdout"),
            "draws": self.draws or None,
            "holdout_size": self.holdout_size,
            "public_size": self.public_size,
            "corpus_size": self.corpus_size,
            "languages": self.languages,
            "noise_floor": self.floor,
            "wall_s": round(self.wall_s, 3),
            "baseline_reused": self.baseline_reused,
            "reference": self.reference.to_json() if self.reference else None,
            "blame": self.blame or None,
        }


def holdout_secret(ws: Workspace) -> bytes:
    """The workspace's holdout secret (created on first use, readable only by its owner)."""
    path = ws.state / SECRET_FILE
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(secrets.token_bytes(32))
        os.replace(tmp, path)
    return path.read_bytes()


def load_prompts(vc: VerifyConfig, worktree: Path) -> list[corpus_mod.Prompt]:
    path = (worktree / vc.corpus) if vc.corpus else None
    try:
        return corpus_mod.load(path)
    except (OSError, ValueError) as exc:
        raise AgentsearchError(f"[verify] corpus: {exc}") from None


LONGEST_DECODE = 512  # the verify run's longest decode at most (its cost grows with it)


def longest_output(config: Config) -> int:
    """Decode steps of the verify run's longest request: a long request of the vLLM workloads (twice the largest
    length profile's mean output, as their uniform and heavy-tailed batches reach), at most ``LONGEST_DECODE``."""
    outs = [int(w.params.get("output_len", 64)) for w in config.workloads if w.spec.engine]
    return min(LONGEST_DECODE, int(2 * max(lengths_mod.SCALES) * max(outs))) if outs else 0


def _runner_spec(
    vc: VerifyConfig, config: Config, side: str, regime: Mapping[str, Any] | None = None
) -> tuple[dict[str, Any], dict[str, str]]:
    """(the vLLM logprob worker's spec, its environment); the spec is empty for a command. ``regime``: engine
    arguments the worker puts over the worktree's serving.json (the run in another side's regime)."""
    env = dict(config.target.env)
    if vc.kind == "command":
        return {}, env
    model = models.resolve(vc.model)
    # processed logprobs: what the sampler draws from (greedy requests without penalties get the raw ones)
    engine = {
        "enforce_eager": True,
        "max_model_len": 2048,
        "seed": 0,
        "dtype": vc.dtype,
        **vc.engine,
        "logprobs_mode": "processed_logprobs",
    }
    engine, device = placement_for(config).logprob_engine(side, engine)  # on a GPU: the side's device, its memory share
    env.update(device)
    spec = {"kind": "vllm-logprobs", "model": model, "engine": engine}
    if regime is not None:
        spec["regime"] = {k: regime.get(k) for k in regimes_mod.REGIME_KEYS}
    return spec, env


def _runner(
    vc: VerifyConfig,
    config: Config,
    worktree: Path,
    log: Path,
    out_root: Path,
    side: str = BASELINE,
    regime: Mapping[str, Any] | None = None,
):
    spec, env = _runner_spec(vc, config, side, regime)
    if vc.kind == "command":
        assert vc.logprobs
        return CommandLogprobs(vc.logprobs, worktree, env, vc.timeout_s, out_root)
    return VllmLogprobs(spec, worktree, env, log, vc.timeout_s, out_root)


def kept_dumps(
    ws: Workspace, config: Config, commit: str, regime: Mapping[str, Any] | None = None, kind: str = BASELINE
) -> baseline_dumps.BaselineDumps:
    """Where the dumps of ``commit`` under this config and machine are kept: the baseline's own (``regime`` None),
    main's in another regime (``kind`` baseline with a ``regime``) or the reference's (``kind`` reference); each
    kind in its own directory, so one never evicts another's."""
    vc = config.verify
    assert vc is not None
    spec, env = _runner_spec(vc, config, BASELINE, regime)
    key = baseline_dumps.baseline_key(
        {
            "commit": commit,
            "verify": dataclasses.asdict(vc),
            "spec": spec,
            "env": env,
            "install": config.target.install,
            "overlay_from": config.target.overlay_from,
            "build": config.target.build,
            "model": baseline_dumps.model_digest(spec.get("model")),
            "environment": environment.fingerprint(),
            "code": baseline_dumps.code_digest(),
            "version": __version__,
        }
    )
    if kind == REFERENCE:
        return baseline_dumps.BaselineDumps(ws.state / baseline_dumps.REFERENCE_DIR, key, baseline_dumps.KEEP_REFERENCE)
    if regime is not None:
        return baseline_dumps.BaselineDumps(ws.state / baseline_dumps.MAIN_DIR, key, baseline_dumps.KEEP_REFERENCE)
    return baseline_dumps.BaselineDumps(ws.state / baseline_dumps.CACHE_DIR, key)


def regime_only(repo_dir: Path, base: str, cand: str) -> bool:
    """Whether ``cand`` changes nothing of ``base`` but regime keys in serving.json (a batching or caching knob): in any
    regime but its own the candidate's run is then main's computation (the same code, engine arguments and
    environment: the worker sets every regime key), and the check takes main's run instead of starting the candidate's
    engine again. Read from the commits, as the sides were built."""
    from .workspace import git

    if base == cand:
        return False
    # every path, submodules included whatever .gitmodules says, renames as a deletion and an addition
    out = git.run_git(
        "diff",
        "--name-status",
        "-z",
        "--no-renames",
        "--ignore-submodules=none",
        "--no-ext-diff",
        base,
        cand,
        cwd=repo_dir,
    )
    if out.split("\0")[:3] != ["M", SERVING_FILE, ""]:
        return False
    try:
        a, b = (json.loads(git.show_file(repo_dir, c, SERVING_FILE) or "null") for c in (base, cand))
    except ValueError:
        return False
    return regimes_mod.apart_from_regime(a, b)


def _serving_of(worktree: Path) -> Any:
    try:
        return read_serving(worktree)
    except WorkerError:
        return None


def side_regime(vc: VerifyConfig, worktree: Path, side: str) -> regimes_mod.Regime:
    """The regime a side's logprob runs use ({} for a command: it has no engine arguments). LogprobError naming
    the side when its serving.json is unreadable or sets a regime key to a value no engine takes."""
    if vc.kind != "vllm":
        return {}
    try:
        return regimes_mod.effective(vc.engine, read_serving(worktree))
    except (WorkerError, regimes_mod.RegimeError) as exc:
        raise LogprobError(f"{side}: serving.json: {exc}") from None


def budget_of(vc: VerifyConfig) -> tuple[str, dict[str, Any], str]:
    """(mode, caps, words) the reference comparison is judged with: ``[verify] drift_budget`` when set, else the
    check's own mode and caps."""
    if vc.drift_budget:
        return (
            "approx",
            dict(vc.drift_budget),
            "[verify] drift_budget " + ", ".join(f"{k} {v:g}" for k, v in vc.drift_budget.items()),
        )
    words = {
        "tight": "the tight mode's tolerance (noise floor x3 or the dtype minimum)",
        "exact": "bit-identity (exact mode)",
    }
    return vc.mode, dict(vc.caps), words.get(vc.mode, "the approx mode's caps")


class ReferenceFailed(LogprobError):
    """The reference could not be built or run: agentsearch's machinery, not the candidate (an internal error)."""


class _Elsewhere:
    """A runner in another built side (the reference's, in its own sandbox): the prompts are copied into that
    side's inputs, its dump is read beneath that side's outputs and copied to where the check reads it."""

    def __init__(self, inner: Any, sides: Sides):
        self.inner, self.sides = inner, sides

    def _call(self, method: str, prompts: Path, out: Path, **args: Any) -> dict:
        inputs = self.sides.inputs / "verify"
        inputs.mkdir(parents=True, exist_ok=True)
        theirs = self.sides.out(BASELINE) / "verify" / out.name
        theirs.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(prompts, inputs / prompts.name)
        dump = getattr(self.inner, method)(inputs / prompts.name, theirs, **args)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(read_beneath(self.sides.out(BASELINE), theirs, MAX_DUMP_BYTES))
        return dump

    def run(self, prompts: Path, out: Path, k: int, max_tokens: int) -> dict:
        return self._call("run", prompts, out, k=k, max_tokens=max_tokens)

    def processed(self, prompts: Path, out: Path, settings: list[dict], k: int, max_tokens: int) -> dict:
        return self._call("processed", prompts, out, settings=settings, k=k, max_tokens=max_tokens)

    def samples(self, prompts: Path, out: Path, settings: list[dict], n: int, seed: int) -> dict:
        return self._call("samples", prompts, out, settings=settings, n=n, seed=seed)

    def close(self) -> None:
        self.inner.close()


class _Trusted:
    """Logprob runs of code that is not the candidate's — the baseline in another regime, the reference in any —
    kept in the house per (commit, regime) and made only at the first miss. The reference's worktree is built
    (in a sandbox of its own) only when one of its dumps is missing."""

    def __init__(
        self, ws: Workspace, config: Config, sd: Sides, reference: str, stack: contextlib.ExitStack, keep: bool = True
    ):
        self.ws, self.config, self.sd, self.reference, self.stack, self.keep = ws, config, sd, reference, stack, keep
        self.runners: dict[tuple[str, str], baseline_dumps.ReusingRunner] = {}
        self.ref_sides: Any = None
        self.collected = 0

    def _reference_side(self) -> Any:
        from .sides import built_sides

        if self.ref_sides is None:
            tag = f"reference-{self.reference[:10]}-{secrets.randbelow(100000):05d}"
            try:
                self.ref_sides = self.stack.enter_context(
                    built_sides(self.ws, self.config, {BASELINE: self.reference}, tag, "the reference")
                )
            except AgentsearchError as exc:
                raise ReferenceFailed(f"the reference {self.reference[:10]} could not be built: {exc}") from None
        return self.ref_sides

    def runner(self, who: str, regime: Mapping[str, Any], n: int) -> baseline_dumps.ReusingRunner:
        vc = self.config.verify
        assert vc is not None
        k = (who, regimes_mod.key(regime))
        if k not in self.runners:
            commit = self.reference if who == REFERENCE else self.sd.commits[BASELINE]
            kept = kept_dumps(self.ws, self.config, commit, regime, kind=who)

            def make() -> Any:
                sd = self._reference_side() if who == REFERENCE else self.sd
                inner = _runner(
                    vc,
                    self.config,
                    sd.worktrees[BASELINE],
                    sd.logs / f"logprobs-{sd.label(who)}-r{n}.log",
                    sd.out(BASELINE),
                    BASELINE,
                    regime,
                )
                return _Elsewhere(inner, sd) if who == REFERENCE else inner

            self.runners[k] = baseline_dumps.ReusingRunner(
                make, kept, self.sd.out(BASELINE), eager=False, keep=self.keep
            )
        return self.runners[k]

    def out(self) -> Path:
        """Where the trusted runs' dumps are read (the baseline side's outputs: only main's code writes there)."""
        return self.sd.out(BASELINE) / "verify"

    def close(self, ok: bool) -> None:
        # a worktree that changed while its runs were made: nothing they made is kept (the next check makes them again)
        moved = {
            BASELINE: bool(self.sd.check()),
            REFERENCE: bool(self.ref_sides is not None and self.ref_sides.check()),
        }
        for (who, _), r in self.runners.items():
            r.close()
            if not self.keep:
                continue
            if r.collected and (not ok or moved[who]):
                r.dumps.discard()
            elif ok and (r.collected or r.reused):
                r.dumps.mark_complete()  # newest by use: what pruning keeps


@dataclass(frozen=True)
class _Prompts:
    """The check's prompts, written where both sides read them, and where each side's dumps go."""

    every: list[corpus_mod.Prompt]  # the corpus, before the profile's selection
    run: list[corpus_mod.Prompt]  # the prompts both sides run (public_only: the public ones)
    public: list[corpus_mod.Prompt]
    hold: list[corpus_mod.Prompt]
    inputs: Path  # the sides' inputs/verify
    outs: dict[str, Path]  # side -> its outputs/verify
    lengths: dict[str, int]  # prompt id -> its decode steps
    shuffle_seed: int
    ordered: Path  # the prompts in corpus order
    shuffled: Path  # the same prompts shuffled: another batch composition and order (the noise floor)


def _write_prompts(ws: Workspace, config: Config, sd: Sides, public_only: bool) -> _Prompts:
    """Select and split the corpus, empty the sides' outputs and write the prompts into their inputs."""
    vc = config.verify
    assert vc is not None
    every = load_prompts(vc, sd.worktrees[BASELINE])
    prompts = corpus_mod.select(every, vc.prompts_wanted)
    secret = holdout_secret(ws)
    public, hold = corpus_mod.split(prompts, secret, vc.holdout)
    if public_only:
        prompts, hold = list(public), []
    inputs = sd.inputs / "verify"
    for side in (BASELINE, CANDIDATE):
        sd.fresh_outputs(side)  # nothing the timed trials left is there for the logprob runs
    outs = {side: sd.out(side) / "verify" for side in (BASELINE, CANDIDATE)}
    for d in (inputs, sd.logs, *outs.values()):
        d.mkdir(parents=True, exist_ok=True)
    shuffle_seed = int.from_bytes(secret[:4], "big")
    lengths = decode_lengths(prompts, vc.max_tokens, longest_output(config))
    ordered = write_prompts(inputs / "prompts.jsonl", prompts, lengths=lengths)
    shuffled = write_prompts(inputs / "prompts-shuffled.jsonl", prompts, shuffle_seed=shuffle_seed, lengths=lengths)
    return _Prompts(every, prompts, public, hold, inputs, outs, lengths, shuffle_seed, ordered, shuffled)


def _regimes(vc: VerifyConfig, sd: Sides) -> tuple[regimes_mod.Regime, list[regimes_mod.Regime]]:
    """(the baseline's regime, the regimes the reference comparison covers: the candidate's own first; then
    production's ([verify] regimes) and the old one, each once)."""
    regime_base, regime_cand = (
        side_regime(vc, sd.worktrees[BASELINE], BASELINE),
        side_regime(vc, sd.worktrees[CANDIDATE], CANDIDATE),
    )
    regimes = [regime_cand]
    for extra in (
        *(regimes_mod.with_overrides(regime_cand, o) for o in vc.regimes),
        *([regime_base] if vc.old_regime else []),
    ):
        if all(regimes_mod.key(extra) != regimes_mod.key(r) for r in regimes):
            regimes.append(extra)
    return regime_base, regimes


@contextlib.contextmanager
def _side_runners(
    config: Config, sd: Sides, kept: baseline_dumps.BaselineDumps | None, main: bool, say: Say
) -> Iterator[dict[str, Any]]:
    """Each side's logprob runner, closed on the way out: the baseline's reuses its kept dumps where there are some,
    and so does the candidate's where it is main's own code (``main``)."""
    vc = config.verify
    assert vc is not None
    runners: dict[str, Any] = {}
    try:
        for side in (BASELINE, CANDIDATE):

            def make(side: str = side) -> Any:
                return _runner(
                    vc, config, sd.worktrees[side], sd.logs / f"logprobs-{sd.label(side)}.log", sd.out(side), side
                )

            if side == BASELINE and kept is not None:
                runners[side] = baseline_dumps.ReusingRunner(make, kept, sd.out(side), eager=not kept.complete)
                if kept.complete:
                    say(
                        "verify",
                        f"the baseline's dumps are kept from an earlier check of {sd.commits[BASELINE][:10]}: its "
                        "engine is not started",
                    )
            elif side == CANDIDATE and main and kept is not None:
                runners[side] = baseline_dumps.ReusingRunner(
                    make, kept, sd.out(side), eager=False
                )  # main's own runs: kept
            else:
                runners[side] = make()
        yield runners
    finally:
        for r in runners.values():
            r.close()


@dataclass(frozen=True)
class _Dumps:
    """What the sides' runs returned: the baseline's twice (corpus order, then shuffled) and the candidate's, each
    with its sample path where there is one; and the draw test's runs."""

    base: dict
    base2: dict
    cand: dict
    sample_prompts: Path | None  # the sample path's prompts in corpus order (None: no sample path)
    draws: list[dict] | None  # the draw test's runs (None: no draw test)


def _collected(say: Say, side: str, what: str, fn: Callable[[], dict]) -> dict:
    say("verify", what)
    try:
        return fn()
    except LogprobError as exc:
        raise LogprobError(f"{side}: {exc}") from None


def _collect(vc: VerifyConfig, runners: Mapping[str, Any], p: _Prompts, sampling: bool, say: Say) -> _Dumps:
    """Every run of the check, in order: the logprobs, the sample path's processed logprobs, the draw test."""

    def logprobs(side: str, prompts_file: Path, out: str) -> Callable[[], dict]:
        return lambda: runners[side].run(prompts_file, p.outs[side] / out, vc.k, vc.max_tokens)

    base = _collected(
        say, BASELINE, f"baseline logprobs for {len(p.run)} prompts", logprobs(BASELINE, p.ordered, "base.jsonl")
    )
    base2 = _collected(
        say, BASELINE, "baseline again, shuffled (noise floor)", logprobs(BASELINE, p.shuffled, "base-shuffled.jsonl")
    )
    cand = _collected(say, CANDIDATE, "candidate logprobs", logprobs(CANDIDATE, p.ordered, "cand.jsonl"))
    s_ordered: Path | None = None
    if sampling:
        s_ordered = _collect_sample(vc, runners, p, say, base, base2, cand)
    draws = _collect_draws(vc, runners, p, say) if sampling and vc.sample_draws else None
    return _Dumps(base, base2, cand, s_ordered, draws)


def _collect_sample(
    vc: VerifyConfig, runners: Mapping[str, Any], p: _Prompts, say: Say, base: dict, base2: dict, cand: dict
) -> Path:
    """The sample path: each side's processed logprobs under SAMPLE_SETTINGS, added to its dumps (``base``, ``base2``,
    ``cand``); the sample prompts in corpus order."""
    s_ordered = write_sample_prompts(p.inputs / "sample.jsonl", p.run, len(SAMPLE_SETTINGS), lengths=p.lengths)
    s_shuffled = write_sample_prompts(
        p.inputs / "sample-shuffled.jsonl",
        p.run,
        len(SAMPLE_SETTINGS),
        shuffle_seed=p.shuffle_seed,
        lengths=p.lengths,
    )

    def processed(side: str, prompts_file: Path, out: str) -> Callable[[], dict]:
        return lambda: runners[side].processed(prompts_file, p.outs[side] / out, SAMPLE_SETTINGS, vc.k, vc.max_tokens)

    base.update(
        _collected(
            say,
            BASELINE,
            "sample path: baseline processed logprobs",
            processed(BASELINE, s_ordered, "sample-base.jsonl"),
        )
    )
    base2.update(
        _collected(
            say,
            BASELINE,
            "sample path: baseline again, shuffled",
            processed(BASELINE, s_shuffled, "sample-base-shuffled.jsonl"),
        )
    )
    cand.update(
        _collected(
            say,
            CANDIDATE,
            "sample path: candidate processed logprobs",
            processed(CANDIDATE, s_ordered, "sample-cand.jsonl"),
        )
    )
    return s_ordered


def _collect_draws(vc: VerifyConfig, runners: Mapping[str, Any], p: _Prompts, say: Say) -> list[dict]:
    """The paired draw test's runs: the baseline, the baseline in another batch (noise floor), the baseline with
    unrelated seeds, the candidate with the baseline's seeds (``judge_draws``' order)."""
    first_of_lang: dict[str, corpus_mod.Prompt] = {}
    for prompt in p.public:
        first_of_lang.setdefault(prompt.lang, prompt)
    contexts = sorted(first_of_lang.values(), key=lambda prompt: len(prompt.text))[: vc.sample_contexts]
    ctx = write_prompts(p.inputs / "draw-contexts.jsonl", contexts)
    ctx_shuffled = write_prompts(p.inputs / "draw-contexts-shuffled.jsonl", contexts[::-1])
    n = vc.sample_draws
    unrelated_seed = DRAW_SEED + n * len(DRAW_SETTINGS)  # past every seed of the paired runs

    def drawn(side: str, file: Path, seed: int, out: str) -> Callable[[], dict]:
        return lambda: runners[side].samples(file, p.outs[side] / out, DRAW_SETTINGS, n, seed)

    return [
        _collected(say, BASELINE, "draw test: baseline", drawn(BASELINE, ctx, DRAW_SEED, "draws-base.jsonl")),
        _collected(
            say,
            BASELINE,
            "draw test: baseline again, same seeds, another batch (noise floor)",
            drawn(BASELINE, ctx_shuffled, DRAW_SEED, "draws-floor.jsonl"),
        ),
        _collected(
            say,
            BASELINE,
            "draw test: baseline with unrelated seeds",
            drawn(BASELINE, ctx, unrelated_seed, "draws-unrelated.jsonl"),
        ),
        _collected(
            say,
            CANDIDATE,
            "draw test: candidate, same seeds",
            drawn(CANDIDATE, ctx, DRAW_SEED, "draws-cand.jsonl"),
        ),
    ]


def _floor_reasons(floor: Mapping[str, PathStats]) -> list[str]:
    """Where the baseline is not self-consistent (its two runs disagree beyond what a batch may change)."""
    reasons: list[str] = []
    for name, st in floor.items():
        if st.missing or st.dropped or st.token_mismatch or st.bad_divergences:
            reasons.append(
                f"noise floor: the baseline is not self-consistent on {name} (missing "
                f"{len(st.missing) + len(st.dropped)}, token mismatches {len(st.token_mismatch)}, divergences "
                f"{len(st.bad_divergences)})"
            )
    return reasons


def _judge_draws(draws: list[dict] | None) -> tuple[dict[str, Any], list[str]]:
    """(the draw test's verdict and statistics, its reasons); ({}, []) without a draw test."""
    if draws is None:
        return {}, []
    dv = judge_draws(*draws)
    return {"passed": dv.passed, **dv.stats}, list(dv.reasons)


def _shares_main_run(ws: Workspace, vc: VerifyConfig, sd: Sides) -> bool:
    """Whether main's run stands for the candidate's in another regime: the candidate changes only regime keys of
    serving.json (``regime_only``, read from the commits), and what the sides' workers read from their worktrees
    agrees (a checkout filter could make the file differ)."""
    return (
        vc.kind == "vllm"
        and regime_only(ws.repo_dir, sd.commits[BASELINE], sd.commits[CANDIDATE])
        and regimes_mod.apart_from_regime(*(_serving_of(sd.worktrees[s]) for s in (BASELINE, CANDIDATE)))
    )


def _languages(
    public: list[corpus_mod.Prompt], base: Mapping, cand: Mapping, tie: float, paths: tuple[str, ...]
) -> dict[str, dict[str, Any]]:
    """Per language of the public prompts: each path's statistics, the candidate against the baseline."""
    languages: dict[str, dict[str, Any]] = {}
    for lang in sorted({p.lang for p in public}):
        ids = [p.id for p in public if p.lang == lang]
        languages[lang] = {path: st.summary() for path, st in compare(base, cand, ids, tie, paths).items()}
    return languages


def run_verify(
    ws: Workspace, config: Config, sd: Sides, say: Say | None = None, public_only: bool = False
) -> VerifyResult:
    """Collect both sides' logprobs (each in its own sandbox) and judge them. Raises LogprobError on failure.

    The prompts are an input both sides read; each side's dumps go to its own output directory,
    so the candidate never runs where the baseline's dumps are. ``public_only``: the held-out prompts
    are not even written for the sides (the agent workbench's advisory ``check_outputs``), no kept
    baseline dumps are read or marked, and kept reference and main runs are read but never written or evicted."""
    t0 = time.perf_counter()
    vc = config.verify
    assert vc is not None
    say = say or (lambda s, d: None)
    p = _write_prompts(ws, config, sd, public_only)
    sampling = vc.kind == "vllm" and vc.sample
    paths = (*PATHS, "sample") if sampling else PATHS
    reference = ws.reference_commit(config, sd.commits[BASELINE])
    main = sd.commits[CANDIDATE] == sd.commits[BASELINE]  # `verify main`: the candidate is main's own code
    regime_base, regimes = _regimes(vc, sd)
    kept = kept_dumps(ws, config, sd.commits[BASELINE]) if vc.reuse_baseline and not public_only else None
    with _side_runners(config, sd, kept, main, say) as runners:
        dumps = _collect(vc, runners, p, sampling, say)
    reused = runners[BASELINE].reused if isinstance(runners.get(BASELINE), baseline_dumps.ReusingRunner) else 0
    tie = DTYPE_FLOOR[vc.dtype]["tie"]
    floor = compare(dumps.base, dumps.base2, [pr.id for pr in p.run], tie, paths)
    reasons = _floor_reasons(floor)
    if kept is not None:
        # kept for the next check only when this one's baseline was self-consistent and its worktree as built
        if reasons or sd.check():
            kept.discard()
        else:
            kept.mark_complete()
    groups = (("public", p.public), ("holdout", p.hold))[: 1 if public_only else 2]
    sets, set_reasons, positions = _judge_sets(
        dumps.base, dumps.cand, groups, paths, floor, vc.mode, dict(vc.caps), vc.dtype
    )
    reasons += set_reasons
    draw_stats, draw_reasons = _judge_draws(dumps.draws)
    reasons += draw_reasons
    shared = _shares_main_run(ws, vc, sd)
    against = _Against(ws, config, sd, reference, regimes, regime_base, main, say, keep=not public_only, shared=shared)
    ref_info, ref_reasons, main_reasons = against.judge(
        dumps.base, dumps.cand, groups, paths, floor, p.ordered, dumps.sample_prompts, candidate_failed=bool(reasons)
    )
    blame = ("main" if main_reasons else "candidate") if (reasons or ref_reasons) else ""
    reasons = [*main_reasons, *reasons, *ref_reasons]
    return VerifyResult(
        verdict="fail" if reasons else "pass",
        reasons=tuple(reasons),
        sets=sets,
        languages=_languages(p.public, dumps.base, dumps.cand, tie, paths),
        floor={path: st.summary() for path, st in floor.items()},
        holdout_size=len(p.hold),
        public_size=len(p.public),
        mode=vc.mode,
        wall_s=time.perf_counter() - t0,
        positions=positions,
        draws=draw_stats,
        corpus_size=len(p.every),
        baseline_reused=reused,
        reference=ref_info,
        blame=blame,
    )


def _judge_sets(
    a: Mapping,
    b: Mapping,
    groups: Any,
    paths: tuple[str, ...],
    floor: Mapping[str, PathStats],
    mode: str,
    caps: dict[str, Any],
    dtype: str,
) -> tuple[dict[str, dict[str, Any]], list[str], dict[str, list[float]]]:
    """(per set and path: passed and statistics; the reasons, "<set> <path>: ..."; per-position KL of the public
    set)."""
    tie = DTYPE_FLOOR[dtype]["tie"]
    sets: dict[str, dict[str, Any]] = {}
    reasons: list[str] = []
    positions: dict[str, list[float]] = {}
    for set_name, group in groups:
        stats = compare(a, b, [p.id for p in group], tie, paths)
        sets[set_name] = {}
        for path, st in stats.items():
            v = judge_path(path, st, floor[path], mode, dtype, caps)
            sets[set_name][path] = {"passed": v.passed, **v.stats}
            reasons += [f"{set_name} {r}" for r in v.reasons]
            if set_name == "public":
                positions[path] = list(st.kl)
    return sets, reasons, positions


@dataclass(frozen=True)
class _Runs:
    """One regime's runs (the same dict where one run stands for another: identity says which)."""

    reference: dict
    main: dict
    candidate: dict


@dataclass(frozen=True)
class _Basis:
    """What every regime's comparison is judged on: the check's own runs, its prompt groups, the paths compared,
    the noise floor, and whether the check's own comparison failed."""

    base: dict
    cand: dict
    groups: Any
    paths: tuple[str, ...]
    floor: Mapping[str, PathStats]
    candidate_failed: bool


@dataclass(frozen=True)
class _RegimeOutcome:
    """One regime's comparisons: the candidate's row, its reasons and, where the candidate failed, main's row against
    the reference and the blame (main is the cause, main's reason)."""

    row: RegimeComparison
    reasons: tuple[str, ...]
    main: RegimeComparison | None = None
    blamed: tuple[bool, str] | None = None


def _cut(why: list[str], n: int = 3) -> str:
    return "; ".join(why[:n]) + (f" (+{len(why) - n} more)" if len(why) > n else "")


class _Against:
    """The candidate against the pinned reference, in each regime the check covers (its own first, then those
    production uses and the old one), judged with the drift budget; and, where the candidate fails, main against
    the reference in the same regime: when main fails there too, main is named (the blame is not the proposal's).

    The reference's and main's runs are kept in the house per (commit, regime) (``_Trusted``): a proposal pays for a
    reference engine only in a regime no earlier check ran. While the reference is the baseline itself and the
    regime the baseline's own, the baseline's dumps are the reference's (the same computation)."""

    def __init__(
        self,
        ws: Workspace,
        config: Config,
        sd: Sides,
        reference: str,
        regimes: list[regimes_mod.Regime],
        regime_base: regimes_mod.Regime,
        main: bool,
        say: Say,
        keep: bool = True,
        shared: bool = False,
    ):
        self.ws, self.config, self.sd, self.reference, self.regimes = ws, config, sd, reference, regimes
        self.regime_base, self.main, self.say, self.keep = regime_base, main, say, keep
        self.shared = shared  # the candidate changes only regime keys: main's run stands for its run elsewhere
        assert config.verify is not None
        self.vc: VerifyConfig = config.verify

    def _label(self, regime: regimes_mod.Regime) -> str:
        return regimes_mod.describe(regime) if self.vc.kind == "vllm" else "the command's run"

    def judge(
        self,
        base: dict,
        cand: dict,
        groups: Any,
        paths: tuple[str, ...],
        floor: Mapping[str, PathStats],
        ordered: Path,
        sample_prompts: Path | None,
        candidate_failed: bool,
    ) -> tuple[ReferenceCheck, list[str], list[str]]:
        budget = budget_of(self.vc)
        mode, caps, words = budget
        t0 = time.perf_counter()
        outcomes: list[_RegimeOutcome] = []
        ok = False
        with contextlib.ExitStack() as stack:
            trusted = _Trusted(self.ws, self.config, self.sd, self.reference, stack, keep=self.keep)
            try:
                for n, regime in enumerate(self.regimes):
                    own = n == 0
                    runs = self._runs(trusted, regime, n, base, cand, ordered, sample_prompts if own else None)
                    basis = _Basis(base, cand, groups, paths if own else PATHS, floor, candidate_failed)
                    outcomes.append(self._compare(regime, own, runs, basis, budget))
                ok = True
            finally:
                trusted.close(ok)
        blamed = [o.blamed for o in outcomes if o.blamed is not None]
        # main is the cause only where, in every regime the candidate failed, main itself is off the reference and the
        # candidate agrees with main (a change that also moves the outputs is the proposal's, whatever main does)
        main_reasons = [why for _, why in blamed] if blamed and all(cause for cause, _ in blamed) else []
        rows = [o.row for o in outcomes]
        info = ReferenceCheck(
            commit=self.reference,
            budget=words,
            mode=mode,
            caps=dict(caps),
            passed=all(r.passed for r in rows),
            against_main=all(r.against_main for r in rows),
            regimes=tuple(rows),
            main=tuple(o.main for o in outcomes if o.main is not None),
            reused=sum(r.reused for r in trusted.runners.values()),
            collected=sum(r.collected for r in trusted.runners.values()),
            wall_s=round(time.perf_counter() - t0, 3),
        )
        return info, [why for o in outcomes for why in o.reasons], main_reasons

    def _runs(
        self,
        trusted: _Trusted,
        regime: regimes_mod.Regime,
        n: int,
        base: dict,
        cand: dict,
        ordered: Path,
        sample: Path | None,
    ) -> _Runs:
        """The reference's, main's and the candidate's runs in ``regime`` (the ``n``-th; 0: the candidate's own), each
        made only where no run of the check already is that computation."""
        own = n == 0
        label = self._label(regime)
        base_commit = self.sd.commits[BASELINE]
        at_base = regimes_mod.key(regime) == regimes_mod.key(self.regime_base)
        if self.reference == base_commit and at_base:
            ref_r = base
        elif own and self.shared and self.reference == base_commit:
            # the reference is main, and main's code with the candidate's engine arguments is the candidate
            ref_r = cand
            self.say("verify", f"the reference at {label}: the candidate's run (it changes only regime keys)")
        else:
            self.say("verify", f"the reference {self.reference[:10]} at {label}")
            ref_r = self._trusted_run(trusted, REFERENCE, regime, n, ordered, sample)
        if at_base:
            main_r = base
        elif self.reference == base_commit:
            main_r = ref_r  # main is the reference: the same computation
        elif (self.main or self.shared) and own:
            main_r = cand  # main's code in the candidate's regime is the candidate's run
        else:
            self.say("verify", f"main at {label}")
            main_r = self._trusted_run(trusted, BASELINE, regime, n, ordered, sample)
        if own or not (self.main or self.shared):
            cand_r = cand if own else self._candidate_run(regime, n, ordered)
        else:
            cand_r = main_r
            self.say("verify", f"candidate at {label}: main's run (it changes only regime keys)")
        return _Runs(ref_r, main_r, cand_r)

    def _compare(
        self,
        regime: regimes_mod.Regime,
        own: bool,
        runs: _Runs,
        basis: _Basis,
        budget: tuple[str, dict[str, Any], str],
    ) -> _RegimeOutcome:
        """The candidate against the reference (the drift budget) and against main in ``regime``; where it fails, main
        against the reference too (is the cause main's?)."""
        vc, (mode, caps, words) = self.vc, budget
        label = self._label(regime)
        at_base = regimes_mod.key(regime) == regimes_mod.key(self.regime_base)
        ref_r, main_r, cand_r = runs.reference, runs.main, runs.candidate
        g, paths, floor = basis.groups, basis.paths, basis.floor
        # the candidate against the reference: the drift budget
        sets, why_ref, _ = _judge_sets(ref_r, cand_r, g, paths, floor, mode, caps, vc.dtype)
        # the candidate against main in the same regime: the per-change rule, in every regime (the check's own
        # comparison is that already in the baseline's regime)
        if own and at_base:
            why_main = ["the check's own comparison failed"] if basis.candidate_failed else []
        else:
            _, why_main, _ = _judge_sets(main_r, cand_r, g, paths, floor, vc.mode, dict(vc.caps), vc.dtype)
        failed = bool(why_ref or why_main or (own and basis.candidate_failed))
        row = RegimeComparison(
            label,
            not why_ref,
            dict(regime),
            own=own,
            against_main=not why_main,
            sets=sets,
            shared=self.shared and not self.main,
        )
        reasons: list[str] = []
        if why_ref and not (ref_r is basis.base and cand_r is basis.cand and not vc.drift_budget):
            # (where the reference is the baseline, judged alike, the check's own reasons say it)
            reasons.append(
                f"drift budget ({words}) against the reference {self.reference[:10]} at {label}: {_cut(why_ref)}"
            )
        if why_main and not (own and at_base):
            reasons.append(f"against main at {label} ({vc.mode}): {_cut(why_main)}")
        if not failed:
            return _RegimeOutcome(row, tuple(reasons))
        # is main itself off the reference here, and the candidate no further from main than one change may be?
        msets, why_mref, _ = _judge_sets(ref_r, main_r, g, paths, floor, mode, caps, vc.dtype)
        why_b = (
            f"main already diverges from the reference {self.reference[:10]} at {label} ({words}): "
            f"{_cut(why_mref, 2)}" + ("" if self.main else " — not this proposal's change")
        )
        return _RegimeOutcome(
            row,
            tuple(reasons),
            RegimeComparison(label, not why_mref, dict(regime), sets=msets),
            (bool(why_mref) and not why_main, why_b),
        )

    def _trusted_run(
        self,
        trusted: _Trusted,
        who: str,
        regime: regimes_mod.Regime,
        n: int,
        ordered: Path,
        sample_prompts: Path | None,
    ) -> dict:
        vc = self.vc
        runner = trusted.runner(who, regime, n)
        tag = "ref" if who == REFERENCE else "main"
        try:
            dump = dict(runner.run(ordered, trusted.out() / f"{tag}-r{n}.jsonl", vc.k, vc.max_tokens))
            if sample_prompts is not None:
                dump.update(
                    runner.processed(
                        sample_prompts, trusted.out() / f"{tag}-r{n}-sample.jsonl", SAMPLE_SETTINGS, vc.k, vc.max_tokens
                    )
                )
        except ReferenceFailed:
            raise
        except LogprobError as exc:
            if who == REFERENCE:
                raise ReferenceFailed(f"the reference {self.reference[:10]} at {self._label(regime)}: {exc}") from None
            raise LogprobError(f"main at {self._label(regime)}: {exc}") from None
        return dump

    def _candidate_run(self, regime: regimes_mod.Regime, n: int, ordered: Path) -> dict:
        vc, sd = self.vc, self.sd
        self.say("verify", f"candidate at {self._label(regime)}")
        runner = _runner(
            vc,
            self.config,
            sd.worktrees[CANDIDATE],
            sd.logs / f"logprobs-{sd.label(CANDIDATE)}-r{n}.log",
            sd.out(CANDIDATE),
            CANDIDATE,
            regime,
        )
        try:
            return runner.run(ordered, sd.out(CANDIDATE) / "verify" / f"cand-r{n}.jsonl", vc.k, vc.max_tokens)
        except LogprobError as exc:
            raise LogprobError(f"{CANDIDATE} at {self._label(regime)}: {exc}") from None
        finally:
            runner.close()


def verify(ws: Workspace, ref: str, say: Say | None = None) -> VerifyResult:
    """``agentsearch verify REF``: both sides checked out with the baseline's config (a REF that touches a
    protected path is refused before anything is checked out), each in its own sandbox."""
    from .sides import built_sides

    config = ws.config()
    if config.verify is None:
        raise AgentsearchError("the target has no [verify] section; add one (see docs/reference/config.md)")
    base, cand = ws.baseline_commit(), ws.resolve(ref)
    tag = f"verify-{cand[:10]}-{secrets.randbelow(100000):05d}"
    with built_sides(ws, config, {BASELINE: base, CANDIDATE: cand}, tag, "verify") as sd:
        try:
            res = run_verify(ws, config, sd, say)
        except LogprobError as exc:
            return VerifyResult(
                "fail", (f"logprob collection failed: {exc}",), {}, {}, {}, 0, 0, config.verify.mode, 0.0
            )
        moved = sd.check()
        if moved:
            return dataclasses.replace(res, verdict="fail", reasons=(*res.reasons, moved))
        return res


def verify_public(ws: Workspace, config: Config, base: str, cand: str, say: Say | None = None) -> VerifyResult:
    """The distribution check of ``cand`` against ``base`` on the public prompts only (advice for an agent:
    the held-out prompts never reach a side it controls)."""
    from .sides import built_sides

    assert config.verify is not None
    tag = f"wb-verify-{cand[:10]}-{secrets.randbelow(100000):05d}"
    with built_sides(ws, config, {BASELINE: base, CANDIDATE: cand}, tag, "check_outputs") as sd:
        try:
            res = run_verify(ws, config, sd, say, public_only=True)
        except LogprobError as exc:
            return VerifyResult(
                "fail", (f"logprob collection failed: {exc}",), {}, {}, {}, 0, 0, config.verify.mode, 0.0
            )
        moved = sd.check()
        return dataclasses.replace(res, verdict="fail", reasons=(*res.reasons, moved)) if moved else res


__all__ = ["ReferenceFailed", "VerifyResult", "run_verify", "verify", "verify_public", "holdout_secret", "PathStats"]

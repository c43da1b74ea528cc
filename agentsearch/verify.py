"""Distribution checks of a candidate against the baseline: public corpus and hidden holdout.

Runs the baseline twice (corpus order, then shuffled: a different batch composition and order —
the noise floor) and the candidate once, compares per path (prefill, decode and, with the vLLM
worker, sample: the sampler's processed logprobs under several sampling settings), per set
(public, holdout) and per language, and passes only if every path passes on both sets. With the
vLLM worker a paired draw test (same seeds on both sides) checks the sampler's use of its random
numbers end to end.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from harness import corpus as corpus_mod
from harness import environment, models
from harness.distribution import DTYPE_FLOOR, PathStats, compare, judge_draws, judge_path
from harness import lengths as lengths_mod
from harness.logprobs import CommandLogprobs, LogprobError, VllmLogprobs, decode_lengths, write_prompts, write_sample_prompts
from harness.trials import BASELINE, CANDIDATE

from . import __version__, baseline_dumps
from .config import Config, VerifyConfig
from .errors import AgentsearchError
from .workloads import placement_for
from .workspace import Workspace

if TYPE_CHECKING:
    from .sides import Sides

# 2: the sample path is processed logprobs per set (public/holdout "sample"), the draw test is "draws";
# every path has kl_mean_se, kl_percentiles, dp_rms, same_top_pct (version 1 records still load: the
# report shows what they have)
VERIFY_SCHEMA = 2
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
    schema_version: int = VERIFY_SCHEMA

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version, "verdict": self.verdict, "reasons": list(self.reasons),
            "mode": self.mode, "public": self.sets.get("public"), "holdout": self.sets.get("holdout"),
            "draws": self.draws or None, "holdout_size": self.holdout_size, "public_size": self.public_size,
            "corpus_size": self.corpus_size, "languages": self.languages, "noise_floor": self.floor, "wall_s": round(self.wall_s, 3),
            "baseline_reused": self.baseline_reused,
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
    outs = [int(w.params.get("output_len", 64)) for w in config.workloads if w.kind.startswith("vllm-")]
    return min(LONGEST_DECODE, int(2 * max(lengths_mod.SCALES) * max(outs))) if outs else 0


def _runner_spec(vc: VerifyConfig, config: Config, side: str) -> tuple[dict[str, Any], dict[str, str]]:
    """(the vLLM logprob worker's spec, its environment); the spec is empty for a command."""
    env = dict(config.target.env)
    if vc.kind == "command":
        return {}, env
    model = models.resolve(vc.model)
    # processed logprobs: what the sampler draws from (greedy requests without penalties get the raw ones)
    engine = {"enforce_eager": True, "max_model_len": 2048, "seed": 0, "dtype": vc.dtype, **vc.engine, "logprobs_mode": "processed_logprobs"}
    engine, device = placement_for(config).logprob_engine(side, engine)  # on a GPU: the side's device, its memory share
    env.update(device)
    return {"kind": "vllm-logprobs", "model": model, "engine": engine}, env


def _runner(vc: VerifyConfig, config: Config, worktree: Path, log: Path, out_root: Path, side: str = BASELINE):
    spec, env = _runner_spec(vc, config, side)
    if vc.kind == "command":
        assert vc.logprobs
        return CommandLogprobs(vc.logprobs, worktree, env, vc.timeout_s, out_root)
    return VllmLogprobs(spec, worktree, env, log, vc.timeout_s, out_root)


def kept_dumps(ws: Workspace, config: Config, commit: str) -> baseline_dumps.BaselineDumps:
    """Where the baseline's dumps for ``commit`` under this config and machine are kept."""
    vc = config.verify
    assert vc is not None
    spec, env = _runner_spec(vc, config, BASELINE)
    key = baseline_dumps.baseline_key({
        "commit": commit, "verify": dataclasses.asdict(vc), "spec": spec, "env": env, "install": config.target.install,
        "overlay_from": config.target.overlay_from, "build": config.target.build, "model": baseline_dumps.model_digest(spec.get("model")),
        "environment": environment.fingerprint(), "code": baseline_dumps.code_digest(), "version": __version__,
    })
    return baseline_dumps.BaselineDumps(ws.state / baseline_dumps.CACHE_DIR, key)


def run_verify(ws: Workspace, config: Config, sd: "Sides", say: Callable[[str, str], None] | None = None,
               public_only: bool = False) -> VerifyResult:
    """Collect both sides' logprobs (each in its own sandbox) and judge them. Raises LogprobError on failure.

    The prompts are an input both sides read; each side's dumps go to its own output directory,
    so the candidate never runs where the baseline's dumps are. ``public_only``: the held-out prompts
    are not even written for the sides (the agent workbench's advisory ``check_outputs``), and no kept
    baseline dumps are read or marked."""
    t0 = time.perf_counter()
    vc = config.verify
    assert vc is not None
    say = say or (lambda s, d: None)
    worktrees = sd.worktrees
    every = load_prompts(vc, worktrees[BASELINE])
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
    sampling = vc.kind == "vllm" and vc.sample
    paths = (*PATHS, "sample") if sampling else PATHS
    runners: dict[str, Any] = {}
    draws: list[dict] | None = None
    kept = kept_dumps(ws, config, sd.commits[BASELINE]) if vc.reuse_baseline and not public_only else None
    try:
        for side in (BASELINE, CANDIDATE):
            def make(side: str = side) -> Any:
                return _runner(vc, config, worktrees[side], sd.logs / f"logprobs-{side}.log", sd.out(side), side)

            if side == BASELINE and kept is not None:
                runners[side] = baseline_dumps.ReusingRunner(make, kept, sd.out(side), eager=not kept.complete)
                if kept.complete:
                    say("verify", f"the baseline's dumps are kept from an earlier check of {sd.commits[BASELINE][:10]}: its engine is not started")
            else:
                runners[side] = make()

        def collect(side: str, what: str, fn: Callable[[], dict]) -> dict:
            say("verify", what)
            try:
                return fn()
            except LogprobError as exc:
                raise LogprobError(f"{side}: {exc}") from None

        def logprobs(side: str, prompts_file: Path, out: str) -> Callable[[], dict]:
            return lambda: runners[side].run(prompts_file, outs[side] / out, vc.k, vc.max_tokens)

        base = collect(BASELINE, f"baseline logprobs for {len(prompts)} prompts", logprobs(BASELINE, ordered, "base.jsonl"))
        base2 = collect(BASELINE, "baseline again, shuffled (noise floor)", logprobs(BASELINE, shuffled, "base-shuffled.jsonl"))
        cand = collect(CANDIDATE, "candidate logprobs", logprobs(CANDIDATE, ordered, "cand.jsonl"))
        if sampling:
            s_ordered = write_sample_prompts(inputs / "sample.jsonl", prompts, len(SAMPLE_SETTINGS), lengths=lengths)
            s_shuffled = write_sample_prompts(inputs / "sample-shuffled.jsonl", prompts, len(SAMPLE_SETTINGS), shuffle_seed=shuffle_seed,
                                              lengths=lengths)

            def processed(side: str, prompts_file: Path, out: str) -> Callable[[], dict]:
                return lambda: runners[side].processed(prompts_file, outs[side] / out, SAMPLE_SETTINGS, vc.k, vc.max_tokens)

            base.update(collect(BASELINE, "sample path: baseline processed logprobs", processed(BASELINE, s_ordered, "sample-base.jsonl")))
            base2.update(collect(BASELINE, "sample path: baseline again, shuffled", processed(BASELINE, s_shuffled, "sample-base-shuffled.jsonl")))
            cand.update(collect(CANDIDATE, "sample path: candidate processed logprobs", processed(CANDIDATE, s_ordered, "sample-cand.jsonl")))
        if sampling and vc.sample_draws:
            first_of_lang: dict[str, corpus_mod.Prompt] = {}
            for p in public:
                first_of_lang.setdefault(p.lang, p)
            contexts = sorted(first_of_lang.values(), key=lambda p: len(p.text))[: vc.sample_contexts]
            ctx = write_prompts(inputs / "draw-contexts.jsonl", contexts)
            ctx_shuffled = write_prompts(inputs / "draw-contexts-shuffled.jsonl", contexts[::-1])
            n = vc.sample_draws
            unrelated_seed = DRAW_SEED + n * len(DRAW_SETTINGS)  # past every seed of the paired runs

            def drawn(side: str, file: Path, seed: int, out: str) -> Callable[[], dict]:
                return lambda: runners[side].samples(file, outs[side] / out, DRAW_SETTINGS, n, seed)

            draws = [
                collect(BASELINE, "draw test: baseline", drawn(BASELINE, ctx, DRAW_SEED, "draws-base.jsonl")),
                collect(BASELINE, "draw test: baseline again, same seeds, another batch (noise floor)",
                        drawn(BASELINE, ctx_shuffled, DRAW_SEED, "draws-floor.jsonl")),
                collect(BASELINE, "draw test: baseline with unrelated seeds", drawn(BASELINE, ctx, unrelated_seed, "draws-unrelated.jsonl")),
                collect(CANDIDATE, "draw test: candidate, same seeds", drawn(CANDIDATE, ctx, DRAW_SEED, "draws-cand.jsonl")),
            ]
    finally:
        for r in runners.values():
            r.close()
    reused = runners[BASELINE].reused if isinstance(runners.get(BASELINE), baseline_dumps.ReusingRunner) else 0
    tie = DTYPE_FLOOR[vc.dtype]["tie"]
    floor = compare(base, base2, [p.id for p in prompts], tie, paths)
    reasons: list[str] = []
    for name, st in floor.items():
        if st.missing or st.dropped or st.token_mismatch or st.bad_divergences:
            reasons.append(f"noise floor: the baseline is not self-consistent on {name} (missing {len(st.missing) + len(st.dropped)}, "
                           f"token mismatches {len(st.token_mismatch)}, divergences {len(st.bad_divergences)})")
    if kept is not None:
        # kept for the next check only when this one's baseline was self-consistent and its worktree as built
        if reasons or sd.check():
            kept.discard()
        else:
            kept.mark_complete()
    sets: dict[str, dict[str, Any]] = {}
    positions: dict[str, list[float]] = {}
    for set_name, group in (("public", public), ("holdout", hold))[:1 if public_only else 2]:
        stats = compare(base, cand, [p.id for p in group], tie, paths)
        sets[set_name] = {}
        for path, st in stats.items():
            v = judge_path(path, st, floor[path], vc.mode, vc.dtype, dict(vc.caps))
            sets[set_name][path] = {"passed": v.passed, **v.stats}
            reasons += [f"{set_name} {r}" for r in v.reasons]
            if set_name == "public":
                positions[path] = list(st.kl)
    draw_stats: dict[str, Any] = {}
    if draws is not None:
        dv = judge_draws(*draws)
        draw_stats = {"passed": dv.passed, **dv.stats}
        reasons += list(dv.reasons)
    languages: dict[str, dict[str, Any]] = {}
    for lang in sorted({p.lang for p in public}):
        ids = [p.id for p in public if p.lang == lang]
        languages[lang] = {path: st.summary() for path, st in compare(base, cand, ids, tie, paths).items()}
    return VerifyResult(
        verdict="fail" if reasons else "pass", reasons=tuple(reasons), sets=sets, languages=languages,
        floor={path: st.summary() for path, st in floor.items()}, holdout_size=len(hold), public_size=len(public),
        mode=vc.mode, wall_s=time.perf_counter() - t0, positions=positions, draws=draw_stats, corpus_size=len(every),
        baseline_reused=reused,
    )


def verify(ws: Workspace, ref: str, say: Callable[[str, str], None] | None = None) -> VerifyResult:
    """``agentsearch verify REF``: both sides checked out with the baseline's config (a REF that touches a
    protected path is refused before anything is checked out), each in its own sandbox."""
    from .sides import built_sides

    config = ws.config()
    if config.verify is None:
        raise AgentsearchError("the target has no [verify] section; add one (see the README's config reference)")
    base, cand = ws.baseline_commit(), ws.resolve(ref)
    tag = f"verify-{cand[:10]}-{secrets.randbelow(100000):05d}"
    with built_sides(ws, config, {BASELINE: base, CANDIDATE: cand}, tag, "verify") as sd:
        try:
            res = run_verify(ws, config, sd, say)
        except LogprobError as exc:
            return VerifyResult("fail", (f"logprob collection failed: {exc}",), {}, {}, {}, 0, 0, config.verify.mode, 0.0)
        moved = sd.check()
        if moved:
            return dataclasses.replace(res, verdict="fail", reasons=(*res.reasons, moved))
        return res


def verify_public(ws: Workspace, config: Config, base: str, cand: str, say: Callable[[str, str], None] | None = None) -> VerifyResult:
    """The distribution check of ``cand`` against ``base`` on the public prompts only (advice for an agent:
    the held-out prompts never reach a side it controls)."""
    from .sides import built_sides

    assert config.verify is not None
    tag = f"wb-verify-{cand[:10]}-{secrets.randbelow(100000):05d}"
    with built_sides(ws, config, {BASELINE: base, CANDIDATE: cand}, tag, "check_outputs") as sd:
        try:
            res = run_verify(ws, config, sd, say, public_only=True)
        except LogprobError as exc:
            return VerifyResult("fail", (f"logprob collection failed: {exc}",), {}, {}, {}, 0, 0, config.verify.mode, 0.0)
        moved = sd.check()
        return dataclasses.replace(res, verdict="fail", reasons=(*res.reasons, moved)) if moved else res


__all__ = ["VerifyResult", "run_verify", "verify", "verify_public", "holdout_secret", "PathStats"]

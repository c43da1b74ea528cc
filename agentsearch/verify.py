"""Distribution checks of a candidate against the baseline: public corpus and hidden holdout.

Runs the baseline twice (corpus order, then shuffled: a different batch composition and order —
the noise floor) and the candidate once, compares per path (prefill, decode), per set
(public, holdout) and per language, and passes only if every path passes on both sets.
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
from harness import tiny_model
from harness.distribution import DTYPE_FLOOR, PathStats, compare, judge_path, judge_samples
from harness.logprobs import CommandLogprobs, LogprobError, VllmLogprobs, write_prompts
from harness.trials import BASELINE, CANDIDATE

from .config import Config, VerifyConfig
from .errors import AgentsearchError
from .workspace import Workspace

if TYPE_CHECKING:
    from .sides import Sides

VERIFY_SCHEMA = 1
SECRET_FILE = "holdout.key"
PATHS = ("prefill", "decode")
# sampling settings of the sample path: the sampler's temperature, top-k and top-p processing
SAMPLE_SETTINGS = [{"temperature": 0.7, "top_p": 0.8}, {"temperature": 1.0, "top_k": 40, "top_p": 0.9}]


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
    schema_version: int = VERIFY_SCHEMA

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version, "verdict": self.verdict, "reasons": list(self.reasons),
            "mode": self.mode, "public": self.sets.get("public"), "holdout": self.sets.get("holdout"),
            "sample": (self.sets.get("sample") or {}).get("sample"),
            "holdout_size": self.holdout_size, "public_size": self.public_size, "languages": self.languages,
            "noise_floor": self.floor, "wall_s": round(self.wall_s, 3),
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


def _runner(vc: VerifyConfig, config: Config, worktree: Path, log: Path, out_root: Path):
    env = dict(config.target.env)
    if vc.kind == "command":
        assert vc.logprobs
        return CommandLogprobs(vc.logprobs, worktree, env, vc.timeout_s, out_root)
    model = str(tiny_model.ensure_in_child()) if vc.model == "tiny" else vc.model
    engine = {"enforce_eager": True, "max_model_len": 2048, "seed": 0, "dtype": vc.dtype, **vc.engine}
    return VllmLogprobs({"kind": "vllm-logprobs", "model": model, "engine": engine}, worktree, env, log, vc.timeout_s, out_root)


def run_verify(ws: Workspace, config: Config, sd: "Sides", say: Callable[[str, str], None] | None = None) -> VerifyResult:
    """Collect both sides' logprobs (each in its own sandbox) and judge them. Raises LogprobError on failure.

    The prompts are an input both sides read; each side's dumps go to its own output directory,
    so the candidate never runs where the baseline's dumps are."""
    t0 = time.perf_counter()
    vc = config.verify
    assert vc is not None
    say = say or (lambda s, d: None)
    worktrees = sd.worktrees
    prompts = load_prompts(vc, worktrees[BASELINE])
    secret = holdout_secret(ws)
    public, hold = corpus_mod.split(prompts, secret, vc.holdout)
    inputs = sd.inputs / "verify"
    for side in (BASELINE, CANDIDATE):
        sd.fresh_outputs(side)  # nothing the timed trials left is there for the logprob runs
    outs = {side: sd.out(side) / "verify" for side in (BASELINE, CANDIDATE)}
    for d in (inputs, sd.logs, *outs.values()):
        d.mkdir(parents=True, exist_ok=True)
    ordered = write_prompts(inputs / "prompts.jsonl", prompts)
    shuffled = write_prompts(inputs / "prompts-shuffled.jsonl", prompts, shuffle_seed=int.from_bytes(secret[:4], "big"))
    runners = {}
    try:
        for side in (BASELINE, CANDIDATE):
            runners[side] = _runner(vc, config, worktrees[side], sd.logs / f"logprobs-{side}.log", sd.out(side))
        def collect(side: str, prompts_file: Path, out: str, what: str):
            say("verify", what)
            try:
                return runners[side].run(prompts_file, outs[side] / out, vc.k, vc.max_tokens)
            except LogprobError as exc:
                raise LogprobError(f"{side}: {exc}") from None

        base = collect(BASELINE, ordered, "base.jsonl", f"baseline logprobs for {len(prompts)} prompts")
        base2 = collect(BASELINE, shuffled, "base-shuffled.jsonl", "baseline again, shuffled (noise floor)")
        cand = collect(CANDIDATE, ordered, "cand.jsonl", "candidate logprobs")
        samples = None
        if vc.kind == "vllm" and vc.sample_draws:
            first_of_lang: dict[str, corpus_mod.Prompt] = {}
            for p in public:
                first_of_lang.setdefault(p.lang, p)
            contexts = list(first_of_lang.values())[: vc.sample_contexts]
            ctx_file = write_prompts(inputs / "sample-contexts.jsonl", contexts)
            draws = []
            for side, seed, name in ((BASELINE, 11, "sample-base-a.jsonl"), (BASELINE, 22, "sample-base-b.jsonl"), (CANDIDATE, 11, "sample-cand.jsonl")):
                say("verify", f"sample path: {side} draws (seed {seed})")
                try:
                    draws.append(runners[side].samples(ctx_file, outs[side] / name, SAMPLE_SETTINGS, vc.sample_draws, seed, len(contexts)))
                except LogprobError as exc:
                    raise LogprobError(f"{side}: {exc}") from None
            samples = draws
    finally:
        for r in runners.values():
            r.close()
    tie = DTYPE_FLOOR[vc.dtype]["tie"]
    floor = compare(base, base2, [p.id for p in prompts], tie, PATHS)
    reasons: list[str] = []
    for name, st in floor.items():
        if st.missing or st.token_mismatch or st.bad_divergences:
            reasons.append(f"noise floor: the baseline is not self-consistent on {name} (missing {len(st.missing)}, "
                           f"token mismatches {len(st.token_mismatch)}, divergences {len(st.bad_divergences)})")
    sets: dict[str, dict[str, Any]] = {}
    positions: dict[str, list[float]] = {}
    for set_name, group in (("public", public), ("holdout", hold)):
        stats = compare(base, cand, [p.id for p in group], tie, PATHS)
        sets[set_name] = {}
        for path, st in stats.items():
            v = judge_path(path, st, floor[path], vc.mode, vc.dtype, dict(vc.caps))
            sets[set_name][path] = {"passed": v.passed, **v.stats}
            reasons += [f"{set_name} {r}" for r in v.reasons]
            if set_name == "public":
                positions[path] = list(st.kl)
    sample_dumps = samples if samples is not None else (base, base2, cand)
    sv = judge_samples(*sample_dumps)
    if sv.stats.get("contexts"):
        sets["sample"] = {"sample": {"passed": sv.passed, **sv.stats}}
        reasons += list(sv.reasons)
    languages: dict[str, dict[str, Any]] = {}
    for lang in sorted({p.lang for p in public}):
        ids = [p.id for p in public if p.lang == lang]
        languages[lang] = {path: st.summary() for path, st in compare(base, cand, ids, tie, PATHS).items()}
    return VerifyResult(
        verdict="fail" if reasons else "pass", reasons=tuple(reasons), sets=sets, languages=languages,
        floor={path: st.summary() for path, st in floor.items()}, holdout_size=len(hold), public_size=len(public),
        mode=vc.mode, wall_s=time.perf_counter() - t0, positions=positions,
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


__all__ = ["VerifyResult", "run_verify", "verify", "holdout_secret", "PathStats"]

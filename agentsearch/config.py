"""agentsearch.toml: frozen dataclasses with a default and a doc on every field.

The file lives at the root of the target's baseline branch and is always protected.
``load_config_text`` validates every key and type and raises ``ConfigError`` with one
line naming the file, the key and what is expected.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import hashlib
import json
import math
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from harness import gate_defaults as D
from harness import models, quiet, serving_load, tails
from harness import placement as P
from harness import regimes as regimes_mod
from harness.regimes import REGIME_KEYS
from history.records import CATEGORIES

from .errors import ConfigError
from .globs import normalize as normalize_glob

CONFIG_FILE = "agentsearch.toml"
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class WorkloadKind:
    """What one kind of workload is: the one place for everything that differs between kinds. A new kind is a row of
    ``WORKLOAD_KINDS`` (and, for an engine kind, the worker's mode of the same name in harness/workers)."""

    name: str
    about: str  # for people (docs, errors)
    engine: bool  # runs in a vLLM engine kept warm over a session of trials (restarts, placement, warm-up, start-up)
    serving: bool = False  # an OpenAI-compatible server under the open-loop load generator (SLOs, traces)
    profilable: bool = False  # `agentsearch profile` can rank where its time goes
    outputs: str = "tokens"  # the outputs check: the sides' generated "tokens", or the command's reported "digest"

    def sessions(self, restarts: int) -> int:
        """Engine sessions per side per evaluation: an engine kind restarts ``restarts`` times; a command's trials
        are fresh processes already."""
        return restarts if self.engine else 1


WORKLOAD_KINDS: dict[str, WorkloadKind] = {
    k.name: k
    for k in (
        WorkloadKind(
            "command", "your command, a fresh process per trial, printing JSON", engine=False, outputs="digest"
        ),
        WorkloadKind("vllm-throughput", "offline generation throughput in a warm engine", engine=True, profilable=True),
        WorkloadKind("vllm-latency", "batch latency in a warm engine", engine=True, profilable=True),
        WorkloadKind("vllm-serve", "an OpenAI-compatible server under open-loop load", engine=True, serving=True),
    )
}
INSTALL_MODES = ("none", "overlay", "command")
VERIFY_MODES = ("exact", "tight", "approx")
# models `agentsearch model NAME` builds offline: a workload or [verify] may name one instead of a
# directory (the one place their names are listed; the preflight refuses any other non-directory)
BUILT_IN_MODELS = models.BUILT_IN
# [verify] profile -> prompts of the corpus checked (0: all of them), chosen evenly from every language
VERIFY_PROFILES = {"full": 0, "quick": 56}


def doc(text: str, default: Any = dataclasses.MISSING, factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field with its documentation attached (shown in the generated config reference,
    docs/reference/config.md, and in errors)."""
    if factory is not dataclasses.MISSING:
        return field(default_factory=factory, metadata={"doc": text})
    if default is dataclasses.MISSING:
        return field(metadata={"doc": text})
    return field(default=default, metadata={"doc": text})


@dataclass(frozen=True)
class TargetConfig:
    baseline: str = doc("Canonical baseline branch; merges advance it.", "main")
    protected: tuple[str, ...] = doc(
        "Globs (`*`, `**`, `?`) no proposal may touch; agentsearch.toml is always protected.", ()
    )
    env: Mapping[str, str] = doc("Environment variables set for every trial.", factory=dict)
    install: str = doc("How a worktree becomes runnable: none | overlay | command.", "none")
    build: str | None = doc("Build command run in the worktree when install = \"command\".", None)
    overlay_from: str | None = doc(
        "For install = \"overlay\": directory whose compiled files (*.so) are linked into each worktree.",
        None,
    )
    test: str | None = doc(
        "Functional tests: a command run in the candidate's worktree (sandboxed) before any measurement; a non-zero "
        "exit rejects.",
        None,
    )
    test_timeout_s: float = doc("Timeout of the functional tests in seconds.", 900.0)

    def __post_init__(self) -> None:
        if self.install not in INSTALL_MODES:
            raise ValueError(f"expected one of {', '.join(INSTALL_MODES)}, got {self.install!r}|install")
        if self.install == "command" and not self.build:
            raise ValueError("install = \"command\" needs a build command|build")
        if self.install == "overlay" and not self.overlay_from:
            raise ValueError("install = \"overlay\" needs overlay_from|overlay_from")
        _check_seconds(self.test_timeout_s, "test_timeout_s")
        globs = []
        for pattern in self.protected:
            try:
                globs.append(normalize_glob(pattern))
            except ValueError as exc:
                raise ValueError(f"{exc}|protected") from None
        object.__setattr__(self, "protected", tuple(dict.fromkeys(globs)))


@dataclass(frozen=True)
class WorkloadConfig:
    name: str = doc("Unique workload name.")
    metric: str = doc("Key of the metric in the workload's JSON output that the gate judges.")
    kind: str = doc("; ".join(f"{k.name}: {k.about}" for k in WORKLOAD_KINDS.values()) + ".", "command")
    command: str | None = doc(
        "Shell command for kind = \"command\"; `{worktree}`, `{seed}`, `{out}` are substituted.", None
    )
    higher_is_better: bool = doc("True for throughput-like metrics, false for latencies.", True)
    unit: str | None = doc(
        "Unit of the metric in verdicts and reports (default: from its name: tok/s, req/s, ms, s, ops/s).", None
    )
    timeout_s: float = doc("Per-trial timeout in seconds; a timeout fails the evaluation.", 600.0)
    env: Mapping[str, str] = doc("Extra environment for this workload's trials.", factory=dict)
    model: str = doc(
        "vLLM kinds: model directory, or \"tiny\" / \"smollm2\" for a model built offline (`agentsearch model`).",
        "tiny",
    )
    engine: Mapping[str, Any] = doc(
        "vLLM kinds: engine arguments (max_num_seqs, block_size, enforce_eager, dtype, ...); the fork's serving.json "
        "overrides them.",
        factory=dict,
    )
    params: Mapping[str, Any] = doc(
        "vLLM kinds: workload parameters (prompts, input_len, output_len, length_dist, batch_size, iterations, "
        "max_concurrency, request_rate).",
        factory=dict,
    )
    restarts: int = doc(
        "vLLM kinds: engine starts per side per evaluation (second level of replication). 4: each proposal's "
        "engine-session effect is estimated on 3 degrees of freedom; with 2 (one) simulated false merges exceed the "
        "level under the instance effects measured here.",
        4,
    )
    max_pairs: int | None = doc(
        "Pairs for this workload at most (default: [gate] max_pairs); useful for slow guards.", None
    )
    startup_timeout_s: float = doc("vLLM kinds: timeout of one engine start-up in seconds.", 600.0)
    outputs: str | None = doc(
        "Command workloads: a key of the output JSON holding a digest of what the run computed (e.g. a hash of its "
        "results); both sides must report the same value for the same seed, or the trial fails (vLLM kinds compare "
        "their generated tokens always).",
        None,
    )

    @property
    def spec(self) -> WorkloadKind:
        """What this workload's kind is (validated on load)."""
        return WORKLOAD_KINDS[self.kind]

    def __post_init__(self) -> None:
        if self.outputs is not None and (not self.outputs or self.outputs == self.metric):
            raise ValueError(f"expected a key other than the metric, got {self.outputs!r}|outputs")
        if self.restarts < 1:
            raise ValueError(f"expected an integer >= 1, got {self.restarts}|restarts")
        if self.max_pairs is not None and self.max_pairs < 2:
            raise ValueError(f"expected an integer >= 2, got {self.max_pairs}|max_pairs")
        if self.kind not in WORKLOAD_KINDS:
            raise ValueError(f"expected one of {', '.join(WORKLOAD_KINDS)}, got {self.kind!r}|kind")
        if not self.spec.engine and not self.command:
            raise ValueError("a command workload needs `command`|command")
        if not self.name or any(c in self.name for c in "/ \t"):
            raise ValueError(f"expected a name without spaces or '/', got {self.name!r}|name")
        _check_seconds(self.timeout_s, "timeout_s")
        _check_seconds(self.startup_timeout_s, "startup_timeout_s")
        if self.spec.serving:
            try:
                serving_load.check_params(self.params, self.metric, timeout_s=self.timeout_s)
            except ValueError as exc:
                raise ValueError(f"{exc}|{'metric' if 'metric' in str(exc) else 'params'}") from None
            mml = self.engine.get("max_model_len")
            if mml is not None and (not isinstance(mml, int) or isinstance(mml, bool) or not 0 < mml <= 1 << 24):
                raise ValueError(
                    "max_model_len must be a positive integer here (the serving load is planned for it), got "
                    f"{mml!r}|engine"
                )
            lower = tails.quantile_metric(self.metric) is not None
            if self.higher_is_better == lower:
                raise ValueError(
                    f"{self.metric} is {'a latency: lower' if lower else 'a rate: higher'} is better; "
                    f"set higher_is_better = {'false' if lower else 'true'}|higher_is_better"
                )


@dataclass(frozen=True)
class SloConfig:
    metric: str = doc(
        "A per-request limit for goodput: ttft_ms, tpot_ms or e2e_ms (definitions: docs/guide/serving.md)."
    )
    max_ms: float = doc("The limit in milliseconds: a request over it did not meet the SLO.")
    p: float | None = doc(
        "A percentile (e.g. 99): the trial's p-th percentile of the metric must be within max_ms; what "
        "throughput at SLO (rate_at_slo_req_s) searches for. Goodput counts requests against max_ms whatever p.",
        None,
    )

    def __post_init__(self) -> None:
        if self.metric.removesuffix("_ms") not in tails.SLO_METRICS or not self.metric.endswith("_ms"):
            raise ValueError(
                f"expected one of {', '.join(m + '_ms' for m in tails.SLO_METRICS)}, got {self.metric!r}|metric"
            )
        if not (math.isfinite(self.max_ms) and self.max_ms > 0):
            raise ValueError(f"expected a positive number of milliseconds, got {self.max_ms!r}|max_ms")
        if self.p is not None and not 0 < self.p < 100:
            raise ValueError(f"expected a percentile strictly between 0 and 100, got {self.p!r}|p")
        if self.p is not None and (
            round(self.p, 3) != self.p or tails.quantile_metric(f"{self.metric[:-3]}_p{self.p:g}_ms") is None
        ):
            raise ValueError(
                f"expected a percentile with at most three decimals and at least 1 (e.g. 99, 99.9), got {self.p!r}|p"
            )

    def slo(self) -> tails.Slo:
        return tails.Slo(self.metric.removesuffix("_ms"), self.max_ms, self.p / 100 if self.p is not None else None)


MAX_SECONDS = 1e6  # a timeout beyond ~11 days is a typo


def _check_seconds(value: float, key: str) -> None:
    if not (math.isfinite(value) and 0 < value <= MAX_SECONDS):
        raise ValueError(f"expected a positive number of seconds (at most {MAX_SECONDS:g}), got {value}|{key}")


@dataclass(frozen=True)
class GateConfig:
    objective: str | None = doc("Workload whose metric must improve (default: the first workload).", None)
    alpha: float = doc("Probability of at least one false merge allowed in one episode (family-wise).", 0.05)
    episode_budget: int = doc("Proposals one episode may judge; alpha is split evenly over them (Bonferroni).", 10)
    min_effect: float = doc("Smallest speedup worth merging (0.02 = 2%).", D.MIN_EFFECT)
    max_regression: float = doc(
        "A non-objective workload may not be significantly slower than this fraction.", D.MAX_REGRESSION
    )
    regression_alpha: float = doc("Level of the one-sided test for regressions.", D.REGRESSION_ALPHA)
    futility: float = doc(
        "Type II level of the SPRT futility boundary (1.5 x min_effect against no speedup).", D.FUTILITY
    )
    min_pairs: int = doc("Pairs measured before the first look.", D.MIN_PAIRS)
    look_every: int = doc("Pairs between two looks of the sequential test.", D.LOOK_EVERY)
    max_pairs: int = doc("Pairs per workload at most (the full budget).", D.MAX_PAIRS)
    confirm_pairs: int = doc(
        "Pairs of the confirmation run with fresh seeds (and, for engine workloads, fresh engines) before a merge (0 "
        "disables).",
        6,
    )
    guard_check_pairs: int = doc(
        "Pairs of the re-measure of a guard's regression on fresh engines and seeds: a guard rejects only when its "
        "regression holds there (at least 4).",
        D.GUARD_CHECK_PAIRS,
    )
    guard_check_sessions: int = doc(
        "Fresh engine sessions those pairs run over; their spread enters the error, so that one more pair of engine "
        "instances cannot decide.",
        D.GUARD_CHECK_SESSIONS,
    )
    plausibility: float = doc("A speedup beyond this factor is held for manual review.", 10.0)
    sandbox: str = doc(
        "auto | required | off: run both sides in bubblewrap (no network; state, history and harness hidden). "
        "auto skips it, saying so in the verdict, where the machine does not allow it.",
        "auto",
    )
    coverage: bool = doc("Python patches: require that changed lines ran (one untimed, traced candidate trial).", True)

    def __post_init__(self) -> None:
        checks = [
            (self.sandbox in ("auto", "required", "off"), "sandbox", "one of auto, required, off"),
            (0 < self.alpha < 1, "alpha", "a number strictly between 0 and 1"),
            (0 < self.regression_alpha < 1, "regression_alpha", "a number strictly between 0 and 1"),
            (0 < self.futility < 0.5, "futility", "a number strictly between 0 and 0.5"),
            (self.episode_budget >= 1, "episode_budget", "an integer >= 1"),
            (0 <= self.min_effect < 1, "min_effect", "a fraction in [0, 1)"),
            (0 <= self.max_regression < 1, "max_regression", "a fraction in [0, 1)"),
            (self.min_pairs >= 2, "min_pairs", "an integer >= 2"),
            (self.look_every >= 1, "look_every", "an integer >= 1"),
            (self.max_pairs >= self.min_pairs, "max_pairs", "an integer >= min_pairs"),
            (self.confirm_pairs >= 0, "confirm_pairs", "an integer >= 0"),
            (
                self.guard_check_pairs >= D.LOADED_CONFIRM_PAIRS,
                "guard_check_pairs",
                f"an integer >= {D.LOADED_CONFIRM_PAIRS}",
            ),
            (
                1 <= self.guard_check_sessions and 2 * self.guard_check_sessions <= self.guard_check_pairs,
                "guard_check_sessions",
                "an integer >= 1 and at most guard_check_pairs / 2 (two pairs per session at least)",
            ),
            (self.plausibility > 1, "plausibility", "a factor > 1"),
        ]
        for ok, key, expected in checks:
            if not ok:
                raise ValueError(f"expected {expected}, got {getattr(self, key)!r}|{key}")

    @property
    def proposal_alpha(self) -> float:
        """The false-merge level one proposal may spend: alpha / episode_budget."""
        return self.alpha / self.episode_budget


def parse_cpus(text: str) -> frozenset[int]:
    """A CPU list as Linux writes it ("1", "0,2", "2-3,6") as a set of CPU numbers."""
    out: set[int] = set()
    try:
        for part in str(text).split(","):
            lo, _, hi = part.strip().partition("-")
            a, b = int(lo), int(hi or lo)
            if a < 0 or b < a:
                raise ValueError
            out.update(range(a, b + 1))
    except ValueError:
        raise ValueError(f'expected "auto", "none" or a CPU list such as "1" or "2-3", got {text!r}') from None
    return frozenset(out)


@dataclass(frozen=True)
class EngineConfig:
    placement: str = doc(
        "auto | shared | alternate | split: where and when the two sides' engines run (see docs/design/placement.md). "
        "auto: CPU -> the lower-noise mode measured there, one GPU -> alternate, two or more -> split.",
        P.AUTO,
    )
    memory_split: float = doc(
        "One GPU: gpu_memory_utilization of each engine that shares it (placement shared; the distribution checks' "
        "engines).",
        P.MEMORY_SPLIT,
    )
    warmup: int = doc("Unmeasured rounds at the start of every engine session, per side.", 1)
    foreign_load: float = doc(
        "Flag a trial (`foreign_load`) when processes outside the comparison used more than this share of the cores "
        "during it.",
        quiet.FOREIGN_LOAD,
    )
    slices: int = doc(
        "Split each pair's two throughput trials into up to this many parts measured alternately on the two warm "
        "engines (A B B A ...), so the halves of a pair run a fraction of a second apart (placement shared; 1: whole "
        "trials).",
        8,
    )
    cpus: str = doc(
        "auto | none | a CPU list (\"1\", \"2-3\"): pin both sides' warm engines to the same CPUs once they are up "
        "(a measurement that uses more CPU time than they give fails). auto: on a machine without a GPU whose engines "
        "set OMP_NUM_THREADS = n, the last n CPUs when the machine has more.",
        "auto",
    )
    baseline_reuse: int = doc(
        "Episodes: how many consecutive evaluations one baseline engine instance (and the baseline's worktree) may "
        "serve while the baseline, config and environment hold (1: every evaluation starts its baseline afresh).",
        2,
    )

    def __post_init__(self) -> None:
        if (
            isinstance(self.baseline_reuse, bool)
            or not isinstance(self.baseline_reuse, int)
            or not (1 <= self.baseline_reuse <= 100)
        ):
            raise ValueError(f"expected an integer from 1 to 100, got {self.baseline_reuse!r}|baseline_reuse")
        if isinstance(self.slices, bool) or not isinstance(self.slices, int) or not (1 <= self.slices <= 64):
            raise ValueError(f"expected an integer from 1 to 64, got {self.slices!r}|slices")
        if self.cpus not in ("auto", "none"):
            try:
                parse_cpus(self.cpus)
            except ValueError as exc:
                raise ValueError(f"{exc}|cpus") from None
        if self.placement not in P.PLACEMENTS:
            raise ValueError(f"expected one of {', '.join(P.PLACEMENTS)}, got {self.placement!r}|placement")
        if not (0 < self.memory_split <= 0.5):
            raise ValueError(
                f"expected a fraction in (0, 0.5] (two engines share the device), got {self.memory_split}|memory_split"
            )
        if isinstance(self.warmup, bool) or not (0 <= self.warmup <= 10):
            raise ValueError(f"expected an integer from 0 to 10, got {self.warmup!r}|warmup")
        if not (0 < self.foreign_load <= 1):
            raise ValueError(f"expected a fraction in (0, 1], got {self.foreign_load}|foreign_load")


def _check_caps(caps: Mapping[str, Any], field_name: str) -> None:
    bad = [key for key in caps if key not in ("kl_mean", "kl_p99", "kl_max", "dlogprob_max", "min_top1")]
    if bad:
        raise ValueError(f"unknown cap {bad[0]!r} (kl_mean, kl_p99, kl_max, dlogprob_max, min_top1)|{field_name}")
    for key, v in caps.items():
        if (
            isinstance(v, bool)
            or not isinstance(v, (int, float))
            or not math.isfinite(v)
            or v <= 0
            or (key == "min_top1" and v > 1)
        ):
            raise ValueError(
                f"cap {key!r}: expected a positive finite number{' <= 1' if key == 'min_top1' else ''}, got "
                f"{v!r}|{field_name}"
            )


@dataclass(frozen=True)
class VerifyConfig:
    logprobs: str | None = doc(
        "kind = \"command\": command writing logprob JSONL for `{prompts}` to `{out}` (see docs/CONTRACTS.md).", None
    )
    kind: str = doc("command | vllm (the built-in vLLM logprob worker, run in each side's worktree).", "command")
    mode: str = doc("exact | tight | approx.", "tight")
    dtype: str = doc("Model dtype; sets the smallest differences `tight` always tolerates.", "float32")
    k: int = doc("Top-k logprobs per position.", 20)
    max_tokens: int = doc("Greedy decode steps per prompt (the decode path).", 16)
    corpus: str | None = doc("Prompt corpus JSONL in the target (default: the shipped multilingual corpus).", None)
    profile: str = doc(
        "full (every prompt of the corpus) or quick (56 prompts, 4 per language of the shipped corpus: short to long).",
        "full",
    )
    corpus_size: int = doc("Prompts to check, chosen evenly from every language (0: the profile's size).", 0)
    holdout: float = doc("Fraction of the corpus held out by the workspace's secret.", 0.25)
    model: str = doc("kind = \"vllm\": model directory, or \"tiny\" / \"smollm2\" (built offline).", "tiny")
    engine: Mapping[str, Any] = doc("kind = \"vllm\": engine arguments for the logprob engine.", factory=dict)
    caps: Mapping[str, Any] = doc(
        "mode = \"approx\": limits, e.g. {kl_mean = 1e-3, kl_p99 = 1e-2, kl_max = 0.1, dlogprob_max = 0.5, "
        "min_top1 = 0.95}.",
        factory=dict,
    )
    timeout_s: float = doc("Timeout of one logprob run in seconds.", 900.0)
    sample: bool = doc(
        "kind = \"vllm\": the sample path (processed logprobs under several sampling settings and the draw test).", True
    )
    sample_draws: int = doc(
        "kind = \"vllm\": seeded draws per context and setting in the draw test (0 disables the draw test).", 100
    )
    sample_contexts: int = doc("kind = \"vllm\": contexts (one short prompt per language) of the draw test.", 2)
    reuse_baseline: bool = doc(
        "Keep the baseline's dumps in the house and reuse them while the baseline commit, this section, the model, the "
        "environment and agentsearch's logprob code are unchanged: the next check starts no baseline engine.",
        True,
    )
    reference: str = doc(
        "The commit outputs are also judged against (an ancestor of the baseline): the candidate must stay within "
        "`drift_budget` of it. Empty: the stock commit `agentsearch init` pinned (refs/agentsearch/reference).",
        "",
    )
    regimes: tuple[Mapping[str, Any], ...] = doc(
        "kind = \"vllm\": regimes production uses, e.g. [{max_num_seqs = 64}, {enable_prefix_caching = true}] (keys: "
        + ", ".join(REGIME_KEYS)
        + "): the candidate is also compared with the reference in each.",
        (),
    )
    old_regime: bool = doc(
        "A proposal that changes the regime (e.g. max_num_seqs) is also compared with the reference in the baseline's "
        "regime: one more candidate engine per such check (measured: +88% of a kept-runs verify). false: its own "
        "regime and `regimes` only.",
        True,
    )
    drift_budget: Mapping[str, Any] = doc(
        "How far main may move from the reference, all merges together: caps like `caps` (kl_mean, kl_p99, kl_max, "
        "dlogprob_max, min_top1). Empty: the mode's own tolerance (tight: the noise floor x3 or the dtype minimum).",
        factory=dict,
    )

    def __post_init__(self) -> None:
        if self.sample_draws < 0 or self.sample_contexts < 1:
            raise ValueError("expected sample_draws >= 0 and sample_contexts >= 1|sample_draws")
        if self.profile not in VERIFY_PROFILES:
            raise ValueError(f"expected one of {', '.join(VERIFY_PROFILES)}, got {self.profile!r}|profile")
        if isinstance(self.corpus_size, bool) or self.corpus_size < 0:
            raise ValueError(f"expected a number of prompts >= 0, got {self.corpus_size!r}|corpus_size")
        if self.mode not in VERIFY_MODES:
            raise ValueError(f"expected one of {', '.join(VERIFY_MODES)}, got {self.mode!r}|mode")
        if self.kind not in ("command", "vllm"):
            raise ValueError(f"expected command or vllm, got {self.kind!r}|kind")
        if self.kind == "command" and not self.logprobs:
            raise ValueError("kind = \"command\" needs a `logprobs` command|logprobs")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"expected float32, bfloat16 or float16, got {self.dtype!r}|dtype")
        if not (0 < self.holdout < 1):
            raise ValueError(f"expected a fraction strictly between 0 and 1, got {self.holdout}|holdout")
        if self.k < 2 or self.max_tokens < 1:
            raise ValueError("expected k >= 2 and max_tokens >= 1|k")
        if self.mode == "approx" and not self.caps:
            raise ValueError("mode = \"approx\" needs caps|caps")
        _check_caps(self.caps, "caps")
        _check_seconds(self.timeout_s, "timeout_s")
        _check_caps(self.drift_budget, "drift_budget")
        if self.regimes and self.kind != "vllm":
            raise ValueError("regimes need kind = \"vllm\" (a command's logprob run has no engine arguments)|regimes")
        for regime in self.regimes:
            if not regime:
                raise ValueError("an empty regime; name at least one of " + ", ".join(REGIME_KEYS) + "|regimes")
            for key, value in regime.items():
                try:
                    regimes_mod.check_value(key, value)
                except regimes_mod.RegimeError as exc:
                    raise ValueError(f"{exc}|regimes") from None
        if self.reference and not self.reference.strip():
            raise ValueError("expected a commit or ref, got blanks|reference")

    @property
    def prompts_wanted(self) -> int:
        """Prompts to check (0: every prompt of the corpus): ``corpus_size``, else the profile's."""
        return self.corpus_size or VERIFY_PROFILES[self.profile]


KNOB_WHERE = ("engine", "env", "json")


@dataclass(frozen=True)
class KnobConfig:
    name: str = doc("Knob name (an engine argument, an environment variable, or a label for a JSON key).")
    values: tuple[Any, ...] = doc(
        "Allowed values (one TOML type), in order; the sweep proposes values other than the current one."
    )
    where: str = doc(
        "engine: a key of `engine` in the serving file; env: a key of its `env`; json: the dotted `key` in `file`.",
        "engine",
    )
    key: str | None = doc("where = \"json\": dotted key path in the file (default: name).", None)
    file: str | None = doc("File holding the knob (default: [sweep] file).", None)
    category: str = doc("config, scheduling, kernel, graph/launch, memory or other.", "config")
    rationale: str = doc("Why this knob may matter (goes into the proposal's rationale).", "")
    gpu_only: bool = doc("Only proposed on machines with a GPU (e.g. CUDA-graph settings).", False)
    prior_wins: float = doc(
        "Prior evidence that the knob matters: pseudo-wins for the sweep's bandit (0 = no opinion).", 0.0
    )

    def __post_init__(self) -> None:
        if self.where not in KNOB_WHERE:
            raise ValueError(f"expected one of {', '.join(KNOB_WHERE)}, got {self.where!r}|where")
        if len({type(v) for v in self.values}) > 1:
            raise ValueError(f"expected values of one type, got {list(self.values)!r}|values")
        if not (math.isfinite(self.prior_wins) and self.prior_wins >= 0):
            raise ValueError(f"expected a finite number >= 0, got {self.prior_wins}|prior_wins")
        if self.category not in CATEGORIES:
            raise ValueError(f"expected one of {', '.join(CATEGORIES)}, got {self.category!r}|category")


@dataclass(frozen=True)
class SweepConfig:
    file: str = doc(
        "The serving-config file that engine/env knobs live in (JSON: {\"engine\": {...}, \"env\": {...}}).",
        "serving.json",
    )
    knobs: tuple[KnobConfig, ...] = doc("[[sweep.knob]] tables: the bounded search space (one knob per proposal).", ())


EXECUTOR_KINDS = ("local", "ray")


@dataclass(frozen=True)
class ExecutorConfig:
    kind: str = doc(
        "local | ray: where evaluations run. local: one after another in this process (the default); ray: "
        "in parallel on a Ray cluster, each evaluation whole on one node (`agentsearch episode --executor`).",
        "local",
    )
    address: str = doc(
        "Ray: the cluster to join (`auto`: the one `ray start` made on this machine; `host:port`).", "auto"
    )
    parallel: int = doc("Ray: evaluations in flight at once (`--parallel`).", 2)
    cpus: float = doc(
        "Ray: CPUs one evaluation reserves on its node (both sides, all pairs, in one placement group).", 1.0
    )
    gpus: float = doc(
        "Ray: GPUs one evaluation reserves on its node (0: none; vLLM engines use the ones Ray assigns).", 0.0
    )
    drain_after: int = doc("Ray: a node whose evaluations died this many times gets no more work in the episode.", 2)

    def __post_init__(self) -> None:
        checks = [
            (self.kind in EXECUTOR_KINDS, "kind", "one of " + ", ".join(EXECUTOR_KINDS)),
            (self.parallel >= 1, "parallel", "an integer >= 1"),
            (self.cpus > 0, "cpus", "a number > 0"),
            (self.gpus >= 0, "gpus", "a number >= 0"),
            (self.drain_after >= 1, "drain_after", "an integer >= 1"),
        ]
        for ok, key, expected in checks:
            if not ok:
                raise ValueError(f"expected {expected}, got {getattr(self, key)!r}|{key}")


@dataclass(frozen=True)
class StackConfig:
    check: str = doc(
        "end | every:N | off: when an episode runs the stack check (`agentsearch stack`) itself, over its own merges. "
        "end: when the episode ends, if it merged at least 2 proposals; every:N: after every N merges of the episode; "
        "off: never.",
        "end",
    )
    leave_one_out: bool = doc(
        "The episode's stack checks also measure each merge's marginal contribution (one measurement more "
        "per merge, and per pair a passenger points to).",
        False,
    )
    removal_pairs: int = doc(
        "Leave-one-out: each removal (and each pair a passenger points to) is measured over at least this many pairs "
        "(at most [gate] max_pairs) before its test may stop: the interference test compares three intervals, and "
        "a removal that stopped after its first significant look is too wide for it.",
        12,
    )

    def __post_init__(self) -> None:
        if self.every is None and self.check not in ("end", "off"):
            raise ValueError(f"expected end, off or every:N (N an integer >= 1), got {self.check!r}|check")
        if self.removal_pairs < 2:
            raise ValueError(f"expected an integer >= 2, got {self.removal_pairs!r}|removal_pairs")

    @property
    def every(self) -> int | None:
        """N of every:N (None: end or off)."""
        head, _, n = self.check.partition(":")
        return int(n) if head == "every" and n.isdigit() and int(n) >= 1 else None


FORGE_KINDS = ("github", "gitea")
UPSTREAMS = ("vllm",)  # [forge] upstream: projects whose contribution rules `pr` knows (agentsearch.upstream)
# a person as git writes one: a name, then an address in angle brackets
OWNER_RE = re.compile(r"[^<>\x00-\x1f]*[^<>\s\x00-\x1f] <[^<>@\s]+@[^<>@\s]+>")


@dataclass(frozen=True)
class ForgeConfig:
    kind: str = doc(
        "github | gitea (Gitea and Forgejo share one API): the forge `review-pr`, `bot` and `pr` talk to.", "github"
    )
    url: str = doc(
        "The forge's web address: https://github.com (its API is api.github.com), a GitHub Enterprise server "
        "(API at URL/api/v3) or a Gitea/Forgejo server (API at URL/api/v1).",
        "https://github.com",
    )
    repo: str = doc(
        "owner/name of the repository whose pull requests are judged (empty: taken from the git remote's URL).", ""
    )
    token_env: str = doc(
        "The environment variable holding the API token (never written to a file, never passed to a trial).",
        "AGENTSEARCH_FORGE_TOKEN",
    )
    remote: str = doc(
        "The target's git remote that pull request heads are fetched from (refs/pull/N/head) and `pr` pushes to.",
        "origin",
    )
    label: str = doc("`bot` judges only open pull requests with this label (empty: every open pull request).", "")
    context: str = doc("The commit status's context (the name a branch protection rule requires).", "agentsearch")
    check_runs: bool = doc(
        "GitHub only, with a GitHub App's installation token: also post a check run named like the context "
        "(conclusion success, failure or neutral; the comment as its summary). A neutral check run passes "
        "a required check where the pending status blocks.",
        False,
    )
    upstream: str = doc(
        "The project whose contribution rules `pr` follows: empty (agentsearch's own evidence body) or vllm "
        "(vLLM's rules for AI-assisted pull requests: a named human owner, the duplicate search, test and "
        "model-evaluation results, an AI-assistance statement, Co-authored-by and Signed-off-by trailers).",
        "",
    )
    owner: str = doc(
        "The human who submits and vouches for an upstream pull request, as `Name <email>` (`pr --owner` "
        "overrides it): the commits are theirs and signed off by them. Without one, an upstream pull request is "
        "refused.",
        "",
    )

    def __post_init__(self) -> None:
        if self.kind not in FORGE_KINDS:
            raise ValueError(f"expected one of {', '.join(FORGE_KINDS)}, got {self.kind!r}|kind")
        if not self.url.startswith(("https://", "http://")):
            raise ValueError(f"expected an http(s) URL, got {self.url!r}|url")
        if self.repo and (self.repo.count("/") != 1 or not all(self.repo.split("/"))):
            raise ValueError(f"expected owner/name, got {self.repo!r}|repo")
        if not self.token_env.isidentifier() or self.token_env.upper() != self.token_env:
            raise ValueError(f"expected an environment variable name in capitals, got {self.token_env!r}|token_env")
        if not self.context or len(self.context) > 100:
            raise ValueError(f"expected a non-empty name of at most 100 characters, got {self.context!r}|context")
        if self.check_runs and self.kind != "github":
            raise ValueError("check runs are GitHub's (an App's token); Gitea has commit statuses only|check_runs")
        if self.upstream not in ("", *UPSTREAMS):
            raise ValueError(f"expected empty or one of {', '.join(UPSTREAMS)}, got {self.upstream!r}|upstream")
        if self.owner and not OWNER_RE.fullmatch(self.owner):
            raise ValueError(f"expected `Name <email>`, got {self.owner!r}|owner")


@dataclass(frozen=True)
class AgentConfig:
    max_turns: int = doc("Claude proposer: model turns per session (the CLI stops the session after them).", 30)
    max_cost_usd: float = doc(
        "Claude proposer: dollars one session may spend on the model (the CLI stops it there).", 5.0
    )
    max_tool_seconds: float = doc(
        "Claude proposer: wall seconds one session's workbench calls may take in all (every tool, charged per call); "
        "a call that would start past it is refused, and a file tool or `run` call is cut at what is left of it.",
        1800.0,
    )
    max_calls_per_turn: int = doc(
        "Claude proposer: workbench calls one model turn may make (the calls past it in that turn are refused).", 8
    )
    max_tool_calls: int = doc(
        "Claude proposer: workbench calls one session may make in all (the calls past it are refused).", 120
    )
    max_measure_pairs: int = doc(
        "Claude proposer: advisory pairs the `measure` tool may run in one session, in all.", 12
    )
    run_timeout_s: float = doc("Claude proposer: the longest one `run` call may take (seconds).", 300.0)
    memory_gib: float = doc("Claude proposer: the address-space limit of a `run` call's processes (GiB).", 16.0)
    output_bytes: int = doc("Claude proposer: the most bytes of a tool call's output the agent sees (the tail).", 12000)
    max_file_mib: int = doc(
        "Claude proposer: the largest file a workbench call may write (MiB; `ulimit -f`), and the largest file "
        "a change may hold.",
        256,
    )
    max_patch_mib: int = doc("Claude proposer: the largest change (as a patch, MiB) a session may propose.", 16)
    revisions: int = doc(
        "Claude proposer: how many times a rejected agent proposal may be revised — a later session starts from its "
        "change with the verdict's reasons and evidence in its prompt (each revision is a proposal of its own).",
        0,
    )

    def __post_init__(self) -> None:
        checks = [
            (self.max_turns >= 1, "max_turns", "an integer >= 1"),
            (self.max_cost_usd > 0, "max_cost_usd", "a number > 0"),
            (self.max_tool_seconds >= 0, "max_tool_seconds", "a number >= 0"),
            (self.max_calls_per_turn >= 1, "max_calls_per_turn", "an integer >= 1"),
            (self.max_tool_calls >= 1, "max_tool_calls", "an integer >= 1"),
            (self.max_measure_pairs >= 0, "max_measure_pairs", "an integer >= 0"),
            (self.run_timeout_s > 0, "run_timeout_s", "a number > 0"),
            (self.memory_gib > 0, "memory_gib", "a number > 0"),
            (self.output_bytes >= 1000, "output_bytes", "an integer >= 1000"),
            (self.revisions >= 0, "revisions", "an integer >= 0"),
            (self.max_file_mib >= 1, "max_file_mib", "an integer >= 1"),
            (self.max_patch_mib >= 1, "max_patch_mib", "an integer >= 1"),
        ]
        for ok, key, expected in checks:
            if not ok:
                raise ValueError(f"expected {expected}, got {getattr(self, key)!r}|{key}")


@dataclass(frozen=True)
class Config:
    target: TargetConfig = doc("[target]", factory=TargetConfig)
    workloads: tuple[WorkloadConfig, ...] = doc("[[workload]] tables", ())
    slos: tuple[SloConfig, ...] = doc("[[slo]] tables", ())
    gate: GateConfig = doc("[gate]", factory=GateConfig)
    verify: VerifyConfig | None = doc("[verify]", None)
    sweep: SweepConfig = doc("[sweep]", factory=SweepConfig)
    executor: ExecutorConfig = doc("[executor]", factory=ExecutorConfig)
    engine: EngineConfig = doc("[engine]", factory=EngineConfig)
    agent: AgentConfig = doc("[agent]", factory=AgentConfig)
    stack: StackConfig = doc("[stack]", factory=StackConfig)
    forge: ForgeConfig = doc("[forge]", factory=ForgeConfig)

    @property
    def objective(self) -> WorkloadConfig:
        name = self.gate.objective or self.workloads[0].name
        return self.workload(name)

    def workload(self, name: str) -> WorkloadConfig:
        for w in self.workloads:
            if w.name == name:
                return w
        raise KeyError(name)

    def slo_specs(self) -> list[dict[str, Any]]:
        """The ``[[slo]]`` tables as the serving session takes them (``harness.tails.Slo`` fields)."""
        return [dataclasses.asdict(x.slo()) for x in self.slos]

    def fingerprint(self) -> str:
        """Hash of everything that affects measurement; stored with every trial."""
        payload = {
            "target_env": dict(self.target.env),
            "install": self.target.install,
            "build": self.target.build,
            # the unit only labels numbers: changing it measures nothing differently
            "workloads": [{k: v for k, v in dataclasses.asdict(w).items() if k != "unit"} for w in self.workloads],
        }
        if self.slos:  # what goodput counts
            payload["slos"] = [dataclasses.asdict(x) for x in self.slos]
        if self.engine != EngineConfig():  # how the sides are placed changes the noise (a calibration's too)
            payload["engine"] = dataclasses.asdict(self.engine)
        blob = json.dumps(payload, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


# ----------------------------------------------------------------------------- loading

_SECTIONS = {
    "target": TargetConfig,
    "gate": GateConfig,
    "verify": VerifyConfig,
    "executor": ExecutorConfig,
    "engine": EngineConfig,
    "agent": AgentConfig,
    "stack": StackConfig,
    "forge": ForgeConfig,
}


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp) if a is not type(None))
    if origin is tuple:
        return "a list of strings"
    if origin in (Mapping, dict, collections.abc.Mapping) or tp is Mapping:
        args = typing.get_args(tp)
        return "a table of values" if args and args[1] is Any else "a table of strings"
    return {str: "a string", int: "an integer", float: "a number", bool: "true or false"}.get(tp, str(tp))


def _coerce(value: Any, tp: Any) -> tuple[bool, Any]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            if arg is type(None):
                continue
            ok, v = _coerce(value, arg)
            if ok:
                return True, v
        return False, None
    if origin is tuple:
        args = typing.get_args(tp)
        if args and typing.get_origin(args[0]) in (Mapping, dict, collections.abc.Mapping):  # a list of tables
            if isinstance(value, list) and all(isinstance(v, dict) for v in value):
                return True, tuple(dict(v) for v in value)
            return False, None
        if args and args[0] is Any:  # knob values: scalars of one TOML type
            if isinstance(value, list) and value and all(isinstance(v, (str, int, float, bool)) for v in value):
                return True, tuple(value)
            return False, None
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return True, tuple(value)
        return False, None
    if origin in (Mapping, dict, collections.abc.Mapping) or tp is Mapping:
        args = typing.get_args(tp)
        if not isinstance(value, dict):
            return False, None
        if args and args[1] is Any:
            if all(isinstance(v, (str, int, float, bool, list)) for v in value.values()):
                return True, dict(value)
            return False, None
        if all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value.values()):
            return True, {str(k): str(v) for k, v in value.items()}
        return False, None
    if tp is bool:
        return (isinstance(value, bool), value)
    if tp is int:
        return (isinstance(value, int) and not isinstance(value, bool), value)
    if tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return (ok, float(value) if ok else None)
    if tp is str:
        return (isinstance(value, str), value)
    return False, None


def _build(cls: type, table: Any, where: str, source: str) -> Any:
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: {where}: expected a table, got {type(table).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in table.items():
        if key not in fields:
            known = ", ".join(sorted(fields))
            raise ConfigError(f"{source}: {where}: unknown key {key!r} (known keys: {known})")
        ok, coerced = _coerce(value, hints[key])
        if not ok:
            raise ConfigError(f"{source}: {where} {key}: expected {_type_name(hints[key])}, got {value!r}")
        if isinstance(coerced, float) and not math.isfinite(coerced):
            raise ConfigError(f"{source}: {where} {key}: expected a finite number, got {value!r}")
        kwargs[key] = coerced
    for name, f in fields.items():
        if name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{source}: {where}: missing required key {name!r} ({f.metadata['doc']})")
    try:
        return cls(**kwargs)
    except ValueError as exc:
        msg, _, key = str(exc).rpartition("|")
        raise ConfigError(f"{source}: {where} {key}: {msg}") from None


def load_config_text(text: str, source: str = CONFIG_FILE) -> Config:
    """Parse and validate the text of an agentsearch.toml."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: TOML syntax error: {exc}") from None
    allowed = set(_SECTIONS) | {"workload", "sweep", "slo"}
    for key in data:
        if key not in allowed:
            raise ConfigError(f"{source}: unknown section [{key}] (known: {', '.join(sorted(allowed))})")
    sections = {
        name: _build(cls, data.get(name, {}), f"[{name}]", source)
        for name, cls in _SECTIONS.items()
        if name != "verify"
    }
    verify = _build(VerifyConfig, data["verify"], "[verify]", source) if "verify" in data else None
    raw_workloads = data.get("workload")
    if not raw_workloads:
        raise ConfigError(f"{source}: missing required [[workload]] table (at least one workload)")
    if not isinstance(raw_workloads, list):
        raise ConfigError(f"{source}: workload: expected [[workload]] tables, got a single value")
    workloads = tuple(_build(WorkloadConfig, w, f"[[workload]] #{i + 1}", source) for i, w in enumerate(raw_workloads))
    names = [w.name for w in workloads]
    _unique(names, f"{source}: [[workload]] name: duplicate workload name")
    slos = _slos(data.get("slo"), source)
    goodput = [w.name for w in workloads if w.metric == tails.GOODPUT]
    if goodput and not slos:
        raise ConfigError(
            f"{source}: [[workload]] {goodput[0]}: metric {tails.GOODPUT} counts requests that meet the SLOs; "
            "add [[slo]] tables, e.g. [[slo]] metric = \"ttft_ms\" max_ms = 500"
        )
    bases = {x.metric.removesuffix("_ms") for x in slos}
    if "tpot" in bases and not bases & {"ttft", "e2e"}:
        raise ConfigError(
            f"{source}: [[slo]] metric: a tpot_ms limit alone can be met by holding every token back and "
            "sending them at the end (TPOT ~0, TTFT late): add a ttft_ms or e2e_ms limit"
        )
    named = sections["gate"].objective or workloads[0].name
    objective = next((w for w in workloads if w.name == named), None)
    qm = tails.quantile_metric(objective.metric) if objective is not None and objective.spec.serving else None
    if qm is not None and qm.base in ("tpot", "itl"):
        raise ConfigError(
            f"{source}: [[workload]] {objective.name if objective else ''} metric: {qm.name} as the objective can be "
            "won by shaping the stream (tokens held back and sent in a burst); judge ttft, e2e, a rate or goodput as "
            "the objective and keep tpot and itl quantiles as guards"
        )
    for i, w in enumerate(workloads):
        if w.spec.serving and w.metric == tails.RATE_AT_SLO:
            try:
                serving_load.check_params(w.params, w.metric, [x.slo() for x in slos])
            except ValueError as exc:
                raise ConfigError(f"{source}: [[workload]] #{i + 1} params: {exc}") from None
    gate: GateConfig = sections["gate"]
    if gate.objective is not None and gate.objective not in names:
        raise ConfigError(
            f"{source}: [gate] objective: expected one of the workload names ({', '.join(names)}), got "
            f"{gate.objective!r}"
        )
    return Config(
        target=sections["target"],
        workloads=workloads,
        slos=slos,
        gate=gate,
        verify=verify,
        sweep=_sweep(data.get("sweep"), source),
        executor=sections["executor"],
        engine=sections["engine"],
        agent=sections["agent"],
        stack=sections["stack"],
        forge=sections["forge"],
    )


def _unique(names: list[str], says: str) -> None:
    """One line naming the first name given twice in a list of tables."""
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"{says} {dupes[0]!r}")


def _slos(raw: Any, source: str) -> tuple[SloConfig, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError(f"{source}: slo: expected [[slo]] tables, got a single value")
    slos = tuple(_build(SloConfig, x, f"[[slo]] #{i + 1}", source) for i, x in enumerate(raw))
    _unique([x.metric for x in slos], f"{source}: [[slo]] metric: two limits for")
    return slos


def _sweep(raw: Any, source: str) -> SweepConfig:
    if raw is None:
        return SweepConfig()
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: [sweep]: expected a table")
    raw = dict(raw)
    knobs_raw = raw.pop("knob", [])
    if not isinstance(knobs_raw, list):
        raise ConfigError(f"{source}: sweep.knob: expected [[sweep.knob]] tables")
    knobs = tuple(_build(KnobConfig, k, f"[[sweep.knob]] #{i + 1}", source) for i, k in enumerate(knobs_raw))
    _unique([k.name for k in knobs], f"{source}: [[sweep.knob]] name: duplicate knob")
    base = _build(SweepConfig, raw, "[sweep]", source)
    return dataclasses.replace(base, knobs=knobs)


def reference_rows() -> list[tuple[str, str, str, str]]:
    """(section, key, default, doc) for every key: the generated config reference
    (docs/hooks.py → docs/reference/config.md)."""
    rows = []
    for section, cls in (
        ("[target]", TargetConfig),
        ("[[workload]]", WorkloadConfig),
        ("[[slo]]", SloConfig),
        ("[gate]", GateConfig),
        ("[engine]", EngineConfig),
        ("[verify]", VerifyConfig),
        ("[sweep]", SweepConfig),
        ("[[sweep.knob]]", KnobConfig),
        ("[executor]", ExecutorConfig),
        ("[agent]", AgentConfig),
        ("[stack]", StackConfig),
        ("[forge]", ForgeConfig),
    ):
        for f in dataclasses.fields(cls):
            if cls is SweepConfig and f.name == "knobs":
                continue
            if f.default is not dataclasses.MISSING:
                default = repr(f.default)
            elif f.default_factory is not dataclasses.MISSING:
                default = repr(f.default_factory())
            else:
                default = "required"
            rows.append((section, f.name, default, f.metadata["doc"]))
    return rows

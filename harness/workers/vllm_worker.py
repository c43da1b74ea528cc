"""A warm vLLM engine that serves many measurement rounds. Runs INSIDE the candidate's
environment (PYTHONPATH = the candidate worktree), so ``import vllm`` is the candidate's code.

Self-contained: standard library + vllm only (never imports agentsearch or harness).

Protocol: the spec is a JSON argument; results go to the file descriptor ``--fd`` as JSON
lines (vLLM's own logs stay on stdout/stderr). Commands arrive on stdin as JSON lines:
``{"cmd": "measure", "seed": N}`` -> ``{"event": "result", "metrics": {...}, "outputs": [[token ids], ...]}``
(the generated tokens of every request, in request order: the orchestrator compares them with the
other side's for the same seed, so a timed run proves what it computed);
``{"cmd": "generate", "seed": N, "index": I, "params": {...}}`` -> ``{"event": "result", "outputs": [...]}`` (one
batch of the latency workload: the orchestrator times each round trip itself);
``{"cmd": "score", "kind": K, "items": [{"seed": S, "index": I, "request": J, "params": {...}, "tokens": [...]}]}``
-> ``{"event": "result", "scores": [[[top id, top logprob, token logprob], ...], ...], "again": [...]}`` (the timed
outputs rule, ``harness/outputs_rule.py``: each answer teacher-forced after its request's prompt, twice, in two
batch orders, from an empty prefix cache);
``{"cmd": "logprobs", "prompts": PATH, "out": PATH, ...}`` -> ``{"event": "done"}``;
``{"cmd": "processed", "prompts": PATH, "out": PATH, "settings": [...], ...}`` -> ``{"event": "done"}`` (the
sample path: seeded sampled continuations with the engine's processed logprobs);
``{"cmd": "samples", ...}`` -> ``{"event": "done"}`` (seeded one-token draws for the draw test);
``{"cmd": "quit"}``. On start-up: ``{"event": "ready", "startup_s": ..., "vllm_file": ..., "vocab_size": ...}``.
Any exception: ``{"event": "error", "error": "..."}`` and exit status 1.

    python vllm_worker.py --fd 3 '{"kind": "vllm-throughput", "model": ..., "engine": {...}, "params": {...}}'
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
import traceback

SERVING_FILE = "serving.json"  # the fork's serving config: engine arguments proposals may change
# the environment this process was given, before vLLM is imported (vLLM sets some variables itself)
GIVEN_ENV = frozenset(os.environ)


def lengths(rng: random.Random, n: int, mean: int, dist: str, lo: int = 4, hi: int | None = None) -> list[int]:
    """n lengths around ``mean`` from a seeded distribution: fixed, uniform or zipf."""
    hi = hi or 2 * mean
    if dist == "fixed":
        return [mean] * n
    if dist == "uniform":
        return [rng.randint(max(lo, mean // 2), max(lo, mean + mean // 2)) for _ in range(n)]
    if dist == "zipf":
        # heavy tail: most requests short, a few long; scaled so the mean is about ``mean``
        raw = [1.0 / (rng.random() ** (1 / 1.5)) for _ in range(n)]
        scale = mean / (sum(raw) / n)
        return [int(min(hi * 4, max(lo, round(r * scale)))) for r in raw]
    raise ValueError(f"unknown length distribution {dist!r} (fixed, uniform, zipf)")


def make_prompts(seed: int, n: int, input_len: int, output_len: int, dist: str, vocab: int):
    rng = random.Random(seed)
    ins = lengths(rng, n, input_len, dist)
    outs = lengths(rng, n, output_len, dist)
    prompts = [[rng.randrange(10, vocab) for _ in range(k)] for k in ins]
    return prompts, outs


def inspect_models_in_process() -> bool:
    """vLLM inspects a model's class in a fresh Python process (a second import of vLLM and torch: about 10 s of
    CPU here) unless ``$VLLM_CACHE_ROOT/modelinfos`` has the answer, and in a sandbox that cache is new for every
    engine (its home is a tmpfs), so every start paid it. On a CPU nothing is at stake in answering in this process
    (the subprocess keeps CUDA out of a parent that forks workers): the same class is imported and inspected, a few
    milliseconds after vLLM itself. Both sides run this worker, so both get it; a vLLM without the hook, or on
    another platform, is left as it is. True when the hook was replaced. What differs from a stock start with a warm
    cache: the model's module is imported while the engine's config is built rather than when its weights load (after
    the platform sets its environment defaults); torch's inductor config, which reads some of them, is imported by
    ``from vllm import LLM`` before either."""
    try:
        from vllm.model_executor.models import registry
        from vllm.platforms import current_platform

        if not current_platform.is_cpu() or not callable(getattr(registry, "_run_in_subprocess", None)):
            return False
    except Exception:  # an older or changed vLLM: its own behaviour
        return False
    registry._run_in_subprocess = lambda fn: fn()  # noqa: SLF001 - vLLM's hook, replaced for this process only
    return True


def engine_arguments(spec: dict) -> dict:
    """The engine's arguments: the spec's, serving.json's over them, then the regime the orchestrator asks for
    (the reference run in the candidate's regime; None: the engine's own default)."""
    engine = dict(spec.get("engine", {}))
    serving = os.path.join(os.getcwd(), SERVING_FILE)
    if "serving_engine" in spec:  # another worktree's serving.json engine section (a warm resolver's request)
        over = spec["serving_engine"]
        if not isinstance(over, dict):
            raise ValueError("serving.json: engine must be an object of engine arguments")
        engine.update(over)
    elif os.path.exists(serving):
        with open(serving) as fh:
            over = json.load(fh).get("engine", {})
        if not isinstance(over, dict):
            raise ValueError("serving.json: engine must be an object of engine arguments")
        engine.update(over)
    for key, value in (spec.get("regime") or {}).items():
        if value is None:
            engine.pop(key, None)
        else:
            engine[key] = value
    return engine


def canonical(obj, depth: int = 0):
    """A resolved configuration as plain JSON: dataclasses and dicts as objects, enums and other objects by their
    repr (an object's repr holding its address says nothing about the configuration: left out)."""
    import dataclasses
    import enum

    if depth > 16:  # deeper than any vLLM config nests: a cycle
        return "<deep>"
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj if not (isinstance(obj, float) and obj != obj) else "nan"
    if isinstance(obj, enum.Enum):
        return str(obj)
    if isinstance(obj, (list, tuple)):
        return [canonical(x, depth + 1) for x in obj]
    if isinstance(obj, (set, frozenset)):
        return sorted((canonical(x, depth + 1) for x in obj), key=repr)
    if isinstance(obj, dict):
        return {str(k): canonical(v, depth + 1) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: canonical(getattr(obj, f.name, None), depth + 1) for f in dataclasses.fields(obj)}
    r = repr(obj)
    return None if " at 0x" in r else r


def stable(a, b):
    """What two resolutions of the same arguments agree on (an instance id or a clock differs each time)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: stable(a[k], b[k]) for k in a if k in b and (a[k] == b[k] or isinstance(a[k], dict))}
    return a


def resolve_with(spec: dict, env: dict) -> dict:
    """``resolve`` in this process with ``env`` over its environment (a value of None: unset), then the environment as
    it was: a kept resolving worker answering for another serving.json's variables (read by vLLM per access, as
    ``vllm.envs`` does until an engine's core caches them, which no resolution does)."""
    saved = {k: os.environ.get(k) for k in env}
    try:
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = str(v)
        return resolve(
            spec, (GIVEN_ENV - {k for k, v in env.items() if v is None}) | {k for k, v in env.items() if v is not None}
        )
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def resolve(spec: dict, given: frozenset = GIVEN_ENV) -> dict:
    """The engine's configuration as vLLM resolves it from these arguments and this environment, without starting
    an engine: every config object (``EngineArgs.create_engine_config``, twice: only what both agree on), every
    environment variable vLLM reads (``vllm.envs``, as parsed), and the ``VLLM_`` variables it does not know (it
    ignores them)."""
    t0 = time.perf_counter()
    from vllm import envs
    from vllm.engine.arg_utils import EngineArgs

    # the model's class answered in this process, as an engine's start does (the same class, inspected the same way;
    # without it vLLM imports itself and torch again in a subprocess: about 8 s of the 16 s a resolution took here)
    inspect_models_in_process()

    engine = engine_arguments(spec)
    first = canonical(EngineArgs(model=spec["model"], **engine).create_engine_config())
    second = canonical(EngineArgs(model=spec["model"], **engine).create_engine_config())

    def read_env() -> dict:
        known = {}
        for name in sorted(envs.environment_variables):
            try:
                known[name] = repr(getattr(envs, name))
            except Exception as exc:  # noqa: BLE001 - a value vLLM cannot parse: what it would fail on
                known[name] = f"<{type(exc).__name__}>"
        return known

    return {
        "config": stable(first, second),
        "env": stable(read_env(), read_env()),  # a default drawn per read (a buffer's random name) says nothing
        "unknown_env": sorted(k for k in os.environ if k.startswith("VLLM_") and k not in envs.environment_variables),
        # the variables this process was given (the others are vLLM's defaults, some drawn per process)
        "set_env": sorted(k for k in envs.environment_variables if k in given),
        "engine_args": engine,
        "resolve_s": time.perf_counter() - t0,
    }


class Engine:
    def __init__(self, spec: dict):
        self.spec = spec
        t0 = time.perf_counter()
        import vllm
        from vllm import LLM

        self.vllm = vllm
        self.import_s = time.perf_counter() - t0
        engine = engine_arguments(spec)
        self.engine_args = engine
        t1 = time.perf_counter()
        self.models_in_process = inspect_models_in_process()
        self.llm = LLM(model=spec["model"], **engine)
        self.startup_s = time.perf_counter() - t1
        self.vocab = int(spec.get("vocab", 16000))
        self.last_outputs: list[list[int]] | None = None

    def measure(self, seed: int, kind: str | None = None, params: dict | None = None) -> dict:
        kind = kind or self.spec["kind"]
        p = self.spec.get("params", {}) if params is None else params
        if kind == "vllm-throughput":
            return self.throughput(seed, p)
        if kind == "vllm-latency":
            return self.latency(seed, p)
        raise ValueError(f"this worker does not run {kind!r}")

    def _sampling(self, max_tokens: int, p: dict):
        from vllm import SamplingParams

        return SamplingParams(
            max_tokens=max_tokens, ignore_eos=True, temperature=float(p.get("temperature", 0.0)), seed=None
        )

    def throughput_requests(self, seed: int, p: dict) -> tuple[list[list[int]], list[int]]:
        """The throughput round's prompts and output lengths for ``seed``."""
        prompts, outs = make_prompts(
            seed,
            int(p.get("prompts", 64)),
            int(p.get("input_len", 64)),
            int(p.get("output_len", 64)),
            p.get("length_dist", "fixed"),
            self.vocab,
        )
        # every request must fit the context: heavy-tailed lengths are clipped to max_model_len
        limit = int(self.engine_args.get("max_model_len") or 1024)
        prompts = [x[: max(1, limit // 2)] for x in prompts]
        # one token of headroom: the outputs rule scores prompt + answer with one more token (prompt_logprobs)
        outs = [max(1, min(o, limit - len(x) - 1)) for x, o in zip(prompts, outs, strict=True)]
        return prompts, outs

    def latency_prompts(self, seed: int, index: int, p: dict) -> list[list[int]]:
        """One latency batch's prompts (fresh for every batch: repeats would measure a prefix cache)."""
        batch = int(p.get("batch_size", 8))
        prompts, _ = make_prompts(
            seed * 1009 + index, batch, int(p.get("input_len", 64)), int(p.get("output_len", 32)), "fixed", self.vocab
        )
        return prompts

    def throughput(self, seed: int, p: dict) -> dict:
        from vllm.inputs import TokensPrompt

        prompts, outs = self.throughput_requests(seed, p)
        reqs = [TokensPrompt(prompt_token_ids=x) for x in prompts]
        sps = [self._sampling(o, p) for o in outs]
        t0 = time.perf_counter()
        results = self.llm.generate(reqs, sps, use_tqdm=False)
        dt = time.perf_counter() - t0
        out_tokens = sum(len(r.outputs[0].token_ids) for r in results)
        in_tokens = sum(len(x) for x in prompts)
        if out_tokens != sum(outs):
            raise RuntimeError(f"generated {out_tokens} tokens, expected {sum(outs)}")
        self.last_outputs = [list(r.outputs[0].token_ids) for r in results]
        return {
            "output_tok_s": out_tokens / dt,
            "total_tok_s": (out_tokens + in_tokens) / dt,
            "requests_s": len(reqs) / dt,
            "elapsed_s": dt,
            "output_tokens": out_tokens,
            "input_tokens": in_tokens,
            "startup_s": self.startup_s,
        }

    def latency(self, seed: int, p: dict) -> dict:
        from vllm.inputs import TokensPrompt

        batch, iters = int(p.get("batch_size", 8)), int(p.get("iterations", 5))

        def batch_of(i: int) -> list:
            # fresh prompts for every run: repeats of one batch would measure a prefix cache, not the engine
            prompts, _ = make_prompts(
                seed * 1009 + i, batch, int(p.get("input_len", 64)), int(p.get("output_len", 32)), "fixed", self.vocab
            )
            return [TokensPrompt(prompt_token_ids=x) for x in prompts]

        sp = self._sampling(int(p.get("output_len", 32)), p)
        self.llm.generate(batch_of(0), sp, use_tqdm=False)  # warm-up, not measured
        lat = []
        for i in range(iters):
            reqs = batch_of(i + 1)
            t0 = time.perf_counter()
            results = self.llm.generate(reqs, sp, use_tqdm=False)
            lat.append(time.perf_counter() - t0)
            self.last_outputs = [list(r.outputs[0].token_ids) for r in results]
        lat.sort()

        def pct(q: float) -> float:
            k = min(len(lat) - 1, max(0, math.ceil(q * len(lat)) - 1))
            return lat[k]

        return {
            "latency_mean_s": sum(lat) / len(lat),
            "latency_p50_s": pct(0.5),
            "latency_p90_s": pct(0.9),
            "latency_p99_s": pct(0.99),
            "iterations": iters,
            "startup_s": self.startup_s,
        }

    def generate_batch(self, seed: int, index: int, p: dict) -> list[list[int]]:
        """One batch of the latency workload (the orchestrator times the round trip); its generated tokens."""
        from vllm.inputs import TokensPrompt

        reqs = [TokensPrompt(prompt_token_ids=x) for x in self.latency_prompts(seed, index, p)]
        results = self.llm.generate(reqs, self._sampling(int(p.get("output_len", 32)), p), use_tqdm=False)
        return [list(r.outputs[0].token_ids) for r in results]

    def score(self, cmd: dict) -> dict:
        """Each item's answer teacher-forced after its request's prompt: per answer token, the model's top token,
        its logprob and the answer token's logprob. Run twice, the second time in the reverse order (another
        batch composition and order: the A/A rounding floor on exactly these positions), each from an empty
        prefix cache, which is emptied again afterwards (scoring leaves nothing for the next timed round)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        kind = cmd.get("kind") or self.spec["kind"]
        seqs, starts = [], []
        for it in cmd["items"]:
            p = it.get("params") or self.spec.get("params", {})
            if kind == "vllm-latency":
                prompt = self.latency_prompts(int(it["seed"]), int(it["index"]), p)[int(it["request"])]
            else:
                prompt = self.throughput_requests(int(it["seed"]), p)[0][int(it["request"])]
            seqs.append(list(prompt) + [int(t) for t in it["tokens"]])
            starts.append(len(prompt))
        sp = SamplingParams(max_tokens=1, prompt_logprobs=1, temperature=0.0)

        def run(order: list[int]) -> list[list[list[float]]]:
            fresh_cache(self.llm)
            res = self.llm.generate([TokensPrompt(prompt_token_ids=seqs[i]) for i in order], sp, use_tqdm=False)
            got: dict[int, list[list[float]]] = {}
            for i, r in zip(order, res, strict=True):
                rows = []
                for pos in range(starts[i], len(seqs[i])):
                    d = r.prompt_logprobs[pos]
                    best = min(
                        d.items(), key=lambda kv: (kv[1].rank if kv[1].rank is not None else 1 << 30, -kv[1].logprob)
                    )
                    rows.append([int(best[0]), float(best[1].logprob), float(d[seqs[i][pos]].logprob)])
                got[i] = rows
            return [got[i] for i in range(len(seqs))]

        first = run(list(range(len(seqs))))
        again = run(list(reversed(range(len(seqs)))))
        fresh_cache(self.llm)
        return {"event": "result", "scores": first, "again": again}

    def logprobs(self, cmd: dict) -> None:
        """The logprob contract of docs/CONTRACTS.md: prefill (teacher-forced) and greedy decode paths."""
        from vllm import SamplingParams

        k = int(cmd.get("k", 20))
        max_tokens = int(cmd.get("max_tokens", 16))
        with open(cmd["prompts"]) as fh:
            items = [json.loads(line) for line in fh if line.strip()]
        texts = [it["text"] for it in items]
        fresh_cache(self.llm)
        pre = SamplingParams(max_tokens=1, prompt_logprobs=k, temperature=0.0)
        # each prompt's own decode steps when the prompts file gives them (heavy-tailed, as the timed runs)
        dec = [
            SamplingParams(max_tokens=int(it.get("max_tokens", max_tokens)), logprobs=k, temperature=0.0)
            for it in items
        ]
        r_pre = self.llm.generate(texts, pre, use_tqdm=False)
        r_dec = self.llm.generate(texts, dec, use_tqdm=False)

        with open(cmd["out"], "w") as out:
            for it, a, b in zip(items, r_pre, r_dec, strict=False):
                prefill = {
                    "id": it["id"],
                    "path": "prefill",
                    "tokens": list(a.prompt_token_ids),
                    "topk": [top(d, k) for d in a.prompt_logprobs],
                }
                out.write(json.dumps(prefill) + "\n")
                o = b.outputs[0]
                out.write(
                    json.dumps(
                        {
                            "id": it["id"],
                            "path": "decode",
                            "tokens": list(o.token_ids),
                            "topk": [top(d, k) for d in o.logprobs],
                        }
                    )
                    + "\n"
                )


def top(d, k: int):
    """The k most likely tokens of one position's logprob dict; tokens the sampler masked (-inf) carry
    no probability and are left out."""
    if d is None:
        return None
    pairs = sorted(
        ((int(t), float(lp.logprob)) for t, lp in d.items() if math.isfinite(lp.logprob)), key=lambda x: -x[1]
    )
    return [[t, lp] for t, lp in pairs[:k]]


def processed(llm, cmd: dict) -> None:
    """The sample path: for every prompt, a seeded sampled continuation under its sampling setting,
    with the logprobs the sampler drew from (the engine runs with logprobs_mode = processed_logprobs:
    after penalties, temperature, min-p, top-k and top-p). Both sides get the same seed per prompt."""
    from vllm import SamplingParams

    mode = getattr(llm.llm_engine.model_config, "logprobs_mode", None)
    if mode != "processed_logprobs":
        raise RuntimeError(f"the sample path needs logprobs_mode = processed_logprobs; the engine runs with {mode!r}")
    k, max_tokens = int(cmd.get("k", 20)), int(cmd.get("max_tokens", 8))
    settings = cmd["settings"]
    with open(cmd["prompts"]) as fh:
        items = [json.loads(line) for line in fh if line.strip()]
    sps = [
        SamplingParams(
            max_tokens=int(it.get("max_tokens", max_tokens)),
            logprobs=k,
            seed=int(it["seed"]),
            **settings[int(it["setting"])],
        )
        for it in items
    ]
    texts = [it["text"] for it in items]
    budget = token_budget(llm)
    fresh_cache(llm)
    results = []
    for group in fit_groups([prompt_tokens(llm, t) + 1 for t in texts], budget):
        results += llm.generate([texts[i] for i in group], [sps[i] for i in group], use_tqdm=False)
    with open(cmd["out"], "w") as out:
        for it, r in zip(items, results, strict=False):
            o = r.outputs[0]
            out.write(
                json.dumps(
                    {
                        "id": f"{it['id']}#s{it['setting']}",
                        "path": "sample",
                        "tokens": list(o.token_ids),
                        "topk": [top(d, k) for d in o.logprobs],
                    }
                )
                + "\n"
            )


def samples(llm, cmd: dict) -> None:
    """The draw test: n seeded draws of the next token at fixed contexts, per sampling setting. vLLM
    gives child i of ``n = N, seed = s`` the seed s + i: setting j draws with the seeds
    ``seed + j*n ... seed + (j+1)*n - 1``, so the orchestrator can choose ranges that do not overlap."""
    from vllm import SamplingParams

    with open(cmd["prompts"]) as fh:
        items = [json.loads(line) for line in fh if line.strip()]
    texts = [it["text"] for it in items]
    n, seed = int(cmd["n"]), int(cmd["seed"])
    budget = token_budget(llm)
    lengths = [prompt_tokens(llm, t) for t in texts]
    fresh_cache(llm)
    with open(cmd["out"], "w") as out:
        for si, setting in enumerate(cmd["settings"]):
            # the n children of each seeded request, in slices that never need a chunked prefill: child i
            # of the slice starting at `start` gets seed + n*si + start + i, as it would in one request
            reqs: list[tuple[int, int, int]] = []  # (item, start, children)
            for j, length in enumerate(lengths):
                per_call = max(1, budget // (length + 1))
                reqs += [(j, start, min(per_call, n - start)) for start in range(0, n, per_call)]
            drawn: dict[int, list[int]] = {j: [] for j in range(len(items))}
            for group in fit_groups([m * (lengths[j] + 1) for j, _, m in reqs], budget):
                sps = [
                    SamplingParams(n=reqs[g][2], max_tokens=1, seed=seed + n * si + reqs[g][1], **setting)
                    for g in group
                ]
                for g, r in zip(
                    group, llm.generate([texts[reqs[g][0]] for g in group], sps, use_tqdm=False), strict=False
                ):
                    drawn[reqs[g][0]] += [int(o.token_ids[0]) for o in sorted(r.outputs, key=lambda o: o.index)]
            for j, it in enumerate(items):
                out.write(
                    json.dumps({"id": f"{it['id']}#s{si}", "path": "draws", "tokens": drawn[j], "topk": []}) + "\n"
                )


def vocab_size(llm) -> int | None:
    """The ids that are tokens: below the model's vocabulary size and the tokenizer's largest id + 1 (vLLM refuses a
    prompt with an id its tokenizer lacks); None where the engine does not say."""
    try:
        n = int(llm.llm_engine.model_config.get_vocab_size())
    except Exception:  # noqa: BLE001 - an engine without the attribute: the orchestrator then trusts no id
        return None
    try:
        tok = llm.get_tokenizer()
        top = getattr(tok, "max_token_id", None)
        n = min(n, int(top) + 1 if top is not None else len(tok))
    except Exception:  # noqa: BLE001 - no tokenizer (skip_tokenizer_init): the model's size
        pass
    return n


def model_dtype(llm) -> str | None:
    """The dtype the model computes in ("float32", "bfloat16", ...), or None where the engine does not say."""
    try:
        return str(llm.llm_engine.model_config.dtype).removeprefix("torch.")
    except Exception:  # noqa: BLE001 - an engine without the attribute
        return None


def fresh_cache(llm) -> None:
    """Every logprob, sample-path and draw run starts from an empty prefix cache. The baseline runs more
    often than the candidate (its noise-floor runs), so with the cache kept its engine would reuse blocks
    the candidate's recomputes: a cached prefix is attended by another kernel path than a fresh prefill,
    and the float results differ in the last bits (an unchanged branch then differed from the baseline on
    the sample path, KL 6e-8 over a zero floor, in 1,024-token scheduler steps). Emptied, both sides'
    engines compute each run from the same state."""
    if not llm.reset_prefix_cache():
        raise RuntimeError("the engine could not empty its prefix cache before a logprob run")


# Seeded requests must never be prefilled in chunks: vLLM 0.32's model runner rewinds the per-request
# generator of a request whose sampled token it discards (a partial prefill) with Generator.set_offset,
# which a CPU generator does not support ("CPU Generator does not use offset"): the engine dies. A
# generate() call whose prompts (plus one token each for a decode step) fit the engine's token budget is
# prefilled whole, whatever max_num_seqs is; seeded requests are therefore submitted in such groups.
# Each request keeps its own seed, so the grouping does not change what is drawn.
def token_budget(llm) -> int:
    return int(llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens)


def prompt_tokens(llm, text: str) -> int:
    return len(llm.get_tokenizer()(text)["input_ids"])


def fit_groups(weights: list[int], budget: int) -> list[list[int]]:
    """Consecutive index groups whose weights (a request's prompt tokens plus one per sequence it
    decodes) sum to at most ``budget``; a heavier request goes alone."""
    groups: list[list[int]] = []
    used = 0
    for i, w in enumerate(weights):
        if groups and used + w <= budget:
            groups[-1].append(i)
            used += w
        else:
            groups.append([i])
            used = w
    return groups


def profile(eng, cmd: dict) -> dict:
    """One measurement under cProfile (dumped to cmd["out"] for the harness) and the PyTorch
    profiler (ops by self time, summarized here). The engine must run in-process
    (VLLM_ENABLE_V1_MULTIPROCESSING=0) for the model's work to be seen."""
    import cProfile

    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    with torch_profile(activities=acts) as tp:
        prof.enable()
        metrics = eng.measure(int(cmd["seed"]), cmd.get("kind"), cmd.get("params"))
        prof.disable()
    wall = time.perf_counter() - t0
    prof.dump_stats(cmd["out"])
    ops = []
    for e in tp.key_averages():
        dev = getattr(e, "self_device_time_total", 0) or getattr(e, "self_cuda_time_total", 0) or 0
        ops.append(
            {"name": e.key, "seconds": (e.self_cpu_time_total + dev) / 1e6, "calls": e.count, "device_s": dev / 1e6}
        )
    ops.sort(key=lambda o: -o["seconds"])
    return {
        "wall_s": wall,
        "metrics": metrics,
        "ops": ops[:40],
        "device": "cuda" if torch.cuda.is_available() else "cpu",
    }


def commands():
    """The orchestrator's commands on stdin, one JSON object a line, until ``quit`` or the end of the pipe."""
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        if cmd["cmd"] == "quit":
            return
        yield cmd


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fd", type=int, required=True)
    ap.add_argument("--resolve", action="store_true", help="resolve the configuration, start no engine, exit")
    ap.add_argument("spec")
    args = ap.parse_args()
    out = os.fdopen(args.fd, "w", buffering=1)

    def send(obj: dict) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    try:
        spec = json.loads(args.spec)
        if args.resolve:
            send({"event": "ready", "resolved": resolve(spec)})
            # kept warm by the orchestrator: the same code resolves another serving.json's engine section (a
            # candidate that changes serving.json alone, in the same environment), vLLM already imported
            for cmd in commands():
                if cmd["cmd"] != "resolve":
                    raise ValueError(f"unknown command {cmd['cmd']!r} for a resolving worker")
                env = cmd.get("env") or {}
                if not isinstance(env, dict):
                    raise ValueError("a resolve request's env must be an object")
                send({"event": "result", "resolved": resolve_with({**spec, "serving_engine": cmd.get("engine")}, env)})
            return 0
        eng = Engine(spec)
        send(
            {
                "event": "ready",
                "startup_s": eng.startup_s,
                "import_s": eng.import_s,
                "vllm_file": eng.vllm.__file__,
                "vllm_version": getattr(eng.vllm, "__version__", "?"),
                "engine_args": eng.engine_args,
                "vocab_size": vocab_size(eng.llm),
                "dtype": model_dtype(eng.llm),
            }
        )
        for cmd in commands():
            if cmd["cmd"] == "measure":
                eng.last_outputs = None
                metrics = eng.measure(int(cmd["seed"]), cmd.get("kind"), cmd.get("params"))
                send({"event": "result", "metrics": metrics, "outputs": eng.last_outputs})
            elif cmd["cmd"] == "generate":
                send(
                    {
                        "event": "result",
                        "outputs": eng.generate_batch(int(cmd["seed"]), int(cmd["index"]), cmd.get("params") or {}),
                    }
                )
            elif cmd["cmd"] == "score":
                try:  # answers the engine refuses (ids its tokenizer lacks, too long): their fault, the engine stays up
                    send(eng.score(cmd))
                except Exception as exc:  # noqa: BLE001 - reported to the orchestrator, which refuses the pair
                    send({"event": "result", "error": f"{type(exc).__name__}: {exc}"[:500]})
            elif cmd["cmd"] == "logprobs":
                eng.logprobs(cmd)
                send({"event": "done"})
            elif cmd["cmd"] == "samples":
                samples(eng.llm, cmd)
                send({"event": "done"})
            elif cmd["cmd"] == "processed":
                processed(eng.llm, cmd)
                send({"event": "done"})
            elif cmd["cmd"] == "profile":
                send({"event": "result", "metrics": profile(eng, cmd)})
            else:
                raise ValueError(f"unknown command {cmd['cmd']!r}")
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, then exit 1
        last = traceback.format_exc().strip().splitlines()[-1]
        send({"event": "error", "error": f"{type(exc).__name__}: {exc}"[:2000], "last": last})
        sys.stderr.write(traceback.format_exc())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The timed outputs rule on real vLLM (CPU): a benign corpus that must pass and a lossy corpus that must fail.

Every variant is a side of a timed pair as the gate runs it: the harness's own warm worker (``Engine`` of
``harness/workers/vllm_worker.py``) measures zipf throughput batches greedily for many seeds; where a request's answer
differs from the baseline's, the baseline's engine scores the candidate's answer and its own (the worker's ``score``
command: teacher forcing, two batch orders) and the candidate's engine scores the baseline's; ``harness.outputs_rule``
judges the pair exactly as ``OutputsMatch`` does in the gate. Each variant's engine runs in its own child process, in
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so that a variant's patch of the model code applies.

    .venv/bin/python benchmarks/outputs_corpus.py [--seeds 100] [--prompts 16] [--input-len 32] [--output-len 32]
        [--only NAME,NAME] [--json FILE]

Benign: engine changes a search proposes, another reduction order, compiled kernels, and a stock that itself rounds by
batch composition (what a GPU does: the reference is batch-variant too). Lossy: lower precision, an approximate
argmax, a layer skipped late in long requests, a cache keyed on the prompt's tail, the longest request cut and padded
at 10-90% of its length, an early EOS. Prints one row per variant: pairs, pairs with any differing request, pairs the
rule passed and refused, flips judged, the largest honest margin, and the scoring's cost against the pair's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BASE_ENGINE = {
    "enforce_eager": True,
    "max_model_len": 1024,
    "dtype": "float32",
    "max_num_seqs": 4,
    "distributed_executor_backend": "uni",
    "seed": 0,
}
# name -> (benign?, group (whose stock is the reference), engine overrides, patch, synthetic cheat on the stock answers)
VARIANTS: dict[str, tuple[bool, str, dict, str, str]] = {
    "A/A: the baseline again": (True, "stock", {}, "", ""),
    "max_num_seqs 4 -> 32": (True, "stock", {"max_num_seqs": 32}, "", ""),
    "rms_norm: native provider (another reduction order)": (
        True,
        "stock",
        {"ir_op_priority": {"rms_norm": ["native"]}},
        "",
        "",
    ),
    "lm head summed in two halves (fp32, another order)": (True, "stock", {}, "split_head", ""),
    "compiled (enforce_eager false)": (True, "stock", {"enforce_eager": False}, "", ""),
    "batch-variant stock: max_num_seqs 4 -> 32": (True, "batch-variant", {"max_num_seqs": 32}, "batch_variant", ""),
    "batch-variant stock: max_num_seqs 4 -> 1": (True, "batch-variant", {"max_num_seqs": 1}, "batch_variant", ""),
    "final hidden states one precision lower (bf16; fp8 in 16-bit)": (False, "stock", {}, "bf16_hidden", ""),
    "logits quantized to 0.01 (an approximate argmax)": (False, "stock", {}, "quantized_logits", ""),
    "last layer skipped past position 96 (long requests)": (False, "stock", {}, "skip_late", ""),
    "answers cached by the prompt's last 4 tokens": (False, "stock", {}, "suffix_cache", ""),
    **{
        f"longest request cut at {p}% and padded": (False, "stock", {}, "", f"cut:{p / 100}")
        for p in (10, 30, 50, 70, 90)
    },
    "longest request stops early (EOS at 75%)": (False, "stock", {}, "", "eos:0.75"),
}
GROUP_PATCH = {"stock": "", "batch-variant": "batch_variant"}
# the batch-variant stock's rounding: what a GPU's split reductions do to float32 logits, a little more (a flip then
# needs a near tie of 2 * 3e-5 nats), below the float32 tie (1e-4) so the reference's own flips stay within it
BATCH_NOISE = {"float32": 3e-5, "bfloat16": 1e-2, "float16": 2e-3}  # below half the dtype's tie
EVAL_PAIRS = 5  # pairs of the smallest evaluation the gate makes (a large effect stops at its first look)


LOSSY_QUANTUM = {"float32": 0.01, "bfloat16": 0.25, "float16": 0.1}  # the approximate argmax's logit step (nats)


def patch(name: str, dtype: str = "float32") -> None:
    """Apply a variant's change to vLLM's Llama code in this process (before the engine is built)."""
    if not name:
        return
    import torch
    from vllm.model_executor.models import llama

    orig_logits = llama.LlamaForCausalLM.compute_logits

    def split(self, hidden):
        w = self.lm_head.weight
        k = hidden.shape[-1] // 2
        full = orig_logits(self, hidden)
        halves = hidden[:, :k] @ w[:, :k].T + hidden[:, k:] @ w[:, k:].T
        return halves[:, : full.shape[-1]].to(full.dtype)

    if name == "split_head":
        llama.LlamaForCausalLM.compute_logits = split
    elif name == "batch_variant":  # every logit rounded by up to BATCH_NOISE nats, set by the batch's size
        noise: dict[tuple[int, int], torch.Tensor] = {}

        def by_batch(self, h):
            logits = orig_logits(self, h)
            key = (h.shape[0], logits.shape[-1])
            if key not in noise:
                g = torch.Generator().manual_seed(h.shape[0])
                size = BATCH_NOISE.get(dtype, BATCH_NOISE["float32"])
                noise[key] = (torch.rand(logits.shape[-1], generator=g, dtype=torch.float64) * 2 - 1) * size
            return logits + noise[key].to(logits.dtype)

        llama.LlamaForCausalLM.compute_logits = by_batch
    elif name == "bf16_hidden":  # one precision below the model's: bfloat16 in a float32 model, 8 bits in a 16-bit one
        low = torch.bfloat16 if dtype == "float32" else torch.float8_e4m3fn
        llama.LlamaForCausalLM.compute_logits = lambda self, h: orig_logits(self, h.to(low).to(h.dtype))
    elif name == "quantized_logits":
        q = LOSSY_QUANTUM.get(dtype, 0.01)
        llama.LlamaForCausalLM.compute_logits = lambda self, h: torch.round(orig_logits(self, h) / q) * q
    elif name == "skip_late":
        layer = llama.LlamaDecoderLayer
        orig_init, orig_fwd = layer.__init__, layer.forward

        def init(self, vllm_config, prefix="", **kw):
            orig_init(self, vllm_config, prefix=prefix, **kw)
            n = vllm_config.model_config.hf_config.num_hidden_layers
            self._last = prefix.endswith(f".{n - 1}")

        def fwd(self, positions, hidden_states, residual, **kw):
            h, r = orig_fwd(self, positions, hidden_states, residual, **kw)
            if not getattr(self, "_last", False) or residual is None:
                return h, r
            late = (positions > 96).unsqueeze(-1)
            return torch.where(late, hidden_states, h), torch.where(late, residual, r)

        layer.__init__, layer.forward = init, fwd
    elif name != "suffix_cache":
        raise ValueError(f"unknown patch {name!r}")


def spec(model: str, engine: dict, params: dict, dtype: str = "float32") -> dict:
    engine = {**BASE_ENGINE, "dtype": dtype, **engine}
    return {"kind": "vllm-throughput", "model": model, "engine": engine, "params": params}


def items(seed: int, params: dict, answers: list[tuple[int, list[int]]]) -> list[dict]:
    return [{"seed": seed, "index": 0, "request": i, "params": params, "tokens": t} for i, t in answers]


def child(job: dict) -> dict:
    """One engine: generate (with ``job["score"]`` answers of the baseline to score as the candidate), or score."""
    from harness.workers.vllm_worker import Engine

    dtype = job.get("dtype", "float32")
    patch(job["patch"], dtype)
    t0 = time.perf_counter()
    eng = Engine(spec(job["model"], job["engine"], job["params"], dtype))
    out: dict = {"startup_s": time.perf_counter() - t0, "outputs": {}, "wall": {}, "scores": {}, "score_s": {}}
    if job["mode"] == "generate":
        for seed in job["seeds"]:
            t = time.perf_counter()
            if job["patch"] == "suffix_cache":
                from vllm import SamplingParams
                from vllm.inputs import TokensPrompt

                prompts, outs = eng.throughput_requests(seed, job["params"])
                res = eng.llm.generate(
                    [TokensPrompt(prompt_token_ids=p[-4:]) for p in prompts],
                    [SamplingParams(max_tokens=o, ignore_eos=True, temperature=0.0) for o in outs],
                    use_tqdm=False,
                )
                got = [list(r.outputs[0].token_ids) for r in res]
            else:
                eng.measure(seed)
                got = eng.last_outputs or []
            out["wall"][seed] = time.perf_counter() - t
            out["outputs"][seed] = got
        base = job.get("base") or {}
        for seed in job["seeds"]:  # the candidate's direction: the baseline's differing answers under this engine
            b = base.get(str(seed))
            if b is None:
                continue
            differ = [(i, x) for i, (x, y) in enumerate(zip(b, out["outputs"][seed], strict=True)) if x != y]
            differ = [(i, x) for i, x in differ if len(x) == len(out["outputs"][seed][i])]
            if differ:
                t = time.perf_counter()
                out["scores"][seed] = eng.score(
                    {"kind": "vllm-throughput", "items": items(seed, job["params"], differ)}
                )
                out["score_s"][seed] = time.perf_counter() - t
    else:
        for key, (seed, asked, _) in job["asks"].items():
            t = time.perf_counter()
            out["scores"][key] = eng.score({"kind": "vllm-throughput", "items": items(seed, job["params"], asked)})
            out["score_s"][key] = time.perf_counter() - t
    return out


def synthetic(cheat: str, answers: list[list[int]]) -> list[list[int]]:
    """The stock answers with the longest request cut and padded (``cut:share``) or stopped early (``eos:share``)."""
    kind, share = cheat.split(":")
    out = [list(a) for a in answers]
    i = max(range(len(out)), key=lambda j: len(out[j]))
    n = len(out[i])
    k = max(1, int(n * float(share)))
    out[i] = out[i][:k] + [out[i][k - 1]] * (n - k) if kind == "cut" else out[i][:k]
    return out


def run_child(job: dict, tmp: Path, env: dict) -> dict:
    path = tmp / f"job-{time.monotonic_ns()}.json"
    path.write_text(json.dumps(job))
    p = subprocess.run(
        [sys.executable, __file__, "--child", str(path)], env=env, capture_output=True, text=True, cwd=str(tmp)
    )
    res = tmp / (path.name + ".out")
    if p.returncode != 0 or not res.exists():
        tail = (p.stderr.strip().splitlines() or ["?"])[-3:]
        raise RuntimeError(f"{job['mode']} {job.get('name', '')}: the engine failed: {' | '.join(tail)[:400]}")
    return json.loads(res.read_text(), object_hook=lambda d: {(int(k) if k.isdigit() else k): v for k, v in d.items()})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--only", default="", help="comma-separated variant names (default: all)")
    ap.add_argument("--json", default="", help="write the rows here too")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        job = json.loads(Path(a.child).read_text())
        Path(a.child + ".out").write_text(json.dumps(child(job)))
        return 0
    if a.seeds < 1 or a.prompts < 1:
        ap.error("--seeds and --prompts must be at least 1")
    from harness import models
    from harness.outputs_rule import Floor, judge, measured_floor, parse_scores

    model = models.resolve(a.model)
    params = {"prompts": a.prompts, "input_len": a.input_len, "output_len": a.output_len, "length_dist": "zipf"}
    seeds = list(range(1, a.seeds + 1))
    names = [n for n in VARIANTS if not a.only or n in a.only.split(",")]
    env = {
        **os.environ,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": "2",
        "OMP_NUM_THREADS": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "PYTHONPATH": str(ROOT),
    }

    def say(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    rows = []
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        for group in sorted({VARIANTS[n][1] for n in names}):
            gpatch = GROUP_PATCH[group]
            common = {"model": model, "params": params, "seeds": seeds, "dtype": a.dtype}
            say(f"{group}: the baseline")
            base = run_child({**common, "mode": "generate", "engine": {}, "patch": gpatch, "name": group}, tmp, env)
            cands = {}
            for n in [n for n in names if VARIANTS[n][1] == group]:
                _, _, engine, vpatch, cheat = VARIANTS[n]
                if cheat:
                    cands[n] = {"outputs": {s: synthetic(cheat, base["outputs"][s]) for s in seeds}, "scores": {}}
                    continue
                say(f"{group}: {n}")
                job = {**common, "mode": "generate", "engine": engine, "patch": vpatch or gpatch, "name": n}
                job["base"] = {str(s): base["outputs"][s] for s in seeds}
                try:
                    cands[n] = run_child(job, tmp, env)
                except RuntimeError as exc:
                    say(str(exc))
            # the baseline's engine scores each differing candidate answer and its own answers: as the gate does, every
            # one of them at a variant's first pair with flips (the run's floor), those of the differing requests later
            asks = {}
            for c in cands.values():
                first_flip = True
                for s in seeds:
                    b, y = base["outputs"][s], c["outputs"][s]
                    flips = [i for i, (p, q) in enumerate(zip(b, y, strict=True)) if p != q and len(p) == len(q)]
                    if flips:
                        own = [i for i in range(len(b)) if i in flips or b[i] == y[i]] if first_flip else flips
                        first_flip = False
                        asks[len(asks)] = (s, [(i, y[i]) for i in flips] + [(i, b[i]) for i in own], len(flips))
            say(f"{group}: the baseline scores {len(asks)} pair(s)")
            job = {**common, "mode": "score", "engine": {}, "patch": gpatch, "asks": asks, "name": "scorer"}
            scored = run_child(job, tmp, env)
            by_pair = {}  # (variant, seed) -> its key in asks (the same order as asks was built)
            k = 0
            for n, c in cands.items():
                for s in seeds:
                    b, y = base["outputs"][s], c["outputs"][s]
                    if any(p != q and len(p) == len(q) for p, q in zip(b, y, strict=True)):
                        by_pair[(n, s)] = k
                        k += 1
            for n, c in cands.items():
                benign = VARIANTS[n][0]
                passed = differ = flips = differ_passed = 0
                floor_seen, floor_positions = 0.0, 0
                per_pair = []
                worst_honest, score_s, pair_s, reasons = 0.0, 0.0, 0.0, []
                for s in seeds:
                    b, y = base["outputs"][s], c["outputs"][s]
                    pair_s += base["wall"][s] + c.get("wall", {}).get(s, base["wall"][s])
                    scores, floor = {}, Floor.of(a.dtype, 0.0, 0)
                    if (n, s) in by_pair:  # (asks were built per variant in seed order: the floor accrues alike)
                        key = by_pair[(n, s)]
                        _, asked, m = asks[key]
                        got = scored["scores"][key]
                        answers = [t for _, t in asked]
                        first, _ = parse_scores(got["scores"], answers)
                        again, _ = parse_scores(got["again"], answers)
                        assert first is not None and again is not None
                        own = list(first[m:])  # the floor on the baseline's own answers, as the gate measures it
                        measured, npos = measured_floor(own, list(again[m:]), own)
                        floor_seen, floor_positions = max(floor_seen, measured), floor_positions + npos
                        floor = Floor.of(a.dtype, floor_seen, floor_positions)
                        theirs = {}
                        if s in c.get("scores", {}):
                            mine = [i for i, _ in asked[:m]]
                            t2, _ = parse_scores(c["scores"][s]["scores"], [b[i] for i in mine])
                            theirs = dict(zip(mine, t2 or [], strict=False))
                            score_s += c["score_s"][s]
                        scores = {i: (first[j], theirs.get(i)) for j, (i, _) in enumerate(asked[:m])}
                        score_s += scored["score_s"][key]
                    v = judge(b, y, scores, floor)
                    differ += b != y
                    passed += v.passed
                    differ_passed += v.passed and b != y
                    per_pair.append(v.passed)
                    flips += len(v.flips)
                    worst_honest = max([worst_honest] + [f.margin for f in v.flips if f.honest])
                    if not v.passed and len(reasons) < 2:
                        reasons.append(v.reasons[0])
                row = {
                    "variant": n,
                    "benign": benign,
                    "pairs": len(seeds),
                    "differ": differ,
                    "passed": passed,
                    "refused": len(seeds) - passed,
                    "differ_passed": differ_passed,
                    # evaluations of EVAL_PAIRS pairs each (the gate's smallest): refused when any pair is
                    "evaluations": len(per_pair) // EVAL_PAIRS,
                    "evaluations_refused": sum(
                        not all(per_pair[i : i + EVAL_PAIRS])
                        for i in range(0, len(per_pair) - EVAL_PAIRS + 1, EVAL_PAIRS)
                    ),
                    "flips": flips,
                    "largest_honest_margin": worst_honest,
                    "score_s_per_pair": score_s / len(seeds),
                    "pair_s": pair_s / len(seeds),
                    "examples": reasons,
                }
                rows.append(row)
                say(f"{n}: {row['passed']}/{row['pairs']} passed, {differ} differ")
    print(
        f"model {a.model}, {a.seeds} zipf batches of {a.prompts} requests (input {a.input_len}, output "
        f"{a.output_len} mean), greedy, {a.dtype}, CPU; baseline engine {json.dumps({**BASE_ENGINE, 'dtype': a.dtype})}"
    )
    head = f"{'variant':54} {'kind':6} {'pairs':>5} {'differ':>6} {'passed':>6} {'refused':>7} {'flips':>5}"
    print(head + f" {'evals refused':>13} {'max honest margin':>17} {'scoring s/pair':>14} {'pair s':>7}")
    for r in rows:
        print(
            f"{r['variant']:54} {'benign' if r['benign'] else 'lossy':6} {r['pairs']:>5} {r['differ']:>6} "
            f"{r['passed']:>6} {r['refused']:>7} {r['flips']:>5} "
            f"{str(r['evaluations_refused']) + '/' + str(r['evaluations']):>13} {r['largest_honest_margin']:>17.3g} "
            f"{r['score_s_per_pair']:>14.4f} {r['pair_s']:>7.3f}"
        )
    for r in rows:
        if r["examples"] and (r["benign"] or r["passed"]):
            print(f"  {r['variant']}: {r['examples'][0]}")
    bad = [
        r
        for r in rows
        if (r["benign"] and r["refused"] > 0.01 * r["pairs"])
        or (not r["benign"] and (r["differ_passed"] or r["evaluations_refused"] < r["evaluations"]))
    ]
    print(
        f"acceptance: benign false rejects <= 1% of pairs; lossy: no differing pair passed and every evaluation "
        f"({EVAL_PAIRS} pairs) refused: "
        + ("holds" if not bad else "FAILS for " + ", ".join(r["variant"] for r in bad))
    )
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())

"""False rejects of the timed outputs check on honest changes: the per-request rule against the old average.

Timed runs decode greedily and each side reports the tokens of every request; the gate compares them per seed.
The old rule passed a pair when the mean share of each request's tokens before the first difference was >= 99%
and >= 95% of the requests were identical; the per-request rule (``agentsearch.workloads.OutputsMatch``) needs
every request identical in full. This script measures, on the real vLLM CPU engine, how often honest changes —
engine configurations the searches propose and benign kernel swaps — differ from the baseline at all, for
zipf batches like the timed runs' (``harness/workers/vllm_worker.py``'s ``make_prompts``).

Each variant runs in its own child process (one engine), the baseline twice (A/A: is the engine deterministic?).

    .venv/bin/python benchmarks/outputs_rule.py [--model tiny|smollm2|DIR] [--seeds 20] [--prompts 64] [--output-len 64]

Prints one row per variant: pairs (seeds), pairs with any divergent request (the per-request rule's false
rejects), pairs the old rule would have failed, and the divergent requests' share.
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
# honest changes: what a search proposes (engine configuration) and kernel providers that compute the same op
VARIANTS: dict[str, dict] = {
    "baseline": {},
    "baseline again (A/A)": {},
    "max_num_seqs 4 -> 32": {"max_num_seqs": 32},
    "max_num_seqs 4 -> 1": {"max_num_seqs": 1},
    "max_num_batched_tokens 256 (chunked prefill)": {"max_num_batched_tokens": 256, "enable_chunked_prefill": True},
    "block_size 16 -> 32": {"block_size": 32},
    "enable_prefix_caching off": {"enable_prefix_caching": False},
    "rms_norm: native torch provider": {"ir_op_priority": {"rms_norm": ["native"]}},
    "fused_add_rms_norm: native provider": {"ir_op_priority": {"fused_add_rms_norm": ["native"]}},
}


def child(variant: str, model: str, seeds: int, prompts: int, input_len: int, output_len: int, out: str) -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from harness.workers.vllm_worker import make_prompts

    engine = {**BASE_ENGINE, **VARIANTS[variant]}
    t0 = time.perf_counter()
    llm = LLM(model=model, **engine)
    started = time.perf_counter() - t0
    vocab = int(llm.llm_engine.model_config.get_vocab_size())
    rows = []
    for seed in range(1, seeds + 1):
        ps, outs = make_prompts(seed, prompts, input_len, output_len, "zipf", min(vocab, 16000))
        ps = [x[:512] for x in ps]
        outs = [max(1, min(o, 1024 - len(x))) for x, o in zip(ps, outs, strict=True)]
        res = llm.generate(
            [TokensPrompt(prompt_token_ids=x) for x in ps],
            [SamplingParams(max_tokens=o, ignore_eos=True, temperature=0.0) for o in outs],
            use_tqdm=False,
        )
        rows.append([list(r.outputs[0].token_ids) for r in res])
    Path(out).write_text(json.dumps({"variant": variant, "startup_s": started, "outputs": rows}))


def old_rule(base: list[list[int]], cand: list[list[int]]) -> bool:
    from agentsearch.workloads import agreement

    share, same = agreement(tuple(map(tuple, base)), tuple(map(tuple, cand)))
    return share >= 0.99 and same >= 0.95


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--only", default="", help="comma-separated variant names (default: all)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.seeds < 1 or a.prompts < 1:
        ap.error("--seeds and --prompts must be at least 1")
    from harness import models

    model = models.resolve(a.model)
    if a.child:
        child(a.child, model, a.seeds, a.prompts, a.input_len, a.output_len, a.out)
        return 0
    names = [n for n in VARIANTS if not a.only or n in a.only.split(",") or n == "baseline"]
    env = {
        **os.environ,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": "2",
        "OMP_NUM_THREADS": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "PYTHONPATH": str(ROOT),
    }
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in names:
            out = Path(tmp) / f"{len(results)}.json"
            print(f"[{time.strftime('%H:%M:%S')}] {n} ...", file=sys.stderr, flush=True)
            p = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    n,
                    "--out",
                    str(out),
                    "--model",
                    a.model,
                    "--seeds",
                    str(a.seeds),
                    "--prompts",
                    str(a.prompts),
                    "--input-len",
                    str(a.input_len),
                    "--output-len",
                    str(a.output_len),
                ],
                env=env,
                capture_output=True,
                text=True,
            )
            if p.returncode != 0 or not out.exists():
                tail = (p.stderr.strip().splitlines() or ["?"])[-1]
                print(f"  {n}: the engine failed: {tail[:200]}", file=sys.stderr)
                continue
            results[n] = json.loads(out.read_text())
    base = results.get("baseline")
    if base is None:
        print("the baseline engine failed: nothing to compare", file=sys.stderr)
        return 1
    print(
        f"model {a.model}, {a.seeds} zipf batches of {a.prompts} requests "
        f"(input {a.input_len}, output {a.output_len} mean), "
        f"greedy, float32, CPU; baseline engine {json.dumps(BASE_ENGINE)}"
    )
    print(f"{'variant':48} {'pairs':>5} {'per-request fails':>17} {'old rule fails':>14} {'divergent requests':>18}")
    for n, r in results.items():
        if n == "baseline":
            continue
        pairs = len(r["outputs"])
        fails = sum(1 for b, c in zip(base["outputs"], r["outputs"], strict=False) if b != c)
        old = sum(1 for b, c in zip(base["outputs"], r["outputs"], strict=False) if not old_rule(b, c))
        div = sum(
            1 for b, c in zip(base["outputs"], r["outputs"], strict=False) for x, y in zip(b, c, strict=False) if x != y
        )
        total = sum(len(b) for b in base["outputs"])
        print(f"{n:48} {pairs:>5} {fails:>17} {old:>14} {div:>9} / {total:<7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

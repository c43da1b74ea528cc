"""How long a sandboxed engine's ``LLM(...)`` takes with vLLM's model inspection in a subprocess (vLLM as it is, with
an empty ``$VLLM_CACHE_ROOT`` as in every sandbox) and in the worker's own process (``inspect_models_in_process``).

    .venv/bin/python benchmarks/engine_startup.py [--runs 2]

Each measurement is a fresh Python process: the tiny model (built offline), the starter's engine arguments
(enforce_eager, max_model_len 512, float32, one process), a new temporary ``VLLM_CACHE_ROOT``; then one greedy request,
whose tokens must be the same both ways. Prints one line per process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[3])
import vllm_worker
from vllm import LLM, SamplingParams
t = time.perf_counter()
patched = vllm_worker.inspect_models_in_process() if sys.argv[2] == "patch" else False
llm = LLM(model=sys.argv[1], enforce_eager=True, max_model_len=512, dtype="float32",
          distributed_executor_backend="uni", max_num_seqs=1)
startup = time.perf_counter() - t
out = llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=5, temperature=0), use_tqdm=False)
print("RESULT " + json.dumps({"patched": patched, "llm_s": startup, "tokens": list(out[0].outputs[0].token_ids)}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    model = subprocess.run(
        [sys.executable, "-m", "agentsearch.cli", "model", "tiny"], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.split()[-1]
    env_base = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": "1",
    }
    tokens = set()
    for _ in range(args.runs):
        for mode in ("nopatch", "patch"):
            with tempfile.TemporaryDirectory() as cache:
                proc = subprocess.run(
                    [sys.executable, "-c", CHILD, model, mode, str(ROOT / "harness" / "workers")],
                    env={**env_base, "VLLM_CACHE_ROOT": cache},
                    capture_output=True,
                    text=True,
                )
            line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                raise SystemExit(f"error: the engine did not start: {proc.stderr.strip().splitlines()[-1:]}")
            r = json.loads(line[7:])
            tokens.add(tuple(r["tokens"]))
            where = "in process" if r["patched"] else "subprocess"
            print(f"{where:<11} LLM() {r['llm_s']:5.1f} s  tokens {r['tokens']}")
    print("the same tokens both ways" if len(tokens) == 1 else f"error: the tokens differ: {sorted(tokens)}")


if __name__ == "__main__":
    main()

"""A toy vLLM fork for engine tests and benchmarks: a stand-in ``vllm`` package (``LLM.generate`` sleeps, or burns
CPU, for a cost per token read from the worktree's cost.txt; greedy "tokens" derived from the prompt) served by the
harness's real warm worker, in the real sandbox, with the real gate. Shared by tests/redteam (the attacks on the
engine path) and benchmarks/contention.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .toy import make_repo, run_cli

TOY_VLLM = '''
import math, os, time
__version__ = "0.0+toy"


class SamplingParams:
    def __init__(self, max_tokens=16, ignore_eos=False, temperature=0.0, seed=None, prompt_logprobs=None, **kw):
        self.max_tokens, self.temperature = max_tokens, temperature
        self.prompt_logprobs = prompt_logprobs


class Logprob:
    def __init__(self, logprob, rank):
        self.logprob, self.rank = logprob, rank


class _Completion:
    def __init__(self, token_ids):
        self.token_ids = token_ids


class _Result:
    def __init__(self, prompt_token_ids, token_ids, prompt_logprobs=None):
        self.prompt_token_ids, self.outputs = prompt_token_ids, [_Completion(token_ids)]
        self.prompt_logprobs = prompt_logprobs


# The toy model: the next token depends on the last one. Its greedy choice nxt(t) has logprob log 0.5, the runner-up
# alt(t) log 0.5 minus margin(t): a near tie (1e-6 nats) after one token in 23, 5e-3 after one in 5, else 0.5.
VOCAB = 9973


def nxt(t):
    return (t * 31 + 7) % VOCAB


def alt(t):
    return (t * 17 + 3) % VOCAB if (t * 17 + 3) % VOCAB != nxt(t) else (t + 1) % VOCAB


def margin(t):
    return 1e-6 if t % 23 == 0 else (5e-3 if t % 5 == 0 else 0.5)


def step(t):
    return nxt(t)  # greedy (a variant may flip where margin(t) is small)


def logprob(prev, tok):
    if tok == nxt(prev):
        return math.log(0.5)
    if tok == alt(prev):
        return math.log(0.5) - margin(prev)
    return math.log(1e-4)


def greedy(ids, n):
    t, out = ids[-1] if ids else 0, []
    for _ in range(n):
        t = step(t)
        out.append(t)
    return out


def scored(ids):
    rows = [None]
    for i in range(1, len(ids)):
        top = nxt(ids[i - 1])
        d = {top: Logprob(math.log(0.5), 1)}
        if ids[i] != top:
            d[ids[i]] = Logprob(logprob(ids[i - 1], ids[i]), 2 if ids[i] == alt(ids[i - 1]) else 3)
        rows.append(d)
    return rows


class _Config:
    dtype = "float32"

    def get_vocab_size(self):
        return VOCAB


class _Engine:
    model_config = _Config()


class LLM:
    def __init__(self, model=None, **engine):
        self.cost = float(open("cost.txt").read())  # seconds of "work" per generated token
        self.llm_engine = _Engine()

    def reset_prefix_cache(self):
        return True

    def generate(self, prompts, sampling_params=None, use_tqdm=False):
        sps = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        out = []
        for p, sp in zip(prompts, sps):
            ids = list(p["prompt_token_ids"])
            if getattr(sp, "prompt_logprobs", None):
                out.append(_Result(ids, [nxt(ids[-1])], scored(ids)))
                continue
            time.sleep(self.cost * sp.max_tokens)
            out.append(_Result(ids, greedy(ids, sp.max_tokens)))
        return out
'''

TOY_INPUTS = '''
def TokensPrompt(**kw):
    return dict(kw)
'''

CONFIG = """
[target]
baseline = "main"
protected = ["bench/**"]

[[workload]]
name = "{name}"
kind = "{kind}"
model = "{model}"
metric = "{metric}"
higher_is_better = {hib}
timeout_s = 60
restarts = 1
params = {{ prompts = 16, input_len = 16, output_len = 16, batch_size = 4, iterations = 3, vary_lengths = false }}

[gate]
max_pairs = 8
confirm_pairs = 3
coverage = false
"""

TOY_MODEL = str(Path(__file__).resolve().parent / "toy-model")  # a model directory (the toy engine ignores it)
THROUGHPUT = dict(name="throughput", kind="vllm-throughput", metric="output_tok_s", hib="true", model=TOY_MODEL)
LATENCY = dict(name="latency", kind="vllm-latency", metric="latency_mean_s", hib="false", model=TOY_MODEL)


def target(tmp_path, workload=THROUGHPUT, engine: str = "", vllm: str = TOY_VLLM, gate: str = ""):
    """A toy vLLM fork (``engine``: lines of an [engine] section to add to its config; ``gate``: of its [gate])."""
    config = CONFIG.format(**workload).replace(
        "coverage = false\n", f"coverage = false\n{gate}\n" if gate else "coverage = false\n"
    )
    config += f"\n[engine]\n{engine}\n" if engine else ""
    repo = make_repo(
        tmp_path / "fork",
        {"agentsearch.toml": config, "vllm/__init__.py": vllm, "vllm/inputs.py": TOY_INPUTS, "cost.txt": "0.0008\n"},
    )
    proc = run_cli("init", "-C", str(repo))
    assert proc.returncode == 0, proc.stderr
    return repo


def evaluate(repo, ref):
    proc = run_cli("evaluate", "-C", str(repo), ref, "--json", timeout=280)
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


CPU_VLLM = TOY_VLLM.replace(
    "            time.sleep(self.cost * sp.max_tokens)\n",
    "            for _ in range(int(self.cost * 2.5e7 * sp.max_tokens)):  # CPU-bound work: slowed by competition\n                pass\n",
)

# the candidate's engine starts a daemon while it boots (before it is pinned): double-forked, it is no longer in
# the engine's process tree; at every measurement it unpins itself and does half of the CPU-bound work
DAEMON = '''
def _daemon_start():
    todo_r, todo_w = os.pipe()
    done_r, done_w = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:  # the daemon: reparented away from the engine's tree
            while True:
                n = int.from_bytes(os.read(todo_r, 8), "big")
                try:
                    os.sched_setaffinity(0, set(range(os.cpu_count())))
                except OSError:
                    pass
                for _ in range(n):
                    pass
                os.write(done_w, b"1")
        os._exit(0)
    os.wait()
    return todo_w, done_r


_TODO, _DONE = _daemon_start()


def _generate(self, prompts, sampling_params=None, use_tqdm=False):
    os.sched_setaffinity(0, set(range(os.cpu_count())))
    sps = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
    work = [int(self.cost * 2.5e7 * sp.max_tokens) for sp in sps]
    half = len(work) // 2
    os.write(_TODO, sum(work[half:]).to_bytes(8, "big"))
    for n in work[:half]:
        for _ in range(n):
            pass
    os.read(_DONE, 1)
    return [_Result(list(p["prompt_token_ids"]), greedy(list(p["prompt_token_ids"]), sp.max_tokens)) for p, sp in zip(prompts, sps)]


LLM.generate = _generate
'''


class Hog:
    """A busy loop on CPU 1 (the engines' pinned CPU) for a with-block: foreign load the engines contend with."""

    def __enter__(self):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "while True: pass"], preexec_fn=lambda: os.sched_setaffinity(0, {1})
        )
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()

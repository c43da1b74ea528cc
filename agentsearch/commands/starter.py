"""The starter agentsearch.toml (and serving.json) written into the embedded vLLM fork."""

from __future__ import annotations

import json
from pathlib import Path

# The fork's serving config: engine arguments and environment that proposals may change
# (this is how configuration proposals work). A conservative batch limit to start from.
STARTER_SERVING = {"engine": {"max_num_seqs": 4, "max_num_batched_tokens": 2048}, "env": {}}


def starter_serving() -> str:
    return json.dumps(STARTER_SERVING, indent=2) + "\n"


def starter_config(site_packages: Path) -> str:
    return f'''# agentsearch target: vLLM (the installed build; Python sources tracked here) on CPU,
# measured with the tiny model built offline. serving.json holds the engine settings
# proposals may change; this file and bench/ are protected.
[target]
baseline = "main"
protected = ["bench/**", "*.dist-info/**"]
install = "overlay"
overlay_from = "{site_packages}"

# One process per engine: the engine core and its worker run in the measuring process
# (start-up 54 -> 20 s on 2 cores; the same on both sides, so the comparison stays fair). A
# proposal that changes only the engine core's inter-process path (ZMQ client, serialization)
# then runs none of its lines and the coverage check rejects it: for such proposals set
# VLLM_ENABLE_V1_MULTIPROCESSING = "1" and drop distributed_executor_backend below.
# In one process vLLM's "auto" thread binding pins the scheduler and the model to one core;
# "nobind" with one OpenMP thread: with two, one busy core elsewhere made trials 9x noisier
# (benchmarks/engine_noise.py: trial SD 1.80 vs 0.09; quiet 0.07-0.15 vs 0.03-0.05).
[target.env]
VLLM_CPU_KVCACHE_SPACE = "1"
VLLM_ENABLE_V1_MULTIPROCESSING = "0"
VLLM_CPU_OMP_THREADS_BIND = "nobind"
OMP_NUM_THREADS = "1"

[[workload]]
name = "throughput"
kind = "vllm-throughput"
metric = "output_tok_s"
higher_is_better = true
timeout_s = 300
# 5 engine sessions per side of 6 pairs ([gate] max_pairs 30). Simulated (benchmarks/gate_quality.py) at a per-pair
# SD of 0.032: a true 3% win merged 87-90% of the time (2 sessions of 6, 12 pairs: 46%); a change of 20% or more
# and (at a quiet hour) a no-op stop within the first two sessions as before; a close call runs on. \
Each proposal's engine-session
# effect is estimated on 4 degrees of freedom (2 sessions: 1), which keeps false merges within the level under an
# engine-instance effect of SD 1.1% per side and makes the lottery attack (docs/measured.md) rarer.
restarts = 5
engine = {{ enforce_eager = true, max_model_len = 1024, dtype = "float32", distributed_executor_backend = "uni" }}
params = {{ prompts = 48, input_len = 48, output_len = 48, length_dist = "uniform" }}

[[workload]]
name = "serve-c1"
kind = "vllm-serve"
metric = "output_tok_s"
higher_is_better = true
timeout_s = 300
restarts = 1
max_pairs = 16  # a warm load generator: a trial costs its requests (seconds), not a vLLM import; \
16 pairs see a 10% regression at SD ~0.13
engine = {{ enforce_eager = true, max_model_len = 1024, dtype = "float32", distributed_executor_backend = "uni" }}
params = {{ prompts = 16, input_len = 32, output_len = 32, max_concurrency = 1 }}

[[workload]]
name = "serve-c8"
kind = "vllm-serve"
metric = "output_tok_s"
higher_is_better = true
timeout_s = 300
restarts = 1
max_pairs = 20
engine = {{ enforce_eager = true, max_model_len = 1024, dtype = "float32", distributed_executor_backend = "uni" }}
params = {{ prompts = 32, input_len = 32, output_len = 32, max_concurrency = 8 }}

[gate]
min_effect = 0.02
max_pairs = 30
min_pairs = 3
confirm_pairs = 4

# Distribution checks (the last check, for survivors only): the baseline's and the candidate's
# token distributions on a multilingual corpus and a hidden holdout, on three paths: prefill,
# greedy decode, and sample (the sampler's processed logprobs under temperature / top-k / top-p /
# min-p / penalties, plus a paired draw test). profile "quick" = 56 prompts (4 per language);
# "full" = all 336 (see docs/design/distribution.md for what each costs).
[verify]
kind = "vllm"
profile = "quick"
max_tokens = 8
engine = {{ distributed_executor_backend = "uni" }}

# The sweep's search space (agentsearch episode --proposer sweep): engine arguments and
# environment in serving.json. prior_wins = what is known before any measurement.
[sweep]
file = "serving.json"

[[sweep.knob]]
name = "max_num_seqs"
values = [8, 16, 32, 64]
category = "scheduling"
prior_wins = 2.0
rationale = "The batch limit: with a tiny model the engine is launch-bound and larger batches amortize each step."

[[sweep.knob]]
name = "max_num_batched_tokens"
values = [1024, 4096, 8192]
category = "scheduling"
rationale = "Tokens per scheduler step: bounds prefill chunking and how many sequences run together."

[[sweep.knob]]
name = "block_size"
values = [32, 64, 128]
category = "memory"
rationale = "KV-cache block size: fewer, larger blocks mean less paging bookkeeping per step."

[[sweep.knob]]
name = "enable_chunked_prefill"
values = [false, true]
category = "scheduling"
rationale = "Mixing prefill chunks into decode steps changes batching of short requests."

[[sweep.knob]]
name = "enable_prefix_caching"
values = [false, true]
category = "memory"
rationale = "Hashing blocks for prefix reuse costs time when prompts share no prefix."

[[sweep.knob]]
name = "VLLM_CPU_KVCACHE_SPACE"
where = "env"
values = ["2", "4"]
category = "memory"
rationale = "KV-cache space in GiB on CPU: more space admits more concurrent sequences."

[[sweep.knob]]
name = "enforce_eager"
values = [false]
category = "graph/launch"
rationale = "torch.compile the model (slower start-up, possibly faster steps)."

[[sweep.knob]]
name = "compilation_config"
values = [0, 3]
category = "graph/launch"
gpu_only = true
rationale = "Compilation mode (0: none, 3: vLLM's torch.compile with CUDA graphs; GPU only)."
'''

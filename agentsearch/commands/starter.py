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

[target.env]
VLLM_CPU_KVCACHE_SPACE = "1"

[[workload]]
name = "throughput"
kind = "vllm-throughput"
metric = "output_tok_s"
higher_is_better = true
timeout_s = 300
restarts = 2
engine = {{ enforce_eager = true, max_model_len = 1024, dtype = "float32" }}
params = {{ prompts = 48, input_len = 48, output_len = 48, length_dist = "uniform" }}

[[workload]]
name = "serve-c1"
kind = "vllm-serve"
metric = "output_tok_s"
higher_is_better = true
timeout_s = 300
restarts = 1
max_pairs = 3
engine = {{ enforce_eager = true, max_model_len = 1024, dtype = "float32" }}
params = {{ prompts = 16, input_len = 32, output_len = 32, max_concurrency = 1 }}

[[workload]]
name = "serve-c8"
kind = "vllm-serve"
metric = "output_tok_s"
higher_is_better = true
timeout_s = 300
restarts = 1
max_pairs = 3
engine = {{ enforce_eager = true, max_model_len = 1024, dtype = "float32" }}
params = {{ prompts = 32, input_len = 32, output_len = 32, max_concurrency = 8 }}

[gate]
min_effect = 0.02
max_pairs = 12
min_pairs = 3
confirm_pairs = 4
'''

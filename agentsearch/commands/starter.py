"""The starter agentsearch.toml written into the embedded vLLM fork."""

from __future__ import annotations

from pathlib import Path


def starter_config(site_packages: Path) -> str:
    return f'''# agentsearch target: vLLM (installed build, Python sources tracked here) on CPU.
[target]
baseline = "main"
protected = ["bench/**", "*.dist-info/**"]
install = "overlay"
overlay_from = "{site_packages}"

[target.env]
VLLM_CPU_KVCACHE_SPACE = "1"
VLLM_TARGET_DEVICE = "cpu"

[[workload]]
name = "throughput"
kind = "vllm-throughput"
metric = "output_tok_s"
higher_is_better = true
timeout_s = 900

[gate]
min_effect = 0.02
'''

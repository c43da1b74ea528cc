"""The proposer registry: the names ``--proposer`` accepts, and building one from command-line
options or from the manifest recorded when its episode started (``--resume``).

The only module that knows the concrete proposers; each is imported when it is asked for (the
Claude proposer needs the agent SDK, which the others do not).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .base import Proposer, ProposerError

PROPOSERS = ("patches", "sweep", "optimize", "claude")  # what --proposer accepts
DEFAULT_PROPOSER = PROPOSERS[0]


def build(name: str, options: Mapping[str, Any], repo_dir: Path) -> Proposer:
    """A proposer from command-line options (``options["config"]`` is the baseline's Config)."""
    if name == "patches":
        from .patches import PatchQueue

        return PatchQueue.from_options(options, repo_dir)
    if name == "sweep":
        from .sweep import Sweep

        config, gpu = options["config"], bool(options.get("gpu"))
        if not config.sweep.knobs and not _kernel_knobs(config, repo_dir, options.get("baseline"), gpu):
            raise ProposerError(
                "the target's agentsearch.toml declares no [[sweep.knob]] and its baseline registers no kernel-library "
                "provider; add knobs (see docs/reference/config.md, [[sweep.knob]]) or a provider "
                "(`agentsearch kernels propose`) to sweep"
            )
        return Sweep(config.sweep, gpu=gpu)
    if name == "optimize":
        from .optimize import Optimize

        config = options["config"]
        if not config.sweep.knobs:
            raise ProposerError(
                "the target's agentsearch.toml declares no [[sweep.knob]]: the optimizer searches that space; add "
                "knobs (see docs/reference/config.md, [[sweep.knob]])"
            )
        return Optimize(config.sweep, options.get("sampler") or "tpe", gpu=bool(options.get("gpu")))
    if name == "claude":
        from .claude import ClaudeProposer

        return ClaudeProposer.from_options(options)
    raise ProposerError(f"unknown proposer {name!r}; use one of {', '.join(PROPOSERS)}")


def _kernel_knobs(config: Any, repo_dir: Path, baseline: str | None, gpu: bool) -> list[Any]:
    """The ``ir_op_priority`` knobs the sweep derives from the baseline (none without a baseline)."""
    from ..workspace import git
    from .kernel_knobs import knobs

    if not baseline:
        return []
    return knobs(lambda path: git.show_file(repo_dir, baseline, path), config.sweep.file, gpu)


def rebuild(name: str, manifest: Mapping[str, Any]) -> Proposer:
    if name == "patches":
        from .patches import PatchQueue

        return PatchQueue.from_manifest(manifest)
    if name == "sweep":
        from .sweep import Sweep

        return Sweep.from_manifest(manifest)
    if name == "optimize":
        from .optimize import Optimize

        return Optimize.from_manifest(manifest)
    if name == "claude":
        from .claude import ClaudeProposer

        return ClaudeProposer.from_manifest(manifest)
    raise ProposerError(f"the history names proposer {name!r}, which this version cannot resume")

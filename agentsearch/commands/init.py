"""`agentsearch init`: validate a target, or create the embedded vLLM fork and initialize it."""

from __future__ import annotations

from pathlib import Path

import click

from .. import preflight
from ..errors import AgentsearchError
from ..workspace import Workspace
from ..workspace.fork import create_fork, find_installed
from .output import print_json
from .starter import starter_config, starter_serving


def run(target: Path, from_installed: str | None, directory: Path | None, as_json: bool = False) -> int:
    if from_installed:
        if from_installed != "vllm":
            raise AgentsearchError(f"--from-installed supports 'vllm', got {from_installed!r}")
        if directory is None:
            raise AgentsearchError("--from-installed vllm needs a DIR to create the fork in")
        pkg_dir, _dist, _version = find_installed("vllm")
        create_fork("vllm", directory, starter_config(pkg_dir.parent), {"serving.json": starter_serving()})
        target = directory
    elif directory is not None:
        raise AgentsearchError("DIR is only used with --from-installed; use -C to point at an existing target")
    ws = Workspace.init(target)
    config = ws.config()
    preflight.require_paths(
        config
    )  # a model or overlay_from that is not there is refused now, not at the first evaluation
    if as_json:
        print_json(
            {
                "repo": str(ws.repo_dir),
                "baseline": config.target.baseline,
                "baseline_commit": ws.baseline_commit(),
                "workloads": [w.name for w in config.workloads],
                "objective": config.objective.name,
                "state": str(ws.state),
            }
        )
        return 0
    click.echo(f"initialized {ws.repo_dir}")
    click.echo(f"  baseline  {config.target.baseline} @ {ws.baseline_commit()[:12]}")
    click.echo(f"  workloads {', '.join(w.name for w in config.workloads)}")
    click.echo(f"  state     {ws.state}")
    click.echo("  next      `agentsearch preflight` checks the environment (and with --run, the baseline alone)")
    return 0

"""The embedded default: the installed vLLM turned into a git repository (overlay mode)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from agentsearch.workspace import Workspace

from .conftest import git, run_cli

pytestmark = pytest.mark.vllm


def test_from_installed_vllm_fork_worktree_imports_from_worktree(tmp_path):
    fork = tmp_path / "vllm-fork"
    proc = run_cli("init", "--from-installed", "vllm", str(fork))
    assert proc.returncode == 0, proc.stderr
    assert "initialized" in proc.stdout
    tracked = git(fork, "ls-files").splitlines()
    assert "vllm/__init__.py" in tracked and "agentsearch.toml" in tracked
    assert not any(p.endswith(".so") for p in tracked)  # compiled files are not tracked
    assert any(p.endswith(".dist-info/METADATA") for p in tracked)

    ws = Workspace.open(fork)
    assert ws.config().target.install == "overlay"
    vc = ws.config().verify  # distribution checks are on by default, on all three paths
    assert vc is not None and vc.kind == "vllm" and vc.sample and vc.prompts_wanted == 56
    # one-process engines by default (start-up 54 -> 20 s here), with threads the OS places
    cfg = ws.config()
    assert (
        cfg.target.env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
        and cfg.target.env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    )
    assert cfg.target.env["OMP_NUM_THREADS"] == "1"
    assert all(w.engine["distributed_executor_backend"] == "uni" for w in cfg.workloads)
    assert vc.engine["distributed_executor_backend"] == "uni"
    p = ws.create_proposal("e1", 1, "try something")
    from pathlib import Path as _P

    from agentsearch.workspace.install import link_overlay

    link_overlay(p.worktree, _P(ws.config().target.overlay_from or ""))
    assert (p.worktree / "vllm" / "_C.abi3.so").exists()
    assert git(p.worktree, "status", "--porcelain") == ""  # linked .so files are git-ignored

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(p.worktree)}
    code = "import vllm, importlib.metadata as m; print(vllm.__file__); print(m.version('vllm'))"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert lines[-2] == str(p.worktree / "vllm" / "__init__.py")
    assert lines[-1].startswith("0.32.0")

    # a second fork into a non-empty directory is refused with one line
    again = run_cli("init", "--from-installed", "vllm", str(fork))
    assert again.returncode == 2 and "not empty" in again.stderr

"""Making a worktree runnable: the install modes of DESIGN.md.

``overlay``: compiled files (``*.so``) from ``overlay_from`` are linked into the worktree at the
same relative path (hardlinks, or symlinks across file systems), for every top-level
directory the worktree has; they are git-ignored by the fork. ``command``: the build
command runs with the worktree as cwd.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from ..config import TargetConfig
from ..errors import AgentsearchError

COMPILED_SUFFIXES = (".so", ".pyd", ".dylib")


def compiled_files(source: Path, top_dirs: list[str]) -> list[Path]:
    """Relative paths of compiled files under ``source/<top_dir>`` for the given top dirs."""
    found = []
    for top in top_dirs:
        root = source / top
        if not root.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for f in filenames:
                if f.endswith(COMPILED_SUFFIXES):
                    found.append(Path(dirpath, f).relative_to(source))
    return found


def link_overlay(worktree: Path, source: Path) -> int:
    if not source.is_dir():
        raise AgentsearchError(f"overlay_from {source} does not exist; re-create the fork with `agentsearch init --from-installed vllm`")
    tops = [p.name for p in worktree.iterdir() if p.is_dir() and not p.name.startswith(".")]
    n = 0
    for rel in compiled_files(source, tops):
        dst = worktree / rel
        if dst.exists():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source / rel, dst)
        except OSError:
            os.symlink(source / rel, dst)
        n += 1
    return n


def prepare_worktree(worktree: Path, target: TargetConfig, timeout_s: float = 3600) -> None:
    if target.install == "overlay":
        assert target.overlay_from
        link_overlay(worktree, Path(target.overlay_from))
    elif target.install == "command":
        assert target.build
        proc = subprocess.run(
            target.build, shell=True, cwd=worktree, capture_output=True, text=True, timeout=timeout_s
        )
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise AgentsearchError(f"build failed in {worktree.name} (exit {proc.returncode}): {tail[0]}")

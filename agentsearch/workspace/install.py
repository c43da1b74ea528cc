"""Making a worktree runnable: the install modes of docs/CONTRACTS.md.

``overlay``: compiled files (``*.so``) from ``overlay_from`` are linked into the worktree at the
same relative path (hardlinks, or symlinks across file systems), for every top-level
directory the worktree has; they are git-ignored by the fork. ``command``: the build
command runs in the side's sandbox (``agentsearch.sides``), never here.
"""

from __future__ import annotations

import os
from pathlib import Path

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
        raise AgentsearchError(
            f"overlay_from {source} does not exist; re-create the fork with `agentsearch init --from-installed vllm`"
        )
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

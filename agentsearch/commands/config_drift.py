"""The working tree's agentsearch.toml versus the committed one that commands actually use.

Commands read the config as committed on the baseline branch; an edited working copy would
otherwise be ignored in silence. ``check`` says so in one line on stderr, or refuses (exit 2)
with --strict-config / AGENTSEARCH_STRICT_CONFIG=1.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ..config import CONFIG_FILE
from ..errors import AgentsearchError
from ..workspace import Workspace, git

STRICT_ENV = "AGENTSEARCH_STRICT_CONFIG"


def strict_from_env() -> bool:
    return os.environ.get(STRICT_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def drift(target: Path) -> str | None:
    """One sentence when the working copy of the config differs from the baseline's committed
    one; None when they agree or nothing can be said (the command reports a broken target)."""
    try:
        ws = Workspace.locate(target)
        branch = ws.baseline_branch
        committed = git.run_git(
            "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}:{CONFIG_FILE}", cwd=ws.repo_dir, check=False
        ).strip()
        path = ws.repo_dir / CONFIG_FILE
        if not committed:
            return None
        if not path.is_file():
            return (
                f"using the committed {CONFIG_FILE} of {branch}; your working copy {path} is missing "
                f"(the deletion is ignored)"
            )
        work = git.run_git("hash-object", "--", CONFIG_FILE, cwd=ws.repo_dir).strip()
        if work == committed:
            return None
        head = git.run_git(
            "rev-parse", "--verify", "--quiet", f"HEAD:{CONFIG_FILE}", cwd=ws.repo_dir, check=False
        ).strip()
        if work == head:  # committed, but on another branch than the baseline
            here = git.checked_out_branch(ws.repo_dir) or "a detached HEAD"
            return (
                f"using the committed {CONFIG_FILE} of {branch}; the copy in your checkout ({here}) differs "
                f"and is not used — merge it into {branch} to use it"
            )
        return (
            f"using the committed {CONFIG_FILE} of {branch}; your working copy differs "
            f"(uncommitted edits are ignored) — commit them to use them"
        )
    except (AgentsearchError, OSError):
        return None


def check(target: Path, strict: bool) -> None:
    """Warn (one line on stderr) or, when ``strict``, refuse with exit status 2."""
    message = drift(target)
    if message is None:
        return
    if strict or strict_from_env():
        why = "--strict-config" if strict else f"{STRICT_ENV}=1"
        raise AgentsearchError(f"{message}; refusing ({why})")
    sys.stderr.write(f"agentsearch: warning: {message}\n")
    sys.stderr.flush()

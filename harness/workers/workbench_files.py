"""The agent workbench's file tools, run INSIDE the agent's sandbox (``agentsearch.workbench``).

``workbench_files.py REQUEST ANSWER``: one request as a JSON file, one JSON answer written to ANSWER:
``{"ok": true, "text": ...}`` or ``{"ok": false, "text": why}`` (both files in the session's private
output directory, which the orchestrator reads without following links). Paths are relative to the working
directory (the agent's worktree) or absolute; this script decides nothing about what may be reached — the
sandbox around it does (only the worktree is writable, and nothing that judges the agent is mounted). It never follows a
request outside what the process can open, and it writes only with ``O_NOFOLLOW`` on the last
component so a link the agent planted is an error, not a redirection. A ``write`` or ``edit`` whose directory
resolves outside the working directory is refused with a line that says so: the sandbox's ``/tmp`` and
``$HOME`` are private to one call, so such a write would answer "wrote" and be gone when the call ends.

ops: ``read`` {path, offset, limit} (numbered lines), ``write`` {path, content}, ``edit`` {path, old,
new, all}, ``ls`` {path}, ``grep`` {pattern, path, glob} (Python regular expression, at most 200 hits).
Never imports agentsearch: it must run with nothing but the interpreter.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import stat
import sys

MAX_READ_LINES = 2000
MAX_HITS = 200
MAX_FILE_BYTES = 4 << 20


def _read_text(path: str) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # a FIFO does not block the open
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError(f"{path} is not a regular file")
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"{path} is larger than {MAX_FILE_BYTES >> 20} MiB")
    if b"\0" in data[:8192]:
        raise ValueError(f"{path} is a binary file")
    return data.decode("utf-8", "replace")


def _write_text(path: str, text: str) -> None:
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError(f"{path} is not a regular file")
    os.ftruncate(fd, 0)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)


def _in_worktree(path: str) -> None:
    """A write only where it persists: under the working directory (the agent's worktree), links on the way
    resolved. Elsewhere ValueError with the truth (the sandbox's /tmp and $HOME die with the call)."""
    root = os.path.realpath(os.getcwd())
    full = os.path.abspath(path)  # links on the way resolved; a link as the last component fails at O_NOFOLLOW
    real = os.path.join(os.path.realpath(os.path.dirname(full)), os.path.basename(full))
    if os.path.commonpath([root, real]) != root:
        raise ValueError(
            f"refused: {path} is outside your worktree; only files in the worktree persist (the sandbox's /tmp and "
            "$HOME are private to one call and gone when it ends): use a path relative to the worktree"
        )


def read(req: dict) -> str:
    lines = _read_text(req["path"]).splitlines()
    offset = max(0, int(req.get("offset") or 0))
    limit = max(1, min(MAX_READ_LINES, int(req.get("limit") or MAX_READ_LINES)))
    shown = lines[offset : offset + limit]
    body = "\n".join(f"{offset + i + 1:6d}\t{line}" for i, line in enumerate(shown))
    more = len(lines) - offset - len(shown)
    return body + (f"\n… {more} more lines (read with offset={offset + len(shown)})" if more > 0 else "")


def write(req: dict) -> str:
    text = str(req["content"])
    _in_worktree(req["path"])
    _write_text(req["path"], text)
    return f"wrote {req['path']} ({len(text.encode())} bytes)"


def edit(req: dict) -> str:
    path, old, new = req["path"], str(req["old"]), str(req["new"])
    _in_worktree(path)
    text = _read_text(path)
    n = text.count(old) if old else 0
    if n == 0:
        raise ValueError(f"the text to replace is not in {path}")
    if n > 1 and not req.get("all"):
        raise ValueError(f"the text to replace occurs {n} times in {path}: give more context or all=true")
    _write_text(path, text.replace(old, new) if req.get("all") else text.replace(old, new, 1))
    return f"edited {path} ({n if req.get('all') else 1} replacement(s))"


def ls(req: dict) -> str:
    path = req.get("path") or "."
    out = []
    for entry in sorted(os.scandir(path), key=lambda e: e.name):
        if entry.name == ".git":
            continue
        kind = "/" if entry.is_dir(follow_symlinks=False) else ("@" if entry.is_symlink() else "")
        out.append(entry.name + kind)
    return "\n".join(out) or "(empty)"


def grep(req: dict) -> str:
    rx = re.compile(str(req["pattern"]))
    root, glob = req.get("path") or ".", req.get("glob") or "*"
    hits: list[str] = []
    walk = [(root, [], [os.path.basename(root)])] if os.path.isfile(root) else os.walk(root)
    for d, dirs, files in walk:
        dirs[:] = sorted(x for x in dirs if x != ".git")
        for name in sorted(files):
            path = root if os.path.isfile(root) else os.path.join(d, name)
            if not fnmatch.fnmatch(name, glob) or os.path.islink(path):
                continue
            try:
                text = _read_text(path)
            except (OSError, ValueError):
                continue
            for no, line in enumerate(text.splitlines(), 1):
                if rx.search(line):
                    hits.append(f"{os.path.normpath(path)}:{no}: {line[:300]}")
                    if len(hits) >= MAX_HITS:
                        return "\n".join(hits) + f"\n… stopped at {MAX_HITS} hits"
    return "\n".join(hits) or "no match"


OPS = {"read": read, "write": write, "edit": edit, "ls": ls, "grep": grep}


def main(argv: list[str]) -> int:
    try:
        with open(argv[1], encoding="utf-8") as fh:
            req = json.load(fh)
        text = OPS[req["op"]](req)
        ok = True
    except (KeyError, TypeError) as exc:
        ok, text = False, f"bad request: {exc}"
    except (OSError, ValueError, re.error) as exc:
        ok, text = False, f"{type(exc).__name__}: {exc}"
    if len(text) > 400_000:
        text = text[:400_000] + "\n… (cut)"
    with open(argv[2], "w", encoding="utf-8") as fh:
        json.dump({"ok": ok, "text": text}, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

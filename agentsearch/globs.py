"""Protected-path globs: `**` crosses directories, `*` and `?` do not."""

from __future__ import annotations

import re
from functools import lru_cache


def normalize(pattern: str) -> str:
    """The canonical form of a protected glob, relative to the repository root: `./bench.sh`
    -> `bench.sh`, `bench/` -> `bench`, `a//b` -> `a/b`. Raises ValueError (one line) for a glob
    that cannot name a path inside the repository: empty, absolute, or with a `..` part."""
    if not isinstance(pattern, str) or not pattern.strip():
        raise ValueError("a protected glob may not be empty")
    if "\0" in pattern or any(ord(c) < 32 for c in pattern):
        raise ValueError(f"protected glob {pattern!r} holds a control character")
    if pattern.strip().startswith(("/", "~/")) or pattern.strip() == "~":
        raise ValueError(f"protected glob {pattern!r} is absolute; write it relative to the repository root")
    parts = [p for p in pattern.strip().split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"protected glob {pattern!r} leaves the repository ('..')")
    if not parts:
        raise ValueError(f"protected glob {pattern!r} names no path (use \"**\" to protect everything)")
    return "/".join(parts)


@lru_cache(maxsize=256)
def _compile(pattern: str) -> re.Pattern[str]:
    try:
        pat = normalize(pattern)
    except ValueError:
        return re.compile(r"(?!)")  # a glob that names no path inside the repository matches nothing
    out = []
    i = 0
    while i < len(pat):
        c = pat[i]
        if pat.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pat.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(c))
            i += 1
    # a pattern naming a directory protects everything below it
    return re.compile("".join(out) + "(?:/.*)?")


def matches(path: str, pattern: str) -> bool:
    return _compile(pattern).fullmatch(path.strip("/")) is not None


def first_match(path: str, patterns: tuple[str, ...] | list[str]) -> str | None:
    for p in patterns:
        if matches(path, p):
            return p
    return None

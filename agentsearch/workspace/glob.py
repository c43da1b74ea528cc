"""Protected-path globs: `**` crosses directories, `*` and `?` do not."""

from __future__ import annotations

import re
from functools import lru_cache


@lru_cache(maxsize=256)
def _compile(pattern: str) -> re.Pattern[str]:
    pat = pattern.strip("/")
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

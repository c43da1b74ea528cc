"""What slow machinery a test reaches, read from its code when it is collected.

The fast tier (`bash .ci/fast`) deselects the tests marked ``vllm``, ``ray``, ``browser`` and ``claude``. A test
that starts one of them without its marker would run in the fast tier and make it slow (or fail it on a machine
without the machinery), so collection refuses it: the hook reads the source of the test, of every fixture in its
closure, and of every function of ``tests/`` or ``benchmarks/`` these call (followed by name, transitively), and
looks for what starts each kind. A test that reaches a kind and lacks its marker is named, with what was found
where, and the run stops before any test starts.

The signatures are the ways this suite starts each kind; a new way of starting one belongs in ``SIGNS``.
"""

from __future__ import annotations

import inspect
import re
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# only the suite's own helpers are followed: the product's code is what the tests exercise, not how they start it
FOLLOWED = (ROOT / "tests", ROOT / "benchmarks")

# kind -> what in a test's code starts it
# (regular expressions, searched in the source)
SIGNS: dict[str, tuple[str, ...]] = {
    # the installed vLLM: a fork of it (every engine, resolution and kernel worker of a vLLM target starts there),
    # or vLLM imported in a child
    "vllm": (r"--from-installed", r"from_installed", r"\bimport vllm\b(?!_)", r"\bfrom vllm(\.\w+)* import\b"),
    # a local Ray cluster
    "ray": (
        r"\bimport ray\b",
        r"\bfrom ray(\.\w+)* import\b",
        r"\bray\.init\(",
        r"\bRayExecutor\(",
        r'"--executor",\s*"ray"',
    ),
    # a headless browser rendering a page
    "browser": (r"\bchromium\b",),
    # the bundled Claude Code CLI
    # (``cli_env``, tests/messages_api.py: the environment that points the real CLI at the scripted API)
    "claude": (r"\bclaude_agent_sdk\b", r'"--proposer",\s*"claude"', r"\bClaudeProposer\(", r"\bcli_env\("),
}


# kind -> the packages whose functions, classes or modules a test's code may call by name to start it
PACKAGES: dict[str, tuple[str, ...]] = {"vllm": ("vllm",), "ray": ("ray",), "claude": ("claude_agent_sdk",)}


@dataclass(frozen=True)
class Reach:
    """One kind a test reaches and where: the function whose source holds the sign."""

    kind: str
    sign: str
    where: str


@cache
def _source(fn: Callable[..., object]) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return ""


def _followed(obj: object) -> bool:
    code = getattr(obj, "__code__", None)
    if code is None:
        return False
    path = Path(code.co_filename).resolve()
    return any(path.is_relative_to(d) for d in FOLLOWED)


def _names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _names(const)


def _package(obj: object) -> str:
    name = obj.__name__ if isinstance(obj, types.ModuleType) else getattr(obj, "__module__", None)
    return (name or "").partition(".")[0]


def _callees(fn: Callable[..., object]) -> Iterator[Callable[..., object] | Reach]:
    """The suite's functions that ``fn`` names, and a ``Reach`` for each name of a package that starts a kind."""
    code = getattr(fn, "__code__", None)
    scope = getattr(fn, "__globals__", {})
    if code is None:
        return
    for name in _names(code):
        if name not in scope:
            continue
        obj = getattr(scope[name], "__wrapped__", scope[name])
        package = _package(obj)
        for kind, packages in PACKAGES.items():
            if package in packages:
                yield Reach(kind, name, getattr(fn, "__qualname__", repr(fn)))
        if callable(obj) and _followed(obj):
            yield obj


def reached(roots: Iterable[Callable[..., object]]) -> list[Reach]:
    """Every kind the functions reach (themselves and what they call of the suite's helpers), first sign each."""
    seen: set[Callable[..., object]] = set()
    todo = [getattr(f, "__wrapped__", f) for f in roots]
    found: dict[str, Reach] = {}
    while todo:
        fn = todo.pop()
        if fn in seen:
            continue
        seen.add(fn)
        text = _source(fn)
        for kind, signs in SIGNS.items():
            if kind in found:
                continue
            for sign in signs:
                hit = re.search(sign, text)
                if hit:
                    found[kind] = Reach(kind, hit.group(0), getattr(fn, "__qualname__", repr(fn)))
                    break
        for callee in _callees(fn):
            if isinstance(callee, Reach):
                found.setdefault(callee.kind, callee)
            else:
                todo.append(callee)
    return sorted(found.values(), key=lambda r: r.kind)


def _roots(item: object) -> list[Callable[..., object]]:
    roots: list[Callable[..., object]] = []
    fn = getattr(item, "function", None)
    if fn is not None:
        roots.append(fn)
    info = getattr(item, "_fixtureinfo", None)
    for defs in info.name2fixturedefs.values() if info is not None else ():
        roots.extend(d.func for d in defs if _followed(d.func))
    return roots


def unmarked(items: Iterable[object]) -> list[str]:
    """One line per test that reaches a kind without its marker."""
    lines = []
    for item in items:
        marks = {m.name for m in item.iter_markers()}  # type: ignore[attr-defined]
        for r in reached(_roots(item)):
            if r.kind not in marks:
                lines.append(f"{item.nodeid}: starts {r.kind} ({r.sign!r} in {r.where}) without @pytest.mark.{r.kind}")  # type: ignore[attr-defined]
    return lines

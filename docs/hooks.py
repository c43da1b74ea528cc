"""MkDocs hooks: the CLI and configuration references and the architecture's layers are generated from the code
at build time, never copied by hand. A page holding ``<!-- generated: cli -->``, ``<!-- generated: config -->``
or ``<!-- generated: layers -->`` gets the reference in its place: every command of the click group with its
usage, help and options; every key of ``agentsearch.toml`` from the config dataclasses
(``agentsearch.config.reference_rows``); the layers of ``agentsearch/`` from the import contract that
`lint-imports` enforces (``pyproject.toml``), each module with the first sentence of its docstring."""

from __future__ import annotations

import ast
import inspect
import re
import tomllib
from pathlib import Path
from typing import Any

CLI_MARK = "<!-- generated: cli -->"
CONFIG_MARK = "<!-- generated: config -->"
LAYERS_MARK = "<!-- generated: layers -->"
ROOT = Path(__file__).resolve().parents[1]


def _cell(text: Any) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def config_markdown() -> str:
    from agentsearch.config import reference_rows

    out: list[str] = []
    section = None
    for sec, key, default, doc in reference_rows():
        if sec != section:
            section = sec
            out += ["", f"## `{sec}`", "", "| section | key | default | meaning |", "|---|---|---|---|"]
        out.append(f"| `{sec}` | `{key}` | `{_cell(default)}` | {_cell(doc)} |")
    return "\n".join(out).strip() + "\n"


def _commands(group: Any, path: tuple[str, ...]) -> list[tuple[tuple[str, ...], Any]]:
    import click

    found = []
    for name in sorted(group.commands):
        cmd = group.commands[name]
        if getattr(cmd, "hidden", False):
            continue
        found.append(((*path, name), cmd))
        if isinstance(cmd, click.Group):
            found += _commands(cmd, (*path, name))
    return found


def cli_markdown() -> str:
    import click

    from agentsearch.cli import main

    out: list[str] = []
    for path, cmd in _commands(main, ("agentsearch",)):
        ctx = click.Context(cmd, info_name=" ".join(path))
        out += ["", f"## `{' '.join(path)}`", "", "```text", cmd.get_usage(ctx).strip(), "```", ""]
        help_text = inspect.cleandoc(cmd.help or "")
        if help_text:
            out += [help_text.replace("\b\n", ""), ""]
        rows = []
        for p in cmd.params:
            if not isinstance(p, click.Option) or p.hidden:
                continue
            names = ", ".join(f"`{o}`" for o in (*p.opts, *p.secondary_opts))
            unset = p.default in (None, False, ()) or callable(p.default) or type(p.default).__name__ == "Sentinel"
            default = "" if unset else f"`{_cell(p.default)}`"
            rows.append(f"| {names} | {_cell(p.help or '')} | {default} |")
        if rows:
            out += ["| option | meaning | default |", "|---|---|---|", *rows, ""]
    return "\n".join(out).strip() + "\n"


def contract_layers(contract: str = "agentsearch-layers") -> list[list[str]]:
    """The layers of an import-linter contract of ``pyproject.toml``, top first, each a list of modules."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (found,) = [c for c in contracts if c["id"] == contract]
    return [[m.strip() for m in layer.split("|")] for layer in found["layers"]]


def module_role(package: str, module: str) -> str:
    """The first sentence of a module's docstring (a package's: its ``__init__.py``); a module without one fails
    the strict docs build, so no layer is drawn without saying what it is."""
    path = ROOT / package / f"{module}.py"
    if not path.exists():
        path = ROOT / package / module / "__init__.py"
    doc = ast.get_docstring(ast.parse(path.read_text())) if path.exists() else None
    if not doc:
        raise ValueError(f"{package}/{module}: no module docstring to say what it is (the architecture page reads it)")
    first = " ".join(doc.split("\n\n")[0].split())
    return re.split(r"(?<=[.!?])\s", first, maxsplit=1)[0]


def layers_markdown() -> str:
    out = ["| layer | module | what it is |", "|--:|---|---|"]
    for n, layer in enumerate(contract_layers(), start=1):
        for module in layer:
            out.append(f"| {n} | `{module}` | {_cell(module_role('agentsearch', module))} |")
    return "\n".join(out) + "\n"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:  # MkDocs hook
    if CLI_MARK in markdown:
        markdown = markdown.replace(CLI_MARK, cli_markdown())
    if CONFIG_MARK in markdown:
        markdown = markdown.replace(CONFIG_MARK, config_markdown())
    if LAYERS_MARK in markdown:
        markdown = markdown.replace(LAYERS_MARK, layers_markdown())
    return markdown

"""MkDocs hooks: the CLI and configuration references are generated from the code at build time, never
copied by hand. A page holding ``<!-- generated: cli -->`` or ``<!-- generated: config -->`` gets the
reference in its place: every command of the click group with its usage, help and options; every key of
``agentsearch.toml`` from the config dataclasses (``agentsearch.config.reference_rows``)."""

from __future__ import annotations

import inspect
from typing import Any

CLI_MARK = "<!-- generated: cli -->"
CONFIG_MARK = "<!-- generated: config -->"


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


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:  # MkDocs hook
    if CLI_MARK in markdown:
        markdown = markdown.replace(CLI_MARK, cli_markdown())
    if CONFIG_MARK in markdown:
        markdown = markdown.replace(CONFIG_MARK, config_markdown())
    return markdown

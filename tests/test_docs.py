"""The documentation site's generated references (docs/hooks.py) and the README as a front door."""

from __future__ import annotations

import importlib.util
import re

import click

from agentsearch.cli import main
from agentsearch.config import reference_rows

from .conftest import ROOT


def hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_config_reference_documents_every_key_with_its_default():
    md = hooks().config_markdown()
    for section, key, _default, _doc in reference_rows():
        row = next((ln for ln in md.splitlines() if ln.startswith(f"| `{section}` | `{key}` |")), None)
        assert row is not None, f"the config reference lacks {section} {key}"
        assert row.count(" | ") == 3, row  # a '|' inside a default or a doc is escaped, the table keeps 4 columns


def test_the_cli_reference_documents_every_command_and_option():
    md = hooks().cli_markdown()

    def walk(group: click.Group, path: tuple[str, ...]):
        for name, cmd in group.commands.items():
            yield (*path, name), cmd
            if isinstance(cmd, click.Group):
                yield from walk(cmd, (*path, name))

    for path, cmd in walk(main, ("agentsearch",)):
        title = f"## `{' '.join(path)}`"
        assert title in md, title
        section = md.split(title, 1)[1].split("\n## `", 1)[0]
        for p in cmd.params:
            if isinstance(p, click.Option) and not p.hidden:
                assert f"`{p.opts[0]}`" in section, (path, p.opts)


def test_the_pages_with_a_generated_reference_hold_its_marker():
    h = hooks()
    assert h.CLI_MARK in (ROOT / "docs" / "reference" / "cli.md").read_text()
    assert h.CONFIG_MARK in (ROOT / "docs" / "reference" / "config.md").read_text()


def test_the_readme_is_a_front_door():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    assert "bash .ci/demo" in readme and "bash .ci/run" in readme  # the two set-up commands
    for link in re.findall(r"\]\(((?:docs/)[^)#]+)", readme):  # every page it links exists
        assert (ROOT / link).is_file(), link

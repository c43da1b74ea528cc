from __future__ import annotations

import pytest
from click.testing import CliRunner

from agentsearch.cli import main

from .conftest import run_cli

ALL = ["init", "calibrate", "evaluate", "verify", "episode", "history", "insights", "report", "pr", "review", "revert", "profile"]


def test_help_lists_every_command():
    res = CliRunner().invoke(main, ["--help"])
    assert res.exit_code == 0
    for name in ALL:
        assert f"  {name} " in res.output


@pytest.mark.parametrize("name", ALL)
def test_every_command_has_target_and_help(name):
    res = CliRunner().invoke(main, [name, "--help"])
    assert res.exit_code == 0
    assert "-C, --target" in res.output


@pytest.mark.parametrize("args", [["profile"]])
def test_pending_commands_say_so_in_one_line(args):
    proc = run_cli(*args)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "is not built yet" in proc.stderr


def test_unexpected_errors_exit_3_with_log(tmp_path, monkeypatch):
    from agentsearch import cli

    def boom() -> int:
        raise RuntimeError("kaput")

    with pytest.raises(SystemExit) as e:
        cli.run_command(boom)
    assert e.value.code == 3
    assert "RuntimeError: kaput" in (tmp_path / "agentsearch-error.log").read_text()

from __future__ import annotations

import pytest
from click.testing import CliRunner

from agentsearch.cli import main

from .conftest import run_cli

ALL = [
    "init",
    "preflight",
    "calibrate",
    "evaluate",
    "verify",
    "episode",
    "history",
    "insights",
    "report",
    "pr",
    "review",
    "revert",
    "profile",
]


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


def test_profile_of_a_command_workload_is_refused_in_one_line(toy_target):
    assert run_cli("init", "-C", str(toy_target)).returncode == 0
    proc = run_cli("profile", "-C", str(toy_target))
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0
    assert "vllm-throughput" in proc.stderr


def test_unexpected_errors_exit_3_with_log(tmp_path, monkeypatch):
    from agentsearch import cli

    def boom() -> int:
        raise RuntimeError("kaput")

    with pytest.raises(SystemExit) as e:
        cli.run_command(boom)
    assert e.value.code == 3
    assert "RuntimeError: kaput" in (tmp_path / "agentsearch-error.log").read_text()

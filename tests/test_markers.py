"""The collection hook (tests/markers.py): a test that starts slow machinery without its marker is refused before any
test runs, so the fast tier (`bash .ci/fast`) cannot grow an engine test by accident."""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path

import pytest

from tests.markers import reached

pytest_plugins = ["pytester"]

FORK = "--from-" + "installed"  # built, so that this module's own source does not read as a fork's creation


def _a_helper_that_makes_a_fork(path: str) -> list[str]:
    return ["init", FORK, "vllm", path]


def _a_helper_two_calls_away(path: str) -> list[str]:
    return _a_helper_that_makes_a_fork(path)


def _plain(x: int) -> int:
    return x + 1


def _module(tmp_path: Path, name: str, text: str) -> types.ModuleType:
    """A module of generated helpers: its source holds the signs, this file's does not."""
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_reach_is_followed_through_the_suites_helpers_by_name(tmp_path):
    def a_test() -> None:
        _a_helper_two_calls_away("/tmp/x")

    # the helpers' sign is a name bound to a built string: nothing to read, so nothing found
    assert reached([a_test, _plain]) == []
    mod = _module(tmp_path, "spelled", 'def spelled():\n    return ["init", "--from-' + 'installed", "vllm"]\n')
    found = reached([mod.spelled])
    assert [(r.kind, r.sign) for r in found] == [("vllm", "--from-" + "installed")]
    assert found[0].where == "spelled"


def test_a_package_named_in_the_code_is_reach_without_a_sign(tmp_path):
    mod = _module(
        tmp_path,
        "packages",
        "import subprocess\nimport ray\n\n"
        "def uses_subprocess():\n    return subprocess.run\n\n"
        "def uses_the_cluster():\n    return ray.available_resources\n",
    )
    assert reached([mod.uses_subprocess]) == []
    found = reached([mod.uses_the_cluster])
    assert [(r.kind, r.sign) for r in found] == [("ray", "ray")]  # the name of a module of the ray package


HOOK = "from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n"


def _suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, marker: str) -> pytest.RunResult:
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
    pytester.makeconftest(HOOK)
    pytester.makeini('[pytest]\nmarkers =\n    vllm: engines\n    ray: ray\n    browser: a browser\n    claude: cli\n')
    sign = '"--from-" "installed"'.replace('" "', "")  # the sign, written only into the generated test
    pytester.makepyfile(
        test_generated=f"""
import pytest

{marker}
def test_starts_an_engine():
    args = ["init", {sign}, "vllm", "fork"]
    assert args

def test_plain():
    assert 1 + 1 == 2
"""
    )
    return pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")


def test_an_unmarked_engine_test_fails_collection_naming_the_test_and_the_sign(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
):
    result = _suite(pytester, monkeypatch, "")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert f"test_generated.py::test_starts_an_engine: starts vllm ({FORK!r} in test_starts_an_engine)" in err
    assert "without @pytest.mark.vllm" in err and "test_plain" not in err
    result.assert_outcomes()  # nothing ran: not the plain test either


def test_the_same_test_with_its_marker_runs_and_the_fast_tier_deselects_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
):
    result = _suite(pytester, monkeypatch, "@pytest.mark.vllm")
    result.assert_outcomes(passed=2)
    fast = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider", "-m", "not vllm")
    fast.assert_outcomes(passed=1, deselected=1)

"""Seconds per test module (tests/durations.py): written by every run, compared with the last."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.durations import ModuleDurations

pytest_plugins = ["pytester"]


def test_a_module_that_grew_by_half_and_30_s_is_named_and_jitter_is_not():
    d = ModuleDurations(Path("unused.json"))
    d.seconds.update({"tests/a.py": 100.0, "tests/b.py": 12.0, "tests/c.py": 200.0, "tests/new.py": 500.0})
    last = {"tests/a.py": 60.0, "tests/b.py": 4.0, "tests/c.py": 150.0}
    # a: 60 -> 100 s (x1.7, +40 s) named; b: x3 but +8 s; c: +50 s but x1.33; new: nothing to compare with
    assert d.grew(last) == [("tests/a.py", 60.0, 100.0)]


def test_every_run_writes_seconds_per_module_and_the_next_run_compares(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
    pytester.makepyfile(
        test_one="def test_a():\n    pass\n", test_two="import time\n\ndef test_b():\n    time.sleep(0.3)\n"
    )
    out = pytester.path / "durations.json"
    none = str(pytester.path / "none.json")  # no recorded full run either (the checkout's .ci/test-durations.json)
    first = pytester.runpytest_subprocess(
        "-p", "tests.durations", "--module-durations", str(out), "--module-durations-recorded", none
    )
    first.assert_outcomes(passed=2)
    doc = json.loads(out.read_text())
    assert set(doc["modules"]) == {"test_one.py", "test_two.py"} and doc["modules"]["test_two.py"] >= 0.3
    assert list(doc["modules"])[0] == "test_two.py"  # slowest first
    assert "no earlier run to compare with" in first.stdout.str()
    second = pytester.runpytest_subprocess(
        "-p", "tests.durations", "--module-durations", str(out), "-p", "no:cacheprovider", "test_one.py"
    )
    assert "no module grew by more than 1.5x and 30 s since the last run" in second.stdout.str()
    assert set(json.loads(out.read_text())["modules"]) == {"test_one.py", "test_two.py"}  # a partial run merges

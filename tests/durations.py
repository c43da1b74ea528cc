"""Seconds per test module, written by every run and compared with the last one (a pytest plugin).

`--durations=40` names the slowest tests of one run; it cannot say which module grew since the last. This plugin
sums each module's setup, call and teardown seconds (on the controller, so `-n 2` runs count too), writes them as
JSON (``--module-durations PATH``; default ``.cache/test-durations.json`` in the checkout, git-ignored) and names
the modules that grew by more than half and 30 s at least since the last run: the tests to look at before CI
passes its limit. The last run is that file's previous content, or on a clean clone (CI) the recorded full run,
``.ci/test-durations.json`` (copy a full run's file there when the suite changes on purpose). A partial run
updates only its own modules.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GREW_FACTOR = 1.5  # a module is named when it took this much longer than last time ...
GREW_MIN_S = 30.0  # ... and at least this many seconds more (small modules jitter by more than half)
RECORDED = ROOT / ".ci" / "test-durations.json"  # the last full run's, committed: what a clean clone compares with


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--module-durations",
        default=str(ROOT / ".cache" / "test-durations.json"),
        help="where to write seconds per test module (JSON) and read the last run's from",
    )
    parser.addoption(
        "--module-durations-recorded",
        default=str(RECORDED),
        help="the recorded full run's seconds per module, compared with when the file above is not there yet",
    )


class ModuleDurations:
    def __init__(self, path: Path, recorded: Path = RECORDED) -> None:
        self.path = path
        self.recorded = recorded
        self.seconds: dict[str, float] = defaultdict(float)
        self.started = time.time()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid.split("::")[0]] += report.duration

    def grew(self, last: dict[str, float]) -> list[tuple[str, float, float]]:
        return sorted(
            (
                (mod, last[mod], s)
                for mod, s in self.seconds.items()
                if mod in last and s > GREW_FACTOR * last[mod] and s - last[mod] >= GREW_MIN_S
            ),
            key=lambda t: t[1] - t[2],
        )

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.seconds:
            return
        last = _modules(self.path) if self.path.exists() else _modules(self.recorded)
        grew = self.grew(last)
        modules = {**last, **{m: round(s, 2) for m, s in self.seconds.items()}}
        doc = {
            "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "wall_s": round(time.time() - self.started, 1),
            "modules": dict(sorted(modules.items(), key=lambda kv: -kv[1])),
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        os.replace(tmp, self.path)
        terminalreporter.write_sep("-", f"seconds per module written to {self.path}")
        if not last:
            terminalreporter.write_line("no earlier run to compare with")
        for mod, before, now in grew:
            terminalreporter.write_line(f"grew: {mod} {before:.0f} s -> {now:.0f} s")
        if last and not grew:
            terminalreporter.write_line(
                f"no module grew by more than {GREW_FACTOR:g}x and {GREW_MIN_S:.0f} s since the last run"
            )


def _modules(path: Path) -> dict[str, float]:
    try:
        doc = json.loads(path.read_text())
        return {str(m): float(s) for m, s in doc["modules"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: the controller sees every report and writes
        return
    if config.option.collectonly:
        return
    config.pluginmanager.register(
        ModuleDurations(Path(config.option.module_durations), Path(config.option.module_durations_recorded)),
        "module-durations",
    )

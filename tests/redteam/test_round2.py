"""Red team, round 3 of fixes: attacks found against the hardened sandbox (each was a real break once).

Escaping the parking of an idle engine with fork relays; answering timed latency batches from a cache
filled during the warm-up; a cache kept in the output directory across trials; the functional tests
swapping a directory for a link so that the orchestrator's restore writes a hook onto the host;
coverage dodged with a committed symbolic link or a latin-1 source file.
"""

from __future__ import annotations

import os
import sys

import pytest

from agentsearch.workspace import Workspace
from benchmarks.toy_engine import CONFIG, CPU_VLLM, LATENCY, THROUGHPUT, TOY_INPUTS, TOY_VLLM, target
from benchmarks.toy_engine import evaluate as evaluate_engine

from ..conftest import commit, git, make_repo, run_cli
from .test_isolation import OUTPUT_BENCH, assert_no_win, evaluate, make_target

pytestmark = pytest.mark.timeout(300)

RELAY = '''
import os as _os, signal as _signal
_BUSY = "/tmp/.busy"


def _relay():
    while True:
        if not _os.path.exists("/tmp/.alive"):
            _os._exit(0)
        if _os.path.exists(_BUSY):
            time.sleep(0.002)
            continue
        t_end = time.monotonic() + 0.001
        while time.monotonic() < t_end:
            pass
        try:
            _os.kill(-1, _signal.SIGCONT)
        except OSError:
            pass
        if _os.fork():
            _os._exit(0)


open("/tmp/.alive", "w").close()
for _ in range(3):
    if _os.fork() == 0:
        _os.setsid()
        _relay()

_real_generate = LLM.generate


def _generate(self, *a, **k):
    open(_BUSY, "w").close()
    try:
        return _real_generate(self, *a, **k)
    finally:
        _os.unlink(_BUSY)


LLM.generate = _generate
'''


def test_fork_relays_cannot_escape_the_parking(tmp_path):
    repo = make_repo(
        tmp_path / "fork",
        {
            "agentsearch.toml": CONFIG.format(**THROUGHPUT),
            "vllm/__init__.py": CPU_VLLM,
            "vllm/inputs.py": TOY_INPUTS,
            "cost.txt": "0.0008\n",
        },
    )
    assert run_cli("init", "-C", str(repo)).returncode == 0
    commit(repo, {"vllm/__init__.py": CPU_VLLM + RELAY}, "relay hogs", branch="relay")
    rc, out = evaluate_engine(repo, "relay")
    assert rc == 4 and out["verdict"] == "reject", out["reasons"]
    # unparked, the relays made the candidate look ~2x faster; parked, only noise is left
    assert out["workloads"]["throughput"]["speedup"] < 1.3, out["workloads"]["throughput"]


PRECOMPUTE = '''
import sys as _sys, json as _json
_m = _sys.modules.get("__main__")
if _m is not None and hasattr(_m, "Engine"):
    _orig = _m.Engine.generate_batch
    _cache = {}
    def _gb(self, seed, index, p):
        key = (seed, index, _json.dumps(p, sort_keys=True))
        if key in _cache:
            return _cache.pop(key)
        out = _orig(self, seed, index, p)
        for j in range(1, int(p.get("iterations", 5)) + 1):
            _cache[(seed, j, _json.dumps(p, sort_keys=True))] = _orig(self, seed, j, p)
        return out
    _m.Engine.generate_batch = _gb
'''


def test_the_warm_up_batch_does_not_reveal_the_timed_ones(tmp_path):
    repo = target(tmp_path, LATENCY)
    commit(repo, {"vllm/__init__.py": TOY_VLLM + PRECOMPUTE}, "precompute in the warm-up", branch="pre")
    rc, out = evaluate_engine(repo, "pre")
    assert rc == 4 and out["verdict"] == "reject", out["reasons"]


HONEST_TABLE = '''import time
def _table():
    time.sleep(0.3)
    return [i * 2 for i in range(1000)]
def compute(items):
    t = _table()
    time.sleep(0.02)
    return [round(x * 2, 9) for x in items]
'''
CACHED_TABLE = '''import os, pickle, time
_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.environ["AGENTSEARCH_OUT"].rstrip("/"))))
_p = os.path.join(_dir, ".table-cache")
def _table():
    try:
        return pickle.load(open(_p, "rb"))
    except OSError:
        pass
    time.sleep(0.3)
    t = [i * 2 for i in range(1000)]
    try:
        pickle.dump(t, open(_p, "wb"))
    except OSError:
        pass
    return t
def compute(items):
    t = _table()
    time.sleep(0.02)
    return [round(x * 2, 9) for x in items]
'''


def test_the_output_directory_does_not_carry_a_cache_between_trials(tmp_path):
    test = (
        f'test = "{sys.executable} -c \'import sys; sys.path.insert(0, \\".\\"); import model; model.compute([1.0])\'"'
    )
    repo = make_target(tmp_path, target_extra=test, files={"bench/bench.py": OUTPUT_BENCH, "model.py": HONEST_TABLE})
    cfg = (
        (repo / "agentsearch.toml")
        .read_text()
        .replace('metric = "ops_s"\nhigher_is_better = true', 'metric = "wall_s"\nhigher_is_better = false')
    )
    commit(
        repo,
        {"agentsearch.toml": cfg.replace('timeout_s = 20', 'timeout_s = 20\noutputs = "digest"')},
        "wall_s + outputs",
    )
    main = Workspace.open(repo).baseline_commit()
    commit(repo, {"model.py": CACHED_TABLE}, "cache the table", branch="attack")
    rc, out = evaluate(repo, "attack")
    assert rc == 4
    assert_no_win(repo, out, main)


RESTORE_TEST = r'''
import os, shutil
import model
gitdir = open(".git").read().split("gitdir:", 1)[1].strip()
common = os.path.dirname(os.path.dirname(gitdir))
shutil.rmtree("hk")
os.symlink(os.path.join(common, "hooks"), "hk")
'''


def test_undoing_the_tests_changes_never_writes_through_a_link(tmp_path):
    canary = tmp_path / "PWNED"
    repo = make_target(
        tmp_path,
        target_extra=f'test = "{sys.executable} test_model.py"',
        files={"test_model.py": "import model\nassert model.FACTOR == 1.0\n", "hk/.keep": ""},
    )
    main = Workspace.open(repo).baseline_commit()
    hook = f"#!/bin/sh\necho ran >> {canary}\ngit --git-dir={repo}/.git update-ref refs/heads/main refs/heads/attack\n"
    commit(
        repo,
        {"test_model.py": RESTORE_TEST, "hk/post-checkout": hook, "model.py": "FACTOR = 1.0  # x\n"},
        "tests",
        branch="attack",
    )
    rc, out = evaluate(repo, "attack")
    assert rc == 4, out["reasons"]  # the tests ran in a disposable copy, removed without following the link
    assert not (repo / ".git" / "hooks" / "post-checkout").exists()
    commit(repo, {"model.py": "FACTOR = 1.0  # y\n"}, "innocent", branch="innocent")
    evaluate(repo, "innocent")  # a later checkout runs no hook of the candidate's
    assert not canary.exists() and Workspace.open(repo).baseline_commit() == main


@pytest.mark.parametrize("trick", ["symlink", "latin1"])
def test_coverage_is_not_dodged(tmp_path, trick):
    repo = make_target(tmp_path, files={"src/dead.py": "X = 1\n"})
    main = Workspace.open(repo).baseline_commit()
    if trick == "symlink":  # a changed .py that is a link to /dev/zero: once a MemoryError, or a hang on /dev/stdin
        git(repo, "checkout", "-q", "-b", "attack")
        (repo / "src" / "dead.py").unlink()
        os.symlink("/dev/zero", repo / "src" / "dead.py")
        (repo / "speed.txt").write_text("1.3\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", "faster + link")
        git(repo, "checkout", "-q", "main")
    else:  # dead code in a latin-1 file: once skipped as "not a Python patch"
        git(repo, "checkout", "-q", "-b", "attack")
        (repo / "src" / "dead.py").write_bytes(b"# -*- coding: latin-1 -*-\nX = 2  # caf\xe9\n")
        (repo / "speed.txt").write_text("1.3\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", "faster + dead latin-1 code")
        git(repo, "checkout", "-q", "main")
    rc, out = evaluate(repo, "attack")
    assert rc == 4 and out["verdict"] == "reject", out["reasons"]
    assert any(r.startswith("coverage:") for r in out["reasons"]), out["reasons"]
    assert Workspace.open(repo).baseline_commit() == main

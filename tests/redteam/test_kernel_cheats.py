"""Kernel proposals on the real vLLM fork: the micro stage (sandboxed worker processes, a separate
checker) rejects wrong and cheating kernels before any engine starts, and holds an implausible
op-level speedup for review.

Cost (2 cores): no engine ever starts; each correctness run is one fresh candidate process importing
vLLM plus one checker process (~20-30 s idle); the timing tests run two pairs of fresh processes
(~1-2 min each). Module total about 5 min idle (about 15 min with the machine at load 7-9); listed in
tests/conftest.py SLOW_FIRST so the other xdist worker starts it early.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ..conftest import commit, git, run_cli

CHEATS = {
    # the input normalised in place (a copy returned): the caller's activations are destroyed
    "mutate": """
def rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> Tensor:
    x.copy_(F.rms_norm(x, (x.shape[-1],), weight, epsilon))
    return x.clone()
""",
    # the output is the input's own memory
    "view": """
def rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> Tensor:
    x.copy_(F.rms_norm(x, (x.shape[-1],), weight, epsilon))
    return x
""",
}
WRONG_EPS = """
def rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, epsilon * 10)
"""
# correct whenever it is checked in the correctness run; skips the work when timed
TIMED_ONLY = """
import sys


def rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> Tensor:
    if "time" in sys.argv:
        return torch.empty_like(x)
    return F.rms_norm(x, (x.shape[-1],), weight, epsilon)
"""
# a broken provider (it fails whenever it is timed): as the *baseline's* choice it is the run's error
CRASH_TIMED = """
import sys


def rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> Tensor:
    if "time" in sys.argv:
        raise RuntimeError("this provider is broken")
    return F.rms_norm(x, (x.shape[-1],), weight, epsilon)
"""
MODULE = "vllm/kernels/agentsearch_cpu_rms_norm.py"
DEF = re.compile(r"\ndef rms_norm\(.*?\n    return F\.rms_norm\(x, \(x\.shape\[-1\],\), weight, epsilon\)\n", re.S)


@pytest.fixture(scope="module")
def fork(tmp_path_factory):
    path = tmp_path_factory.mktemp("kfork") / "fork"
    assert run_cli("init", "--from-installed", "vllm", str(path)).returncode == 0
    for impl in ("agentsearch_cpu", "agentsearch_cpu_c"):
        proc = run_cli("kernels", "propose", "-C", str(path), "rms_norm", "--impl", impl, "--json")
        assert proc.returncode == 0, proc.stderr
    git(path, "checkout", "-q", "kernels/agentsearch_cpu-rms_norm")
    honest = (path / MODULE).read_text()
    git(path, "checkout", "-q", "main")
    for name, body in {**CHEATS, "wrong-eps": WRONG_EPS, "timed-only": TIMED_ONLY, "crash-timed": CRASH_TIMED}.items():
        text, n = DEF.subn("\n" + body, honest)
        assert n == 1
        commit(path, {MODULE: text}, f"cheat: {name}", branch=f"cheat-{name}", start="kernels/agentsearch_cpu-rms_norm")
    return path


def bench(fork: Path, *args: str) -> tuple[int, dict]:
    proc = run_cli(
        "kernels",
        "bench",
        "-C",
        str(fork),
        "rms_norm",
        "--candidate-provider",
        "agentsearch_cpu",
        "--json",
        "--seed",
        "7",
        *args,
        timeout=1200,
    )
    assert proc.returncode in (0, 4), proc.stderr[-2000:]
    return proc.returncode, json.loads(proc.stdout)


def test_wrong_kernel_proposal_is_rejected_at_the_micro_stage_without_an_engine(fork):
    proc = run_cli("evaluate", "-C", str(fork), "cheat-wrong-eps", "--json", timeout=1200)
    out = json.loads(proc.stdout)
    assert proc.returncode == 4 and out["verdict"] == "reject"
    checks = {c["name"]: c for c in out["checks"]}
    assert checks["micro"]["status"] == "fail" and "wrong result" in checks["micro"]["detail"]
    assert out["failed_check"] == "micro" and out["failure"] == "changed-outputs"
    assert "no engine started" in checks["micro"]["detail"]
    assert "objective" not in checks and out["timing"]["engine_s"] == 0 and out["trials"] == []
    assert out["reasons"][0].startswith("micro: rms_norm with ['agentsearch_cpu', 'native']: wrong result")
    assert out["wall_s"] < 300  # seconds to a couple of minutes on a loaded 2-core machine; engines never start
    report = run_cli("report", "-C", str(fork), "cheat-wrong-eps")  # the evidence report shows the micro stage
    assert (
        report.returncode == 0
        and "| micro | fail | rms_norm with \\['agentsearch_cpu', 'native'\\]: wrong result" in report.stdout
    ), report.stdout[-3000:]


# (outputs cached per shape fail the same value check as the wrong epsilon above; tests/test_kernels.py
# runs every cheat through the same checks in-process, in seconds)
@pytest.mark.parametrize("cheat,why", [("mutate", "changed by the call"), ("view", "views of an input")])
def test_cheating_kernels_fail_correctness(fork, cheat, why):
    rc, out = bench(fork, "--candidate", f"cheat-{cheat}")
    assert rc == 4 and out["status"] == "fail", out
    assert why in out["detail"], out["detail"]
    assert out["micro"]["ops"][0]["pairs"] == 0  # rejected before any timing


def test_timed_calls_are_checked_too(fork):
    rc, out = bench(fork, "--candidate", "cheat-timed-only", "--pairs", "2")
    assert rc == 4 and out["status"] == "fail"
    assert "a timed call returned a wrong result" in out["detail"], out["detail"]
    assert out["micro"]["ops"][0]["correct"] is True  # it passed the correctness run: only the timed check sees it


def test_a_baseline_provider_that_fails_alone_too_is_the_runs_error_not_a_rejection(fork):
    proc = run_cli(
        "kernels",
        "bench",
        "-C",
        str(fork),
        "rms_norm",
        "--baseline",
        "cheat-crash-timed",
        "--baseline-provider",
        "agentsearch_cpu",
        "--candidate",
        "main",
        "--candidate-provider",
        "native",
        "--seed",
        "7",
        "--pairs",
        "2",
        timeout=1200,
    )
    assert proc.returncode == 5, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and proc.stdout.strip() == ""
    assert "fails in the micro stage" in proc.stderr and "fails alone too" in proc.stderr, proc.stderr[-2000:]


def test_cpu_kernel_measured_at_op_level_and_an_implausible_speedup_held_for_review(fork):
    cfg = (fork / "agentsearch.toml").read_text()
    before = git(fork, "rev-parse", "main").strip()
    commit(fork, {"agentsearch.toml": cfg.replace("[gate]\n", "[gate]\nplausibility = 1.1\n", 1)}, "plausibility 1.1")
    # the sides: the proposal and the commit it is based on; the bound: the current baseline's config
    # vLLM's compiled CPU kernel against the native chain of eager ops: about 2x faster alone (2.4 ms -> 1.2 ms per
    # mix, 1.97x beside three busy loops here). A round is timed on the orchestrator's clock, so its round trip carries
    # the wake-ups of a loaded machine: beside the other CI worker's serving test (two engines over both CPUs at 80
    # requests/s) that once diluted the kernel to 1.01x. A diluted measurement may not be a win the gate holds (it is
    # said as measured, a pass); it is measured again, at most twice, since the test is about the bound
    for attempt in range(3):
        rc, out = bench(
            fork,
            "--baseline",
            before,
            "--candidate",
            "kernels/agentsearch_cpu_c-rms_norm",
            "--candidate-provider",
            "agentsearch_cpu_c",
            "--pairs",
            "2",
        )
        r = out["micro"]["ops"][0]
        assert r["correct"] and r["pairs"] >= 2 and "agentsearch_cpu_c:" in r["providers"], out
        if r["speedup"] > 1.1:
            break
        assert rc == 0 and out["status"] == "pass" and r["decision"] == "ok", out
        print(f"attempt {attempt + 1}: diluted to {r['speedup']:.2f}x under load")
    assert r["speedup"] > 1.1 and r["candidate_us"] < r["baseline_us"], r
    assert rc == 4 and out["status"] == "review" and "held for review" in out["detail"], out

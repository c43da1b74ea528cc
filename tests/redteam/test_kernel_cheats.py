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

pytestmark = pytest.mark.vllm

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
# round 4: work after the rounds. The output is a tensor subclass whose values are computed when first read
# (after the timed rounds); its detach and clone stay lazy, so the copy taken inside the round is lazy too
LAZY = """
class _Later(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        first = args[0] if args else None
        if func in (torch.Tensor.detach, torch.Tensor.clone) and isinstance(first, _Later) and "_todo" in first.__dict__:
            with torch._C.DisableTorchFunctionSubclass():
                twin = torch.empty_like(first).as_subclass(_Later)
            twin._todo = first._todo
            return twin
        for a in args:
            if isinstance(a, _Later) and "_todo" in a.__dict__:
                x, w, eps = a.__dict__.pop("_todo")
                with torch._C.DisableTorchFunctionSubclass():
                    a.copy_(F.rms_norm(x, (x.shape[-1],), w, eps))
        return super().__torch_function__(func, types, args, kwargs)


def rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> Tensor:
    with torch._C.DisableTorchFunctionSubclass():
        out = torch.empty_like(x).as_subclass(_Later)
    out._todo = (x, weight, epsilon)
    return out
"""
# round 4: work before the rounds. At import, walk up the worker's stack to the inputs it prepared and compute every
# result then; each timed call hands back its precomputed answer
PRECOMPUTE = """
import sys

_done = {}


def _precompute():
    f = sys._getframe()
    while f is not None:
        inputs = f.f_locals.get("inputs")
        if isinstance(inputs, list) and inputs:  # the rounds' inputs as prepared (tuples, or each round's batch)
            for args in [a for x in inputs for a in (x.batch if hasattr(x, "batch") else [x])]:
                if len(args) == 4 and rms_norm_supports(*args):
                    x, w, eps, _ = args
                    _done[x.data_ptr()] = F.rms_norm(x, (x.shape[-1],), w, eps)
            return
        f = f.f_back


def rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> Tensor:
    out = _done.pop(x.data_ptr(), None)
    return out if out is not None else F.rms_norm(x, (x.shape[-1],), weight, epsilon)


_precompute()
"""
# round 4: the instrument's own modules. A `kernels` package in the candidate's worktree, with the instrument's real
# helpers behind it but `outputs_of` replaced: it fills the provider's empty outputs with the reference's values
SHADOW = """
def rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> Tensor:
    out = torch.empty_like(x)
    try:
        import kernels.specs

        kernels.specs._pending[id(out)] = (x, weight, epsilon)
    except (ImportError, AttributeError):
        pass
    return out
"""
SHADOW_FILES = {
    "kernels/__init__.py": "import os, sys\n\n__path__.append(os.path.dirname(os.path.abspath(sys.argv[0])))\n",
    "kernels/specs.py": '''import os
import sys

_real = os.path.join(os.path.dirname(os.path.abspath(sys.argv[0])), "specs.py")
exec(compile(open(_real).read(), _real, "exec"))
_pending = {}
_outputs_of = outputs_of


def outputs_of(result):
    for t in [result] if isinstance(result, Tensor) else list(result):
        todo = _pending.pop(id(t), None)
        if todo is not None:
            t.copy_(REFERENCES["rms_norm"](*todo))
    return _outputs_of(result)
''',
}
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
    bodies = {
        **CHEATS,
        "wrong-eps": WRONG_EPS,
        "timed-only": TIMED_ONLY,
        "crash-timed": CRASH_TIMED,
        "lazy": LAZY,
        "precompute": PRECOMPUTE,
        "shadow": SHADOW,
    }
    for name, body in bodies.items():
        text, n = DEF.subn("\n" + body, honest)
        assert n == 1
        files = {MODULE: text, **(SHADOW_FILES if name == "shadow" else {})}
        commit(path, files, f"cheat: {name}", branch=f"cheat-{name}", start="kernels/agentsearch_cpu-rms_norm")
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


def test_round4_a_lazy_output_fails_as_a_subclass_before_any_timing(fork):
    rc, out = bench(fork, "--candidate", "cheat-lazy", "--pairs", "2")
    assert rc == 4 and out["status"] == "fail", out
    assert "returned a _Later, not a plain torch.Tensor" in out["detail"], out["detail"]
    assert out["micro"]["ops"][0]["pairs"] == 0


def test_round4_results_computed_before_the_rounds_are_wrong_on_the_salted_inputs(fork):
    rc, out = bench(fork, "--candidate", "cheat-precompute", "--pairs", "2")
    # the correctness run's inputs are as prepared: the precomputed answers are right there
    assert out["micro"]["ops"][0]["correct"] is True, out
    assert rc == 4 and out["status"] == "fail", out
    assert "a timed call returned a wrong result" in out["detail"], out["detail"]


def test_round4_a_kernels_package_in_the_worktree_is_never_the_instruments(fork):
    rc, out = bench(fork, "--candidate", "cheat-shadow", "--pairs", "2")
    assert rc == 4 and out["status"] == "fail", out
    # the instrument's own helpers ran: the provider's empty outputs were checked as they were
    assert "wrong result" in out["detail"] and out["micro"]["ops"][0]["pairs"] == 0, out["detail"]


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

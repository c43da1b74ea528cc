"""The kernel library: references and tolerances equal the fork's, every implementation matches on
every generated case (Triton through its interpreter), planted wrong kernels fail; the proposal files
and the micro stage's scope. Real processes, real git; no engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from agentsearch import micro
from kernels import catalog
from kernels import fork as kfork

from .conftest import ROOT, commit, make_repo


def run_py(code: str, env: dict[str, str] | None = None, timeout: float = 600) -> dict:
    """Run ``code`` in a fresh interpreter (the repository on its path); its last stdout line as JSON."""
    e = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    p = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout, env=e, cwd=ROOT
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.vllm
def test_references_tolerances_and_cpu_providers_agree_with_the_installed_fork():
    """The trusted copies equal the fork's native implementations and registered tolerances; the CPU
    providers (the C one needs the fork's compiled ops) match on every generated case they accept."""
    out = run_py("""
        import json, torch
        from vllm import ir
        from vllm.platforms import current_platform
        current_platform.import_ir_kernels()
        from kernels import catalog, specs
        from kernels.library import cpu_norms, cpu_c_norms
        tol, ref = [], []
        for name, info in catalog.OPS.items():
            op = getattr(ir.ops, name)
            for d in ("float32", "bfloat16", "float16"):
                if op.get_tolerance(specs.DTYPES[d]) != info.tolerance(d):
                    tol.append((name, d))
            for case in catalog.cases(name, 128, seed=3) + catalog.cases(name, 576, seed=4, max_tokens=64):
                args = specs.make_inputs(case)
                want = specs.outputs_of(op.impls["native"].impl_fn(*args))
                if specs.compare(case, specs.outputs_of(specs.REFERENCES[name](*args)), want):
                    ref.append(specs.describe(case))
        impl = {}
        for p in catalog.providers(kind="cpu"):
            mod = {"cpu_norms.py": cpu_norms, "cpu_c_norms.py": cpu_c_norms}[p.module]
            cases = catalog.cases(p.op, 128, seed=5) + catalog.cases(p.op, 576, seed=6, max_tokens=64)
            n, fails = specs.check_impl(getattr(mod, p.function), getattr(mod, p.supports_args), cases, inplace=p.inplace)
            impl[f"{p.name}/{p.op}"] = [n, len(cases), fails[:3]]
        print(json.dumps({"tol": tol, "ref": ref, "impl": impl}))
    """)
    assert out["tol"] == [] and out["ref"] == []
    assert len(out["impl"]) == 4
    for name, (covered, total, fails) in out["impl"].items():
        assert fails == [], (name, fails)
        assert covered >= total // 4, (name, covered, total)  # float32 at least (a third of the cases)


TRITON_CHECK = """
    import json, triton
    from kernels import catalog, specs
    from kernels.library import triton_norms as T

    def floor_pow2(n):
        return 1 << (n.bit_length() - 1)

    planted = {
        # epsilon off by 10x
        "eps": {"rms_norm": lambda x, w, e, v=None: T._launch(x, None, w, e * 10)[0],
                "fused_add_rms_norm": lambda x, r, w, e, v=None: T._launch(x, r, w, e * 10)},
        # the masked tail dropped: the block covers only the largest power of two below the hidden size
        "tail": {"rms_norm": lambda x, w, e, v=None: T._launch(x, None, w, e, block=floor_pow2(x.shape[-1]))[0],
                 "fused_add_rms_norm": lambda x, r, w, e, v=None: T._launch(x, r, w, e, block=floor_pow2(x.shape[-1]))},
    }
    out = {}
    for p in catalog.providers(kind="triton"):
        cases = catalog.cases(p.op, 128, seed=11, small=True)
        supports = getattr(T, p.supports_args)
        n, fails = specs.check_impl(getattr(T, p.function), supports, cases)
        out[p.op] = {"covered": n, "total": len(cases), "fails": fails[:3],
                     "planted": {k: len(specs.check_impl(v[p.op], supports, cases)[1]) for k, v in planted.items()}}
    print(json.dumps(out))
"""


def test_triton_kernels_match_every_generated_case_under_the_interpreter_and_planted_bugs_fail():
    out = run_py(TRITON_CHECK, env={"TRITON_INTERPRET": "1"})
    assert set(out) == {"rms_norm", "fused_add_rms_norm"}
    for op, r in out.items():
        assert r["fails"] == [], (op, r["fails"])
        # every case but the variance_size ones (those dispatch to the next provider)
        assert r["covered"] == r["total"] - len(catalog.OPS[op].dtypes), r
        assert r["planted"]["eps"] > 0, "an epsilon off by 10x must fail"
        assert r["planted"]["tail"] > 0, "a dropped masked tail must fail on the odd sizes"


def test_generated_cases_cover_zipf_odd_noncontiguous_and_hidden_sets():
    cs = catalog.cases("rms_norm", 576, seed=1)
    assert {c["dtype"] for c in cs} == {"float32", "bfloat16", "float16"}
    assert any(c["hidden"] % 2 == 1 for c in cs) and any(not c["contiguous"] for c in cs)
    assert (
        any(c["variance_size"] for c in cs)
        and max(c["tokens"] for c in cs) == 512
        and min(c["tokens"] for c in cs) == 1
    )
    assert catalog.cases("rms_norm", 576, seed=2) != cs  # a hidden set from another seed differs
    bench = catalog.bench_cases("rms_norm", 128, seed=1)
    assert len({c["seed"] for c in bench}) == len(bench)  # every timed call its own inputs
    assert sum(c["tokens"] <= 8 for c in bench) > len(bench) // 3  # Zipf: mostly small batches


@pytest.mark.vllm
def test_proposal_files_register_the_provider_and_select_it():
    p = catalog.provider("rms_norm", "agentsearch_cpu")
    text = kfork.module_text(p)
    compile(text, kfork.module_path(p), "exec")
    assert kfork.registered({"m": text}) == {"rms_norm": ["agentsearch_cpu"]}
    assert (
        'ir.ops.rms_norm.register_impl(\n    "agentsearch_cpu", supported=current_platform.is_cpu(), supports_args=rms_norm_supports'
        in text
    )
    tri = kfork.module_text(catalog.provider("fused_add_rms_norm", "agentsearch_triton"))
    assert "from vllm.triton_utils import tl, triton" in tri and "\nimport triton\n" not in tri
    serving = kfork.with_priority('{"engine": {"max_num_seqs": 4}, "env": {}}', "rms_norm", "agentsearch_cpu")
    assert json.loads(serving)["engine"] == {
        "max_num_seqs": 4,
        "ir_op_priority": {"rms_norm": ["agentsearch_cpu", "native"]},
    }
    assert kfork.priorities(serving) == {"rms_norm": ["agentsearch_cpu", "native"]}
    assert kfork.priorities('{"engine": {"ir_op_priority": {"rms_norm": "a, native"}}}') == {
        "rms_norm": ["a", "native"]
    }
    init = "from . import vllm_c\n"
    assert kfork.kernels_init(kfork.kernels_init(init, p), p).count("agentsearch_cpu_rms_norm") == 1
    with pytest.raises(KeyError, match="has: agentsearch_cpu, agentsearch_cpu_c, agentsearch_triton"):
        catalog.provider("rms_norm", "nope")


def test_micro_scope_finds_kernel_proposals_only(tmp_path):
    repo = make_repo(
        tmp_path / "r",
        {"serving.json": '{"engine": {}}\n', "vllm/kernels/__init__.py": "\n", "vllm/other.py": "X = 1\n"},
    )
    base = commit(repo, None, "noop")
    prio = commit(
        repo,
        {"serving.json": kfork.with_priority('{"engine": {}}', "rms_norm", "agentsearch_cpu")},
        "prio",
        branch="prio",
    )
    code = commit(repo, {"vllm/kernels/mine.py": "Y = 2\n"}, "code", branch="code")
    other = commit(repo, {"vllm/other.py": "X = 2\n"}, "other", branch="other")
    targets = micro.scope(repo, base, prio)
    assert [(t.op, t.baseline, t.candidate, t.timed) for t in targets] == [
        ("rms_norm", (), ("agentsearch_cpu", "native"), True)
    ]
    assert [(t.op, t.timed) for t in micro.scope(repo, base, code)] == [(op, True) for op in catalog.OPS]
    both = commit(repo, {"vllm/kernels/mine.py": "Y = 3\n"}, "code + prio", branch="prio")
    assert [(t.op, t.timed) for t in micro.scope(repo, base, both)] == [(op, op == "rms_norm") for op in catalog.OPS]
    assert micro.scope(repo, base, other) == []


def test_cheating_implementations_fail_the_checks_in_process():
    """The checks the micro stage runs (values against the trusted reference with the op's tolerance,
    inputs unchanged, no output aliasing an input) on cheats, in seconds; the sandboxed pipeline runs
    them on the real fork in tests/redteam/test_kernel_cheats.py."""
    import torch
    import torch.nn.functional as F

    from kernels import specs

    cases = [
        c for c in catalog.cases("rms_norm", 128, seed=9) if c["dtype"] == "float32" and c["variance_size"] is None
    ]
    cache: dict = {}

    def cached(x, w, e, v=None):  # outputs cached across calls, per shape: work skipped for repeated shapes
        key = (tuple(x.shape), x.dtype)
        if key not in cache:
            cache[key] = F.rms_norm(x, (x.shape[-1],), w, e)
        return cache[key].clone()

    def mutate(x, w, e, v=None):
        x.copy_(F.rms_norm(x, (x.shape[-1],), w, e))
        return x.clone()

    def view(x, w, e, v=None):
        return x.copy_(F.rms_norm(x, (x.shape[-1],), w, e))

    def honest(x, w, e, v=None):
        return F.rms_norm(x, (x.shape[-1],), w, e)

    assert specs.check_fn(honest, cases) == []
    assert any("outside atol" in f for f in specs.check_fn(cached, cases))
    assert all("changed its inputs" in f for f in specs.check_fn(mutate, cases))
    assert all("changed its inputs" in f or "view of an input" in f for f in specs.check_fn(view, cases))
    x = torch.randn(4, 8)
    assert specs.aliases([x[1:]], specs.storages([x])) and not specs.aliases([x.clone()], specs.storages([x]))


def test_sweep_proposes_ir_op_priority_over_the_providers_the_baseline_registers():
    from agentsearch.config import SweepConfig
    from agentsearch.proposers import Context
    from agentsearch.proposers.sweep import Sweep

    cpu = catalog.provider("rms_norm", "agentsearch_cpu")
    tri = catalog.provider("rms_norm", "agentsearch_triton")
    files = {
        "serving.json": '{"engine": {"max_num_seqs": 4}, "env": {}}\n',
        kfork.KERNELS_INIT: kfork.kernels_init(kfork.kernels_init("from . import vllm_c\n", cpu), tri),
        kfork.module_path(cpu): kfork.module_text(cpu),
        kfork.module_path(tri): kfork.module_text(tri),
        "vllm/kernels/vllm_c.py": '@ir.ops.rms_norm.register_impl(\n    "vllm_c", supported=GPGPU_DEVICE)\n',
    }
    ctx = Context(read_file=files.get, history=[], insights=None, number=1, seed=3)
    sweep = Sweep(SweepConfig(file="serving.json", knobs=()))
    c = sweep.next(set(), ctx)
    assert (
        c is not None
        and c.category == "kernel"
        and c.meta["knobs"] == {"ir_op_priority.rms_norm": [["native"], ["agentsearch_cpu", "native"]]}
    )
    assert '"agentsearch_cpu"' in c.patch and "agentsearch_triton" not in c.patch  # no GPU here: CPU providers only
    assert sweep.next({c.key}, ctx) is None  # nothing else registered: vllm_c is not the library's
    again = Sweep.from_manifest(json.loads(json.dumps(sweep.manifest())))
    assert again.next(set(), ctx).key == c.key  # --resume proposes the same
    gpu = Sweep(SweepConfig(file="serving.json", knobs=()), gpu=True)
    assert [v for v in gpu.next(set(), ctx).meta["knobs"].values()][0][1][0] in (
        "agentsearch_cpu",
        "agentsearch_triton",
    )
    assert (
        Sweep(SweepConfig(file="serving.json", knobs=())).next(
            set(), Context(read_file={}.get, history=[], insights=None, number=1, seed=3)
        )
        is None
    )


def test_a_sweep_of_kernel_knobs_alone_starts_and_one_of_neither_is_refused(tmp_path):
    """A target whose only search space is the providers its baseline registers (no [[sweep.knob]]) can
    sweep (benchmarks/kernel_episode.py does); with neither, one line says what to add."""
    from types import SimpleNamespace

    from agentsearch.config import SweepConfig
    from agentsearch.proposers import ProposerError, build

    cpu = catalog.provider("rms_norm", "agentsearch_cpu_c")
    config = SimpleNamespace(sweep=SweepConfig(file="serving.json", knobs=()))
    fork = make_repo(
        tmp_path / "fork",
        {
            "serving.json": '{"engine": {}, "env": {}}\n',
            kfork.KERNELS_INIT: kfork.kernels_init("", cpu),
            kfork.module_path(cpu): kfork.module_text(cpu),
        },
    )
    assert build("sweep", {"config": config, "baseline": "main"}, fork).name == "sweep"
    bare = make_repo(tmp_path / "bare", {"serving.json": '{"engine": {}, "env": {}}\n'})
    with pytest.raises(
        ProposerError, match=r"no \[\[sweep.knob\]\] and its baseline registers no kernel-library provider"
    ):
        build("sweep", {"config": config, "baseline": "main"}, bare)


def test_the_gate_holds_an_implausible_micro_speedup_for_review_and_rejects_a_failed_micro():
    from agentsearch.gate import MERGE, REJECT, REQUIRED_CHECKS, REVIEW, Check, Status, judge

    passed = [Check(n, Status.PASS, "ok") for n in REQUIRED_CHECKS]
    assert judge(passed + [Check("micro", Status.PASS, "rms_norm: 1.2x")]).verdict == MERGE
    held = judge(passed + [Check("micro", Status.REVIEW, "rms_norm: 40x beyond the plausibility bound")])
    assert held.verdict == REVIEW and held.reasons == ("micro: rms_norm: 40x beyond the plausibility bound",)
    assert judge(passed + [Check("micro", Status.FAIL, "wrong result")]).verdict == REJECT


def test_the_claude_prompt_carries_the_op_specs_and_a_library_example_on_a_fork_only():
    from agentsearch.proposers import Context
    from agentsearch.proposers.claude import render_prompt

    fork_files = {kfork.KERNELS_INIT: "from . import vllm_c\n"}
    text = render_prompt(Context(read_file=fork_files.get, history=[], insights=None, number=1, seed=1), ())
    assert "## Kernels: the fork's IR ops" in text and "fused_add_rms_norm(x: Tensor, x_residual: Tensor" in text
    assert 'ir.ops.rms_norm.register_impl(\n    "agentsearch_cpu"' in text  # the example, as a proposal adds it
    other = render_prompt(Context(read_file={}.get, history=[], insights=None, number=1, seed=1), ())
    assert "## Kernels" not in other


def test_a_sides_outputs_are_taken_without_following_a_link_it_made(tmp_path):
    """Red team, agents (a lead): a side that makes its `micro` output directory a link to another directory
    (another side's, the orchestrator's) has its outputs refused, never read from there."""
    from agentsearch.micro import _take

    root, other = tmp_path / "out-candidate", tmp_path / "out-baseline" / "micro"
    other.mkdir(parents=True)
    (other / "samples.npz").write_bytes(b"the baseline's correct outputs")
    root.mkdir()
    (root / "micro").symlink_to(other)
    kept = tmp_path / "kept.npz"
    assert not _take(root, root / "micro" / "samples.npz", kept) and not kept.exists()
    (root / "micro").unlink()
    (root / "micro").mkdir()
    (root / "micro" / "samples.npz").write_bytes(b"its own")
    assert _take(root, root / "micro" / "samples.npz", kept) and kept.read_bytes() == b"its own"

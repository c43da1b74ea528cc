"""Attacks on the upstream pull request (`agentsearch pr` with [forge] upstream = "vllm"): what a proposal controls —
its title, its patch's From: line, the paths it changed — and what other people on the forge control — the titles
of the open pull requests the duplicate search finds — must not add a trailer to the owner's commit, a qualifier to
the search, or markup (a mention, a link, an image, an HTML tag) to the body a maintainer reads."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from agentsearch.upstream import Owner, coauthor, commit_message, search_terms

from ..test_upstream_pr import OWNER, upstream  # noqa: F401 - the fixture: a toy episode with a merged win

EVIL = "Evil Maintainer <evil@example.com>"


def trailers(message: str) -> list[str]:
    proc = subprocess.run(["git", "interpret-trailers", "--parse"], input=message, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_a_title_cannot_add_a_trailer_to_the_owners_commit() -> None:
    owner = Owner.of(OWNER, "vLLM")
    for title in (
        f"Faster\n\nSigned-off-by: {EVIL}",
        f"Faster\r\n\r\nCo-authored-by: {EVIL}\nReviewed-by: {EVIL}",
        f"Signed-off-by: {EVIL}",
        "Faster\u2028\u2028Signed-off-by: " + EVIL,
    ):
        msg = commit_message(title, "Measured: +30%.", "Claude <noreply@anthropic.com>", owner, signoff=True)
        assert trailers(msg) == ["Co-authored-by: Claude <noreply@anthropic.com>", f"Signed-off-by: {OWNER}"], msg
        assert "\n" not in msg.split("\n\n", 1)[0]  # the subject is one line


def test_a_patch_from_line_names_one_co_author_at_most() -> None:
    for patch, expected in (
        (f"From 1234 Mon Sep 17 00:00:00 2001\nFrom: {EVIL}\nSubject: x\n", EVIL),
        (f"From: A <a@example.com>\nSigned-off-by: {EVIL}\n", "A <a@example.com>"),
        (f"From: A <a@example.com>, {EVIL}\n", "agentsearch patches proposer <agentsearch@users.noreply.github.com>"),
        ("From: \x1b[2Jnobody\n", "agentsearch patches proposer <agentsearch@users.noreply.github.com>"),
    ):
        assert coauthor("patches", patch) == expected
        msg = commit_message("Faster", "Measured.", coauthor("patches", patch), Owner.of(OWNER, "vLLM"), signoff=True)
        assert trailers(msg)[-1] == f"Signed-off-by: {OWNER}" and len(trailers(msg)) == 2


def test_a_title_cannot_steer_the_duplicate_search() -> None:
    """Qualifiers (repo:, is:, author:), quotes and operators would search elsewhere or nothing: only plain terms."""
    for title in (
        'repo:evil/other is:closed author:bot label:"x" OR max_num_seqs',
        "-- in:title NOT engine.step $(rm -rf /) `x`",
        "x" * 500 + "_y",
    ):
        terms = search_terms(title, ["vllm/v1/core/sched/scheduler.py", "../../etc/passwd.py"])
        assert 1 <= len(terms) <= 5 and terms[:2] == ["scheduler", "passwd"], terms
        for t in terms:
            assert t.replace("_", "").replace(".", "").replace("-", "").isalnum() and len(t) <= 60, terms
    assert search_terms("max_num_seqs: 4 -> 32", ["vllm/v1/core/sched/scheduler.py"])[:2] == [
        "scheduler",
        "max_num_seqs",
    ]
    # a file name is proposal-controlled too: its words, never its qualifiers, markup or quotes
    terms = search_terms("x", ["vllm/kernels/rms is:closed created:>2099 user:a `<img src=x> @simon-mo.py"])
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+", t) for t in terms) and "rms" in terms, terms
    # a title full of made-up identifiers cannot push the changed modules out of the search
    crowd = search_terms("Raise qq_zz1 qq_zz2 qq_zz3 qq_zz4 qq_zz5 qq_zz6", ["src/engine.py"])
    assert crowd[0] == "engine", crowd


def test_a_change_with_no_search_term_needs_the_owners_own_search() -> None:
    from agentsearch.errors import AgentsearchError
    from agentsearch.upstream import refuse_duplicates

    assert search_terms("Go 2x", ["csrc/k.cu"]) == []
    with pytest.raises(AgentsearchError, match="no duplicate search could be derived"):
        refuse_duplicates([], "")
    refuse_duplicates([], "searched 'rms_norm' and 'fused norm' by hand: nothing open")  # the owner's words suffice


def test_a_patch_author_with_markup_or_two_people_is_not_a_co_author() -> None:
    tool = "agentsearch patches proposer <agentsearch@users.noreply.github.com>"
    for line in (
        "x` @vllm-project/maintainers ![i](https://evil.example/t.png) `y <a@b.c>",
        "A <a@example.com>, B <b@example.com>",
        "[A](https://e.x) <a@example.com>",
        "Signed-off-by: E <e@example.com>",
    ):
        assert coauthor("patches", f"From: {line}\n") == tool, line
    assert coauthor("patches", "From: Zoë O'Neil <zoe@example.org>\n") == "Zoë O'Neil <zoe@example.org>"


def test_the_forges_search_results_reach_the_body_as_text(upstream, monkeypatch):  # noqa: F811
    """Another account's pull request titles are untrusted: no mention, link, image or tag survives in our body."""
    repo, fake = upstream
    monkeypatch.setenv("AGENTSEARCH_FORGE_TOKEN", fake.token)
    from ..conftest import git, run_cli

    git(repo, "push", "-q", "origin", "main:evil-branch")
    fake.open_pr(
        "evil-branch",
        title='engine <img src=x onerror=alert(1)> [click](https://evil.example) @vllm-maintainers ![i](https://e.x/a.png) | x',
        author="mallory",
    )
    proc = run_cli(
        "pr", "-C", str(repo), "001", "--owner", OWNER, "--not-duplicate", "<b>@here</b> [x](https://e.x)", "--json"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    body = fake.prs[max(fake.prs)]["body"]
    row = next(ln for ln in body.splitlines() if ln.startswith("| `engine` |"))
    assert row.count("|") - row.count("\\|") == 3  # the title's pipe is no new cell
    assert not re.search(r"(?<!\\)<(img|b)\b", body)  # every tag's bracket escaped
    for raw in ("](https://evil.example)", "![i]", "](https://e.x)"):
        assert raw not in body, raw
    assert "@vllm-maintainers" not in body.replace("`@vllm-maintainers`", "") and "@here" not in body.replace(
        "`@here`", ""
    )
    assert json.loads(proc.stdout)["upstream"]["not_duplicate"].startswith("<b>")


KERNEL_BASE = '''import torch


def rms(x, w, eps):
    if x.shape[0] == 8:  # already there: not this change's
        pass
    return x * w
'''
KERNEL_CAND = '''import torch
BLOCK = 128


def rms(x, w, eps):
    if x.shape[0] == 8:  # already there: not this change's
        pass
    if x.shape[0] == 4:
        return fast_path(x, w)
    if M == 4096 or x.size(-1) != 2048:
        pass
    if num_tokens in (1, 2, 4):
        pass
    if x.dim() == 2 and x.shape[-1] % 16 == 0:
        pass
    # agentsearch: shape-specific one token per sequence is the decode step's shape
    if x.shape[0] == 1:
        pass
    return x * w


def supports_args(x, w, eps, variance_size=None):
    return x.shape[-1] == 4096


register(supported=lambda x: x.shape[0] in (4, 8), supports_args=lambda x, *a: x.numel() == 64)
'''


def test_a_kernel_hard_coded_for_the_benchmarks_shapes_is_named_line_by_line(tmp_path) -> None:
    """Exact shape comparisons with literals on the change's own lines of kernel code are named; a provider's
    supports_args (where a restriction belongs), a declared line, a rank check, an alignment check, a tile constant,
    an unchanged line and code outside the kernel paths are not."""
    from agentsearch.upstream import shape_literals
    from benchmarks.toy import make_repo

    from ..conftest import commit, git

    repo = make_repo(tmp_path / "r", {"vllm/kernels/mine.py": KERNEL_BASE, "csrc/k.cu": "int f(int M) { return M; }\n"})
    base = git(repo, "rev-parse", "main").strip()
    cand = commit(
        repo,
        {
            "vllm/kernels/mine.py": KERNEL_CAND,
            "csrc/k.cu": "int f(int M) {\n  if (M == 4096) return 1;\n  return M;\n}\n",
            "vllm/model_executor/other.py": "def f(x):\n    return x.shape[0] == 4\n",
        },
        "a kernel",
    )
    found = shape_literals(repo, base, cand)
    lines = [f.split(": ", 1)[0] for f in found]
    assert lines == [
        "csrc/k.cu:2",
        "vllm/kernels/mine.py:8",
        "vllm/kernels/mine.py:10",
        "vllm/kernels/mine.py:12",
    ], found
    assert found[1].endswith("if x.shape[0] == 4:")


def test_the_kernels_micro_benchmark_runs_against_the_installed_vllm(tmp_path) -> None:
    """The micro-benchmark an upstream kernel pull request carries (benchmarks/kernels/) is a real, standalone script:
    run on the installed vLLM (CPU), it checks the provider against native and prints a time per call."""
    import sys

    import pytest

    from agentsearch.errors import AgentsearchError
    from agentsearch.upstream import PROFILES, kernel_benchmark

    path, script = kernel_benchmark("rms_norm", "native", PROFILES["vllm"], 'x"""; import os #\\', "0.0.0")
    assert path == "benchmarks/kernels/benchmark_rms_norm_native.py"
    compile(script, path, "exec")  # a check summary cannot end the docstring
    f = tmp_path / "bench.py"
    f.write_text(script)
    proc = subprocess.run(
        [sys.executable, str(f), "--quick", "--dtype", "float32"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = proc.stdout.strip().splitlines()[-1].split()
    assert row[:3] == ["float32", "16", "1024"] and row[-1].endswith("x") and float(row[3]) > 0, proc.stdout
    with pytest.raises(AgentsearchError, match="Python identifier"):
        kernel_benchmark("rms_norm", "x; import os", PROFILES["vllm"], "", "0")


HARD_CODED = {  # each a kernel pinned to one shape, written the way the red team of #59 slipped past the first lint
    "alias": "def f(x):\n    t = x.shape[0]\n    if t == 4096:\n        return 1\n",
    "unpacked": "def f(x):\n    b, h = x.shape\n    if h == 4096:\n        return 1\n",
    "module_constant": "H = 4096\ndef f(x):\n    if x.shape[-1] == H:\n        return 1\n",
    "float_literal": "def f(x):\n    if x.shape[-1] == 4096.0:\n        return 1\n",
    "pow_literal": "def f(x):\n    if x.shape[-1] == 2**12:\n        return 1\n",
    "chained_range": "def f(x):\n    if 4095 < x.shape[-1] < 4097:\n        return 1\n",
    "match": "def f(x):\n    match x.shape:\n        case (1, 4096):\n            return 1\n",
    "walrus_and": "def f(x):\n    if (t := x.shape[0]) and t == 4096:\n        return 1\n",
    "range_in": "def f(x):\n    if x.shape[-1] in range(4096, 4097):\n        return 1\n",
    "dict_dispatch": "def f(x):\n    return {4096: 1}.get(x.shape[-1], 0)\n",
    "stride": "def f(x):\n    if x.stride(0) == 4096:\n        return 1\n",
    "len": "def f(x):\n    if len(x) == 4096:\n        return 1\n",
    "helper_named_like_supported": (
        "def supported_here(x):\n    return x.shape[-1] == 4096\ndef f(x):\n    if supported_here(x):\n        return 1\n"
    ),
    "subtract": "def f(x):\n    if not x.shape[-1] - 4096:\n        return 1\n",
    "operator_eq": "import operator\ndef f(x):\n    if operator.eq(x.shape[-1], 4096):\n        return 1\n",
}
NOT_SHAPES = {  # restrictions and facts that are no hard-coded shape
    "rank": "def f(x):\n    assert len(x.shape) == 2\n    return x\n",
    "alignment": "def f(x):\n    return x.shape[-1] % 16 == 0\n",
    "tile": "BLOCK = 128\ndef f(x):\n    return x\n",
    "supports_args": "def supports_args(x, w, e, v=None):\n    return x.shape[-1] == 4096\n",
    "bound": "def f(x):\n    if x.shape[-1] <= 8192:\n        return 1\n",
}


def test_the_shape_lint_sees_through_aliases_constants_and_other_spellings() -> None:
    from agentsearch.upstream import _python_shape_literals

    missed = [k for k, src in HARD_CODED.items() if not _python_shape_literals(src)]
    assert missed == [], missed
    flagged = {k: _python_shape_literals(src) for k, src in NOT_SHAPES.items()}
    assert not any(flagged.values()), flagged
    assert _python_shape_literals("def g[T](x: T) -> T:\n    return x\n") is None  # unparseable: said, not skipped


def test_the_shape_lint_reads_c_cuda_and_kernel_files_anywhere(tmp_path) -> None:
    from agentsearch.upstream import shape_literals
    from benchmarks.toy import make_repo

    from ..conftest import commit, git

    repo = make_repo(tmp_path / "r", {"README": "x\n"})
    base = git(repo, "rev-parse", "main").strip()
    c_src = (
        "void f(int n, int hidden_size) {\n"
        "  if (hidden_size == 4096u) { fast(); }\n"
        "  if (hidden_size==0x1000UL) { fast(); }\n"
        "  if (n == 4096) { fast(); }\n"
        "  if (input.size(-1) == 4096) { fast(); }\n"
        "  switch (n) { case 4096: fast(); }\n"
        '  TORCH_CHECK(head_dim == 128 || head_dim == 64, "unsupported head size");\n'
        "  x = y * 2;  // works for any M; was M == 16 before\n"
        "}\n"
    )
    cand = commit(
        repo,
        {
            "csrc/layernorm.cc": c_src,
            "vllm/model_executor/layers/fused.py": "@triton.jit\ndef k(x):\n    if x.shape[0] == 4:\n        pass\n",
            "vllm/model_executor/layers/plain.py": "def f(x):\n    return x.shape[0] == 4\n",  # not kernel code
            "vllm/kernels/new.py": "def g[T](x: T) -> T:\n    return x\n",
        },
        "kernels",
    )
    got = [f.split(": ", 1)[0] for f in shape_literals(repo, base, cand)]
    assert got == [
        "csrc/layernorm.cc:2",
        "csrc/layernorm.cc:3",
        "csrc/layernorm.cc:4",
        "csrc/layernorm.cc:5",
        "csrc/layernorm.cc:6",
        "vllm/kernels/new.py:1",
        "vllm/model_executor/layers/fused.py:3",
    ], got


def test_an_added_line_cannot_hide_the_lines_after_it_from_the_diff(tmp_path) -> None:
    """`git diff -U0` shows an added line `++ 0` as `+++ 0`, a file header's shape; a line holding U+2028 is one
    line to git. Neither ends the file's hunks: the changed lines (the coverage check's and the shape lint's) are
    all there, and a path git quotes (a tab, a quote) is read unquoted."""
    from agentsearch.workspace import git as g
    from benchmarks.toy import make_repo

    from ..conftest import commit, git

    base_src = "def fast(x):\n" + "    pass\n" * 5 + "    return x\n"
    repo = make_repo(tmp_path / "r", {"vllm/kernels/fast.py": base_src})
    base = git(repo, "rev-parse", "main").strip()
    src = (
        "++ 0\nS = '\u2028diff --git a/x b/x'\ndef fast(x):\n"
        + "    pass\n" * 5
        + "    if x.shape[-1] == 4096:\n        return x\n    return x\n"
    )
    cand = commit(repo, {"vllm/kernels/fast.py": src, 'vllm/kernels/q"uo\tte.py': "A = 1\n"}, "k")
    lines = g.changed_lines(repo, base, cand)
    assert lines["vllm/kernels/fast.py"] >= {1, 2, 9} and lines['vllm/kernels/q"uo\tte.py'] == {1}, lines

"""Correct against the stock model on the real vLLM fork (issue #42): a change on main that is dormant at the
starter's max_num_seqs 4 (it moves the logits only in batches of more than 8 requests) is blamed on main when an
honest proposal (max_num_seqs 4 -> 32) wakes it; on a clean main the same proposal passes.

Cost: one fork and three verifies, nine logprob engine starts (the reference's and main's runs are kept per
commit and regime: the later checks reuse them), about 6 minutes on the 2-core machine beside another engine test.
"""

from __future__ import annotations

import json

import pytest

from agentsearch.workspace import Workspace

from .conftest import commit, git, run_cli
from .test_vllm_integration import FAST_CONFIG, make_fork, serving

pytestmark = pytest.mark.vllm

# production runs max_num_seqs 32: the checks cover it whatever the proposal's own regime
CONFIG = (
    FAST_CONFIG
    + """
[verify]
kind = "vllm"
corpus_size = 24
max_tokens = 8
sample = false
engine = {{ distributed_executor_backend = "uni" }}
regimes = [{{ max_num_seqs = 32 }}]
"""
)

# planted in the fork's sampler: a small deterministic change of every logit, only in batches of more than 8
DORMANT = (
    "vllm/v1/sample/sampler.py",
    "        logits = logits.to(torch.float32)\n",
    "        logits = logits.to(torch.float32)\n"
    "        if logits.shape[0] > 8:\n"
    "            logits = logits + 0.01 * torch.sin(torch.arange(logits.shape[-1], dtype=torch.float32, device=logits.device))\n",
)


def verify(repo, ref):
    proc = run_cli("verify", "-C", str(repo), ref, "--json", timeout=1800)
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_a_change_dormant_on_main_is_blamed_on_main_when_an_honest_proposal_wakes_it(tmp_path_factory):
    fork = make_fork(tmp_path_factory, "vllm-ref", CONFIG)
    commit(fork, {"serving.json": serving(4)}, "max_num_seqs 4")
    git(fork, "update-ref", "refs/agentsearch/reference", "main")  # the stock code at the starter's regime
    stock = git(fork, "rev-parse", "main").strip()

    # a clean main: the honest proposal passes against main and against the reference, in its regime and the old one
    commit(fork, {"serving.json": serving(32)}, "max_num_seqs 32", branch="seqs32")
    git(fork, "checkout", "-q", "main")
    rc, out = verify(fork, "seqs32")
    assert rc == 0 and out["verdict"] == "pass" and out["blame"] is None, out["reasons"]
    ref = out["reference"]
    assert ref["commit"] == stock and ref["passed"]
    assert [r["label"] for r in ref["regimes"]] == ["max_num_seqs 32", "max_num_seqs 4"]
    # a change of regime keys only: main's run at 4 stands for the candidate's (no candidate engine at 4, issue #56)
    assert all(r["shared"] for r in ref["regimes"]), ref["regimes"]

    # an earlier change lands on main unjudged at 32 (the gate saw it only at 4, where it is dormant)
    path, old, new = DORMANT
    text = (fork / path).read_text()
    assert old in text
    commit(fork, {path: text.replace(old, new, 1)}, "an earlier change: dormant at max_num_seqs 4")
    main = git(fork, "rev-parse", "main").strip()

    # `verify main`: main against the reference, in its own regime (passes: dormant) and in production's (fails)
    rc, mine = verify(fork, "main")
    assert rc == 1 and mine["blame"] == "main", mine["reasons"]
    assert mine["reasons"][0].startswith(f"main already diverges from the reference {stock[:10]} at max_num_seqs 32"), (
        mine["reasons"]
    )
    rows = {r["label"]: r["passed"] for r in mine["reference"]["regimes"]}
    assert rows == {"max_num_seqs 4": True, "max_num_seqs 32": False}, rows
    # the first check ran no reference at 32 (the reference was main: the candidate's own run stood for it, issue #56),
    # so this one runs it, and keeps it for the next
    assert mine["reference"]["collected"] >= 1

    # the same honest proposal on this main: refused, with main named as the cause
    commit(fork, {"serving.json": serving(32)}, "max_num_seqs 32", branch="seqs32b", start=main)
    git(fork, "checkout", "-q", "main")
    rc, out = verify(fork, "seqs32b")
    assert rc == 1 and out["verdict"] == "fail" and out["blame"] == "main", out["reasons"]
    assert out["reasons"][0].startswith(f"main already diverges from the reference {stock[:10]} at max_num_seqs 32"), (
        out["reasons"]
    )
    assert "not this proposal's change" in out["reasons"][0]
    assert any(r.startswith("public decode") for r in out["reasons"][1:]), out["reasons"]  # what the candidate did wake
    assert out["reference"]["collected"] == 0  # main's and the reference's runs at 32 and at 4: all kept
    assert Workspace.open(fork).baseline_commit() == main

"""Red team: the timed outputs rule is statistical, not bitwise (harness/outputs_rule.py, issue 54).

The toy vLLM fork (benchmarks/toy_engine.py) is a Markov model whose greedy choice has a known runner-up and margin:
a near tie (1e-6 nats) after one token in 23, 5e-3 after one in 5. An honest change that flips greedy tokens only
at near ties (what compiled kernels or another batch do to a real model) must merge; a change that flips where the
reference is sure (a lower precision), pads, or answers with tokens outside the vocabulary must be refused — through
the real warm worker, its ``score`` command on the baseline's engine, the sandbox and the gate."""

from __future__ import annotations

import pytest

from agentsearch.workspace import Workspace
from benchmarks.toy_engine import TOY_VLLM, evaluate, target

from ..conftest import commit, run_cli

pytestmark = pytest.mark.timeout(300)

FLIP_AT_NEAR_TIES = TOY_VLLM.replace(
    "    return nxt(t)  # greedy (a variant may flip where margin(t) is small)",
    "    return alt(t) if margin(t) < 1e-5 else nxt(t)  # another summation order: near ties go the other way",
)
FLIP_BEYOND_TIES = TOY_VLLM.replace(
    "    return nxt(t)  # greedy (a variant may flip where margin(t) is small)",
    "    return alt(t) if margin(t) < 1e-2 else nxt(t)  # a lower precision: flips where the reference is sure",
)
OUT_OF_VOCABULARY = '''
_gen = LLM.generate


def _generate(self, prompts, sampling_params=None, use_tqdm=False):
    res = _gen(self, prompts, sampling_params, use_tqdm)
    if not getattr(sampling_params if not isinstance(sampling_params, list) else sampling_params[0], "prompt_logprobs", None):
        res[0].outputs[0].token_ids = list(res[0].outputs[0].token_ids[:-1]) + [2**30]
    return res


LLM.generate = _generate
'''


def test_an_honest_change_that_flips_near_ties_merges_and_says_so(tmp_path):
    assert FLIP_AT_NEAR_TIES != TOY_VLLM
    repo = target(tmp_path)
    commit(repo, {"vllm/__init__.py": FLIP_AT_NEAR_TIES, "cost.txt": "0.0006\n"}, "sum in another order", branch="f")
    rc, out = evaluate(repo, "f")
    assert rc == 0 and out["verdict"] == "merge", out["reasons"]
    judged = [t["metrics"] for t in out["trials"] if "outputs_compared" in t["metrics"]]
    assert judged and all(m["outputs_compared"] == "distributions" and m["outputs_flips"] > 0 for m in judged)
    assert all(m["outputs_tie"] == pytest.approx(1e-4) and m["outputs_floor"] == 0.0 for m in judged)
    assert all(m["outputs_flip_margin_max"] <= 1e-4 and "margin" in m["outputs_flip_example"] for m in judged)
    report = run_cli("report", "-C", str(repo), "f", "--format", "md")
    assert report.returncode == 0, report.stderr
    table = report.stdout.split("### Timed outputs", 1)[1].split("\n## ", 1)[0]
    row = next(ln for ln in table.splitlines() if ln.startswith("| throughput | objective |"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    objective = [t for t in out["trials"] if "outputs_compared" in t["metrics"] and t["phase"] == "objective"]
    assert cells[2] == "0" and int(cells[3]) == len(objective) and int(cells[5]) > 0, row
    assert cells[7] == "0.0001" and cells[8] == "0", row  # the tie, and the floor measured on this engine
    assert "one flip: request" in table and "margin" in table


def test_a_lossy_change_that_flips_where_the_reference_is_sure_is_refused(tmp_path):
    repo = target(tmp_path)
    main = Workspace.open(repo).baseline_commit()
    commit(repo, {"vllm/__init__.py": FLIP_BEYOND_TIES, "cost.txt": "0.0006\n"}, "bf16 somewhere", branch="lossy")
    rc, out = evaluate(repo, "lossy")
    assert rc == 4 and out["verdict"] == "reject", out["reasons"]
    reason = " ".join(out["reasons"])
    # refused at a flip where the reference is sure (5e-3 nats), whether it is the request's first difference ("top-2
    # margin") or follows a near-tie flip ("after the flip ... worst gap")
    assert "outputs check" in reason and "0.005 nats" in reason and "tie 0.0001" in reason, reason
    assert Workspace.open(repo).baseline_commit() == main


def test_a_token_outside_the_vocabulary_is_refused_before_the_baseline_scores_it(tmp_path):
    repo = target(tmp_path)
    commit(repo, {"vllm/__init__.py": TOY_VLLM + OUT_OF_VOCABULARY, "cost.txt": "0.0006\n"}, "odd id", branch="oov")
    rc, out = evaluate(repo, "oov")
    assert rc == 4 and out["verdict"] == "reject", out["reasons"]
    assert any("token id 1073741824 is outside the model's vocabulary" in r for r in out["reasons"]), out["reasons"]


@pytest.mark.parametrize("variant", ["honest", "lossy"])
def test_one_engine_at_a_time_scores_what_the_candidate_s_session_completed(tmp_path, variant):
    """Alternate placement (one GPU's default): every other round ends in the candidate's session, after the
    baseline's engine is gone. Those pairs' flips wait for the next baseline session (or one started for them after
    the last pair): the honest change still merges, the lossy one is still refused."""
    repo = target(tmp_path, engine='placement = "alternate"')
    vllm = FLIP_AT_NEAR_TIES if variant == "honest" else FLIP_BEYOND_TIES
    commit(repo, {"vllm/__init__.py": vllm, "cost.txt": "0.0006\n"}, "sum in another order", branch="f")
    rc, out = evaluate(repo, "f")
    if variant == "honest":
        assert rc == 0 and out["verdict"] == "merge", out["reasons"]
        judged = [t["metrics"].get("outputs_compared") for t in out["trials"]]
        assert "pending" in judged and "distributions" in judged, judged  # both kinds of round happened
    else:
        assert rc == 4 and out["verdict"] == "reject", out["reasons"]
        assert any("0.005 nats" in r and "tie 0.0001" in r for r in out["reasons"]), out["reasons"]


@pytest.mark.parametrize("placement", ["shared", "alternate"])
def test_calibrate_measures_the_rounding_floor_and_keeps_it_with_the_environment(tmp_path, placement):
    """`agentsearch calibrate` scores the baseline's own answers on its engine, in two batch orders and against its
    decode: the floor the outputs rule's tie is made of, per engine and dtype, stored with the calibration (one
    engine at a time: on a baseline engine started for it)."""
    import json

    repo = target(tmp_path, engine=f'placement = "{placement}"')
    proc = run_cli("calibrate", "-C", str(repo), "--pairs", "4", "--machine-probe", "0", "--json", timeout=280)
    assert proc.returncode == 0, proc.stderr
    w = json.loads(proc.stdout)["workloads"]["throughput"]
    assert w["outputs_floor"] == 0.0 and w["outputs_tie"] == pytest.approx(1e-4) and w["outputs_dtype"] == "float32"
    assert w["outputs_positions"] == 16 * 16 and w["outputs_note"] == ""  # every token of every answer
    text = run_cli("calibrate", "-C", str(repo), "--pairs", "4", "--machine-probe", "0", timeout=280)
    assert "rounding floor on this engine (float32): 0 nats over 256 positions" in text.stdout, text.stdout

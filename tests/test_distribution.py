"""Distribution checks: statistics, and acceptance on a toy numpy language model target."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from agentsearch.workspace import Workspace
from harness.corpus import NATURAL, build, load, split
from harness.distribution import PathStats, compare_position, judge_path, systematic_shift

from .conftest import ROOT, commit, make_repo, run_cli

LM = (ROOT / "tests" / "toy_lm.py").read_text()
CONFIG = """
[target]
baseline = "main"

[[workload]]
name = "speed"
command = "true"
metric = "x"

[verify]
logprobs = "{python} lm.py {{prompts}} {{out}}"
timeout_s = 120
"""


def test_shipped_corpus_is_the_built_one_and_diverse():
    prompts = load()
    assert [(p.id, p.lang, p.text) for p in prompts] == [(p.id, p.lang, p.text) for p in build()]
    assert len(prompts) >= 300
    langs = {p.lang for p in prompts}
    assert len(langs & set(NATURAL)) >= 10 and {"code", "numbers"} <= langs
    text = "".join(p.text for p in prompts)
    for lo, hi, script in [(0x0400, 0x04FF, "Cyrillic"), (0x4E00, 0x9FFF, "CJK"), (0x0600, 0x06FF, "Arabic"), (0x0900, 0x097F, "Devanagari"), (0xAC00, 0xD7AF, "Hangul")]:
        assert any(lo <= ord(c) <= hi for c in text), script
    sizes = sorted(len(p.text.encode()) for p in prompts)
    assert sizes[0] < 60 and sizes[-1] > 400  # short to several hundred tokens


def test_holdout_depends_on_the_secret():
    prompts = load()
    pub1, hold1 = split(prompts, b"a" * 32, 0.25)
    pub2, hold2 = split(prompts, b"b" * 32, 0.25)
    assert 0.15 < len(hold1) / len(prompts) < 0.35
    assert {p.id for p in hold1} != {p.id for p in hold2}
    assert len(pub1) + len(hold1) == len(prompts)


def test_compare_position_basics():
    a = {1: math.log(0.6), 2: math.log(0.3), 3: math.log(0.05)}
    assert compare_position(a, dict(a))[:3] == (0.0, 0.0, 0.0)
    b = {1: math.log(0.3), 2: math.log(0.6), 3: math.log(0.05)}
    kl, tv, dlp, signed, agree = compare_position(a, b)
    assert kl > 0.1 and tv == pytest.approx(0.3) and not agree and signed < 0
    c = {1: math.log(0.6), 2: math.log(0.3), 4: math.log(0.05)}  # different support: handled via the tail
    assert compare_position(a, c)[0] >= 0


def test_systematic_shift_is_caught_even_when_tiny():
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 1e-7, 500).tolist()
    assert systematic_shift(noise, [], "float32") == ""
    shifted = (np.abs(rng.normal(0, 1e-5, 500)) + 5e-6).tolist()  # every position up, each far below the caps
    assert "systematic shift" in systematic_shift(shifted, [], "float32")


def test_exact_mode_needs_bit_identity():
    st = PathStats(kl=[0.0], tv=[0.0], dlp=[1e-9], signed=[1e-9], agree=[True], exact=False, sequences=1)
    assert not judge_path("prefill", st, PathStats(), "exact", "float32").passed
    assert judge_path("prefill", st, PathStats(), "tight", "float32").passed


@pytest.fixture
def lm_target(tmp_path):
    import sys

    repo = make_repo(tmp_path / "lm", {"agentsearch.toml": CONFIG.format(python=sys.executable), "lm.py": LM})
    assert run_cli("init", "-C", str(repo)).returncode == 0
    return repo


def verify(repo, ref):
    proc = run_cli("verify", "-C", str(repo), ref, "--json")
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


VARIANTS = {
    "refactor": [("return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS)", "return x * (np.float32(1.0) / np.sqrt(np.square(x).mean(-1, keepdims=True) + EPS))")],
    "eps": [("EPS = np.float32(1e-5)", "EPS = np.float32(1e-3)")],
    "scale": [("    return rmsnorm(h) @ U", "    return (rmsnorm(h) @ U) * np.float32(1.001)")],
    "residual": [("    h = h + np.tanh(rmsnorm(h) @ W1) @ W2", "    h = np.tanh(rmsnorm(h) @ W1) @ W2")],
    "truncate": [("    z = z - z.max(-1, keepdims=True)", "    z = z.copy()\n    z[..., -8:] = -np.inf\n    z = z - z.max(-1, keepdims=True)")],
}


def variant(repo, name):
    text = LM
    for old, new in VARIANTS[name]:
        assert old in text
        text = text.replace(old, new)
    commit(repo, {"lm.py": text}, name, branch=name)


def test_exact_refactor_passes(lm_target):
    variant(lm_target, "refactor")
    rc, out = verify(lm_target, "refactor")
    assert rc == 0 and out["verdict"] == "pass", out["reasons"]
    assert out["public"]["prefill"]["positions"] > 1000 and out["holdout_size"] > 0
    assert set(out["languages"]) >= {"en", "zh", "ar", "hi", "ru", "code"}


@pytest.mark.parametrize("name", ["eps", "scale", "residual", "truncate"])
def test_real_changes_fail(lm_target, name):
    variant(lm_target, name)
    rc, out = verify(lm_target, name)
    assert rc == 1 and out["verdict"] == "fail"
    text = " ".join(out["reasons"])
    assert "prefill" in text and "public" in text


def test_special_casing_public_prompts_fails_on_the_holdout(lm_target):
    ws = Workspace.open(lm_target)
    from agentsearch.verify import holdout_secret

    public, hold = split(load(), holdout_secret(ws), 0.25)
    cheat = LM.replace(
        "            toks = tokenize(item[\"text\"])\n            lp = logprobs(logits(toks))",
        "            toks = tokenize(item[\"text\"])\n            lp = logprobs(logits(toks) * (np.float32(1.0) if item[\"id\"] in PUBLIC else np.float32(1.05)))",
    ).replace("EPS = np.float32(1e-5)", "EPS = np.float32(1e-5)\nPUBLIC = set(open('public_ids.txt').read().split())")
    commit(lm_target, {"lm.py": cheat, "public_ids.txt": "\n".join(p.id for p in public)}, "cheat", branch="cheat")
    rc, out = verify(lm_target, "cheat")
    assert rc == 1
    assert all(r.startswith("holdout") for r in out["reasons"]), out["reasons"]
    assert out["public"]["prefill"]["passed"] and not out["holdout"]["prefill"]["passed"]


def test_evaluate_includes_the_distribution_check(lm_target):
    import sys

    cfg = CONFIG.format(python=sys.executable).replace('command = "true"\nmetric = "x"', f'command = "{sys.executable} speed.py {{out}}"\nmetric = "x"') + "\n[gate]\ncoverage = false  # lm.py does not run in the speed workload\n"
    speed = "import json, sys, random\njson.dump({'x': float(open('f.txt').read()) * random.gauss(1, 0.01)}, open(sys.argv[1], 'w'))\n"
    commit(lm_target, {"agentsearch.toml": cfg, "speed.py": speed, "f.txt": "1.0"}, "bench")
    commit(lm_target, {"f.txt": "1.5", "lm.py": LM.replace("EPS = np.float32(1e-5)", "EPS = np.float32(1e-3)")}, "fast but wrong", branch="fastwrong")
    commit(lm_target, {"f.txt": "1.5"}, "fast and right", branch="fastright")
    proc = run_cli("evaluate", "-C", str(lm_target), "fastwrong", "--json")
    out = json.loads(proc.stdout)
    assert proc.returncode == 4 and any(r.startswith("distribution:") for r in out["reasons"]), out["reasons"]
    proc = run_cli("evaluate", "-C", str(lm_target), "fastright", "--json")
    out = json.loads(proc.stdout)
    assert proc.returncode == 0, out["reasons"]
    assert out["distribution"]["verdict"] == "pass"

"""Distribution checks: statistics, and acceptance on a toy numpy language model target."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from agentsearch.workspace import Workspace
from harness.corpus import NATURAL, build, load, select, split
from harness.distribution import PathStats, Record, compare, compare_position, judge_draws, judge_path, systematic_shift

from .conftest import ROOT, commit, evaluation_record, git, make_repo, run_cli

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
    for lo, hi, script in [
        (0x0400, 0x04FF, "Cyrillic"),
        (0x4E00, 0x9FFF, "CJK"),
        (0x0600, 0x06FF, "Arabic"),
        (0x0900, 0x097F, "Devanagari"),
        (0xAC00, 0xD7AF, "Hangul"),
    ]:
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


def test_a_complete_listing_rounding_is_not_a_difference_but_a_masked_token_is():
    """The sample path's processed logprobs list every token the sampler kept: they sum to 1 only within
    float32 rounding. Measured on the real engine (the benign reassociation, min-p 0.05): 0.99999990 on
    one side, 1.00000003 on the other, which without a tail floor read as KL 5e-6 at every such position."""
    lp = [math.log(0.7), math.log(0.2), math.log(0.0999999)]  # sums to 0.9999999
    a = {1: lp[0], 2: lp[1], 3: lp[2]}
    b = {1: lp[0] + 3e-8, 2: lp[1] + 2e-8, 3: lp[2] + 4e-8}  # an ulp or two each: sums to 1.00000003
    kl, tv, dlp, _, agree = compare_position(a, b)
    assert kl < 1e-12 and tv < 1e-7 and dlp < 1e-7 and agree
    # a token one side's sampler kept and the other's masked (a top-k/top-p boundary moved) is a real difference
    c = {1: math.log(0.7 / 0.9), 2: math.log(0.2 / 0.9)}
    assert compare_position(a, c)[0] > 0.05 and compare_position(c, a)[0] > 0.05


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


def _rec(pid, path, tokens, topk):
    return Record(pid, path, tuple(tokens), tuple(None if e is None else tuple((t, lp) for t, lp in e) for e in topk))


def test_statistics_people_read():
    """llama.cpp's --kl-divergence numbers: mean KL ± SE, percentiles, RMS Δp, same top token %."""
    rng = np.random.default_rng(1)
    base, cand = {}, {}
    for i in range(40):
        pos_a, pos_b = [], []
        for _ in range(10):
            z = rng.normal(0, 2, 6)
            za = z - np.log(np.exp(z).sum())
            zb = z + rng.normal(0, 0.05, 6)
            zb = zb - np.log(np.exp(zb).sum())
            pos_a.append([(t, float(za[t])) for t in range(6)])
            pos_b.append([(t, float(zb[t])) for t in range(6)])
        base[(f"p{i}", "prefill")] = _rec(f"p{i}", "prefill", range(10), pos_a)
        cand[(f"p{i}", "prefill")] = _rec(f"p{i}", "prefill", range(10), pos_b)
    s = compare(base, cand, [f"p{i}" for i in range(40)], 1e-4)["prefill"].summary()
    kl = compare(base, cand, [f"p{i}" for i in range(40)], 1e-4)["prefill"].kl
    assert s["positions"] == 400
    assert s["kl_mean"] == pytest.approx(np.mean(kl)) and s["kl_mean_se"] == pytest.approx(np.std(kl, ddof=1) / 20)
    pc = s["kl_percentiles"]
    assert list(pc) == ["99.9", "99", "95", "90", "50"]
    assert pc["50"] < pc["90"] < pc["95"] < pc["99"] <= pc["99.9"] <= s["kl_max"]
    assert 0 < s["dp_rms"] < 0.05
    assert 90 < s["same_top_pct"] <= 100 and s["same_top_pct"] == pytest.approx(100 * s["top1_agreement"])
    same = compare(base, dict(base), [f"p{i}" for i in range(40)], 1e-4)["prefill"].summary()
    assert same["kl_mean"] == 0 and same["dp_rms"] == 0 and same["same_top_pct"] == 100 and same["exact"]


def test_positions_the_candidate_leaves_empty_fail_rather_than_drop_out():
    """Red team: a candidate whose logprobs are NaN where it differs (the worker drops NaN entries, so the
    listing is empty) must not shrink the comparison to the positions where it agrees."""
    entry = [(1, -0.1), (2, -2.4)]
    base = {("p", "prefill"): _rec("p", "prefill", [5, 6, 7, 8], [None, entry, entry, entry])}
    cand = {("p", "prefill"): _rec("p", "prefill", [5, 6, 7, 8], [None, entry, [], entry])}
    st = compare(base, cand, ["p"], 1e-4)["prefill"]
    assert st.dropped == ["p@2"] and len(st.kl) == 2 and not st.exact
    v = judge_path("prefill", st, compare(base, dict(base), ["p"], 1e-4)["prefill"], "tight", "float32")
    assert not v.passed and "listed no logprobs at 1 position(s) the baseline did, e.g. p@2" in v.reasons[0]
    assert compare(base, dict(base), ["p"], 1e-4)["prefill"].dropped == []  # the first position has none on both sides


def test_sample_path_aligns_until_a_draw_differs():
    """The sample path compares every setting of a prompt, step by step, until the sampled tokens differ."""
    a = {(f"x#s{j}", "sample"): _rec(f"x#s{j}", "sample", [1, 2, 3], [[(1, -0.1), (2, -2.4)]] * 3) for j in range(2)}
    b = dict(a)
    b[("x#s1", "sample")] = _rec(
        "x#s1", "sample", [1, 9, 3], [[(1, -0.1), (2, -2.4)], [(9, -0.2), (2, -1.7)], [(1, -0.1), (2, -2.4)]]
    )
    st = compare(a, b, ["x"], 1e-4, ("sample",))["sample"]
    assert st.sequences == 2 and len(st.kl) == 5  # 3 positions of s0, 2 of s1 (stopped after the divergence)
    assert st.divergences == 1 and not st.bad_divergences and not st.exact
    assert compare(a, {}, ["x"], 1e-4, ("sample",))["sample"].missing == ["x#s0", "x#s1"]


def _draws(seed, n=400, contexts=3, tokens=50, shift=None):
    out = {}
    for c in range(contexts):
        rng = np.random.default_rng(seed * 100 + c)
        drawn = rng.integers(0, tokens, n).tolist()
        if shift:
            drawn = [t if i % shift else (t + 1) % tokens for i, t in enumerate(drawn)]
        out[(f"c{c}#s0", "draws")] = _rec(f"c{c}#s0", "draws", drawn, [])
    return out


def test_draw_test_is_paired_and_can_fail():
    base = _draws(1)
    ok = judge_draws(base, _draws(1), _draws(2), _draws(1))
    assert ok.passed and ok.stats["status"] == "pass" and ok.stats["changed"] == 0
    assert ok.stats["unrelated_changed"] > 0.9 * ok.stats["draws"]
    # a sampler that changes one draw in 20 with the same seeds: far below what a frequency test resolves
    bad = judge_draws(base, _draws(1), _draws(2), _draws(1, shift=20))
    assert not bad.passed and bad.stats["changed"] == 60 and "same seeds" in bad.reasons[0]
    # a sampler that ignores its seed
    assert not judge_draws(base, _draws(1), _draws(2), _draws(3)).passed
    # a baseline that does not reproduce its own draws cannot judge anything
    noisy = judge_draws(base, _draws(4), _draws(2), _draws(1))
    assert not noisy.passed and "does not reproduce" in noisy.reasons[0]


def test_a_single_category_is_not_testable_not_a_pass():
    one = {(f"c{c}#s0", "draws"): _rec(f"c{c}#s0", "draws", [7] * 300, []) for c in range(2)}
    v = judge_draws(one, dict(one), dict(one), dict(one))
    assert v.stats["status"] == "not testable" and v.stats["testable"] == 0 and v.stats["p"] is None
    assert len(v.stats["not_testable"]) == 2
    few = {k: _rec(k[0], "draws", r.tokens[:50], []) for k, r in _draws(1).items()}
    assert not judge_draws(few, few, few, few).passed  # too few draws to resolve anything: said, not passed


def test_quick_profile_selects_every_language_short_to_long():
    prompts = load()
    quick = select(prompts, 56)
    assert len(quick) == 56 and {p.lang for p in quick} == {p.lang for p in prompts}
    sizes = sorted(len(p.text.encode()) for p in quick)
    assert sizes[0] < 60 and sizes[-1] > 400
    assert select(prompts, 0) == prompts and select(prompts, 10_000) == prompts


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
    "refactor": [
        (
            "return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS)",
            "return x * (np.float32(1.0) / np.sqrt(np.square(x).mean(-1, keepdims=True) + EPS))",
        )
    ],
    "eps": [("EPS = np.float32(1e-5)", "EPS = np.float32(1e-3)")],
    "scale": [("    return rmsnorm(h) @ U", "    return (rmsnorm(h) @ U) * np.float32(1.001)")],
    "residual": [("    h = h + np.tanh(rmsnorm(h) @ W1) @ W2", "    h = np.tanh(rmsnorm(h) @ W1) @ W2")],
    "truncate": [
        (
            "    z = z - z.max(-1, keepdims=True)",
            "    z = z.copy()\n    z[..., -8:] = -np.inf\n    z = z - z.max(-1, keepdims=True)",
        )
    ],
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

    cfg = (
        CONFIG.format(python=sys.executable).replace(
            'command = "true"\nmetric = "x"', f'command = "{sys.executable} speed.py {{out}}"\nmetric = "x"'
        )
        + "\n[gate]\ncoverage = false  # lm.py does not run in the speed workload\n"
    )
    speed = "import json, sys, random\njson.dump({'x': float(open('f.txt').read()) * random.gauss(1, 0.01)}, open(sys.argv[1], 'w'))\n"
    commit(lm_target, {"agentsearch.toml": cfg, "speed.py": speed, "f.txt": "1.0"}, "bench")
    commit(
        lm_target,
        {"f.txt": "1.5", "lm.py": LM.replace("EPS = np.float32(1e-5)", "EPS = np.float32(1e-3)")},
        "fast but wrong",
        branch="fastwrong",
    )
    commit(lm_target, {"f.txt": "1.5"}, "fast and right", branch="fastright")
    proc = run_cli("evaluate", "-C", str(lm_target), "fastwrong", "--json")
    out = json.loads(proc.stdout)
    assert proc.returncode == 4 and any(r.startswith("distribution:") for r in out["reasons"]), out["reasons"]
    proc = run_cli("evaluate", "-C", str(lm_target), "fastright", "--json")
    out = json.loads(proc.stdout)
    assert proc.returncode == 0, out["reasons"]
    assert out["distribution"]["verdict"] == "pass"
    assert out["distribution"]["baseline_reused"] == 2  # the first evaluation's baseline dumps: same baseline


def test_the_baselines_dumps_are_reused_until_what_they_depend_on_changes(lm_target):
    variant(lm_target, "refactor")
    refactored = git(lm_target, "show", "refactor:lm.py")
    kept = Workspace.open(lm_target).state / "verify-baseline"
    rc, first = verify(lm_target, "refactor")
    assert rc == 0 and first["baseline_reused"] == 0 and len(list(kept.glob("*/*.jsonl"))) == 2
    rc, again = verify(lm_target, "refactor")
    assert rc == 0 and again["baseline_reused"] == 2
    assert again["public"] == first["public"] and again["noise_floor"] == first["noise_floor"]  # the same numbers
    # a damaged dump is collected again, not trusted
    dump = next(kept.glob("*/*.jsonl"))
    dump.write_text(dump.read_text()[: len(dump.read_text()) // 2])
    rc, out = verify(lm_target, "refactor")
    assert rc == 0 and out["baseline_reused"] == 1 and out["public"] == first["public"]
    # what the dumps depend on: the [verify] section, the baseline commit
    cfg = (lm_target / "agentsearch.toml").read_text()
    commit(lm_target, {"agentsearch.toml": cfg.replace("[verify]\n", "[verify]\nk = 10\n")}, "top-10")
    commit(lm_target, {"lm.py": refactored}, "refactor", branch="refactor-2")  # the change again, on the new main
    rc, out = verify(lm_target, "refactor-2")
    assert rc == 0 and out["baseline_reused"] == 0
    commit(lm_target, {"NOTES.md": "a new baseline\n"}, "notes")
    commit(lm_target, {"lm.py": refactored}, "refactor", branch="refactor-3")
    rc, out = verify(lm_target, "refactor-3")
    assert rc == 0 and out["baseline_reused"] == 0
    assert len([d for d in kept.iterdir() if d.is_dir()]) == 3
    # a baseline that is not self-consistent (its output depends on the batch order) keeps nothing: the
    # next check measures it again instead of failing every candidate on a stale floor
    flaky = LM.replace(
        "        for line in fh:\n            item = json.loads(line)",
        "        for n, line in enumerate(fh):\n            item = json.loads(line)\n            if n % 7 == 3:\n                continue",
    )
    assert "n % 7" in flaky
    commit(lm_target, {"lm.py": flaky}, "order-dependent baseline")
    commit(lm_target, {"NOTES.md": "same model\n"}, "notes", branch="flaky-candidate")
    before = {d.name for d in kept.iterdir()}
    rc, out = verify(lm_target, "flaky-candidate")
    assert rc == 1 and any(r.startswith("noise floor") for r in out["reasons"]), out["reasons"]
    assert {d.name for d in kept.iterdir()} == before  # nothing of that check was kept
    # opted out: nothing kept, nothing reused
    commit(lm_target, {"agentsearch.toml": cfg.replace("[verify]\n", "[verify]\nreuse_baseline = false\n")}, "no reuse")
    commit(lm_target, {"lm.py": LM}, "the model again")
    commit(lm_target, {"lm.py": refactored}, "refactor", branch="refactor-4")
    for _ in range(2):
        rc, out = verify(lm_target, "refactor-4")
        assert rc == 0 and out["baseline_reused"] == 0
    assert len([d for d in kept.iterdir() if d.is_dir()]) == 3


def _v2_stats(kl_mean, same):
    return {
        "passed": True,
        "positions": 312,
        "sequences": 39,
        "kl_mean": kl_mean,
        "kl_mean_se": kl_mean / 20,
        "kl_percentiles": {"99.9": 3.2e-7, "99": 2.5e-7, "95": 1.7e-7, "90": 1.5e-7, "50": 3.7e-8},
        "kl_p99": 2.5e-7,
        "kl_max": 3.4e-7,
        "dp_rms": 2.4e-5,
        "dlogprob_max": 0.01,
        "top1_agreement": same / 100,
        "same_top_pct": same,
        "same_top_pct_se": 0.1,
        "divergences": 0,
        "kl_by_position": [kl_mean] * 8,
    }


@pytest.mark.parametrize("fmt", ["md", "html"])
def test_report_distribution_section_shows_the_statistics(fmt):
    """The evidence report's distribution section: llama.cpp's numbers per set and path, the draw
    test; a record from before verify schema 2 still renders (what it lacks shows as —)."""
    from agentsearch.report import Evidence, render

    paths = {p: _v2_stats(6.28e-8, 99.5) for p in ("prefill", "decode", "sample")}
    dist = {
        "schema_version": 2,
        "verdict": "pass",
        "reasons": [],
        "mode": "tight",
        "public": paths,
        "holdout": paths,
        "draws": {
            "passed": True,
            "contexts": 4,
            "testable": 4,
            "not_testable": [],
            "draws": 400,
            "changed": 0,
            "floor_changed": 0,
            "unrelated_changed": 392,
            "p": 1.0,
            "status": "pass",
        },
        "public_size": 42,
        "holdout_size": 14,
        "corpus_size": 336,
        "languages": {},
        "noise_floor": {},
    }
    text, _ = render(Evidence("x", "evaluation", evaluation_record(verdict="merge", distribution=dist), []), fmt)
    assert "6.28e-08 ± 3.1e-09" in text and "99.50 ± 0.10 %" in text and "2.4e-05" in text
    assert "3.2e-07" in text and "3.7e-08" in text  # percentiles 99.9 and 50
    assert "(chosen from 336)" in text and "0 of 400 draws changed" in text and "unrelated seeds 392" in text
    for path in ("prefill", "decode", "sample"):
        assert f"public | {path}" in text if fmt == "md" else f"<td>public</td><td>{path}</td>" in text
    old = {
        "verdict": "pass",
        "reasons": [],
        "mode": "tight",
        "public_size": 42,
        "holdout_size": 14,
        "public": {
            "prefill": {
                "passed": True,
                "positions": 10,
                "kl_mean": 1e-9,
                "kl_p99": 1e-9,
                "kl_max": 1e-9,
                "dlogprob_max": 1e-5,
                "top1_agreement": 1.0,
                "divergences": 0,
            }
        },
        "sample": {"passed": True, "contexts": 8, "tv_max": 0.1},
    }
    text, _ = render(Evidence("x", "evaluation", evaluation_record(verdict="merge", distribution=old), []), fmt)
    assert "100.00 %" in text and "Draw test" not in text


def test_sample_prompts_get_the_same_setting_and_seed_in_any_order(tmp_path):
    from harness.logprobs import write_sample_prompts

    prompts = select(load(), 28)
    a = [json.loads(x) for x in write_sample_prompts(tmp_path / "a.jsonl", prompts, 6).read_text().splitlines()]
    b = [
        json.loads(x)
        for x in write_sample_prompts(tmp_path / "b.jsonl", prompts, 6, shuffle_seed=3).read_text().splitlines()
    ]
    assert [x["id"] for x in a] != [x["id"] for x in b]  # another order (the noise floor's batches)
    assert {x["id"]: (x["setting"], x["seed"]) for x in a} == {x["id"]: (x["setting"], x["seed"]) for x in b}
    assert sorted({x["setting"] for x in a}) == list(range(6)) and len({x["seed"] for x in a}) == len(a)


def test_seeded_requests_are_grouped_to_fit_one_step():
    """The worker's grouping (seeded requests must never be prefilled in chunks on CPU): groups keep
    order, stay within the token budget, and a request heavier than the budget goes alone."""
    from harness.workers.vllm_worker import fit_groups

    weights = [300, 500, 300, 1200, 100, 100, 2000, 50]
    groups = fit_groups(weights, 1024)
    assert [i for g in groups for i in g] == list(range(len(weights)))
    assert groups == [[0, 1], [2], [3], [4, 5], [6], [7]]
    assert all(sum(weights[i] for i in g) <= 1024 or len(g) == 1 for g in groups)
    assert fit_groups([], 1024) == []

"""Correct against the stock model: the pinned reference, the drift budget and the blame (issue #42), on the
toy numpy language model (a command logprob target): real git, real sandboxed runs, real statistics.

The vLLM side (regimes: a change dormant at max_num_seqs 4 that bites at 32) is tests/test_vllm_reference.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from agentsearch.workspace import Workspace
from agentsearch.workspace.workspace import REFERENCE_REF

from .conftest import commit, git, make_repo, run_cli
from .test_distribution import CONFIG, LM

# a speed workload that reads f.txt (1% noise): a proposal that writes 1.5 there is 50% faster
SPEED = "import json, sys, random\njson.dump({'x': float(open('f.txt').read()) * random.gauss(1, 0.01)}, open(sys.argv[1], 'w'))\n"


def lm_repo(tmp_path: Path, verify_extra: str = "", name: str = "lm") -> Path:
    cfg = (
        CONFIG.format(python=sys.executable)
        .replace('command = "true"\nmetric = "x"', f'command = "{sys.executable} speed.py {{out}}"\nmetric = "x"')
        .replace("[verify]\n", "[verify]\ncorpus_size = 60\n" + verify_extra)
        + "\n[gate]\ncoverage = false  # lm.py does not run in the speed workload\nconfirm_pairs = 3\n"
    )
    repo = make_repo(tmp_path / name, {"agentsearch.toml": cfg, "lm.py": LM, "speed.py": SPEED, "f.txt": "1.0"})
    proc = run_cli("init", "-C", str(repo))
    assert proc.returncode == 0, proc.stderr
    return repo


def nudged(*seeds: int, sigma: str = "3e-4") -> str:
    """The toy model with zero-mean noise on its logits, one term per seed, fixed per input (no systematic shift:
    each term moves every distribution a little, in no common direction; two terms move it about twice as far)."""
    old = "    return rmsnorm(h) @ U"
    assert old in LM
    noise = "".join(
        f"    z = z + np.random.default_rng([{k}, len(tokens), int(sum(tokens))]).normal(0, {sigma}, z.shape).astype(np.float32)\n"
        for k in seeds
    )
    return LM.replace(old, "    z = rmsnorm(h) @ U\n" + noise + "    return z")


EPS = ("EPS = np.float32(1e-5)", "EPS = np.float32(1e-3)")  # a lossy change
REFACTOR = (
    "return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS)",
    "return x * (np.float32(1.0) / np.sqrt(np.square(x).mean(-1, keepdims=True) + EPS))",
)  # bit-exact


def verify(repo: Path, ref: str) -> tuple[int, dict]:
    proc = run_cli("verify", "-C", str(repo), ref, "--json")
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_init_pins_the_reference_and_no_merge_or_second_init_moves_it(tmp_path):
    repo = lm_repo(tmp_path)
    stock = git(repo, "rev-parse", "main").strip()
    assert git(repo, "rev-parse", REFERENCE_REF).strip() == stock
    commit(repo, {"NOTES.md": "main moves\n"}, "notes")
    assert run_cli("init", "-C", str(repo)).returncode == 0
    ws = Workspace.open(repo)
    assert ws.reference_commit() == stock != ws.baseline_commit()
    # the preflight names it
    proc = run_cli("preflight", "-C", str(repo))
    assert f"reference   {stock[:12]}" in proc.stdout, proc.stdout


def test_main_is_named_when_it_diverges_from_the_reference_and_the_reference_runs_are_kept(tmp_path):
    """main carries a lossy change the gate never saw (committed directly): an exact refactor on top of it agrees with
    main, but not with the stock model. The check fails, names main (not the proposal), and `verify main` fails too."""
    repo = lm_repo(tmp_path)
    stock = git(repo, "rev-parse", "main").strip()
    commit(repo, {"lm.py": LM.replace(*EPS)}, "an earlier change, never judged")
    commit(repo, {"lm.py": LM.replace(*EPS).replace(*REFACTOR)}, "an exact refactor", branch="refactor")
    git(repo, "checkout", "-q", "main")
    rc, out = verify(repo, "refactor")
    assert rc == 1 and out["verdict"] == "fail" and out["blame"] == "main", out["reasons"]
    assert out["reasons"][0].startswith(f"main already diverges from the reference {stock[:10]}"), out["reasons"]
    assert "not this proposal's change" in out["reasons"][0]
    assert out["public"]["prefill"]["passed"] and out["holdout"]["decode"]["passed"]  # against main: bit-exact
    ref = out["reference"]
    assert (
        ref["commit"] == stock and not ref["passed"] and ref["collected"] == 1 and ref["reused"] == 0
    )  # one run: prefill and decode
    assert [m["passed"] for m in ref["main"]] == [False]
    # the reference's runs are kept: the next check starts no reference run
    rc, again = verify(repo, "refactor")
    assert rc == 1 and again["reference"]["reused"] >= 1 and again["reference"]["collected"] == 0
    assert again["reference"]["regimes"] == ref["regimes"]  # the same numbers
    # `verify main`: main against the reference
    rc, mine = verify(repo, "main")
    assert rc == 1 and mine["blame"] == "main" and mine["reasons"][0].startswith("main already diverges"), mine[
        "reasons"
    ]
    # the human table says so too
    proc = run_cli("verify", "-C", str(repo), "refactor")
    assert proc.returncode == 1 and "main itself diverges from the reference" in proc.stdout
    # in an evaluation the failure is main's: a finding about main, not a lesson against the proposal
    commit(repo, {"f.txt": "1.5"}, "faster", branch="faster")
    proc = run_cli("evaluate", "-C", str(repo), "faster", "--json")
    ev = json.loads(proc.stdout)
    assert proc.returncode == 4 and ev["failed_check"] == "distribution" and ev["failure"] == "main-diverges", ev[
        "reasons"
    ]


def test_a_clean_main_passes_against_the_reference_and_an_ancestor_can_be_named(tmp_path):
    repo = lm_repo(tmp_path)
    variant = LM.replace(*REFACTOR)
    commit(repo, {"lm.py": variant}, "refactor", branch="refactor")
    git(repo, "checkout", "-q", "main")
    rc, out = verify(repo, "refactor")
    assert rc == 0 and out["verdict"] == "pass" and out["blame"] is None, out["reasons"]
    ref = out["reference"]
    # the reference is the baseline itself: its dumps are the baseline's, no run of its own
    assert ref["passed"] and ref["collected"] == 0 and [r["label"] for r in ref["regimes"]] == ["the command's run"]


def test_the_drift_budget_caps_what_the_merges_add_up_to(tmp_path):
    """Each change moves the distributions by KL at most ~2.3e-7 (measured), within the per-change caps (2.8e-7);
    the two together move them ~3.8e-7 from the stock model, past the budget (3e-7). The first merges; the second is
    refused naming the budget; the history holds main's drift after the merge."""
    repo = lm_repo(tmp_path, 'mode = "approx"\ncaps = {kl_max = 2.8e-7}\ndrift_budget = {kl_max = 3e-7}\n')
    commit(repo, {"lm.py": nudged(1), "f.txt": "1.5"}, "first nudge, 50% faster", branch="p/first")
    git(repo, "checkout", "-q", "main")
    proc = run_cli("episode", "-C", str(repo), "--branches", "p/*", "--seed", "3", "--json")
    first = json.loads(proc.stdout)
    assert proc.returncode == 0 and first["merged"] == 1, first
    after_first = Workspace.open(repo).baseline_commit()
    commit(
        repo,
        {"lm.py": nudged(1, 2), "f.txt": "2.2"},
        "second nudge, faster again",
        branch="q/second",
        start=after_first,
    )
    git(repo, "checkout", "-q", "main")
    proc = run_cli("episode", "-C", str(repo), "--branches", "q/*", "--seed", "4", "--json")
    second = json.loads(proc.stdout)
    assert second["merged"] == 0, second
    (row,) = second["proposals"]
    text = " ".join(row["reasons"])
    assert "drift budget ([verify] drift_budget kl_max 3e-07) against the reference" in text, row["reasons"]
    assert "main already diverges" not in text  # main itself is within the budget: the proposal is what goes past it
    # main's drift, merge by merge
    hist = json.loads(run_cli("history", "-C", str(repo), "--json").stdout)
    (point,) = hist["drift"]
    assert point["event"] == "merge" and point["commit"] == after_first
    kl = point["regimes"]["the command's run"]["prefill"]["kl_max"]
    assert 1e-8 < kl < 3e-7, point
    shown = run_cli("history", "-C", str(repo)).stdout
    assert "drift from the reference" in shown and "budget" in shown
    (merged,) = json.loads(run_cli("review", "-C", str(repo), "--json").stdout)["merges"]
    # the rejected proposal's report: the reference table, and the drift curve with the budget (a plot)
    rep = tmp_path / "second.md"
    proc = run_cli("report", "-C", str(repo), second["proposals"][0]["proposal"], "-o", str(rep))
    assert proc.returncode == 0, proc.stderr
    md = rep.read_text()
    assert "Against the reference" in md and "past the drift budget" in md and "distribution-drift" in md, md[:2000]
    worst = max(p["kl_max"] for p in point["regimes"]["the command's run"].values())
    assert merged["merge"] == after_first and merged["drift_kl_max"] == worst >= kl


def test_bad_reference_config_is_one_line_before_anything_runs(tmp_path):
    repo = lm_repo(tmp_path)
    cfg = (repo / "agentsearch.toml").read_text()
    # a reference that is not an ancestor of the baseline
    side = commit(repo, {"NOTES.md": "elsewhere\n"}, "a side branch", branch="side")
    git(repo, "checkout", "-q", "main")
    commit(
        repo,
        {"agentsearch.toml": cfg.replace("[verify]\n", f'[verify]\nreference = "{side}"\n')},
        "reference: a side branch",
    )
    commit(repo, {"NOTES.md": "x\n"}, "x", branch="x")
    git(repo, "checkout", "-q", "main")
    proc = run_cli("verify", "-C", str(repo), "x")
    assert proc.returncode == 5 and "is not an ancestor of the baseline" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert not list((Workspace.open(repo).state / "tmp").iterdir())  # nothing was built
    # a regime key no engine has, or regimes on a command target: the config says so
    for extra, needle in (
        ('regimes = [{max_num_seqz = 4}]\nkind = "vllm"\n', "unknown regime key 'max_num_seqz'"),
        ("regimes = [{max_num_seqs = 64}]\n", "regimes need kind = \"vllm\""),
    ):
        commit(repo, {"agentsearch.toml": cfg.replace("[verify]\n", "[verify]\n" + extra)}, "bad regimes")
        proc = run_cli("verify", "-C", str(repo), "x")
        assert proc.returncode != 0 and needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, (
            proc.stderr
        )
    # a workspace made before the reference was pinned: one line saying how to pin it; `init` pins it
    commit(repo, {"agentsearch.toml": cfg}, "config again")
    git(repo, "update-ref", "-d", REFERENCE_REF)
    proc = run_cli("verify", "-C", str(repo), "x")
    assert proc.returncode == 5 and "no reference is pinned" in proc.stderr and "agentsearch init" in proc.stderr, (
        proc.stderr
    )
    assert run_cli("init", "-C", str(repo)).returncode == 0
    assert git(repo, "rev-parse", REFERENCE_REF).strip() == git(repo, "rev-parse", "main").strip()


def test_a_change_of_regime_keys_only_reuses_mains_runs(tmp_path):
    """Issue #56: a proposal that changes nothing but regime keys of serving.json (batching, caching) runs main's code
    with main's engine arguments in every regime but its own: ``regime_only`` says so, and the check takes main's run
    instead of starting the candidate's engine again. Anything else in the diff, or another engine argument or the
    environment changed with it, is a candidate of its own."""
    from agentsearch.verify import regime_only
    from harness.regimes import apart_from_regime

    base = {"engine": {"max_num_seqs": 4, "max_num_batched_tokens": 2048}, "env": {}}
    seqs = {"engine": {"max_num_seqs": 32, "max_num_batched_tokens": 2048}, "env": {}}
    assert apart_from_regime(base, seqs)
    assert apart_from_regime(base, {"engine": {"max_num_batched_tokens": 2048, "block_size": 64}, "env": {}})
    assert not apart_from_regime(base, {**seqs, "engine": {**seqs["engine"], "enforce_eager": False}})
    assert not apart_from_regime(base, {**seqs, "env": {"VLLM_CPU_KVCACHE_SPACE": "4"}})
    assert not apart_from_regime(base, {**seqs, "engine": "max_num_seqs=32"})
    assert not apart_from_regime(base, [seqs])

    repo = make_repo(tmp_path / "r", {"serving.json": json.dumps(base), "code.py": "x = 1\n"})
    main = git(repo, "rev-parse", "HEAD").strip()
    only = commit(repo, {"serving.json": json.dumps(seqs)}, "max_num_seqs 32", branch="seqs")
    assert regime_only(repo, main, only)
    both = commit(repo, {"serving.json": json.dumps(seqs), "code.py": "x = 2\n"}, "and code", branch="both")
    assert not regime_only(repo, main, both)
    env = commit(repo, {"serving.json": json.dumps({**seqs, "env": {"VLLM_X": "1"}})}, "and env", branch="env")
    assert not regime_only(repo, main, env)
    gone = commit(repo, {"code.py": "x = 1\n"}, "no serving.json", branch="gone")
    git(repo, "checkout", "-q", "gone")
    git(repo, "rm", "-q", "serving.json")
    git(repo, "commit", "-qm", "drop it")
    gone = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "checkout", "-q", "main")
    assert not regime_only(repo, main, gone)
    assert not regime_only(repo, main, main)  # main itself: the check's `main` case, not this one

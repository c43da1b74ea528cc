"""Red team: the pinned stock reference, regimes, the drift budget and the blame (issue #42, 0.3.0).

An adversary controls the candidate branch (its code, its serving.json, its build, its outputs, its commit
message) and tries to (a) pass a change that moves the outputs, (b) poison the kept reference/main dumps,
(c) shift its own fault onto main (failure "main-diverges": kept out of the insights' avoid list), (d) crash
the check, (e) run or read outside its sandbox via the reference side, (f) inject text through regime labels.

Every test asserts that the attack FAILS (the defence holds). A test marked ``xfail(strict=True)`` would be an
attack that SUCCEEDS today (a hole, or a plain bug): its reason names it, and it starts passing when fixed.

The integration tests use the toy numpy LM as a command logprob target (tests/test_reference.py helpers): a
command target has no regimes, so the regime attacks are unit tests of harness.regimes,
agentsearch.verify.side_regime / kept_dumps, the vLLM worker's engine-argument merge (with a stand-in
``vllm`` module) and harness.sandbox.use.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest

from agentsearch import baseline_dumps
from agentsearch.config import load_config_text
from agentsearch.errors import ConfigError
from agentsearch.verify import budget_of, kept_dumps, side_regime
from agentsearch.workspace.workspace import REFERENCE_REF
from harness import regimes, sandbox
from harness.logprobs import LogprobError
from history.records import AVOID, BREAKING, FailureKind

from ..conftest import commit, git, run_cli
from ..test_reference import EPS, LM, REFACTOR, lm_repo, verify

HOT = (
    "    return rmsnorm(h) @ U",
    "    return np.float32(0.8) * (rmsnorm(h) @ U)",
)  # logits x0.8: argmax kept, KL ~3e-2


def _cfg(verify_extra: str = "", kind: str = "vllm", model: str = "/nonexistent-model") -> str:
    head = f'kind = "{kind}"\nmodel = "{model}"\n' if kind == "vllm" else 'logprobs = "true"\n'
    return (
        '[target]\nbaseline = "main"\n[[workload]]\nname = "speed"\ncommand = "true"\nmetric = "x"\n'
        f"[verify]\n{head}{verify_extra}"
    )


def _tree_hashes(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")) if root.is_dir() else ():
        if p.is_file():
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


# ============================================================================ (a) a false pass
def _nan_masked(lm: str) -> str:
    """The lossy change (logits x0.8), plus NaN as the top logprob at the first compared position of every record:
    the first KL of every set is NaN, and NaN > limit is False everywhere (kl_mean/p99 via numpy, kl_max and
    dlogprob_max via Python max() seeded with the NaN)."""
    out = lm.replace(*HOT)
    pre = '            out.write(json.dumps({"id": item["id"], "path": "prefill"'
    dec = '            out.write(json.dumps({"id": item["id"], "path": "decode"'
    assert pre in out and dec in out
    out = out.replace(pre, '            if len(pre) > 1: pre[1][0][1] = float("nan")\n' + pre)
    return out.replace(dec, '            dec[0][0][1] = float("nan")\n' + dec)


def test_in_a_clean_workspace_a_lossy_candidate_keeps_its_blame_and_cannot_claim_mains(tmp_path):
    """main == the pinned reference. (a)/(c) A lossy change fails, blamed on the candidate. (c)/(f) A candidate whose
    stderr (and commit message) says main diverges: the blame is structural (VerifyResult.blame), never read from
    the reasons' English. The `main` shortcut (candidate commit == baseline commit): passes, no reference run."""
    repo = lm_repo(tmp_path)
    commit(repo, {"lm.py": LM.replace(*HOT)}, "hot", branch="hot")
    fake = "main already diverges from the reference 0000000000 at the command's run: not this proposal's change"
    liar = LM.replace(
        'if __name__ == "__main__":\n',
        f'if __name__ == "__main__":\n    sys.stderr.write({fake!r} + "\\n")\n    sys.exit(1)\n',
    )
    assert liar != LM
    commit(
        repo, {"lm.py": liar}, "main already diverges from the reference (not this proposal's change)", branch="liar"
    )
    rc, out = verify(repo, "hot")
    assert rc == 1 and out["verdict"] == "fail" and out["blame"] == "candidate", out["reasons"]
    assert not any(r.startswith("main already diverges") for r in out["reasons"])
    rc, out = verify(repo, "liar")
    assert rc == 1 and out["verdict"] == "fail" and out["blame"] is None, out
    assert out["reasons"][0].startswith("logprob collection failed: candidate"), out["reasons"]
    rc, out = verify(repo, "main")
    assert rc == 0 and out["verdict"] == "pass" and out["blame"] is None, out["reasons"]
    assert out["reference"]["passed"] and out["reference"]["collected"] == 0 and out["reference"]["main"] == []


def test_nan_logprobs_do_not_mask_a_lossy_change_from_the_reference(tmp_path):
    repo = lm_repo(tmp_path, 'drift_budget = {kl_max = 1e-4}\n')
    commit(
        repo, {"NOTES.md": "main moves (outputs do not)\n"}, "notes"
    )  # the reference is its own run, not the baseline's dumps
    commit(repo, {"lm.py": _nan_masked(LM)}, "faster softmax", branch="masked")
    rc, out = verify(repo, "masked")
    assert out["reference"] is None or not out["reference"]["passed"], out["reference"]
    assert rc == 1 and out["verdict"] == "fail", out


# ============================================================================ (c) the blame
def test_a_candidate_that_breaks_outputs_against_main_is_not_blamed_on_main(tmp_path):
    repo = lm_repo(tmp_path)
    commit(repo, {"lm.py": LM.replace(*EPS)}, "an earlier change, never judged")  # main diverges (KL ~1e-5)
    commit(repo, {"lm.py": LM.replace(*EPS).replace(*HOT)}, "faster", branch="broken")
    rc, out = verify(repo, "broken")
    assert rc == 1 and out["verdict"] == "fail"
    assert any(r.startswith("public prefill") for r in out["reasons"])  # it fails against main itself
    # in an evaluation (the change is 50% faster, so it reaches the distribution checks)
    commit(repo, {"f.txt": "1.5"}, "and faster", branch="broken")
    proc = run_cli("evaluate", "-C", str(repo), "broken", "--json")
    ev = json.loads(proc.stdout)
    assert ev["failed_check"] == "distribution", ev["reasons"]
    assert (out["blame"], ev["failure"]) == ("candidate", "distribution"), out["reasons"][:2]


# ============================================================================ (b) poisoning / (e) reading outside
ATTACK = r'''
import hashlib as _h, os as _os
from pathlib import Path as _P


def _attack(out_path):
    leaked = []
    try:
        gitdir = _P((_P.cwd() / ".git").read_text().split("gitdir:", 1)[1].strip())
        common = gitdir.parents[1]
    except Exception:
        common = None
    if common is not None:
        state = common / "agentsearch"
        try:
            leaked.append("holdout.key %d bytes" % len((state / "holdout.key").read_bytes()))
        except Exception:
            pass
        for sub in ("verify-reference", "verify-baseline"):
            for root, _dirs, files in _os.walk(state / sub):
                for f in files:
                    p = _P(root) / f
                    if f.endswith(".jsonl"):
                        try:  # a poisoned dump with a matching digest: get() would take it
                            data = open(p, "rb").read().replace(b"-0.", b"-1.")
                            p.write_bytes(data)
                            p.with_suffix(".sha256").write_bytes(_h.sha256(data).hexdigest().encode())
                        except Exception:
                            pass
        try:
            seen = [d for d in _os.listdir(common / "agentsearch-worktrees") if "baseline" in d or "reference" in d]
            if seen:
                leaked.append("worktrees " + ",".join(seen))
        except Exception:
            pass
    # the check's baseline outputs (where the trusted runs' dumps are read and kept from)
    sib = _P(out_path).resolve().parents[2] / "baseline" / "verify"
    for name in ("ref-r0.jsonl", "main-r0.jsonl", "base.jsonl"):
        try:
            if (sib / name).exists():
                leaked.append("saw " + name)
            (sib / name).write_text("{}\n")
        except Exception:
            pass
    if leaked:
        sys.stderr.write("LEAKED " + "; ".join(leaked) + "\n")
        sys.exit(3)


'''


def test_a_candidate_cannot_poison_the_kept_reference_or_read_the_holdout(tmp_path):
    if not sandbox.probe()[0]:
        pytest.skip("bubblewrap unavailable: the attack would run unconfined")
    repo = lm_repo(tmp_path)
    commit(repo, {"NOTES.md": "main moves (outputs do not)\n"}, "notes")  # reference != baseline: its own kept runs
    commit(repo, {"lm.py": LM.replace(*REFACTOR)}, "refactor", branch="honest")
    attacker = LM.replace(
        'if __name__ == "__main__":\n', ATTACK + 'if __name__ == "__main__":\n    _attack(sys.argv[2])\n'
    )
    commit(repo, {"lm.py": attacker}, "refactor (attack)", branch="attacker")
    state = repo / ".git" / "agentsearch"
    key = (state / "holdout.key").read_bytes() if (state / "holdout.key").exists() else None
    rc, first = verify(repo, "honest")
    assert rc == 0 and first["verdict"] == "pass" and first["reference"]["collected"] >= 1, first["reasons"]
    kept = {d: _tree_hashes(state / d) for d in (baseline_dumps.REFERENCE_DIR, baseline_dumps.CACHE_DIR)}
    assert kept[baseline_dumps.REFERENCE_DIR], "the reference's runs were not kept"
    rc, attacked = verify(repo, "attacker")
    assert not any("LEAKED" in r for r in attacked["reasons"]), attacked["reasons"]
    assert rc == 0 and attacked["verdict"] == "pass", attacked["reasons"]
    for d, before in kept.items():
        after = _tree_hashes(state / d)
        assert {k: after.get(k) for k in before} == before, f"{d} changed under the attack"
    rc, again = verify(repo, "honest")
    assert rc == 0 and again["reference"]["reused"] >= 1 and again["reference"]["collected"] == 0
    assert again["reference"]["regimes"] == first["reference"]["regimes"]  # the same numbers as before the attack
    if key is not None:
        assert (state / "holdout.key").read_bytes() == key


# ============================================================================ (d) a clean rejection, never a traceback
def test_a_reference_that_cannot_run_or_build_is_a_clean_one_line_failure(tmp_path):
    repo = lm_repo(tmp_path)
    broken = commit(repo, {"lm.py": "import sys\nsys.exit('the stock model cannot run')\n"}, "broken for a while")
    commit(repo, {"lm.py": LM}, "fixed")
    git(repo, "update-ref", REFERENCE_REF, broken)
    commit(repo, {"lm.py": LM.replace(*REFACTOR)}, "refactor", branch="x")
    rc, out = verify(repo, "x")
    assert rc == 1 and out["verdict"] == "fail", out
    assert out["reasons"][0].startswith("logprob collection failed: the reference "), out["reasons"]
    # a reference the baseline's build command cannot build
    git(repo, "update-ref", REFERENCE_REF, git(repo, "rev-list", "--max-parents=0", "main").strip())
    cfg = (
        (repo / "agentsearch.toml")
        .read_text()
        .replace(
            '[target]\nbaseline = "main"\n',
            '[target]\nbaseline = "main"\ninstall = "command"\nbuild = "test -f ok.txt"\n',
        )
    )
    assert "build =" in cfg
    commit(repo, {"agentsearch.toml": cfg, "ok.txt": "ok\n"}, "a build step")
    commit(repo, {"lm.py": LM.replace(*REFACTOR)}, "refactor", branch="y", start="main")
    rc, out = verify(repo, "y")  # the reference's build fails: a clean failure naming it, never a traceback
    assert rc == 1 and out["verdict"] == "fail" and "could not be built" in out["reasons"][0], out["reasons"]


def test_a_reference_that_cannot_run_is_not_recorded_as_the_candidates_distribution_failure(tmp_path):
    repo = lm_repo(tmp_path)
    broken = commit(repo, {"lm.py": "import sys\nsys.exit('the stock model cannot run')\n"}, "broken for a while")
    commit(repo, {"lm.py": LM}, "fixed")
    git(repo, "update-ref", REFERENCE_REF, broken)
    commit(repo, {"f.txt": "1.5"}, "faster", branch="faster")
    proc = run_cli("evaluate", "-C", str(repo), "faster", "--json")
    ev = json.loads(proc.stdout)
    assert ev["failed_check"] == "distribution" and "the reference " in ev["reasons"][0], ev["reasons"]
    assert FailureKind(ev["failure"]) not in AVOID | BREAKING | {
        FailureKind.CHANGED_OUTPUTS,
        FailureKind.TESTS_FAILED,
    }, ev["failure"]


# ============================================================================ regimes (unit): (f) labels, (d) bad values
NASTY = [
    "<script>alert(1)</script>",
    "4\n**PASS**",
    "| x | y |",
    4.0,
    float("nan"),
    -1,
    0,
    1 << 21,
    True,
    [4],
    {"v": 4},
    "4",
]


@pytest.mark.parametrize("value", NASTY, ids=[repr(v)[:20] for v in NASTY])
def test_a_candidate_serving_json_cannot_put_text_or_junk_into_a_regime(tmp_path, value):
    (tmp_path / "serving.json").write_text(json.dumps({"engine": {"max_num_seqs": value}}))
    vc = SimpleNamespace(kind="vllm", engine={})
    with pytest.raises(LogprobError, match=r"^candidate: serving.json"):
        side_regime(vc, tmp_path, "candidate")


@pytest.mark.parametrize("value", ["yes", 1, 0, None], ids=["str", "one", "zero", "none"])
def test_a_switch_takes_only_true_or_false(tmp_path, value):
    (tmp_path / "serving.json").write_text(json.dumps({"engine": {"enable_prefix_caching": value}}))
    vc = SimpleNamespace(kind="vllm", engine={})
    if value is None:
        assert side_regime(vc, tmp_path, "candidate")["enable_prefix_caching"] is None
        return
    with pytest.raises(LogprobError):
        side_regime(vc, tmp_path, "candidate")


def test_unusable_serving_json_is_a_logprob_error_never_a_traceback(tmp_path):
    vc = SimpleNamespace(kind="vllm", engine={})
    cases = {
        "deep": "[" * 100000 + "]" * 100000,
        "huge-int": '{"engine": {"max_num_seqs": ' + "9" * 5000 + "}}",
        "not-json": "{engine: 4}",
        "nan": '{"engine": {"block_size": NaN}}',
        "binary": "\udcff",
    }
    for name, text in cases.items():
        d = tmp_path / name
        d.mkdir()
        (d / "serving.json").write_bytes(text.encode("utf-8", "surrogateescape"))
        with pytest.raises(LogprobError):
            side_regime(vc, d, "candidate")
    # links and non-files: refused, not followed (the worker would follow a link)
    link = tmp_path / "link"
    link.mkdir()
    (tmp_path / "elsewhere.json").write_text('{"engine": {"max_num_seqs": 4}}')
    (link / "serving.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(LogprobError):
        side_regime(vc, link, "candidate")
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "serving.json")
    with pytest.raises(LogprobError):
        side_regime(vc, fifo, "candidate")  # O_NONBLOCK: no hang
    sub = tmp_path / "dir"
    (sub / "serving.json").mkdir(parents=True)
    with pytest.raises(LogprobError):
        side_regime(vc, sub, "candidate")
    # shapes the worker would not read as the orchestrator does: refused (an engine section must be an object)
    for text in ("[]", '{"engine": null}', '{"engine": "max_num_seqs=4"}', '{"engine": [["max_num_seqs", 4]]}'):
        (tmp_path / "odd2").mkdir(exist_ok=True)
        (tmp_path / "odd2" / "serving.json").write_text(text)
        with pytest.raises(LogprobError):
            side_regime(vc, tmp_path / "odd2", "candidate")
    # no regime at all: the engine's arguments stand
    for text in ("null", "{}"):
        (tmp_path / "odd").mkdir(exist_ok=True)
        (tmp_path / "odd" / "serving.json").write_text(text)
        assert (
            side_regime(SimpleNamespace(kind="vllm", engine={"max_num_seqs": 8}), tmp_path / "odd", "c")["max_num_seqs"]
            == 8
        )
    # a command target has no regime, whatever its serving.json says
    assert side_regime(SimpleNamespace(kind="command", engine={}), link, "candidate") == {}


def test_labels_carry_only_regime_keys_and_checked_values():
    reg = regimes.effective(
        {"max_num_seqs": 8, "evil<b>": "x"},
        {
            "engine": {
                "block_size": 32,
                "enable_chunked_prefill": False,
                "<img src=x>": "| a |",
                "max_model_len": "**x**",
            }
        },
    )
    assert set(reg) == set(regimes.REGIME_KEYS)
    label = regimes.describe(reg)
    assert label == "max_num_seqs 8, enable_chunked_prefill false, block_size 32"
    assert set(label) <= set("abcdefghijklmnopqrstuvwxyz_0123456789 ,")
    assert regimes.describe({k: None for k in regimes.REGIME_KEYS}) == "the engine's defaults"
    with pytest.raises(regimes.RegimeError):
        regimes.with_overrides(reg, {"max_num_seqs; rm -rf /": 4})


def test_regime_keys_deduplicate_like_with_like():
    base = {k: None for k in regimes.REGIME_KEYS}
    assert regimes.key({"max_num_seqs": 4}) == regimes.key({**base, "max_num_seqs": 4})  # unset == None
    assert regimes.key({"max_num_seqs": 4, "block_size": 16}) == regimes.key({"block_size": 16, "max_num_seqs": 4})
    assert regimes.key({"enable_prefix_caching": True}) != regimes.key(
        {"enable_prefix_caching": 1}
    )  # never a collision
    assert regimes.key({"enable_prefix_caching": False}) != regimes.key({"enable_prefix_caching": None})
    assert regimes.key({"max_num_seqs": 4, "junk": 1}) == regimes.key({"max_num_seqs": 4})  # only regime keys count
    # production's partial regime goes over the candidate's: the candidate cannot take a key production names
    assert regimes.with_overrides({**base, "max_num_seqs": 4}, {"max_num_seqs": 64})["max_num_seqs"] == 64


def test_bad_regime_and_budget_config_is_a_config_error():
    for extra, needle in (
        ("regimes = [{max_num_seqs = 4.5}]\n", "max_num_seqs"),
        ("regimes = [{}]\n", "empty regime"),
        ('regimes = [{max_num_seqs = "<b>64</b>"}]\n', "max_num_seqs"),
        ("regimes = [{max_num_seqs = 4, junk = 1}]\n", "unknown regime key"),
        ("regimes = [{enable_prefix_caching = 1}]\n", "true or false"),
        ("drift_budget = {kl_max = -1}\n", "drift_budget"),
        ("drift_budget = {kl_max = nan}\n", "drift_budget"),
        ("drift_budget = {kl_max = true}\n", "drift_budget"),
        ("drift_budget = {min_top1 = 2}\n", "drift_budget"),
        ("drift_budget = {kl_maxx = 1e-3}\n", "unknown cap"),
        ('reference = "   "\n', "reference"),
    ):
        with pytest.raises(ConfigError, match=needle):
            load_config_text(_cfg(extra))
    with pytest.raises(ConfigError, match="regimes need kind"):
        load_config_text(_cfg("regimes = [{max_num_seqs = 64}]\n", kind="command"))
    mode, caps, words = budget_of(load_config_text(_cfg("drift_budget = {kl_max = 3e-7}\n")).verify)
    assert (mode, caps, words) == ("approx", {"kl_max": 3e-7}, "[verify] drift_budget kl_max 3e-07")


# ============================================================================ the worker's merge vs the orchestrator's view
def _worker_engine_args(monkeypatch, worktree: Path, spec: dict) -> dict:
    """The engine arguments harness/workers/vllm_worker.py's Engine hands to vllm.LLM, with a stand-in vllm."""
    from harness.workers import vllm_worker

    got: dict = {}
    fake = types.ModuleType("vllm")

    class LLM:
        def __init__(self, model, **kw):
            got.update(kw)

    fake.LLM = LLM  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.chdir(worktree)
    vllm_worker.Engine({"model": "m", **spec})
    return got


def test_the_worker_applies_the_regime_over_serving_json(tmp_path, monkeypatch):
    (tmp_path / "serving.json").write_text(
        json.dumps({"engine": {"max_num_seqs": 4, "block_size": 16, "enforce_eager": False}})
    )
    regime = regimes.with_overrides({k: None for k in regimes.REGIME_KEYS}, {"max_num_seqs": 32})
    args = _worker_engine_args(monkeypatch, tmp_path, {"engine": {"seed": 0, "block_size": 8}, "regime": regime})
    assert args["max_num_seqs"] == 32 and "block_size" not in args  # None: the engine's own default, not serving.json's
    assert args["enforce_eager"] is False  # a non-regime argument of the side's serving.json stays


def test_the_orchestrator_reads_the_regime_the_worker_will_run(tmp_path, monkeypatch):
    (tmp_path / "serving.json").write_text(json.dumps({"engine": {"max_num_seqs": 4}}))
    vc = SimpleNamespace(kind="vllm", engine={"max_num_seqs": 256})
    assert side_regime(vc, tmp_path, "candidate")["max_num_seqs"] == 4
    assert _worker_engine_args(monkeypatch, tmp_path, {"engine": dict(vc.engine)})["max_num_seqs"] == 4


def test_a_list_of_pairs_engine_section_cannot_hide_the_candidates_regime(tmp_path, monkeypatch):
    (tmp_path / "serving.json").write_text(json.dumps({"engine": [["max_num_seqs", 4]]}))
    vc = SimpleNamespace(kind="vllm", engine={})
    with pytest.raises(LogprobError):  # the orchestrator refuses it ...
        side_regime(vc, tmp_path, "candidate")
    with pytest.raises(ValueError, match="engine must be an object"):  # ... and so does the worker
        _worker_engine_args(monkeypatch, tmp_path, {"engine": {}})


# ============================================================================ kept dumps: keys and keeping (b)
def test_kept_dump_keys_separate_commit_regime_and_side(tmp_path):
    (tmp_path / "model").mkdir()
    cfg = load_config_text(_cfg("regimes = [{max_num_seqs = 64}]\n", model=str(tmp_path / "model")))
    ws = SimpleNamespace(state=tmp_path / "state")
    c1, c2 = "1" * 40, "2" * 40
    r4, r64 = {"max_num_seqs": 4}, {"max_num_seqs": 64}
    main4, main64 = kept_dumps(ws, cfg, c1, r4), kept_dumps(ws, cfg, c1, r64)
    ref4 = kept_dumps(ws, cfg, c1, r4, kind="reference")
    assert (
        len(
            {
                main4.dir,
                main64.dir,
                ref4.dir,
                kept_dumps(ws, cfg, c2, r4, kind="reference").dir,
                kept_dumps(ws, cfg, c1).dir,
            }
        )
        == 5
    )
    assert ref4.root.name == baseline_dumps.REFERENCE_DIR and main4.root.name == baseline_dumps.MAIN_DIR
    assert kept_dumps(ws, cfg, c1).root.name == baseline_dumps.CACHE_DIR
    assert kept_dumps(ws, cfg, c1, {**r4, "block_size": None}).dir == main4.dir  # the same regime: the same runs
    # another drift budget, another reference: another key (never a stale hit)
    other = load_config_text(
        _cfg("regimes = [{max_num_seqs = 64}]\ndrift_budget = {kl_max = 1e-3}\n", model=str(tmp_path / "model"))
    )
    assert kept_dumps(ws, other, c1, r4, kind="reference").dir != ref4.dir


def test_mains_regime_runs_do_not_evict_the_baselines_kept_dumps(tmp_path):
    (tmp_path / "model").mkdir()
    cfg = load_config_text(
        _cfg(
            "regimes = [{max_num_seqs = 8}, {max_num_seqs = 16}, {max_num_seqs = 64}]\n", model=str(tmp_path / "model")
        )
    )
    ws = SimpleNamespace(state=tmp_path / "state")
    c = "1" * 40
    plain = kept_dumps(ws, cfg, c)
    plain.dir.mkdir(parents=True)
    (plain.dir / "x.jsonl").write_text("{}\n")
    plain.mark_complete()  # run_verify: the baseline's dumps, complete
    for n, seqs in enumerate((4, 8, 16, 64)):  # _Trusted.close: main at the candidate's and production's regimes
        d = kept_dumps(ws, cfg, c, {"max_num_seqs": seqs})
        d.dir.mkdir(parents=True)
        os.utime(plain.dir, (1e9 + n, 1e9 + n))  # the baseline's directory is older than each
        d.mark_complete()
    assert plain.complete, "the baseline's kept dumps were pruned by main's regime runs"


# ============================================================================ (e) sandbox.use merging
def _box(root: Path) -> sandbox.Sandbox:
    return sandbox.Sandbox(worktree=str(root), outputs=str(root) + "-out", devices=())


def test_a_nested_containment_adds_sides_and_never_unconfines(tmp_path):
    a, b, c = (str(tmp_path / n) for n in ("verify-baseline", "verify-candidate", "reference-baseline"))
    outer = sandbox.Containment({a: _box(Path(a)), b: _box(Path(b))})
    with sandbox.use(outer):
        with sandbox.use(sandbox.Containment({c: _box(Path(c))})):
            box = sandbox.active()
            assert box is not None
            assert box.for_cwd(b + "/sub").worktree == b  # the candidate keeps its own sandbox
            assert box.for_cwd(c).worktree == c
            with pytest.raises(sandbox.SandboxError):
                box.for_cwd(str(tmp_path))  # nothing outside a side runs
            argv, shell = sandbox.wrap(["true"], cwd=b)
            assert not shell and "--unshare-net" in argv and str(tmp_path / "reference-baseline") not in argv
        # the reference side is gone with its block; the check's sides stay
        with pytest.raises(sandbox.SandboxError):
            sandbox.active().for_cwd(c)  # type: ignore[union-attr]
        assert sandbox.active() is outer
        with sandbox.use(None):  # None adds nothing and removes nothing
            assert sandbox.active() is outer
    assert sandbox.active() is None
    # an inner side for the same worktree replaces the outer one (disposable copies use other paths)
    with sandbox.use(outer):
        tighter = sandbox.Sandbox(worktree=a, outputs=a + "-out", devices=(), read_only=("/nonexistent-ro",))
        with sandbox.use(sandbox.Containment({a: tighter})):
            assert sandbox.active().for_cwd(a) is tighter  # type: ignore[union-attr]


def test_a_nested_inner_side_gets_its_own_sandbox(tmp_path):
    outer_root, inner_root = tmp_path / "wt", tmp_path / "wt" / "copy"
    with sandbox.use(sandbox.Containment({str(outer_root): _box(outer_root)})):
        with sandbox.use(sandbox.Containment({str(inner_root): _box(inner_root)})):
            assert sandbox.active().for_cwd(inner_root / "x").worktree == str(inner_root)  # type: ignore[union-attr]


# ============================================================================ regimes end to end (run_verify, stubbed runs)
# run_verify and _Against as they are; only the logprob runs (and the serving.json reads) are stand-ins: every run
# returns the dump of a toy distribution that is the stock one plus named, fixed, zero-mean logit terms.
SEQ_IDS = [f"p{i:02d}" for i in range(40)]
STUB_CFG = (
    'mode = "approx"\ncaps = {kl_max = 1e-4}\ndrift_budget = {kl_max = 1e-2}\n'
    "sample = false\nreuse_baseline = false\ncorpus_size = 40\n"
)


def _toy_dump(**terms: float) -> dict:
    import numpy as np

    from harness.distribution import Record

    out = {}
    for i, pid in enumerate(SEQ_IDS):
        r = np.random.default_rng([99, i])
        z = r.normal(0, 1, (7, 12))
        z[np.arange(7), r.integers(0, 12, 7)] += 6  # a clear top token: no greedy flips
        for name, d in terms.items():
            z = z + d * np.random.default_rng([sum(map(ord, name)), i]).normal(0, 1, z.shape)
        z = z - z.max(-1, keepdims=True)
        lp = z - np.log(np.exp(z).sum(-1, keepdims=True))

        def top(row):
            return tuple((int(t), float(row[t])) for t in np.argsort(-row, kind="stable")[:8])

        out[(pid, "prefill")] = Record(
            pid, "prefill", tuple(range(7)), (None,) + tuple(top(lp[j]) for j in range(1, 7))
        )
        out[(pid, "decode")] = Record(
            pid, "decode", tuple(int(np.argmax(lp[j])) for j in range(7)), tuple(top(lp[j]) for j in range(7))
        )
    return out


def _seqs(n: int) -> dict:
    return {k: (n if k == "max_num_seqs" else None) for k in regimes.REGIME_KEYS}


def _stubbed_verify(
    tmp_path,
    monkeypatch,
    own: dict[str, int],
    plain: dict[str, dict],
    runs: dict[tuple[str, int], dict],
    shared: bool = False,
    reference: str = "f" * 40,
):
    """run_verify with the baseline at ``own['baseline']`` max_num_seqs and the candidate at ``own['candidate']``;
    ``plain``: each side's own run; ``runs``: (who, max_num_seqs) -> dump for the reference's, main's and the
    candidate's runs in other regimes; ``shared``: the candidate changes only regime keys (``regime_only``, read from
    git, says so). Returns (VerifyResult, the runs made)."""
    from agentsearch import verify as V
    from harness import corpus as corpus_mod
    from harness.trials import BASELINE, CANDIDATE

    config = load_config_text(_cfg(STUB_CFG))
    made: list[tuple[str, int]] = []

    class Runner:
        def __init__(self, side):
            self.side = side

        def run(self, prompts, out, k, max_tokens):
            return plain[self.side]

        def close(self):
            pass

    def trusted(self, _trusted, who, regime, n, ordered, sample_prompts):
        made.append((who, regime["max_num_seqs"]))
        return runs[(who, regime["max_num_seqs"])]

    def candidate(self, regime, n, ordered):
        made.append(("candidate", regime["max_num_seqs"]))
        return runs[("candidate", regime["max_num_seqs"])]

    monkeypatch.setattr(V, "load_prompts", lambda vc, wt: [corpus_mod.Prompt(pid, "en", "x") for pid in SEQ_IDS])
    monkeypatch.setattr(V, "holdout_secret", lambda ws: b"k" * 32)
    monkeypatch.setattr(V, "side_regime", lambda vc, wt, side: _seqs(own[side]))
    monkeypatch.setattr(V, "_runner", lambda vc, config, wt, log, out_root, side=BASELINE, regime=None: Runner(side))
    monkeypatch.setattr(V._Against, "_trusted_run", trusted)
    monkeypatch.setattr(V._Against, "_candidate_run", candidate)
    monkeypatch.setattr(V, "regime_only", lambda repo_dir, base, cand: shared)
    scratch = tmp_path / "scratch"
    sd = SimpleNamespace(
        commits={BASELINE: "b" * 40, CANDIDATE: "c" * 40},
        worktrees={BASELINE: tmp_path / "b", CANDIDATE: tmp_path / "c"},
        inputs=scratch / "in",
        logs=scratch / "logs",
        out=lambda side: scratch / "out" / side,
        fresh_outputs=lambda side: None,
        check=lambda: "",
        label=lambda side: side,
    )
    ws = SimpleNamespace(reference_commit=lambda config, base: reference, state=tmp_path / "state", repo_dir=tmp_path)
    return V.run_verify(ws, config, sd), made


def test_stubbed_regimes_a_regime_only_change_takes_mains_runs_and_is_judged_the_same(tmp_path, monkeypatch):
    """Issue #56: the same honest 4 -> 32 as below, known to change only regime keys: main's run at 4 stands for the
    candidate's and the candidate's at 32 for main's (only the reference runs), with the same verdict and blame."""
    x0, xm = _toy_dump(), _toy_dump(main=0.3)
    res, made = _stubbed_verify(
        tmp_path,
        monkeypatch,
        {"baseline": 4, "candidate": 32},
        {"baseline": x0, "candidate": xm},
        {("reference", 32): x0, ("reference", 4): x0},
        shared=True,
    )
    assert made == [("reference", 32), ("reference", 4)], made
    assert res.verdict == "fail" and res.blame == "main", res.reasons
    assert res.reasons[0].startswith("main already diverges from the reference ffffffffff at max_num_seqs 32")
    assert res.reference is not None and all(r.shared for r in res.reference.regimes)
    # while the reference is main itself, the candidate's own run is the reference's in its regime too: no run at all
    res, made = _stubbed_verify(
        tmp_path / "again",
        monkeypatch,
        {"baseline": 4, "candidate": 32},
        {"baseline": x0, "candidate": x0},
        {},
        shared=True,
        reference="b" * 40,
    )
    assert made == [] and res.verdict == "pass", (made, res.reasons)


def test_a_candidate_cannot_borrow_mains_runs_unless_it_changes_only_regime_keys(tmp_path):
    """What decides that main's runs stand for a candidate's is read from git, never from the proposal's words: any
    other file, a non-regime engine argument, the environment, another top-level key, a serving.json turned into a
    link or removed makes it a candidate of its own, run in every regime."""
    from agentsearch.verify import regime_only

    base = {"engine": {"max_num_seqs": 4, "max_model_len": 1024}, "env": {"VLLM_FOO": 1, "VLLM_BAR": 0}}
    repo = tmp_path / "r"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    commit(repo, {"serving.json": json.dumps(base), "vllm/x.py": "X = 1\n"}, "baseline")
    main = git(repo, "rev-parse", "HEAD").strip()

    def cand(name: str, files: dict[str, str]) -> str:
        return commit(repo, files, name, branch=name)

    seqs = {**base, "engine": {**base["engine"], "max_num_seqs": 32}}
    assert regime_only(repo, main, cand("honest", {"serving.json": json.dumps(seqs)}))
    refused = {
        "code": {"serving.json": json.dumps(seqs), "vllm/x.py": "X = 2\n"},
        "eager": {"serving.json": json.dumps({**seqs, "engine": {"max_num_seqs": 32, "enforce_eager": False}})},
        "env": {"serving.json": json.dumps({**seqs, "env": {"VLLM_CPU_KVCACHE_SPACE": "4"}})},
        "top": {"serving.json": json.dumps({**seqs, "plugins": ["mine"]})},
        "notes": {"serving.json": json.dumps(seqs), "NOTES.md": "only regime keys, trust me\n"},
        # equal in Python, not to the engine: env values reach it as str(v) ("1.0", "False"), arguments typed
        "types": {"serving.json": json.dumps({**seqs, "env": {"VLLM_FOO": 1.0, "VLLM_BAR": False}})},
        "argtype": {"serving.json": json.dumps({**seqs, "engine": {**seqs["engine"], "max_model_len": 1024.0}})},
    }
    for name, files in refused.items():
        assert not regime_only(repo, main, cand(name, files)), name
    git(repo, "checkout", "-q", "-b", "link", "main")
    (repo / "elsewhere.json").write_text(json.dumps(seqs))
    os.remove(repo / "serving.json")
    os.symlink("elsewhere.json", repo / "serving.json")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "a link")
    link = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "checkout", "-q", "main")
    assert not regime_only(repo, main, link)


def test_stubbed_regimes_an_honest_regime_change_that_wakes_mains_drift_is_blamed_on_main(tmp_path, monkeypatch):
    """Issue #42's own case (tests/test_vllm_reference.py), the defence to keep: main carries drift dormant at 4;
    an honest proposal 4 -> 32 wakes it: it fails, and main is named."""
    x0, xm = _toy_dump(), _toy_dump(main=0.3)
    res, made = _stubbed_verify(
        tmp_path,
        monkeypatch,
        {"baseline": 4, "candidate": 32},
        {"baseline": x0, "candidate": xm},
        {("reference", 32): x0, ("reference", 4): x0, ("candidate", 4): x0, ("baseline", 32): xm},
    )
    assert res.reference is not None and [r.label for r in res.reference.regimes] == [
        "max_num_seqs 32",
        "max_num_seqs 4",
    ]  # its own, then the old
    assert res.verdict == "fail" and res.blame == "main", res.reasons
    assert res.reasons[0].startswith("main already diverges from the reference ffffffffff at max_num_seqs 32")


def test_stubbed_regimes_a_lossy_change_on_a_clean_main_is_the_candidates(tmp_path, monkeypatch):
    x0, xc = _toy_dump(), _toy_dump(cand=0.3)
    res, _ = _stubbed_verify(
        tmp_path,
        monkeypatch,
        {"baseline": 4, "candidate": 32},
        {"baseline": x0, "candidate": xc},
        {("reference", 32): x0, ("reference", 4): x0, ("candidate", 4): xc, ("baseline", 32): x0},
    )
    assert res.verdict == "fail" and res.blame == "candidate", res.reasons


def test_stubbed_regimes_a_candidate_cannot_hide_its_change_behind_mains_drift_by_picking_the_regime(
    tmp_path, monkeypatch
):
    x0, xm = _toy_dump(), _toy_dump(main=0.3)
    own_change = _toy_dump(main=0.3, cand=0.3)
    res, _ = _stubbed_verify(
        tmp_path,
        monkeypatch,
        {"baseline": 4, "candidate": 32},
        {"baseline": x0, "candidate": own_change},
        {("reference", 32): x0, ("reference", 4): x0, ("candidate", 4): _toy_dump(cand=0.3), ("baseline", 32): xm},
    )
    assert res.verdict == "fail"
    assert res.blame == "candidate", res.reasons[:2]


def test_stubbed_regimes_the_per_change_caps_hold_in_every_regime(tmp_path, monkeypatch):
    x0 = _toy_dump()
    res, made = _stubbed_verify(
        tmp_path,
        monkeypatch,
        {"baseline": 32, "candidate": 4},
        {"baseline": x0, "candidate": x0},
        {("reference", 4): x0, ("reference", 32): x0, ("baseline", 4): x0, ("candidate", 32): _toy_dump(cand=0.03)},
    )
    assert ("candidate", 32) in made  # the old regime was run ...
    assert res.verdict == "fail", (
        res.reasons,
        res.reference.regimes[1].sets["public"]["prefill"]["kl_max"],
    )  # ... and judged

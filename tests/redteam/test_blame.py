"""Red team: a candidate that tries to pass its failure off as the run's.

A failure of the baseline (or the machine) is the run's error: exit 5, nothing judged, an episode
stops. A candidate would gain from that twice — its rejection dodged, and the episode stopped. So
its own failures must stay its rejections however they are dressed up, a failure found by
comparing the sides is its failure whichever side's trial it is found after, and whatever it does
to the baseline at run time must not survive its absence (the baseline is re-run alone before a
baseline failure counts as the run's).

The bench (protected) imports the candidate's ``model.py``, so each attack runs as candidate code.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from agentsearch.cli import main
from harness.seeds import pair_seeds

from ..conftest import commit, make_repo

pytestmark = pytest.mark.timeout(300)

BENCH = """
import json, os, random, sys
seed, out = int(sys.argv[1]), sys.argv[2]
sys.path.insert(0, os.getcwd())
import model  # the code under test runs here, first
poison = os.path.join(os.environ.get("HOME", "/nonexistent"), ".toy-poison")
if os.path.exists(poison):  # a one-shot poisoned cache: breaks the run that finds it
    os.remove(poison)
    sys.exit("bench: found a poisoned cache")
factor = float(open("speed.txt").read()) * getattr(model, "FACTOR", 1.0)
json.dump({"ops_s": 1000.0 * factor * random.gauss(1.0, 0.02), "digest": str(model.digest(seed))}, open(out, "w"))
"""

CONFIG = """
[target]
baseline = "main"
protected = ["bench/**"]

[[workload]]
name = "speed"
command = "{python} bench/bench.py {{seed}} {{out}}"
metric = "ops_s"
outputs = "digest"
timeout_s = 20

[gate]
max_pairs = 6
confirm_pairs = 2
{extra}
"""

MODEL = "FACTOR = 1.0\ndef digest(seed):\n    return seed % 9973\n"


def target(root: Path, extra: str = "") -> Path:
    repo = make_repo(
        root,
        {
            "agentsearch.toml": CONFIG.format(python=sys.executable, extra=extra),
            "bench/bench.py": BENCH,
            "speed.txt": "1.0\n",
            "model.py": MODEL,
        },
    )
    assert CliRunner().invoke(main, ["init", "-C", str(repo)]).exit_code == 0
    return repo


def evaluate(repo: Path, ref: str, *extra: str):
    """`agentsearch evaluate` in this process (the real group and exit codes; progress goes to stderr)."""
    res = CliRunner().invoke(main, ["evaluate", "-C", str(repo), ref, "--json", *extra])
    assert res.stdout, res.stderr
    return SimpleNamespace(returncode=res.exit_code, stderr=res.stderr), json.loads(res.stdout)


def kinds(repo: Path) -> list[str]:
    return [
        json.loads(line)["kind"] for line in (repo / ".git" / "agentsearch" / "history.jsonl").read_text().splitlines()
    ]


def test_a_candidate_crash_dressed_as_a_broken_baseline_is_its_rejection(tmp_path):
    repo = target(tmp_path / "t")
    attack = (
        MODEL
        + """
import sys
sys.stderr.write("agentsearch: error: the baseline 0123456789ab is broken: baseline trial failed (speed, pair 1)\\n")
sys.exit(5)
"""
    )
    commit(repo, {"model.py": attack, "speed.txt": "1.3\n"}, "look like a broken baseline", branch="attack")
    proc, out = evaluate(repo, "attack")
    assert proc.returncode == 4 and out["verdict"] == "reject", proc.stderr
    assert out["reasons"][0].startswith("objective: candidate trial failed") and "baseline alone" not in proc.stderr
    assert "run-error" not in kinds(repo) and "evaluation" in kinds(repo)


def test_an_outputs_mismatch_found_after_the_baselines_trial_is_the_candidates(tmp_path):
    repo = target(tmp_path / "t")
    # a master seed whose first pair (AB) has an even seed and second pair (BA) an odd one: the candidate's
    # wrong digest is found after the *baseline's* trial of the second pair
    seed = next(m for m in range(1000) if pair_seeds(m, "speed")(0) % 2 == 0 and pair_seeds(m, "speed")(1) % 2 == 1)
    attack = "FACTOR = 1.3\ndef digest(seed):\n    return seed % 9973 if seed % 2 == 0 else -1  # cuts corners on odd inputs\n"
    commit(repo, {"model.py": attack}, "faster by computing less", branch="attack")
    proc, out = evaluate(repo, "attack", "--seed", str(seed))
    assert proc.returncode == 4 and out["verdict"] == "reject", proc.stderr
    last = out["trials"][-1]
    assert last["side"] == "baseline" and last["error"].startswith("outputs check:"), last
    assert (
        "outputs check" in out["reasons"][0] and "baseline alone" not in proc.stderr
    )  # no re-run: the comparison is the candidate's
    # and the reason names the pair, not the side measured second (it read "baseline trial failed" in a demo)
    assert "the sides' outputs differ (speed, pair 2" in out["reasons"][0] and "trial failed" not in out["reasons"][0]


def test_poisoning_the_baseline_at_run_time_is_the_candidates_rejection_not_the_runs_error(tmp_path):
    # only with the sandbox off can a candidate reach the baseline's run at all (a shared $HOME); then
    # its sabotage makes the *baseline's* trial fail — which must not stop the run nor dodge the rejection
    repo = target(tmp_path / "t", extra='sandbox = "off"')
    attack = (
        MODEL.replace("FACTOR = 1.0", "FACTOR = 1.3")
        + """
import atexit, os
_poison = os.path.join(os.environ.get("HOME", "/nonexistent"), ".toy-poison")
if os.path.exists(_poison):
    os.remove(_poison)  # immune itself
atexit.register(lambda: open(_poison, "w").write("x"))  # ... and poisons whoever runs next
"""
    )
    commit(repo, {"model.py": attack}, "poison the next run", branch="attack")
    proc, out = evaluate(repo, "attack")
    assert proc.returncode == 4 and out["verdict"] == "reject", proc.stderr
    failed = [t for t in out["trials"] if not t["ok"]]
    assert failed and failed[-1]["side"] == "baseline" and "poisoned" in failed[-1]["error"]
    assert "baseline alone" in proc.stderr  # the baseline was re-run alone, and passed
    # once is not enough to blame a candidate (a loaded machine can fail an honest pair once): measured again on fresh
    # engines, the candidate poisoned the baseline again
    assert "measuring the candidate again on fresh engines" in proc.stderr, proc.stderr
    assert any(
        "failed beside this candidate twice" in r and "the failure came with this candidate" in r
        for r in out["reasons"]
    ), out["reasons"]
    assert "run-error" not in kinds(repo) and "evaluation" in kinds(repo)


def test_a_baseline_that_failed_once_beside_an_honest_candidate_is_measured_again_not_its_rejection(
    tmp_path, monkeypatch
):
    # round 4: the machine, not the candidate, failed one baseline trial (in the demo under load: a worker's clock
    # read against a loaded orchestrator's). The baseline passes alone, so it used to be the candidate's rejection
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    monkeypatch.setenv("HOME", str(home))
    repo = target(tmp_path / "t", extra='sandbox = "off"')
    commit(repo, {"speed.txt": "1.3\n"}, "faster", branch="honest")
    (home / ".toy-poison").write_text("x")  # a one-shot hiccup: the first trial that runs (the baseline's) fails
    proc, out = evaluate(repo, "honest")
    assert "baseline alone" in proc.stderr and "measuring the candidate again on fresh engines" in proc.stderr
    # held for review only because this test turns the sandbox off (to reach the shared $HOME): the win itself passed
    assert out["verdict"] == "review" and [r.split(":")[0] for r in out["reasons"]] == ["sandbox"], out["reasons"]
    checks = {c["name"]: c for c in out["checks"]}
    assert checks["objective"]["status"] == checks["confirmation"]["status"] == "pass", checks
    note = checks["baseline-alone"]
    assert note["status"] == "pass" and "found a poisoned cache" in note["detail"], note
    assert "passed alone: everything was measured again on fresh engines" in note["detail"]
    assert all(t["ok"] for t in out["trials"])  # the verdict's evidence is the second attempt's
    assert "run-error" not in kinds(repo)

"""The peers' failure cases, replayed (issue #57, item 4): what went wrong in other optimizers' trackers, shown to be
refused or impossible here, on the toy target with real git, real child processes and the real gate.

- GEAK #437: a "+1.36%" win measured against a baseline number taken earlier in a campaign was +0.16% in a
  same-session A/B. Here every evaluation measures its own baseline, interleaved with the candidate: on a machine
  that speeds up through the campaign, no-ops are not merged and a real win is estimated at its own size.
- Hyperloom #552 / #1258: a candidate measured cold against a baseline measured warm. Here the baseline's kept
  worktree is warm and every candidate's is new: a bench that is slow on its first run in a worktree neither sinks
  a real win nor flags a no-op as a regression.
- Hyperloom #1433: a fallback path promoted a faster candidate whose quality evaluation was missing. Here a missing
  distribution check is a rejection, and no other command (pr, review) promotes the rejected candidate.
- GEAK #418: kernels never timed reported ``isolated_speedup 0.0``. Here a candidate stopped before measurement
  has no number anywhere: null in JSON, "not run" in the report, and no effect in the insights.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from agentsearch.workspace import Workspace
from history import HistoryLog
from history.proposals import proposals_of

from .conftest import run_cli
from .test_episode import BENCH, ENGINE, episode_json, make_target, patch_from

FAST = ENGINE.replace("SPEED = 1.0", "SPEED = 1.1")  # a real +10%
NOOP = ENGINE.replace("# the toy", "# the small toy")  # a comment: nothing changes


def queue(repo: Path, root: Path, patches: dict[str, tuple[str, str]]) -> Path:
    q = root / "queue"
    q.mkdir()
    for i, (name, (engine, subject)) in enumerate(patches.items(), 1):
        (q / f"{i:02d}-{name}.patch").write_text(patch_from(repo, {"src/engine.py": engine}, name, subject))
    return q


def history(repo: Path):
    return proposals_of(HistoryLog(Workspace.open(repo).state / "history.jsonl").entries())


# a machine that gets faster through the campaign: +3% per second of wall time since the target was made (a
# campaign of a few minutes drifts by more than any win here); a baseline number carried from earlier would make
# every later candidate look faster
DRIFTING = BENCH.replace(
    "json.dump({\"ops_s\": 1000.0 * engine.SPEED",
    "drift = 1.0 + 0.03 * (time.time() - float(os.environ['TOY_T0']))\n"
    "json.dump({\"ops_s\": 1000.0 * drift * engine.SPEED",
)


def test_a_baseline_that_drifts_through_a_campaign_is_measured_again_beside_every_candidate(tmp_path):
    """GEAK #437: each evaluation measures its own baseline, paired with the candidate, so the drift of the machine
    moves both sides: the no-ops are not merged and the real win is estimated near +10%, while the baseline's own
    median moves with the machine from one evaluation to the next."""
    assert DRIFTING != BENCH
    repo = make_target(tmp_path / "toy", bench=DRIFTING, env=f'TOY_T0 = "{time.time():.3f}"\n')
    q = queue(
        repo,
        tmp_path,
        {
            "noop-1": (NOOP, "Reword a comment"),
            "fast": (FAST, "Make the engine 10% faster"),
            "noop-2": (
                FAST.replace("# the toy", "# the small toy"),
                "Reword the comment again",
            ),
        },
    )
    rc, out = episode_json(repo, "--patches", str(q), "--seed", "3")
    assert rc == 0, out
    by = {r["title"]: r for r in out["proposals"]}
    fast = by["Make the engine 10% faster"]
    assert fast["merged"] and 1.05 < fast["speedup"] < 1.16, fast  # +10%, not +10% plus the drift
    for title in ("Reword a comment", "Reword the comment again"):
        assert not by[title]["merged"], by[title]
    medians = [p.verdict.objective_summary.baseline_median for p in history(repo) if p.verdict.objective_summary]
    # measured again each time: the machine drifted between the first evaluation and the last (two evaluations a
    # moment apart can read the same; CI saw 1077.45 and 1077.42, then 1388)
    assert len(medians) == 3 and medians[2] > 1.05 * medians[0], medians


# slow on its first run (a cold cache, a JIT, a clock ramp), fast once its cache exists: the cache is kept where a
# process may keep one, its home directory; the result says whether the run found it warm
COLD_FIRST = BENCH.replace(
    "json.dump({\"ops_s\": 1000.0 * engine.SPEED",
    "cache = os.path.join(os.path.expanduser('~'), '.bench-warm')\n"
    "warm = os.path.exists(cache)\n"
    "open(cache, 'w').close()\n"
    "json.dump({\"warm\": float(warm), \"ops_s\": 1000.0 * (1.0 if warm else 0.5) * engine.SPEED",
)


def test_a_cold_candidate_is_not_compared_with_a_warm_baseline(tmp_path):
    """Hyperloom #552/#1258: a cold candidate against a warm baseline. Every trial runs in a fresh sandbox whose home
    and /tmp are new (nothing a run caches survives it; writing into the worktree is refused as a modified
    worktree), so both sides are measured alike even with the baseline's side kept across proposals: a no-op is
    not judged a regression and a real +10% win is merged near its own size. (An engine session is warm by design:
    every session, kept or new, starts with unmeasured warm-up rounds on both sides, ``[engine] warmup``.)"""
    assert COLD_FIRST != BENCH
    repo = make_target(tmp_path / "toy", bench=COLD_FIRST)
    q = queue(repo, tmp_path, {"noop": (NOOP, "Reword a comment"), "fast": (FAST, "Make the engine 10% faster")})
    rc, out = episode_json(repo, "--patches", str(q), "--seed", "5")
    assert rc == 0, out
    by = {r["title"]: r for r in out["proposals"]}
    recorded = {p.created.title: p for p in history(repo)}
    noop = recorded["Reword a comment"]
    assert not by["Reword a comment"]["merged"] and "regression" not in noop.verdict.failures, noop.reasons
    fast = by["Make the engine 10% faster"]
    assert fast["merged"] and 1.05 < fast["speedup"] < 1.16, fast
    # the second evaluation's baseline side was the first one's, kept: the case this test is about
    assert noop.verdict.baseline_side == "fresh" and recorded[fast["title"]].verdict.baseline_side == "warm"
    # and no timed trial on either side found the cache of an earlier one
    trials = [
        t
        for e in HistoryLog(Workspace.open(repo).state / "history.jsonl").entries()
        if e.kind == "trial"
        for t in [e.data]
    ]
    warm = [t["metrics"].get("warm") for t in trials if "warm" in (t.get("metrics") or {})]
    assert warm and set(warm) == {0.0}, warm


def test_a_faster_candidate_without_its_quality_evaluation_is_rejected_and_nothing_promotes_it(tmp_path):
    """Hyperloom #1433: a throughput win whose accuracy evaluation could not be produced was promoted by a fallback.
    Here the candidate's logprob run fails (its change breaks the model's numerics code): the distribution check
    fails, the proposal is rejected, and neither `pr` nor `review` treats it as a win."""
    repo = make_target(tmp_path / "toy")
    broken = ENGINE.replace("SPEED = 1.0", "SPEED = 1.5").replace("EPS = 1e-5", 'EPS = "unavailable"')
    q = queue(repo, tmp_path, {"broken-eval": (broken, "Faster, its model evaluation crashes")})
    before = Workspace.open(repo).baseline_commit()
    rc, out = episode_json(repo, "--patches", str(q), "--seed", "9")
    assert rc == 0, out
    (row,) = out["proposals"]
    assert row["verdict"] == "reject" and not row["merged"] and row["speedup"] > 1.3, row  # it was faster
    assert any("distribution" in r for r in row["reasons"]), row["reasons"]
    assert Workspace.open(repo).baseline_commit() == before
    pr = run_cli("pr", "-C", str(repo), row["proposal"], "--dry-run", "--no-plots")
    assert pr.returncode != 0 and "--force" in pr.stderr, (pr.returncode, pr.stderr)
    review = run_cli("review", "-C", str(repo))
    assert review.returncode == 0 and row["proposal"] not in review.stdout, review.stdout
    assert run_cli("history", "verify", "-C", str(repo)).returncode == 0  # the history agrees with the baseline


def test_a_number_never_measured_is_never_reported(tmp_path):
    """GEAK #418: `isolated_speedup 0.0` for kernels never timed. A candidate stopped before its measurement (it
    touches the protected benchmark) has no speedup in the episode's JSON, every figure of its report reads
    "not run", and the insights count it as no effect measured, not as an effect of 0."""
    repo = make_target(tmp_path / "toy")
    q = tmp_path / "queue"
    q.mkdir()
    cheat = patch_from(repo, {"bench/bench.py": BENCH.replace("1000.0", "2000.0")}, "cheat", "Speed up the bench")
    (q / "01-cheat.patch").write_text(cheat)
    before = Workspace.open(repo).baseline_commit()
    rc, out = episode_json(repo, "--patches", str(q), "--seed", "2")
    assert rc == 0, out
    (row,) = out["proposals"]
    assert row["verdict"] == "reject" and row["speedup"] is None and row["pairs"] is None, row
    rep = run_cli("report", "-C", str(repo), row["proposal"], "--json")
    assert rep.returncode == 0, rep.stderr
    figures = {f["name"]: f for f in json.loads(rep.stdout)["figures"]}
    assert figures["timing.wall_s"]["provenance"] == "once"  # the evaluation's own wall time: measured
    unmeasured = [f for n, f in figures.items() if n != "timing.wall_s"]
    assert unmeasured and all(f["value"] is None and f["provenance"] == "not run" for f in unmeasured), figures
    md = run_cli("report", "-C", str(repo), row["proposal"]).stdout
    assert "No workload was measured" in md and "engines and measurement not run" in md, md
    assert "measurement 0" not in md and "engines 0" not in md and "+0.0%" not in md
    (p,) = history(repo)
    assert p.speedup is None and p.effect is None
    ins = run_cli("insights", "-C", str(repo), "--json")
    assert ins.returncode == 0, ins.stderr
    zeros = [k for k, v in _walk(json.loads(ins.stdout)) if "effect" in k and v == 0 and not isinstance(v, bool)]
    assert not zeros, zeros  # no effect of 0 stands in for the measurement that did not happen
    assert Workspace.open(repo).baseline_commit() == before  # nothing merged


def _walk(obj, key: str = ""):
    """(key, value) of every leaf of a JSON document."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk(v, str(k))
    elif isinstance(obj, list):
        for v in obj:
            yield from _walk(v, key)
    else:
        yield key, obj

"""The gate on the real engine: false merges, detections, noise and cost through the real episode loop.

    flock /tmp/agentsearch-engine.lock .venv/bin/python benchmarks/engine_gate.py [--aa 3] [--placement auto]
        [--sleep-ms 0.1] [--slow-ms 1.5] [--max-pairs 30] [--restarts 5] [--keep DIR]
        [--only planted --planted 6 --spin-us 55 --budget 10]

Creates the embedded vLLM fork (the installed vLLM as a git repository, tiny model, CPU or GPU) with the
starter's throughput objective alone (no serving guards, no distribution checks: they measure other
things and would multiply the cost), and a **baseline with a deliberate sleep of ``--sleep-ms`` in every
scheduler step** (``Scheduler.schedule``). Then one episode (``agentsearch episode --branches``) judges,
in this order:

- ``--aa`` A/A proposals: a different comment appended to the scheduler each time (the code that runs is
  the baseline's): any merge is a false merge;
- ``slow``: the sleep raised to ``--slow-ms`` (a large slowdown): must be rejected, the pairs it took say
  how fast a loser stops;
- ``batch``: ``max_num_seqs`` 4 -> 8 in serving.json (a real engine setting): should merge;
- ``fast``: the sleep removed — a true engine-level speedup of a few % (its size is what the gate
  estimates; compare with the A/A noise): a detection if it merges;
- ``--planted`` N proposals ``planted``: the baseline also busy-waits ``--spin-us`` microseconds in every
  scheduler step and each of these removes that wait (a different comment each): N independent tries at
  a planted speedup of about 3% (150 us here); the share that merges is the detection rate, and the mean
  of their estimates says how large the planted effect really is. They are judged after the episode, each
  by ``agentsearch evaluate`` (which never merges) against the baseline they were cut from, at the
  episode's per-proposal level: inside the episode the first one to merge would leave the others nothing
  to remove (their patches no longer apply).

``--budget`` sets ``[gate] episode_budget`` (default: the number of proposals), over which the episode's
alpha is split: 10 for the level a main job's proposals are judged at.

It prints, per proposal, the verdict, estimate, pairs and wall time; then the per-pair SD of the A/A
proposals' objective pairs, false merges, detections, proposals per hour, the load average during the
run and the placement. ``--reuse 2,1`` runs the whole episode once per ``[engine] baseline_reuse`` value,
each on a fresh fork (2: the baseline's worktree and engines kept warm across rejections, one engine
instance serving at most 2 evaluations; 1: every evaluation starts its baseline afresh), and prints one
summary line per value at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentsearch.commands.starter import starter_config  # noqa: E402
from agentsearch.workspace import git  # noqa: E402

SCHEDULER = "vllm/v1/core/sched/scheduler.py"
SLEEP_MARK = "# engine_gate: deliberate sleep"
SPIN_MARK = "# engine_gate: deliberate busy-wait"


def cli(*args: str, timeout: float = 7200) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agentsearch.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def objective_only(
    config: str,
    placement: str,
    max_pairs: int,
    budget: int,
    restarts: int = 5,
    reuse: int = 2,
    slices: int | None = None,
    prompts: int | None = None,
) -> str:
    """The starter config with its first workload (the throughput objective) and a small [gate]."""
    head, rest = config.split("[[workload]]", 1)
    first = re.sub(
        r"\nrestarts = \d+\n", f"\nrestarts = {restarts}\n", "[[workload]]" + rest.split("[[workload]]", 1)[0]
    )
    if prompts:
        first, n = re.subn(r"\bprompts = \d+", f"prompts = {prompts}", first)
        if n != 1:
            raise SystemExit("--prompts: the starter's objective has no single `prompts = N` to replace")
    return (
        head + first + f"\n[gate]\nmin_effect = 0.02\nmin_pairs = 3\nmax_pairs = {max_pairs}\nconfirm_pairs = 4\n"
        f"episode_budget = {budget}\n\n[engine]\nplacement = \"{placement}\"\nbaseline_reuse = {reuse}\n"
        + (f"slices = {slices}\n" if slices else "")
    )


def at_schedule_start(source: str, lines: str) -> str:
    """``source`` with ``lines`` inserted as the first statements of ``Scheduler.schedule``."""
    m = re.search(r"\n    def schedule\(self[^)]*\)[^:]*:\n", source)
    if m is None:
        raise SystemExit(
            f"{SCHEDULER}: no `def schedule(self)` found; this vLLM version is not supported by the benchmark"
        )
    return source[: m.end()] + lines + source[m.end() :]


def with_sleep(source: str, ms: float) -> str:
    """``Scheduler.schedule`` with ``time.sleep(ms / 1000)`` as its first statement (``ms`` 0: none)."""
    source = re.sub(rf"\n[ ]*time\.sleep\([^)]*\)  {re.escape(SLEEP_MARK)}", "", source)
    return at_schedule_start(source, f"        time.sleep({ms / 1000!r})  {SLEEP_MARK}\n") if ms > 0 else source


def with_spin(source: str, us: float) -> str:
    """``Scheduler.schedule`` opening with a busy-wait of ``us`` microseconds (``us`` 0: none): unlike a sleep,
    exact to a microsecond, so an effect of a few % can be planted."""
    source = re.sub(rf"\n[ ]*[^\n]*  {re.escape(SPIN_MARK)}", "", source)
    wait = (
        f"        _spin_until = time.perf_counter() + {us / 1e6!r}  {SPIN_MARK}\n"
        f"        while time.perf_counter() < _spin_until: pass  {SPIN_MARK}\n"
    )
    return at_schedule_start(source, wait) if us > 0 else source


def make_fork(
    path: Path,
    placement: str,
    max_pairs: int,
    budget: int,
    sleep_ms: float,
    slow_ms: float,
    aa: int,
    only: set[str],
    restarts: int,
    reuse: int = 2,
    slices: int | None = None,
    planted: int = 0,
    spin_us: float = 0,
    prompts: int | None = None,
) -> None:
    proc = cli("init", "--from-installed", "vllm", str(path))
    if proc.returncode != 0:
        raise SystemExit(proc.stderr)
    site = next(
        line.split('"')[1]
        for line in (path / "agentsearch.toml").read_text().splitlines()
        if line.startswith("overlay_from")
    )
    (path / "agentsearch.toml").write_text(
        objective_only(starter_config(Path(site)), placement, max_pairs, budget, restarts, reuse, slices, prompts)
    )
    sched = path / SCHEDULER
    original = sched.read_text()
    if "import time\n" not in original:
        raise SystemExit(f"{SCHEDULER} does not import time; this vLLM version is not supported by the benchmark")
    sched.write_text(with_spin(with_sleep(original, sleep_ms), spin_us if planted else 0))
    git.commit_all(
        path,
        f"benchmark baseline: throughput objective only, {sleep_ms} ms sleep"
        + (f" and a {spin_us} us busy-wait" if planted else "")
        + " per scheduler step",
    )

    def branch(name: str, change) -> None:
        if re.sub(r"^gate/\d-|^planted/|-\d+$", "", name) not in only:
            return

        def run(*a: str) -> None:
            subprocess.run(["git", "-c", "commit.gpgsign=false", *a], cwd=path, check=True, capture_output=True)

        run("checkout", "-q", "-b", name, "main")
        change()
        run("commit", "-qam", name)
        run("checkout", "-q", "main")

    base = sched.read_text()
    for i in range(aa):
        branch(
            f"gate/1-aa-{i + 1}",
            lambda i=i: sched.write_text(base + f"\n# A/A proposal {i + 1}: a comment, nothing else\n"),
        )
    branch("gate/2-slow", lambda: sched.write_text(with_sleep(base, slow_ms)))
    serving = json.loads((path / "serving.json").read_text())
    branch(
        "gate/3-batch",
        lambda: (path / "serving.json").write_text(
            json.dumps(
                {**serving, "engine": {**serving["engine"], "max_num_seqs": 2 * serving["engine"]["max_num_seqs"]}},
                indent=2,
            )
            + "\n"
        ),
    )
    branch("gate/4-fast", lambda: sched.write_text(with_sleep(base, 0)))
    for i in range(planted):
        branch(
            f"planted/planted-{i + 1}",
            lambda i=i: sched.write_text(with_spin(base, 0) + f"\n# planted proposal {i + 1}\n"),
        )
    if cli("init", "-C", str(path)).returncode != 0:
        raise SystemExit("init failed")


def history(path: Path) -> list[dict]:
    common = subprocess.run(
        ["git", "rev-parse", "--git-common-dir"], cwd=path, capture_output=True, text=True, check=True
    ).stdout.strip()
    hist = (
        (path / common / "agentsearch" / "history.jsonl")
        if not os.path.isabs(common)
        else Path(common) / "agentsearch" / "history.jsonl"
    )
    return [json.loads(line) for line in hist.read_text().splitlines() if line.strip()] if hist.exists() else []


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--aa", type=int, default=3, help="A/A proposals")
    ap.add_argument("--placement", default="auto")
    ap.add_argument(
        "--sleep-ms",
        type=float,
        default=0.1,
        help="the baseline's sleep per scheduler step (the 'fast' proposal removes it)",
    )
    ap.add_argument("--slow-ms", type=float, default=1.5, help="the 'slow' proposal's sleep per scheduler step")
    ap.add_argument("--max-pairs", type=int, default=30, help="the objective's pair budget (the starter's 30)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--restarts", type=int, default=5, help="engine sessions per side per evaluation (the starter's 5)")
    ap.add_argument(
        "--only", default="aa,slow,batch,fast", help="which proposals (comma-separated kinds; planted needs --planted)"
    )
    ap.add_argument(
        "--planted", type=int, default=0, help="proposals that remove the baseline's --spin-us busy-wait (kind planted)"
    )
    ap.add_argument(
        "--spin-us", type=float, default=55.0, help="the baseline's busy-wait per scheduler step when --planted is set"
    )
    ap.add_argument("--budget", type=int, help="[gate] episode_budget (default: the number of proposals)")
    ap.add_argument(
        "--reuse",
        default="2",
        help="[engine] baseline_reuse values, one episode each (e.g. 2,1: warm baseline on, off)",
    )
    ap.add_argument("--slices", type=int, help="[engine] slices (default: the config's default)")
    ap.add_argument(
        "--prompts",
        type=int,
        help="the objective's prompts per trial (default: the starter's; with --slices: larger pairs)",
    )
    ap.add_argument(
        "--dry-run", action="store_true", help="build the fork and its branches, print their diffs, run nothing"
    )
    ap.add_argument("--keep", type=Path, help="create the forks here (DIR/reuse-N) and keep them")
    args = ap.parse_args()
    lines = []
    for reuse in [int(x) for x in args.reuse.split(",")]:
        print(f"\n=== [engine] baseline_reuse = {reuse} ===", flush=True)
        line = run_once(args, reuse)
        if line is None:
            return 1
        lines.append(line)
    print("\n" + "\n".join(lines))
    return 0


def run_once(args: argparse.Namespace, reuse: int) -> str | None:
    """One episode on a fresh fork; prints its table; returns its summary line (None: it failed)."""
    only = set(args.only.split(","))
    planted = args.planted if "planted" in only else 0
    proposals = (args.aa if "aa" in only else 0) + len(only & {"slow", "batch", "fast"}) + planted
    budget = max(proposals, args.budget or 0)
    loads: list[float] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            loads.append(os.getloadavg()[0])
            stop.wait(5)

    with tempfile.TemporaryDirectory() as tmp:
        fork = (args.keep / f"reuse-{reuse}") if args.keep else Path(tmp) / "fork"
        t0 = time.time()
        make_fork(
            fork,
            args.placement,
            args.max_pairs,
            budget,
            args.sleep_ms,
            args.slow_ms,
            args.aa,
            only,
            args.restarts,
            reuse,
            args.slices,
            planted,
            args.spin_us,
            args.prompts,
        )
        print(f"fork ready in {time.time() - t0:.0f} s: {fork}", flush=True)
        if args.dry_run:
            for b in subprocess.run(
                ["git", "branch", "--list", "gate/*", "planted/*", "--format=%(refname:short)"],
                cwd=fork,
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split():
                stat = subprocess.run(
                    ["git", "diff", "--stat", "main", b], cwd=fork, capture_output=True, text=True, check=True
                ).stdout
                diff = subprocess.run(
                    ["git", "diff", "-U0", "main", b], cwd=fork, capture_output=True, text=True, check=True
                ).stdout
                print(f"{b}: {stat.strip().splitlines()[-1]}")
                print("\n".join(x for x in diff.splitlines() if x[:1] in "+-" and x[:3] not in ("+++", "---")))
            return "dry run"
        threading.Thread(target=sample, daemon=True).start()
        start = git.resolve_commit(fork, "main")
        t1 = time.time()
        summary: dict = {"proposals": []}
        if proposals > planted:
            proc = cli(
                "episode",
                "-C",
                str(fork),
                "--branches",
                "gate/*",
                "--budget",
                str(proposals - planted),
                "--seed",
                str(args.seed),
                "--json",
            )
            if proc.returncode not in (0, 1, 4):
                print(proc.stderr[-3000:])
                return None
            summary = json.loads(proc.stdout)
        entries = history(fork)
        # planted tries: each judged by `evaluate` (never merges) against the baseline they were cut from, at the
        # episode's per-proposal level — one of them merging in an episode would leave the others nothing to remove
        evaluated = []
        for i in range(planted):
            name = f"planted/planted-{i + 1}"
            proc = cli(
                "evaluate",
                "-C",
                str(fork),
                "--json",
                "--baseline",
                start,
                "--alpha",
                f"{0.05 / budget:.6g}",
                "--seed",
                str(args.seed + i),
                name,
            )
            if proc.returncode not in (0, 4):
                print(proc.stderr[-3000:])
                return None
            evaluated.append((name, json.loads(proc.stdout)))
            print(f"  {name}: {evaluated[-1][1]['verdict']}", flush=True)
        wall = time.time() - t1
        stop.set()
    verdicts = {e["proposal"]: e["data"] for e in entries if e["kind"] == "verdict"}
    trials = [{**e["data"], "proposal": e.get("proposal")} for e in entries if e["kind"] == "trial"]
    for name, ev in evaluated:
        obj = ev["workloads"].get("throughput") or next(iter(ev["workloads"].values()), {})
        summary["proposals"].append(
            {
                "proposal": name,
                "branch": name,
                "title": name,
                "verdict": ev["verdict"],
                "speedup": obj.get("speedup"),
                "pairs": obj.get("pairs"),
                "reasons": ev["reasons"],
            }
        )
        verdicts[name] = {
            "timing": ev["timing"],
            "baseline_side": ev["baseline_side"],
            "baseline_engines_reused": ev["baseline_engines_reused"],
        }
        trials += [{**t, "proposal": name} for t in ev["trials"]]
    rows = []
    for r in summary["proposals"]:
        v = verdicts.get(r["proposal"], {})
        m = re.search(
            r"gate[/-]\d+-([a-z]+)", r["branch"] or r["title"] or ""
        )  # gate/1-aa-2 as agentsearch/<ep>/002-gate-1-aa-2
        kind = "planted" if (r["branch"] or "").startswith("planted/") else m.group(1) if m else "?"
        rows.append(
            {
                "proposal": r["proposal"],
                "kind": kind,
                "verdict": r["verdict"],
                "speedup": r["speedup"],
                "pairs": r["pairs"],
                "wall_s": (v.get("timing") or {}).get("wall_s"),
                "engine_s": (v.get("timing") or {}).get("engine_s"),
                "baseline": f"{v.get('baseline_side', '-')}/{v.get('baseline_engines_reused', 0)}",
                "reason": (r["reasons"] or [""])[0][:100],
            }
        )
    print(
        f"\n{'proposal':<28}{'kind':<7}{'verdict':<9}{'estimate':>10}{'pairs':>7}{'wall s':>8}{'engine s':>10}"
        f"{'baseline':>10}  reason"
    )
    for r in rows:
        est = f"{r['speedup'] - 1:+.1%}" if r["speedup"] else "-"
        print(
            f"{r['proposal']:<28}{r['kind']:<7}{r['verdict'] or '-':<9}{est:>10}{r['pairs'] or '-':>7}"
            f"{r['wall_s'] or 0:>8.0f}"
            f"{r['engine_s'] or 0:>10.0f}{r['baseline']:>10}  {r['reason']}"
        )
    # per-pair SD of the A/A proposals' objective pairs (the engine's noise as the gate sees it)
    aa_ids = {r["proposal"] for r in rows if r["kind"] == "aa"}
    d: list[float] = []
    for pid in aa_ids:
        by_pair: dict[int, dict[str, float]] = {}
        for t in trials:
            if t.get("proposal") == pid and t.get("phase") == "objective" and t.get("ok") and t.get("pair", -1) >= 0:
                by_pair.setdefault(t["pair"], {})[t["side"]] = t["value"]
        d += [math.log(p["candidate"] / p["baseline"]) for p in by_pair.values() if len(p) == 2]
    trial_s = [t["wall_s"] for t in trials if t.get("ok") and t.get("pair", -1) >= 0]
    foreign = sum(1 for t in trials if (t.get("metrics") or {}).get("foreign_load"))
    sd = statistics.stdev(d) if len(d) > 1 else float("nan")
    mean = statistics.mean(d) if d else float("nan")
    false_merges = sum(1 for r in rows if r["kind"] == "aa" and r["verdict"] == "merge")
    by_kind = {r["kind"]: r for r in rows}
    engine = sum(r["engine_s"] or 0 for r in rows)
    line = (
        f"baseline_reuse {reuse}, slices {args.slices or 'default'}, prompts {args.prompts or 'default'}: "
        f"placement {args.placement}; "
        f"{len(rows)} proposals in {wall:.0f} s = "
        f"{3600 * len(rows) / wall:.1f} proposals/hour; mean wall per proposal {wall / max(1, len(rows)):.0f} s, "
        f"engines {engine:.0f} s in all; A/A per-pair SD {sd:.4f}, mean log-ratio {mean:+.4f} over {len(d)} pairs, "
        f"false merges {false_merges}/{args.aa if 'aa' in only else 0}"
    )
    print("\n" + line)
    for k, want in (("slow", "reject"), ("batch", "merge"), ("fast", "merge")):
        r = by_kind.get(k)
        if r:
            ok = "detected" if r["verdict"] == want else "missed"
            print(f"{k}: {ok} ({r['verdict']}, estimate {(r['speedup'] or 1) - 1:+.1%}, {r['pairs']} pairs)")
    tries = [r for r in rows if r["kind"] == "planted"]
    if tries:
        hits = sum(1 for r in tries if r["verdict"] == "merge")
        est = [math.log(r["speedup"]) for r in tries if r["speedup"]]
        pooled = planted_effect(trials, {r["proposal"] for r in tries})
        print(
            f"planted ({args.spin_us:g} us busy-wait removed): detected {hits}/{len(tries)} "
            f"within {args.max_pairs} pairs "
            f"(episode_budget {budget}); estimates {', '.join(f'{math.expm1(x):+.1%}' for x in est)}; "
            "the planted effect over all "
            f"their pairs: {pooled}; pairs {', '.join(str(r['pairs']) for r in tries)}"
        )
    print(
        f"trials: median {statistics.median(trial_s) if trial_s else float('nan'):.2f} s each, "
        f"{foreign} flagged foreign_load; "
        f"load average during the run: mean {statistics.mean(loads) if loads else float('nan'):.2f}, "
        f"max {max(loads, default=float('nan')):.2f} "
        f"({os.cpu_count()} CPUs)",
        flush=True,
    )
    return line


def planted_effect(trials: list[dict], proposals: set[str]) -> str:
    """The mean log-ratio of all objective pairs of ``proposals`` (the planted effect's best estimate), as a speedup."""
    by_pair: dict[tuple[str, str, int], dict[str, float]] = {}
    for t in trials:
        if (
            t.get("proposal") in proposals
            and t.get("ok")
            and t.get("pair", -1) >= 0
            and t.get("phase") in ("objective", "confirmation")
        ):
            by_pair.setdefault((t["proposal"], t["phase"], t["pair"]), {})[t["side"]] = t["value"]
    d = [math.log(p["candidate"] / p["baseline"]) for p in by_pair.values() if len(p) == 2]
    if len(d) < 2:
        return "-"
    se = statistics.stdev(d) / math.sqrt(len(d))
    return (
        f"{math.expm1(statistics.mean(d)):+.2%} (± {1.96 * se:.2%}, {len(d)} pairs, "
        f"per-pair SD {statistics.stdev(d):.4f})"
    )


if __name__ == "__main__":
    raise SystemExit(main())

"""Stack checks on the real engine (#39): the planted cases on the embedded default, judged by the gate.

    flock /tmp/agentsearch-engine.lock .venv/bin/python benchmarks/stack_engine.py
        --case compose|passenger|bystander|bisect [--runs 1] [--no-loo] [--seed 7]
        [--out docs/data/stack-engine.jsonl] [--keep DIR] [--dry-run]
    .venv/bin/python benchmarks/stack_engine.py --summary docs/data/stack-engine.jsonl

A fork of the embedded vLLM (``agentsearch init --from-installed vllm``) with the starter's throughput objective
(5 engine sessions of 6 pairs, 30 at most, confirmation on 4 fresh pairs) and no distribution checks, whose start
(the range's start) **busy-waits in every scheduler step** for each planted cost: one line per cost at the top of
``Scheduler.schedule``, ``if not PLANTED_X_REMOVED and self.max_model_len != GUARD_LEN: _stack_spin(US)``, and one
flag per cost at the end of the module (the flags kept apart by blank lines, so a merge reverts on its own). Each
proposal is a patch of a chain fed to ``agentsearch episode --patches``: it merges only if the gate finds it a
significant, confirmed win. Then:

- ``compose``: merge 1 removes cost A (``PLANTED_A_REMOVED = True``), merge 2 removes cost B. Two wins that compose:
  expected *delivers*, and with the leave-one-out both *contribute*. Its stack check is also an honest stack for the
  A/A count (how often an honest stack is called *under-delivers*); ``--no-loo`` runs only the episode's own check
  (two measurements less).
- ``passenger``: merge 1 removes cost A by its flag; merge 2 deletes cost A's line and removes cost B (a rewrite that
  takes merge 1's gain over). Expected: *delivers*; leave-one-out names merge 1 a *passenger* (its marginal
  contribution today is nothing) and merge 2 *contributes*; the pair (1, 2) *interferes* (without both, cost A is
  back: far more than the two single removals).
- ``bystander``: the passenger case and a third merge that removes cost C, independent of the other two. The
  passenger points to two pairs: (1, 2) *interferes* as before, and (1, 3) must **not** be flagged (without both,
  the tip loses exactly what removing merge 3 alone loses): the interference test's false flags, on a pair without
  interference. Expected: *delivers*; passenger, contributes, contributes; interfering [(1, 2)] only.
- ``bisect``: six merges, each removing one of six planted costs; merge 3 also adds a busy-wait that only the
  ``single`` workload's engines run (``max_model_len == GUARD_LEN``): a guard regression of about 25% that the
  gate's ``max_regression`` (0.5 here) lets through. ``agentsearch stack bisect --metric single`` must name merge 3
  in at most 4 steps (the tip, then ceil(log2 6) = 3 halvings). This case's gate looks first after 6 pairs (the
  starter's 3), so that one evaluation gives a bisect step the 6 pairs of ``single`` it decides on.

The planted costs are busy-waits, not sleeps: exact to a microsecond (removing 600 us per step measured +8.5% on
this machine, docs/2026-12-06-stack-engine.md). Each run appends one JSON line to
``--out`` (the case, start, minutes, each proposal's verdict, the stack check's or the bisection's record and
whether it gave the expected verdict); ``--summary FILE`` prints the table. ``--dry-run`` builds the fork and the
patches and prints their diffs (no engine).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentsearch.commands.starter import starter_config  # noqa: E402
from benchmarks.engine_gate import SCHEDULER, at_schedule_start, objective_only  # noqa: E402

CLI = [sys.executable, "-m", "agentsearch.cli"]
MARK = "# stack_engine"
GUARD_LEN = 512  # the `single` workload's max_model_len: the only engines the bisect case's regression slows
CASES = ("compose", "passenger", "bystander", "bisect")
# planted cost per letter, microseconds per scheduler step (measured 2026-12-06: removing 600 us was +8.5%, then 450
# us +9.3%, confirmed +9.4% and +11.7%: a step of the starter's objective is about 7 ms here)
COSTS = {
    "compose": {"A": 600, "B": 450},
    "passenger": {"A": 600, "B": 450},
    "bystander": {"A": 600, "B": 500, "C": 500},
    "bisect": dict.fromkeys("ABCDEF", 500),
}
GUARD_US = 2000  # the bisect case's regression on `single`: about 25% of its throughput (a step is about 7 ms)
BISECT_CULPRIT = 3  # the merge (1-based) that carries it
SPIN = f"""

def _stack_spin(us):  {MARK}: a planted cost, exact to a microsecond
    end = time.perf_counter() + us / 1e6
    while time.perf_counter() < end:
        pass
"""
SINGLE_WORKLOAD = f"""
[[workload]]
name = "single"
kind = "vllm-throughput"
metric = "output_tok_s"
higher_is_better = true
timeout_s = 300
restarts = 2
max_pairs = 12
engine = {{ enforce_eager = true, max_model_len = {GUARD_LEN}, dtype = "float32", \
distributed_executor_backend = "uni" }}
params = {{ prompts = 24, input_len = 48, output_len = 48, length_dist = "uniform" }}
"""


def config(starter: str, case: str, loo: bool) -> str:
    """The starter's throughput objective and gate (no guards, no [verify]); for ``bisect`` the ``single`` guard and a
    gate that lets its planted regression through; ``[stack]`` as the case needs it."""
    text = objective_only(starter, "auto", 30, len(COSTS[case]))
    head, gate = text.split("\n[gate]\n", 1)
    if case == "bisect":
        head += SINGLE_WORKLOAD
        # min_pairs 6: a bisect step decides on no fewer than 6 pairs of `single` (agentsearch.stack.MIN_STEP_PAIRS);
        # at the starter's 3 a guard that passes at its first look gives 3, and every step runs a second evaluation
        gate = "max_regression = 0.5\n" + re.sub(r"^min_pairs = \d+$", "min_pairs = 6", gate, flags=re.M)
    stack = (
        '[stack]\ncheck = "off"\n'
        if case == "bisect"
        else f'[stack]\ncheck = "end"\nleave_one_out = {str(loo).lower()}\n'
    )
    return f"{head}\n[gate]\n{gate}\n{stack}"


def flag(letter: str) -> str:
    return f"PLANTED_{letter}_REMOVED"


def cost_line(letter: str, us: int) -> str:
    cond = f"not {flag(letter)} and self.max_model_len != {GUARD_LEN}"
    return f"        if {cond}: _stack_spin({us})  {MARK}: cost {letter}\n"


def guard_line(us: int) -> str:
    return f"        if self.max_model_len == {GUARD_LEN}: _stack_spin({us})  {MARK}: the planted guard regression\n"


def planted_start(source: str, costs: dict[str, int]) -> str:
    """The scheduler of the range's start: each cost's line at the top of ``schedule``, its flag at the module's
    end (two blank lines between flags: a revert of one flag never touches another's context)."""
    if "\nimport time\n" not in source:
        raise SystemExit(f"{SCHEDULER} does not import time; this vLLM version is not supported by the benchmark")
    out = at_schedule_start(source, "".join(cost_line(k, us) for k, us in costs.items()))
    out = out.rstrip("\n") + "\n" + SPIN
    for k in costs:
        out += f"\n\n{flag(k)} = False  {MARK}\n"
    return out


def remove_by_flag(source: str, letter: str) -> str:
    new, n = re.subn(rf"^{flag(letter)} = False  ", f"{flag(letter)} = True  ", source, flags=re.M)
    if n != 1:
        raise SystemExit(f"no flag for planted cost {letter}")
    return new


def delete_line(source: str, letter: str) -> str:
    new, n = re.subn(rf"^[^\n]*{re.escape(MARK)}: cost {letter}\n", "", source, flags=re.M)
    if n != 1:
        raise SystemExit(f"no line for planted cost {letter}")
    return new


def add_guard_regression(source: str, us: int) -> str:
    return at_schedule_start(source, guard_line(us))


def chain(case: str) -> list[tuple[str, object]]:
    """The case's proposals in order: (subject, change of the scheduler's source)."""
    if case == "compose":
        return [
            ("Remove planted cost A", lambda s: remove_by_flag(s, "A")),
            ("Remove planted cost B", lambda s: remove_by_flag(s, "B")),
        ]
    if case in ("passenger", "bystander"):
        return [
            ("Remove planted cost A by its flag", lambda s: remove_by_flag(s, "A")),
            ("Rewrite: drop cost A's code and remove cost B", lambda s: remove_by_flag(delete_line(s, "A"), "B")),
        ] + ([("Remove planted cost C", lambda s: remove_by_flag(s, "C"))] if case == "bystander" else [])
    steps: list[tuple[str, object]] = []
    for i, letter in enumerate(COSTS["bisect"], 1):
        if i == BISECT_CULPRIT:
            steps.append(
                (
                    f"Remove planted cost {letter}",
                    lambda s, k=letter: add_guard_regression(remove_by_flag(s, k), GUARD_US),
                )
            )
        else:
            steps.append((f"Remove planted cost {letter}", lambda s, k=letter: remove_by_flag(s, k)))
    return steps


def git(repo: Path, *args: str) -> str:
    proc = subprocess.run(
        [
            "git",
            "-c",
            "commit.gpgsign=false",
            "-c",
            "user.name=stack_engine",
            "-c",
            "user.email=stack_engine@localhost",
            *args,
        ],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"git {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def make_fork(where: Path, case: str, loo: bool) -> tuple[Path, Path]:
    """The fork at the range's start, and the directory of the case's patches (a chain on top of it)."""
    fork = where / "fork"
    proc = subprocess.run([*CLI, "init", "--from-installed", "vllm", str(fork)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr.strip()[-2000:])
    site = next(
        line.split('"')[1]
        for line in (fork / "agentsearch.toml").read_text().splitlines()
        if line.startswith("overlay_from")
    )
    (fork / "agentsearch.toml").write_text(config(starter_config(Path(site)), case, loo))
    sched = fork / SCHEDULER
    sched.write_text(planted_start(sched.read_text(), COSTS[case]))
    git(fork, "add", "-A")
    git(fork, "commit", "-qm", f"stack_engine start: the {case} case's planted costs")
    git(fork, "checkout", "-q", "-b", "scratch/chain")
    for subject, change in chain(case):
        sched.write_text(change(sched.read_text()))  # type: ignore[operator]
        git(fork, "commit", "-qam", f"{subject}\n\nCategory: scheduling")
    queue = where / "queue"
    git(fork, "format-patch", "-q", "-o", str(queue), "main..scratch/chain")
    git(fork, "checkout", "-q", "main")
    git(fork, "branch", "-D", "scratch/chain")
    if subprocess.run([*CLI, "init", "-C", str(fork)], capture_output=True).returncode != 0:
        raise SystemExit("agentsearch init -C FORK failed")
    return fork, queue


def progress(argv: list[str]) -> subprocess.CompletedProcess:
    """Run an agentsearch command, its progress lines (stderr) shown as they come and kept; its stdout returned."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err: list[str] = []

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            err.append(line)
            sys.stderr.write(line)
            sys.stderr.flush()

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    out = proc.stdout.read() if proc.stdout else ""
    proc.wait()
    t.join()
    return subprocess.CompletedProcess(argv, proc.returncode, out, "".join(err))


def records(fork: Path, kind: str) -> list[dict]:
    """The history's records of ``kind`` (their data), oldest first."""
    common = git(fork, "rev-parse", "--git-common-dir").strip()
    path = (fork / common if not Path(common).is_absolute() else Path(common)) / "agentsearch" / "history.jsonl"
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return [e["data"] for e in entries if e.get("kind") == kind]


def expected(case: str, row: dict) -> tuple[bool, str]:
    """Whether the run gave the case's named verdicts, and what it got."""
    merged = [p.get("merged", p["verdict"] == "merge") for p in row["proposals"]]
    if not all(merged):
        return False, f"merged {sum(merged)} of {len(merged)} planted wins"
    if case == "bisect":
        b = row.get("bisect") or {}
        got = b.get("culprit_index")
        steps = len(b.get("steps", []))
        return got == BISECT_CULPRIT and steps <= 4, f"named merge {got} in {steps} steps"
    s = row.get("stack") or {}
    decisions = [r["decision"] for r in s.get("removals", [])]
    what = f"{s.get('verdict')}; removals {decisions}; interfering {s.get('interfering')}"
    if s.get("verdict") != "delivers":
        return False, what
    if not row.get("loo"):
        return True, what
    if case == "compose":
        return decisions == ["contributes", "contributes"], what
    if case == "bystander":
        what += f"; tested {s.get('pairs_tested')}"
        return (
            decisions == ["passenger", "contributes", "contributes"]
            and s.get("interfering") == [[1, 2]]
            and [1, 3] in s.get("pairs_tested", []),
            what,
        )
    return decisions == ["passenger", "contributes"] and s.get("interfering") == [[1, 2]], what


def run_once(case: str, loo: bool, seed: int, keep: Path | None, dry_run: bool) -> dict | None:
    with tempfile.TemporaryDirectory(prefix="stack-engine-", ignore_cleanup_errors=True) as tmp:
        where = (keep or Path(tmp)).resolve()
        fork, queue = make_fork(where, case, loo)
        if dry_run:
            for p in sorted(queue.iterdir()):
                print(p.name)
                diff = p.read_text().split("\n---\n", 1)[-1]
                print(
                    "\n".join(
                        x for x in diff.splitlines() if x[:1] in ("+", "-") and x[:3] not in ("+++", "---", "-- ")
                    )
                )
            return None
        start = datetime.now(UTC)
        t0 = time.time()
        proc = progress([*CLI, "episode", "-C", str(fork), "--patches", str(queue), "--seed", str(seed), "--json"])
        row: dict = {
            "case": case,
            "loo": loo,
            "seed": seed,
            "start": start.isoformat(timespec="seconds"),
            "hour": start.hour,
        }
        try:
            out = json.loads(proc.stdout)
        except json.JSONDecodeError:
            row["error"] = (proc.stderr.strip().splitlines() or [f"no output (exit {proc.returncode})"])[-1][:500]
            row["minutes"] = (time.time() - t0) / 60
            return row
        row["proposals"] = [
            {
                "title": p.get("title"),
                "verdict": p["verdict"],
                "merged": bool(p.get("merged", p["verdict"] == "merge")),
                "speedup": p.get("speedup"),
                "pairs": p.get("pairs"),
            }
            for p in out["proposals"]
        ]
        row["episode_stack"] = out.get("stack")  # the episode's own summary: a failed check's error is only here
        merges = [m["new"] for m in records(fork, "merge") if m.get("ok")]
        index = {c: i for i, c in enumerate(merges, 1)}
        if case != "bisect":
            checks = records(fork, "stack-check")
            if checks:
                s = checks[-1]
                row["stack"] = {
                    "verdict": s["verdict"],
                    "reasons": s["reasons"][:3],
                    "cumulative": s["cumulative"],
                    "ci": s["ci"],
                    "product": s["product"],
                    "product_ci": s["product_ci"],
                    "pairs": s.get("pairs"),
                    "removals": [
                        {
                            "merge": index.get(r["merge"]),
                            "decision": r["decision"],
                            "marginal": r.get("marginal"),
                            "ci": r.get("ci"),
                            "pairs": r.get("pairs"),
                            "shrank": r.get("shrank"),  # since 2026-12-06 (agentsearch 0.5.0 + #39)
                        }
                        for r in s.get("removals", [])
                    ],
                    "guards": [
                        {"name": g["name"], "role": g["role"], "decision": g["decision"], "speedup": g.get("speedup")}
                        for g in s.get("guards", [])
                    ],
                    "interfering": [
                        sorted(index.get(m) for m in p["merges"]) for p in s.get("interference", []) if p["interfere"]
                    ],
                    "pairs_tested": [sorted(index.get(m) for m in p["merges"]) for p in s.get("interference", [])],
                    "interference": [  # each tested pair: without both, against the product of the single removals
                        {k: p.get(k) for k in ("joint", "ci", "expected", "p_value", "pairs", "reason")}
                        for p in s.get("interference", [])
                    ],
                    "seconds": s.get("seconds"),
                }
        elif len(merges) == len(COSTS[case]):
            b = progress(
                [*CLI, "stack", "bisect", "-C", str(fork), "--metric", "single", "--seed", str(seed), "--json"]
            )
            found = records(fork, "stack-bisect")
            if found:
                r = found[-1]
                row["bisect"] = {
                    "culprit_index": index.get(r["culprit"]) if r.get("culprit") else None,
                    "reason": r["reason"],
                    "steps": [
                        {
                            "index": s["index"],
                            "outcome": s["outcome"],
                            "speedup": s.get("speedup"),
                            "ci": s.get("ci"),
                            "pairs": s.get("pairs"),
                        }
                        for s in r["steps"]
                    ],
                    "seconds": r.get("seconds"),
                }
            else:
                row["bisect"] = {"error": (b.stderr.strip().splitlines() or ["no record"])[-1][:500], "steps": []}
        row["minutes"] = (time.time() - t0) / 60
        row["ok"], row["got"] = expected(case, row)
        return row


def pct(x: float | None) -> str:
    return f"{x - 1:+.1%}" if x else "-"


def summary(lines: list[dict]) -> None:
    print(f"{'start (UTC)':<17} {'case':<10} {'merged':<7} {'result':<60} {'as planted':<10} {'min':>5}")
    for r in lines:
        if "error" in r:
            print(f"{r['start'][:16]:<17} {r['case']:<10} error: {r['error'][:90]}")
            continue
        merged = f"{sum(p.get('merged', p['verdict'] == 'merge') for p in r['proposals'])}/{len(r['proposals'])}"
        if r["case"] == "bisect":
            b = r.get("bisect") or {}
            res = f"named merge {b.get('culprit_index')} in {len(b.get('steps', []))} steps: " + " ".join(
                f"{s['index']}:{s['outcome']}" for s in b.get("steps", [])
            )
        else:
            s = r.get("stack") or {}
            res = f"{s.get('verdict')} {pct(s.get('cumulative'))} vs product {pct(s.get('product'))}"
            if s.get("removals"):
                res += "; " + ", ".join(f"{x['merge']} {x['decision']} {pct(x['marginal'])}" for x in s["removals"])
            if s.get("interfering"):
                res += f"; interfering {s['interfering']}"
        print(
            f"{r['start'][:16]:<17} {r['case']:<10} {merged:<7} {res:<60} "
            f"{'yes' if r['ok'] else 'NO':<10} {r['minutes']:>5.1f}"
        )
    honest = [r for r in lines if r.get("case") == "compose" and r.get("stack")]
    if honest:
        short = sum(r["stack"]["verdict"] == "under-delivers" for r in honest)
        print(f"honest stacks (compose): {len(honest)}, called under-delivers {short}")
    for case in CASES:
        rows = [r for r in lines if r.get("case") == case and "error" not in r]
        if rows:
            print(f"{case}: {sum(r['ok'] for r in rows)} of {len(rows)} runs as planted")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", choices=CASES, default="compose")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--no-loo", action="store_true", help="not bisect: the episode's own stack check only")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default="", help="append one JSON line per run here")
    ap.add_argument("--keep", type=Path, help="build the fork and patches here and keep them (one run)")
    ap.add_argument(
        "--dry-run", action="store_true", help="build the fork and the patches, print the diffs, run nothing"
    )
    ap.add_argument("--summary", default="", help="print the table of the runs in this file and exit")
    args = ap.parse_args()
    if args.summary:
        summary([json.loads(line) for line in Path(args.summary).read_text().splitlines() if line.strip()])
        return
    rows = []
    for i in range(1 if args.dry_run or args.keep else args.runs):
        row = run_once(args.case, not args.no_loo and args.case != "bisect", args.seed + i, args.keep, args.dry_run)
        if row is None:
            return
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
    summary(rows)


if __name__ == "__main__":
    main()

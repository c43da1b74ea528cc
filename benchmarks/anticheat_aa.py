"""The anti-cheat checks' false failures on honest A/A pairs, idle and under load (issue #55, round 4).

Every check that can fail a side's trial — the worker's clock against the orchestrator's, the CPU envelope of a
pinned engine, the outputs rule, the worktree check, the load generator's schedule, a timeout — is run by the real
gate on the toy engine target of ``benchmarks/toy_engine.py`` (a vLLM stand-in whose work is CPU time, served by the
harness's real warm worker in the real sandbox). The candidate changes a comment: any trial failure is a false
alarm. Two conditions:

- ``idle``: one evaluation at a time;
- ``load``: ``--loops`` evaluations at once (each beside the others' engine workloads) and a busy loop on CPU 1
  (the engines' pinned CPU).

    .venv/bin/python benchmarks/anticheat_aa.py [--pairs 200] [--loops 3] [--only idle|load] [--json F]
        [--micro PAIRS]

``--micro PAIRS``: the micro stage's checks too (the worker's clock against the orchestrator's round trips, the
timed outputs against the checker), on ``kernels bench`` of the installed vLLM's ``rms_norm`` against itself
(``native`` on both sides: an honest A/A), PAIRS pairs per condition; under load a busy loop on each CPU.

Prints, per condition: evaluations, pairs, the failed trials by check and side, the false-failure rate of each
check per pair, and how many candidates were rejected for a failure of the baseline's side (the acceptance: 0).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.toy import commit  # noqa: E402
from benchmarks.toy_engine import CPU_VLLM, Hog, evaluate, target  # noqa: E402

# what a failed trial's error starts with or says, per check (the first that matches names it)
CHECKS = (
    ("clock", "the worker's clock disagrees"),
    ("cpu-envelope", "envelope"),
    ("outputs", "outputs"),
    ("worktree", "worktree modified"),
    ("load-generator", "fell behind its schedule"),
    ("timeout", "timed out"),
)


MICRO_CHECKS = (("clock", "clock disagrees"), ("outputs", "wrong result"))


def check_of(error: str) -> str:
    return next((name for name, needle in CHECKS if needle in error), "other")


def aa_target(root: Path) -> Path:
    repo = target(root, vllm=CPU_VLLM)
    cfg = (repo / "agentsearch.toml").read_text().replace("max_pairs = 8\n", "max_pairs = 12\nmin_pairs = 4\n")
    commit(repo, {"agentsearch.toml": cfg}, "A/A: up to 12 pairs")
    vllm = (repo / "vllm" / "__init__.py").read_text()
    commit(repo, {"vllm/__init__.py": vllm + "\n# A/A: a comment, nothing else\n"}, "a comment", branch="aa")
    return repo


def loop(repo: Path, pairs_wanted: int, tally: dict, lock: threading.Lock, label: str) -> None:
    while True:
        with lock:
            if tally["pairs"] >= pairs_wanted:
                return
        t0 = time.perf_counter()
        rc, out = evaluate(repo, "aa")
        trials = [t for t in out.get("trials", []) if t["pair"] >= 0]
        pairs = len({(t["workload"], t["pair"]) for t in trials if t["ok"]}) // 1
        failed = [t for t in out.get("trials", []) if not t["ok"]]
        if out.get("verdict") == "merge":  # an A/A merge: kept for a look (the gate's error, not a check's)
            keep = Path(tempfile.gettempdir()) / "anticheat-aa-merges"
            keep.mkdir(exist_ok=True)
            (keep / f"{label.replace('[', '-').rstrip(']')}-{time.time_ns()}.json").write_text(json.dumps(out))
        reasons = out.get("reasons", [])
        checks = {c["name"]: c for c in out.get("checks", [])}
        with lock:
            tally["evaluations"] += 1
            tally["pairs"] += pairs
            tally["verdicts"][out.get("verdict", f"rc {rc}")] += 1
            for t in failed:
                tally["failed"][(check_of(t.get("error", "")), t["side"])] += 1
            if any("baseline trial failed" in r or "baseline's" in r and "failed" in r for r in reasons):
                tally["rejected_for_baseline"] += int(out.get("verdict") == "reject")
            if "baseline-alone" in checks:
                tally["remeasured"] += 1
            n = tally["evaluations"]
        print(
            f"{label} #{n:<3} {out.get('verdict', '?'):<7} {pairs:>2} pairs {len(failed)} failed trials "
            f"{time.perf_counter() - t0:5.0f} s  {(reasons or [''])[0][:100]}",
            flush=True,
        )


def condition(name: str, pairs_wanted: int, loops: int) -> dict:
    tally: dict = {
        "evaluations": 0,
        "pairs": 0,
        "verdicts": Counter(),
        "failed": Counter(),
        "rejected_for_baseline": 0,
        "remeasured": 0,
    }
    lock = threading.Lock()
    with tempfile.TemporaryDirectory(prefix=f"aa-{name}-") as tmp:
        repos = [aa_target(Path(tmp) / f"t{i}") for i in range(loops)]
        t0 = time.perf_counter()
        hog = Hog() if name == "load" else None
        if hog is not None:
            hog.__enter__()
        try:
            threads = [
                threading.Thread(target=loop, args=(r, pairs_wanted, tally, lock, f"{name}[{i}]"))
                for i, r in enumerate(repos)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            if hog is not None:
                hog.__exit__(None, None, None)
        tally["wall_s"] = time.perf_counter() - t0
    return tally


def show(name: str, t: dict) -> dict:
    pairs = max(1, t["pairs"])
    print(f"\n{name}: {t['evaluations']} evaluations, {t['pairs']} pairs, {t['wall_s']:.0f} s")
    print(f"  verdicts: {dict(t['verdicts'])}")
    print(f"  candidates rejected for a failure of the baseline's side: {t['rejected_for_baseline']}")
    print(f"  evaluations measured again after a baseline failure (baseline-alone): {t['remeasured']}")
    rates = {}
    for check, _ in (*CHECKS, ("other", "")):
        b, c = t["failed"][(check, "baseline")], t["failed"][(check, "candidate")]
        rates[check] = (b + c) / pairs
        print(f"  {check:<15} baseline {b:>3}  candidate {c:>3}  per pair {rates[check]:.2%}")
    return {
        "evaluations": t["evaluations"],
        "pairs": t["pairs"],
        "wall_s": round(t["wall_s"]),
        "verdicts": dict(t["verdicts"]),
        "rejected_for_baseline": t["rejected_for_baseline"],
        "remeasured": t["remeasured"],
        "failed": {f"{k[0]}/{k[1]}": v for k, v in t["failed"].items()},
        "rate_per_pair": rates,
    }


def micro_condition(name: str, pairs_wanted: int) -> dict:
    """A/A ``kernels bench`` runs (8 pairs each) until ``pairs_wanted`` pairs; failures by check."""
    import os
    import subprocess

    from benchmarks.toy import run_cli

    tally: dict = {"benches": 0, "pairs": 0, "failed": Counter(), "statuses": Counter()}
    hogs = []
    with tempfile.TemporaryDirectory(prefix=f"aa-micro-{name}-") as tmp:
        fork = Path(tmp) / "fork"
        assert run_cli("init", "--from-installed", "vllm", str(fork)).returncode == 0
        t0 = time.perf_counter()
        if name == "load":
            for cpu in range(os.cpu_count() or 1):
                hogs.append(
                    subprocess.Popen(
                        [sys.executable, "-c", "while True: pass"],
                        preexec_fn=lambda c=cpu: os.sched_setaffinity(0, {c}),
                    )
                )
        try:
            while tally["pairs"] < pairs_wanted:
                args = ("kernels", "bench", "-C", str(fork), "rms_norm", "--baseline", "main", "--candidate", "main")
                proc = run_cli(*args, "--candidate-provider", "native", "--pairs", "8", "--json", timeout=1200)
                if proc.returncode not in (0, 4):  # the set-up's error, not a check's: stop, say it
                    raise SystemExit(f"kernels bench failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
                out = json.loads(proc.stdout) if proc.stdout.strip() else {"status": f"rc {proc.returncode}"}
                op = (out.get("micro", {}).get("ops") or [{}])[0]
                tally["benches"] += 1
                tally["pairs"] += int(op.get("pairs") or 0)
                tally["statuses"][out.get("status", "?")] += 1
                detail = str(out.get("detail", ""))
                if out.get("status") != "pass":
                    check = (
                        "clock" if "clock disagrees" in detail else "outputs" if "wrong result" in detail else "other"
                    )
                    tally["failed"][check] += 1
                print(
                    f"micro {name} #{tally['benches']:<3} {out.get('status')} {op.get('pairs')} pairs  {detail[:110]}"
                )
        finally:
            for h in hogs:
                h.kill()
                h.wait()
        tally["wall_s"] = time.perf_counter() - t0
    pairs = max(1, tally["pairs"])
    print(f"\nmicro {name}: {tally['benches']} benches, {tally['pairs']} pairs, {tally['wall_s']:.0f} s")
    print(f"  statuses: {dict(tally['statuses'])}")
    for check in ("clock", "outputs", "other"):
        print(f"  {check:<8} {tally['failed'][check]:>3}  per pair {tally['failed'][check] / pairs:.2%}")
    return {
        "benches": tally["benches"],
        "pairs": tally["pairs"],
        "wall_s": round(tally["wall_s"]),
        "statuses": dict(tally["statuses"]),
        "failed": dict(tally["failed"]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=200, help="honest A/A pairs per condition (at least)")
    ap.add_argument("--loops", type=int, default=3, help="evaluations at once under load")
    ap.add_argument("--only", choices=("idle", "load"))
    ap.add_argument("--json", type=Path, help="write the numbers here")
    ap.add_argument("--micro", type=int, default=0, help="micro-stage A/A pairs per condition (0: none)")
    ap.add_argument("--no-engine", action="store_true", help="only the micro stage")
    a = ap.parse_args()
    res = {}
    for name in ("idle", "load"):
        if a.only and a.only != name:
            continue
        if not a.no_engine:
            res[name] = show(name, condition(name, a.pairs, 1 if name == "idle" else a.loops))
        if a.micro:
            res[f"micro-{name}"] = micro_condition(name, a.micro)
    if a.json:
        a.json.write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()

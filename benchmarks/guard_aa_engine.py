"""The demo's guards on the real engine, A/A: how often serve-c1 and serve-c8 call a false regression (#43).

    flock /tmp/agentsearch-engine.lock .venv/bin/python benchmarks/guard_aa_engine.py [--runs 5] [--slow-ms 0]
        [--delay-ms 0]
        [--out docs/data/guard-aa-engine.jsonl]
    .venv/bin/python benchmarks/guard_aa_engine.py --summary docs/data/guard-aa-engine.jsonl

A fork of the embedded vLLM (``agentsearch init --from-installed vllm``) with the starter's two serving guards
exactly as the demo runs them (``serve-c1``: concurrency 1, 16 pairs at most; ``serve-c8``: concurrency 8, 20
pairs), the starter's ``[target]`` and ``[gate]``. The objective is a toy command the candidate makes 1.5x
faster, so every evaluation reaches the guards (a real objective would stop an A/A candidate before them); the
distribution checks are off (they judge outputs, not speed, and would double each run's cost). Each run is one
``agentsearch evaluate`` of a fresh candidate branch:

- ``--slow-ms 0``: the candidate changes a comment in the scheduler (an A/A for both guards): every guard
  rejection is a false alarm; a first call that the fresh-engine re-measure did not confirm is counted apart.
- ``--slow-ms S``: every scheduler step of the candidate sleeps S ms more: a real regression the guards
  should catch (confirmed on fresh engines)? Measured 2026-12-06: not on this machine. With 0.3 ms the candidate's
  servers were 2-5% *faster* at both concurrencies (a sleeping engine core leaves its CPU to the API server).
- ``--delay-ms D``: every request the candidate's server answers waits D ms in the completion handler (an
  ``asyncio.sleep`` before it is served, ``benchmarks/serving_guard_engine.py``'s anchor): a regression on the
  serving path itself, the power runs' planted regression.

The gate's coverage check is off for both kinds of power runs: the toy objective runs none of the changed lines, and
the check would reject before any guard measured.

Each run appends one JSON line to ``--out`` (its start time, hour, verdict and each guard's first call and
re-measure), so runs made at different hours and sessions add up; ``--summary FILE`` prints the table of
every line in FILE (per hour and in total). Prints one line per run as it ends.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentsearch.config import load_config_text  # noqa: E402 (the repository root first)
from benchmarks.engine_gate import SCHEDULER, at_schedule_start  # noqa: E402
from benchmarks.serving_guard_engine import ANCHOR, SERVING_PY  # noqa: E402
from benchmarks.toy import git  # noqa: E402

CLI = [sys.executable, "-m", "agentsearch.cli"]
ONE_FRESH_PAIR = [4, 1]  # a guard's re-measure before 2026-12-06 (pairs, sessions): rows without "guard_check"
GUARDS = ("serve-c1", "serve-c8")
SPEED_WORKLOAD = f'''[[workload]]
name = "speed"
command = "{sys.executable} speed.py {{out}}"
metric = "x"
restarts = 1

'''
SPEED = (
    "import json, sys, random\n"
    "json.dump({'x': float(open('f.txt').read()) * random.gauss(1, 0.01)}, open(sys.argv[1], 'w'))\n"
)


def demo_guards_config(starter: str) -> str:
    """The starter config with its objective replaced by the toy ``speed`` command and no ``[verify]`` or
    ``[sweep]``: the guard workloads, ``[target]`` and ``[gate]`` as the demo has them."""
    blocks = re.split(r"\n(?=\[)", starter)
    kept: list[str] = []
    for block in blocks:
        head = block.split("\n", 1)[0].strip()
        if head == "[[workload]]":
            name = re.search(r'^name = "([^"]+)"', block, re.M)
            if not name or name.group(1) not in GUARDS:
                continue
        elif head.startswith(("[verify", "[sweep", "[[sweep", "[stack")):
            continue
        kept.append(block)
    text = "\n".join(kept)
    at = text.index("[[workload]]")
    missing = [g for g in GUARDS if f'name = "{g}"' not in text]
    if missing:
        raise SystemExit(f"error: the starter config has no workload {missing}: this benchmark needs updating")
    return text[:at] + SPEED_WORKLOAD + text[at:] + "\n"


def power_config(text: str) -> str:
    """For ``--slow-ms`` runs: the gate's coverage check off. The toy objective runs no line of the scheduler, so the
    check would reject the candidate before any guard measured it; the guards' own design and statistics are the
    starter's (an A/A candidate changes no executable line, so the check passes it either way)."""
    if "\n[gate]\n" not in text:
        raise SystemExit("error: the starter config has no [gate]: this benchmark needs updating")
    return text.replace("\n[gate]\n", "\n[gate]\ncoverage = false\n", 1)


def make_fork(where: Path, power: bool = False) -> Path:
    fork = where / "fork"
    subprocess.run([*CLI, "init", "--from-installed", "vllm", str(fork)], check=True, capture_output=True, cwd=ROOT)
    config = demo_guards_config((fork / "agentsearch.toml").read_text())
    (fork / "agentsearch.toml").write_text(power_config(config) if power else config)
    (fork / "speed.py").write_text(SPEED)
    (fork / "f.txt").write_text("1.0")
    git(fork, "add", "-A")
    git(fork, "commit", "-qm", "the demo's guards behind a toy objective")
    return fork


def plant(src: str, slow_ms: float, note: str) -> str:
    """The scheduler with a comment (``slow_ms`` 0: nothing that runs changes) or a sleep in every step."""
    body = f"        # {note}\n"
    if slow_ms > 0:
        body += f"        __import__('time').sleep({slow_ms / 1000!r})\n"
    return at_schedule_start(src, body)


def delayed(src: str, delay_ms: float) -> str:
    """The completion handler with every request waiting ``delay_ms`` before it is served."""
    if src.count(ANCHOR) != 1:
        raise SystemExit(f"error: {SERVING_PY} changed: the planted delay has no single anchor")
    return src.replace(ANCHOR, f"        await __import__('asyncio').sleep({delay_ms / 1000!r})\n{ANCHOR}")


def candidate(fork: Path, i: int, slow_ms: float, delay_ms: float = 0.0) -> str:
    branch = f"run-{i}-{int(time.time())}"
    git(fork, "checkout", "-q", "-b", branch, "main")
    (fork / "f.txt").write_text("1.5")
    (fork / SCHEDULER).write_text(plant((fork / SCHEDULER).read_text(), slow_ms, f"run {i}: {branch}"))
    if delay_ms > 0:
        (fork / SERVING_PY).write_text(delayed((fork / SERVING_PY).read_text(), delay_ms))
    git(fork, "commit", "-qam", f"run {i}")
    git(fork, "checkout", "-q", "main")
    return branch


def baseline_e2e_ms(trials: list[dict], name: str) -> float | None:
    """The median over the baseline's trials of ``name`` of each trial's median request latency (ms): what a planted
    wait per request (``--delay-ms``) is a share of."""
    values = sorted(
        t["metrics"]["e2e_p50_ms"]
        for t in trials
        if t.get("workload") == name
        and t.get("side") == "baseline"
        and t.get("ok")
        and isinstance((t.get("metrics") or {}).get("e2e_p50_ms"), (int, float))
    )
    return values[len(values) // 2] if values else None


def pair_log_ratios(trials: list[dict], name: str, phase: str) -> list[list[float]]:
    """[session, log(candidate / baseline)] of each complete pair of ``name`` measured in ``phase`` ("guard": the
    first run, "guard-check": the fresh engines), in pair order: what tells an engine instance's effect (every pair
    of a session off by the same amount) from per-pair noise."""
    sides: dict[int, dict[str, dict]] = defaultdict(dict)
    for t in trials:
        if t.get("workload") == name and t.get("phase") == phase and t.get("ok") and (t.get("pair") or 0) >= 0:
            sides[t["pair"]][t["side"]] = t
    return [
        [p["candidate"].get("session", 0), round(math.log(p["candidate"]["value"] / p["baseline"]["value"]), 4)]
        for _, p in sorted(sides.items())
        if "candidate" in p and "baseline" in p and p["candidate"].get("value") and p["baseline"].get("value")
    ]


def guard_row(workloads: dict, name: str, trials: list[dict] | None = None) -> dict:
    first = workloads.get(name) or {}
    again = workloads.get(f"{name} (fresh engines)") or {}
    return {
        "baseline_e2e_ms": baseline_e2e_ms(trials or [], name),
        "decision": first.get("decision", "not run"),
        "speedup": first.get("speedup"),
        "pairs": first.get("pairs"),
        "p_value": first.get("p_value"),
        "fresh": again.get("decision"),
        "fresh_speedup": again.get("speedup"),
        "pairs_first": pair_log_ratios(trials or [], name, "guard"),
        "pairs_fresh": pair_log_ratios(trials or [], name, "guard-check"),
    }


def cell(g: dict) -> str:
    s = f"{g['decision']}"
    if g.get("speedup"):
        s += f" {g['speedup'] - 1:+.1%}"
    if g.get("fresh"):
        s += f" -> {g['fresh']}"
    return s


def kind(r: dict) -> str:
    """A/A, or the planted regression of a power run."""
    slow, delay = r.get("slow_ms", 0.0), r.get("delay_ms", 0.0)
    if not slow and not delay:
        return "A/A"
    return " ".join(w for w in (f"+{slow:g}ms/step" if slow else "", f"+{delay:g}ms/req" if delay else "") if w)


def recheck(r: dict) -> tuple[int, int]:
    """The design of a run's guard re-measure on fresh engines: (pairs, sessions)."""
    pairs, sessions = r.get("guard_check") or ONE_FRESH_PAIR
    return int(pairs), int(sessions)


def planted(rows: list[dict], delay_ms: float) -> str:
    """The regression a wait of ``delay_ms`` per request plants in serve-c1 (concurrency 1: every request is
    ``delay_ms`` longer, so output tokens per second fall by d / (e2e + d)), over the runs that recorded the
    baseline's median request latency; '' when none did."""
    e2e = sorted(x for r in rows if (x := r["guards"]["serve-c1"].get("baseline_e2e_ms")))
    if not delay_ms or not e2e:
        return ""
    lo, hi = delay_ms / (e2e[-1] + delay_ms), delay_ms / (e2e[0] + delay_ms)
    span = f"baseline requests {e2e[0]:.0f}-{e2e[-1]:.0f} ms, {len(e2e)} runs"
    return f" (serve-c1 planted {lo:.1%}-{hi:.1%} slower: {span})"


def summary(lines: list[dict], runs: bool = False) -> None:
    ok = [r for r in lines if "verdict" in r]
    if runs:  # one row per run: when, the verdict, each guard's call, change and pairs
        print(
            f"{'start (UTC)':<17} {'candidate':<10} {'verdict':<7} "
            + " ".join(f"{g:<34}" for g in GUARDS)
            + f" {'min':>5}"
        )
        for r in ok:
            cells = []
            for g in GUARDS:
                c = r["guards"][g]
                cells.append(f"{cell(c)} ({c.get('pairs')} pairs, p {c.get('p_value') or 0:.2f})")
            print(
                f"{r['start'][:16]:<17} {kind(r):<10} {r['verdict']:<7} "
                + " ".join(f"{x:<34}" for x in cells)
                + f" {r['minutes']:>5.1f}"
            )
    by_hour: dict[int, list[dict]] = defaultdict(list)
    for r in ok:
        if kind(r) == "A/A":  # the hours table counts false alarms: A/A runs only
            by_hour[r["hour"]].append(r)
    print(
        f"{'hour (UTC)':>10} {'runs':>4} " + " ".join(f"{g + ' first call':>17} {g + ' rejected':>16}" for g in GUARDS)
    )
    for hour, rows in sorted(by_hour.items()):
        print(
            f"{hour:>10} {len(rows):>4} "
            + " ".join(
                f"{sum(r['guards'][g]['decision'] in ('regressed', 'unconfirmed') for r in rows):>17} "
                f"{sum(r['guards'][g]['decision'] == 'regressed' for r in rows):>16}"
                for g in GUARDS
            )
        )
    for slow, delay, check in sorted({(r["slow_ms"], r.get("delay_ms", 0.0), recheck(r)) for r in ok}):
        rows = [r for r in ok if r["slow_ms"] == slow and r.get("delay_ms", 0.0) == delay and recheck(r) == check]
        calls = {g: sum(r["guards"][g]["decision"] in ("regressed", "unconfirmed") for r in rows) for g in GUARDS}
        rejected = {g: sum(r["guards"][g]["decision"] == "regressed" for r in rows) for g in GUARDS}
        merged = sum(r["verdict"] == "merge" for r in rows)
        hours = len({r["hour"] for r in rows})
        what = (
            "A/A"
            if slow == 0 and delay == 0
            else " and ".join(
                w
                for w in (f"slow {slow:g} ms/step" if slow else "", f"delay {delay:g} ms/request" if delay else "")
                if w
            )
        )
        what += f", re-measure {check[0]} pairs/{check[1]} sessions"
        print(
            f"{what}: {len(rows)} evaluations over {hours} hours; "
            + "; ".join(f"{g}: first call {calls[g]}, rejected after fresh engines {rejected[g]}" for g in GUARDS)
            + f"; merged {merged}; {sum(r['minutes'] for r in rows):.0f} min"
            + planted(rows, delay)
        )
    errors = len(lines) - len(ok)
    if errors:
        print(f"{errors} runs ended in the run's error (not counted)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--slow-ms", type=float, default=0.0, help="the candidate's extra sleep per scheduler step")
    ap.add_argument("--delay-ms", type=float, default=0.0, help="the candidate's extra wait per request served")
    ap.add_argument("--out", default="", help="append one JSON line per run here")
    ap.add_argument("--summary", default="", help="print the table of the runs in this file and exit")
    args = ap.parse_args()
    if args.summary:
        summary([json.loads(line) for line in Path(args.summary).read_text().splitlines() if line.strip()], runs=True)
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="guard-aa-") as tmp:
        fork = make_fork(Path(tmp), power=args.slow_ms > 0 or args.delay_ms > 0)
        gate = load_config_text((fork / "agentsearch.toml").read_text()).gate
        print(f"{'run':>3} {'start':<17} {'verdict':<7} {'serve-c1':<32} {'serve-c8':<32} {'min':>5}", flush=True)
        for i in range(args.runs):
            branch = candidate(fork, i, args.slow_ms, args.delay_ms)
            start = datetime.now(UTC)
            t0 = time.time()
            proc = subprocess.run(
                [*CLI, "evaluate", "-C", str(fork), branch, "--json"], capture_output=True, text=True, cwd=ROOT
            )
            row: dict = {
                "start": start.isoformat(timespec="seconds"),
                "hour": start.hour,
                "slow_ms": args.slow_ms,
                "delay_ms": args.delay_ms,
                "minutes": (time.time() - t0) / 60,
                "guard_check": [gate.guard_check_pairs, gate.guard_check_sessions],  # the re-measure's design
            }
            try:
                out = json.loads(proc.stdout)
            except json.JSONDecodeError:
                row["error"] = (proc.stderr.strip().splitlines() or ["no output"])[-1][:500]
                print(f"{i:>3} {row['start'][:16]:<17} error: {row['error']}", flush=True)
            else:
                w = out.get("workloads", {})
                row.update(
                    verdict=out["verdict"],
                    reasons=out.get("reasons", [])[:3],
                    guards={g: guard_row(w, g, out.get("trials") or []) for g in GUARDS},
                )
                print(
                    f"{i:>3} {row['start'][:16]:<17} {out['verdict']:<7} "
                    + " ".join(f"{cell(row['guards'][g]):<32}" for g in GUARDS)
                    + f" {row['minutes']:>5.1f}",
                    flush=True,
                )
            rows.append(row)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
    summary(rows)


if __name__ == "__main__":
    main()

"""Tail guards on the real engine: A/A false alarms and a planted tail regression, evaluation by evaluation (#41).

    .venv/bin/python benchmarks/serving_guard_engine.py [--runs 10] [--delay-ms 0] [--goodput [--slo-ms 30]]
        [--out results.json]

A fork of the embedded vLLM (``agentsearch init --from-installed vllm``) with a toy command objective (the
candidate makes it 1.5x faster, so the guards always run) and two serving guards on the same warm servers, under
the same open-loop load (Poisson, 80 requests/s, 16-token prompts, 2 output tokens, max_num_seqs 8):
``ttft-p50`` (median TTFT over 200 requests) and ``ttft-p99`` (p99 TTFT over 1,000 requests, the fewest a p99 is
judged over). Each run is one ``agentsearch evaluate`` of a fresh candidate branch:

- ``--delay-ms 0``: the serving code is untouched (an A/A for both guards; a comment changes): every rejection
  is a false alarm.
- ``--delay-ms D``: one request in about 50 (by its prompt) waits D ms before it is served: a tail-only
  regression; the p99 guard should reject, the median guard should not.

With ``--goodput`` the objective is instead a serving one, ``goodput_req_s`` (200 requests at 80 requests/s,
``[[slo]]`` TTFT within ``--slo-ms``, 30 by default: every request meets it; near the median TTFT, about 8 ms
here, half of them do), and the candidate changes nothing that runs: every merge is a false one. Each run's line
then names the share of requests that met the SLO on each side.

Prints one line per run (verdict, each guard's decision and change, whether a first call was confirmed on fresh
engines, the run's minutes) and the totals.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "agentsearch.cli"]
SERVING_PY = "vllm/entrypoints/openai/completion/serving.py"
ANCHOR = "        return await self._with_kv_transfer_rejection_cleanup("
CONFIG = """[target]
baseline = "main"
protected = ["bench/**", "*.dist-info/**"]
install = "overlay"
overlay_from = "{site}"

[target.env]
VLLM_CPU_KVCACHE_SPACE = "1"
VLLM_ENABLE_V1_MULTIPROCESSING = "0"
VLLM_CPU_OMP_THREADS_BIND = "nobind"
OMP_NUM_THREADS = "1"

[[workload]]
name = "speed"
command = "{python} speed.py {{out}}"
metric = "x"
restarts = 1

[[workload]]
name = "ttft-p50"
kind = "vllm-serve"
metric = "ttft_p50_ms"
higher_is_better = false
timeout_s = 240
restarts = 1
max_pairs = 6
engine = {{ enforce_eager = true, max_model_len = 512, dtype = "float32", distributed_executor_backend = "uni" }}
params = {{ prompts = 200, input_len = 16, output_len = 2, request_rate = 80, vary_lengths = false }}

[[workload]]
name = "ttft-p99"
kind = "vllm-serve"
metric = "ttft_p99_ms"
higher_is_better = false
timeout_s = 240
restarts = 1
max_pairs = 6
engine = {{ enforce_eager = true, max_model_len = 512, dtype = "float32", distributed_executor_backend = "uni" }}
params = {{ prompts = 1000, input_len = 16, output_len = 2, request_rate = 80, vary_lengths = false }}

[gate]
max_pairs = 6
confirm_pairs = 2
episode_budget = 1
plausibility = 100.0
coverage = false
"""
GOODPUT = """
[[workload]]
name = "goodput"
kind = "vllm-serve"
metric = "goodput_req_s"
timeout_s = 240
restarts = 1
max_pairs = 6
engine = {{ enforce_eager = true, max_model_len = 512, dtype = "float32", distributed_executor_backend = "uni" }}
params = {{ prompts = 200, input_len = 16, output_len = 2, request_rate = 80, vary_lengths = false }}

[[slo]]
metric = "ttft_ms"
max_ms = {slo_ms}
"""
SPEED = (
    "import json, sys, random\n"
    "json.dump({'x': float(open('f.txt').read()) * random.gauss(1, 0.01)}, open(sys.argv[1], 'w'))\n"
)


def git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "bench",
        "GIT_AUTHOR_EMAIL": "b@b",
        "GIT_COMMITTER_NAME": "bench",
        "GIT_COMMITTER_EMAIL": "b@b",
    }
    return subprocess.run(
        ["git", "-c", "commit.gpgsign=false", *args], cwd=repo, env=env, check=True, capture_output=True, text=True
    ).stdout


def make_fork(where: Path, goodput: bool = False, slo_ms: float = 30.0) -> Path:
    fork = where / "fork"
    subprocess.run([*CLI, "init", "--from-installed", "vllm", str(fork)], check=True, capture_output=True, cwd=ROOT)
    site = next(
        line.split('"')[1]
        for line in (fork / "agentsearch.toml").read_text().splitlines()
        if line.startswith("overlay_from")
    )
    config = CONFIG.format(site=site, python=sys.executable)
    if goodput:  # the goodput workload first: the objective
        head, _, rest = config.partition("[[workload]]")
        config = head + GOODPUT.format(slo_ms=slo_ms).lstrip() + "\n[[workload]]" + rest
    (fork / "agentsearch.toml").write_text(config)
    (fork / "speed.py").write_text(SPEED)
    (fork / "f.txt").write_text("1.0")
    (fork / "serving.json").write_text(json.dumps({"engine": {"max_num_seqs": 8}, "env": {}}, indent=2) + "\n")
    git(fork, "add", "-A")
    git(fork, "commit", "-qm", "tail guards")
    return fork


def plant(src: str, delay_ms: float, note: str = "") -> str:
    """The fork's completion handler with the planted tail: one request in about 50 (by its prompt) waits
    ``delay_ms`` before it is served, the others do not (0: a comment only, an A/A change)."""
    if src.count(ANCHOR) != 1:
        raise ValueError(f"{SERVING_PY} changed: the planted delay has no single anchor")
    if delay_ms <= 0:
        return src.replace(ANCHOR, f"        # {note or 'nothing changes here'}\n{ANCHOR}")
    return src.replace(
        ANCHOR,
        f"""        import asyncio as _asyncio, zlib as _zlib
        if _zlib.crc32(repr(request.prompt).encode()) % 50 == 0:
            await _asyncio.sleep({delay_ms / 1000!r})
{ANCHOR}""",
    )


def candidate(fork: Path, i: int, delay_ms: float) -> str:
    branch = f"run-{i}"
    git(fork, "checkout", "-q", "-b", branch, "main")
    (fork / "f.txt").write_text("1.5")
    src = plant((fork / SERVING_PY).read_text(), delay_ms, f"run {i}: nothing changes here")
    (fork / SERVING_PY).write_text(src)
    git(fork, "commit", "-qam", f"run {i}")
    git(fork, "checkout", "-q", "main")
    return branch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--delay-ms", type=float, default=0.0)
    ap.add_argument("--goodput", action="store_true", help="the objective is goodput_req_s (an A/A objective)")
    ap.add_argument("--slo-ms", type=float, default=30.0, help="--goodput: the TTFT SLO in milliseconds")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="serving-guards-") as tmp:
        fork = make_fork(Path(tmp), args.goodput, args.slo_ms)
        print(
            f"{'run':>3} {'verdict':<7} {'p50 guard':<22} {'p99 guard':<22} {'p99 first call':<15} {'min':>5}",
            flush=True,
        )
        for i in range(args.runs):
            branch = candidate(fork, i, args.delay_ms)
            t0 = time.time()
            proc = subprocess.run(
                [*CLI, "evaluate", "-C", str(fork), branch, "--json"], capture_output=True, text=True, cwd=ROOT
            )
            minutes = (time.time() - t0) / 60
            try:
                out = json.loads(proc.stdout)
            except json.JSONDecodeError:
                print(f"{i:>3} error: {proc.stderr.strip().splitlines()[-1:]}", flush=True)
                rows.append({"run": i, "error": proc.stderr[-2000:]})
                continue
            w = out.get("workloads", {})

            def cell(name: str) -> str:
                s = w.get(name)  # noqa: B023 - called within the iteration
                return (
                    f"{s['decision']} {s['speedup'] - 1:+.1%}"
                    if s and s.get("speedup")
                    else (s or {}).get("decision", "not run")
                )

            met = {
                side: [
                    t["metrics"].get("slo_attainment")
                    for t in out.get("trials", [])
                    if t.get("ok") and t["workload"] == "goodput" and t["side"] == side
                ]
                for side in ("baseline", "candidate")
            }
            attained = " ".join(f"{side} {sum(v) / len(v):.0%}" for side, v in met.items() if v and None not in v)
            medians = sorted(
                t["metrics"]["ttft_p50_ms"]
                for t in out.get("trials", [])
                if t.get("ok") and t["workload"] == "goodput" and t["metrics"].get("ttft_p50_ms")
            )
            if medians:
                attained += f" (median TTFT {medians[len(medians) // 2]:.1f} ms)"
            fresh = w.get("ttft-p99 (fresh engines)")
            first = (
                "confirmed" if fresh and fresh.get("decision") == "regressed" else ("not confirmed" if fresh else "-")
            )
            print(
                f"{i:>3} {out['verdict']:<7} {cell('ttft-p50'):<22} {cell('ttft-p99'):<22} {first:<15} {minutes:>5.1f}"
                + (f"  goodput {cell('goodput')}, SLO met: {attained}" if args.goodput else "")
                + ("" if out["verdict"] == "merge" else f"  {out['reasons'][:1]}"),
                flush=True,
            )
            p99 = [t for t in out.get("trials", []) if t.get("ok") and t["workload"] == "ttft-p99"]
            rows.append(
                {
                    "run": i,
                    "verdict": out["verdict"],
                    "reasons": out.get("reasons"),
                    "minutes": minutes,
                    "slo_attainment": met,
                    "workloads": {
                        k: {x: v.get(x) for x in ("decision", "speedup", "ci", "pairs", "p_value")}
                        for k, v in w.items()
                    },
                    "p99_trials": [
                        {
                            "side": t["side"],
                            "ttft_p99_ms": t["metrics"].get("ttft_p99_ms"),
                            "ttft_p50_ms": t["metrics"].get("ttft_p50_ms"),
                            "lag_p99_ms": t["metrics"].get("generator_lag_p99_ms"),
                        }
                        for t in p99
                    ],
                }
            )
    ok = [r for r in rows if "verdict" in r]
    rejected_p99 = sum(1 for r in ok if any(str(x).startswith("guard-workloads: ttft-p99") for x in r["reasons"]))
    rejected_p50 = sum(1 for r in ok if any(str(x).startswith("guard-workloads: ttft-p50") for x in r["reasons"]))
    print(
        f"delay {args.delay_ms:g} ms: {len(ok)} runs; rejected by the p99 guard {rejected_p99}, "
        f"by the median guard {rejected_p50}; "
        f"merged {sum(r['verdict'] == 'merge' for r in ok)}; {sum(r['minutes'] for r in ok):.0f} min"
    )
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

"""Op-level speedups of the kernel library's CPU providers against vLLM's `native`, with 95% CIs.

Creates the embedded vLLM fork in a temporary directory, writes one kernel proposal per CPU provider
and op (`agentsearch kernels propose`), and measures each with `agentsearch kernels bench`: the
candidate's provider on every generated and hidden case first, then interleaved pairs of fresh
processes (each side in its own sandbox), the gate's paired statistics. Prints one row per provider.

    python benchmarks/kernel_micro.py [--pairs 8] [--op rms_norm] [--kind cpu|triton] [--keep DIR]

`--kind triton` measures the Triton providers instead (a CUDA machine: `.ci/gpu-check` runs it).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels import catalog  # noqa: E402


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentsearch.cli", *args], capture_output=True, text=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=8, help="timing pairs at most per provider (a look halfway)")
    ap.add_argument("--op", action="append", help="only this op (repeatable)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--kind", default="cpu", choices=("cpu", "triton"), help="which providers (triton: on a CUDA device)"
    )
    ap.add_argument("--keep", type=Path, help="create the fork here and keep it")
    args = ap.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="agentsearch-kernels-")) / "fork"
    if cli("init", "--from-installed", "vllm", str(root)).returncode != 0:
        print("could not create the fork", file=sys.stderr)
        return 1
    rows = []
    print(
        f"{'op':20s} {'provider':18s} {'native us':>10s} {'provider us':>12s} {'speedup':>8s} {'95% CI':>16s} "
        f"{'pairs':>5s} {'s':>5s}  status"
    )
    for p in catalog.providers(kind=args.kind):
        if args.op and p.op not in args.op:
            continue
        prop = cli("kernels", "propose", "-C", str(root), p.op, "--impl", p.name, "--json")
        if prop.returncode != 0:
            print(f"{p.op:20s} {p.name:18s} propose failed: {prop.stderr.strip()[-200:]}")
            continue
        branch = json.loads(prop.stdout)["branch"]
        t0 = time.perf_counter()
        b = cli(
            "kernels",
            "bench",
            "-C",
            str(root),
            p.op,
            "--candidate",
            branch,
            "--candidate-provider",
            p.name,
            "--pairs",
            str(args.pairs),
            "--seed",
            str(args.seed),
            "--json",
        )
        wall = time.perf_counter() - t0
        try:
            data = json.loads(b.stdout)
        except ValueError:
            print(f"{p.op:20s} {p.name:18s} bench failed: {b.stderr.strip()[-300:]}")
            continue
        r = data["micro"]["ops"][0]
        if r["speedup"] is None:
            print(f"{p.op:20s} {p.name:18s} {data['status']}: {data['detail'][:160]}")
            continue
        ci = f"[{r['ci'][0]:.2f}, {r['ci'][1]:.2f}]"
        print(
            f"{p.op:20s} {p.name:18s} {r['baseline_us']:10.0f} {r['candidate_us']:12.0f} {r['speedup']:7.2f}x "
            f"{ci:>16s} "
            f"{r['pairs']:5d} {wall:5.0f}  {data['status']}"
        )
        rows.append(
            {
                "op": p.op,
                "provider": p.name,
                **{k: r[k] for k in ("baseline_us", "candidate_us", "speedup", "ci", "pairs")},
                "status": data["status"],
                "wall_s": round(wall, 1),
            }
        )
    print(json.dumps({"rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

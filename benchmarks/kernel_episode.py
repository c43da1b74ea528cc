"""A kernel proposal from the sweep, judged end to end on the real vLLM fork.

Creates the embedded vLLM fork (the starter config: throughput objective, serving guards,
distribution check) in a temporary directory; commits on its baseline one provider of the kernel
library, registered in the fork's kernel registry but not selected (what a merged
`agentsearch kernels propose` leaves once its priority is reverted, or what a fork that ships
providers looks like); removes the starter's other sweep knobs so that the sweep's only knob is
the derived `ir_op_priority.<op>`; then runs one sweep episode. The proposal it makes selects the
provider in `serving.json`'s `ir_op_priority`; the evaluation runs the micro stage (op-level
correctness and timing, before any engine), then the engines (objective, guards, confirmation),
then the distribution check. Prints the verdict, each check, and writes the evidence report.

    python benchmarks/kernel_episode.py [--op rms_norm] [--impl agentsearch_cpu_c] [--seed 1] [--keep DIR]

Engines: two start-ups per phase, minutes on 2 cores (wrap it in `flock /tmp/agentsearch-engine.lock`
where engines share the machine).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernels import catalog  # noqa: E402
from kernels import fork as kfork  # noqa: E402


def cli(*args: str, stream: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agentsearch.cli", *args],
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=None if stream else subprocess.PIPE,
    )


def git(fork: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(fork), *args], check=True, capture_output=True, text=True).stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--op", default="rms_norm")
    ap.add_argument("--impl", default="agentsearch_cpu_c", help="a CPU provider of the kernel library (kernels list)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", type=Path, help="create the fork here and keep it")
    args = ap.parse_args()
    try:
        p = catalog.provider(args.op, args.impl)
    except KeyError as exc:
        raise SystemExit(str(exc.args[0])) from None
    if p.kind != "cpu":
        raise SystemExit(f"{args.impl} is a {p.kind} provider; this machine's sweep proposes CPU providers only")
    fork = args.keep or Path(tempfile.mkdtemp(prefix="agentsearch-kernel-episode-")) / "fork"
    made = cli("init", "--from-installed", "vllm", str(fork))
    if made.returncode != 0:
        raise SystemExit(f"could not create the fork: {made.stderr.strip()[-400:]}")
    cfg = (fork / "agentsearch.toml").read_text()
    cfg = re.sub(r"\n\[\[sweep\.knob\]\]\n.*?(?=\n\[|\Z)", "\n", cfg, flags=re.S)  # the kernel knob only
    (fork / "agentsearch.toml").write_text(cfg)
    init = fork / kfork.KERNELS_INIT
    init.write_text(kfork.kernels_init(init.read_text(), p))
    (fork / kfork.module_path(p)).write_text(kfork.module_text(p))
    git(fork, "add", "-A")
    git(
        fork,
        "-c",
        "commit.gpgsign=false",
        "commit",
        "-qm",
        f"register {p.name} for {args.op} (not selected); sweep: kernel knob only",
    )
    print(f"fork {fork}: baseline registers {p.name} for {args.op}; running one sweep episode", file=sys.stderr)
    t0 = time.perf_counter()
    ep = cli(
        "episode",
        "-C",
        str(fork),
        "--proposer",
        "sweep",
        "--budget",
        "1",
        "--seed",
        str(args.seed),
        "--json",
        stream=True,
    )
    wall = time.perf_counter() - t0
    try:
        summary = json.loads(ep.stdout)
    except ValueError:
        raise SystemExit(f"the episode printed no JSON (exit {ep.returncode})") from None
    row = summary["proposals"][0] if summary["proposals"] else None
    if row is None:
        raise SystemExit(f"no proposal was made: {summary['reason']}")
    from agentsearch.workspace import Workspace
    from history import HistoryLog

    verdicts = [
        e.data
        for e in HistoryLog(Workspace.open(fork).state / "history.jsonl").entries()
        if e.kind == "verdict" and e.proposal == row["proposal"]
    ]
    md = fork.parent / "kernel-proposal.md"
    cli("report", "-C", str(fork), row["proposal"], "-o", str(md))
    print(f"\nproposal {row['proposal']}: {row['title']}")
    print(f"verdict {row['verdict']}{' (merged)' if row['merged'] else ''} in {wall:.0f} s: {row['headline']}")
    for r in row["reasons"]:
        print(f"  reason: {r}")
    for c in verdicts[-1].get("checks") or [] if verdicts else []:
        print(f"  {c.get('name', '?'):14s} {c.get('status', '?'):8s} {str(c.get('detail', ''))[:160]}")
    print(f"evidence report: {md}")
    return 0 if row["verdict"] in ("merge", "reject") else 1


if __name__ == "__main__":
    raise SystemExit(main())

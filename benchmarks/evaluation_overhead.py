"""Where does the wall time of one real evaluation go? Engine start-up, measurement, overhead.

Creates the embedded vLLM fork in a temporary directory, commits a configuration change
(max_num_seqs 4 -> 32 in serving.json) and evaluates it with the starter config on the tiny
model, then prints the split. Target: orchestration overhead <= 2% of the wall time.

    python benchmarks/evaluation_overhead.py [--keep DIR]
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

from agentsearch.evaluation import evaluate  # noqa: E402
from agentsearch.workspace import Workspace  # noqa: E402
from agentsearch.workspace.git import run_git  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep", type=Path, help="create the fork here and keep it")
    args = ap.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="agentsearch-overhead-")) / "fork"
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "agentsearch.cli", "init", "--from-installed", "vllm", str(root)],
        check=True,
        capture_output=True,
    )
    t_fork = time.perf_counter() - t0
    t1 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "agentsearch.cli", "model", "tiny"], check=True, capture_output=True)
    t_model = time.perf_counter() - t1  # one-time: cached for every later evaluation
    serving = json.loads((root / "serving.json").read_text())
    serving["engine"]["max_num_seqs"] = 32
    run_git("checkout", "-q", "-b", "seqs32", cwd=root)
    (root / "serving.json").write_text(json.dumps(serving, indent=2) + "\n")
    run_git("commit", "-q", "-am", "max_num_seqs 32", cwd=root)
    run_git("checkout", "-q", "main", cwd=root)
    ws = Workspace.open(root)
    result = evaluate(ws, "seqs32", progress=lambda stage, detail: print(f"  {stage}: {detail}", file=sys.stderr))
    t = result.timing().to_json()
    print(
        f"fork created in {t_fork:.1f} s, tiny model ready in {t_model:.1f} s "
        "(one-time costs, not part of an evaluation)"
    )
    print(f"verdict: {result.verdict.verdict} {' / '.join(result.verdict.reasons)}")
    for name, w in result.workloads.items():
        if w.speedup:
            print(
                f"  {name}: speedup {w.speedup:.3f} CI [{w.ci[0]:.3f}, {w.ci[1]:.3f}] "
                f"after {w.pairs} pairs ({w.decision})"
            )
        else:
            print(f"  {name}: {w.decision}")
    trials = len(result.trials)
    print(
        f"wall {t['wall_s']:.1f} s = engine start-up/shutdown {t['engine_s']:.1f} s "
        f"+ measurement {t['measurement_s']:.1f} s "
        f"({trials} trials) + orchestration overhead {t['overhead_s']:.2f} s ({t['overhead_pct']:.2f}%)"
    )
    print(f"target overhead <= 2%: {'MET' if t['overhead_pct'] <= 2 else 'NOT MET'}")
    if t.get("verify_s"):
        rest = t["wall_s"] - t["verify_s"]
        share = 100 * t["verify_s"] / rest if rest > 0 else float("inf")
        print(
            f"distribution checks (verify, the last check) {t['verify_s']:.1f} s: "
            f"+{share:.0f}% on the rest of the evaluation "
            f"({rest:.1f} s); target <= 25%: {'MET' if share <= 25 else 'NOT MET'}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

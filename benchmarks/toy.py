"""The toy command target (its bench and config), shared by the tests (tests/conftest.py) and the benchmarks: it reads a
speed factor (and failure modes) from the worktree and adds real random noise (``TOY_CV``)."""

import sys

TOY_BENCH = """
import json, os, random, sys, time
seed, out = int(sys.argv[1]), sys.argv[2]
mode = open("mode.txt").read().strip() if os.path.exists("mode.txt") else ""
if mode == "crash":
    sys.stderr.write("Traceback: ZeroDivisionError: division by zero\\n")
    sys.exit(1)
if mode == "hang":
    time.sleep(3600)
factor = float(open("speed.txt").read())
rng = random.Random()
cv = float(os.environ.get("TOY_CV", "0.02"))
json.dump({"ops_s": 1000.0 * factor * rng.gauss(1.0, cv), "seed": seed}, open(out, "w"))
"""

TOY_CONFIG = """
[target]
baseline = "main"
protected = ["bench/**"]

[target.env]
TOY_CV = "0.02"

[[workload]]
name = "speed"
command = "{python} bench/bench.py {{seed}} {{out}}"
metric = "ops_s"
higher_is_better = true
timeout_s = {timeout}
"""


def toy_config(timeout: float = 10, extra: str = "") -> str:
    return TOY_CONFIG.format(python=sys.executable, timeout=timeout) + extra

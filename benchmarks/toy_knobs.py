"""A toy command target whose speed depends on hidden settings of JSON knobs (benchmark + tests).

params.json holds knobs k0..k{N-1}, each 0..3. Hidden: GOOD[k] = (value, gain) — the value that
speeds the bench up by ``gain``; BAD[k] = value that crashes the bench. Other values: no effect.
"""

import json
import sys

BENCH = """
import json, os, random, sys
seed, out = int(sys.argv[1]), sys.argv[2]
p = json.load(open("params.json"))
good = {good}
bad = {bad}
speed = 1.0
for k, v in p.items():
    if k in bad and v == bad[k]:
        sys.stderr.write(f"RuntimeError: {{k}}={{v}} is not supported\\n")
        sys.exit(1)
    if k in good and v == good[k][0]:
        speed *= 1 + good[k][1]
json.dump({{"ops_s": 1000.0 * speed * random.gauss(1.0, 0.02)}}, open(out, "w"))
"""


def config(python: str, knobs: int, budget: int = 10) -> str:
    text = f'''[target]
baseline = "main"
protected = ["bench/**"]

[[workload]]
name = "speed"
command = "{python} bench/bench.py {{seed}} {{out}}"
metric = "ops_s"
timeout_s = 10

[gate]
episode_budget = {budget}
max_pairs = 10
confirm_pairs = 3
'''
    for i in range(knobs):
        text += f'''
[[sweep.knob]]
name = "k{i}"
where = "json"
file = "params.json"
values = [0, 1, 2, 3]
category = "{"scheduling" if i % 2 else "memory"}"
'''
    return text


def files(knobs: int, good: dict, bad: dict) -> dict:
    return {
        "agentsearch.toml": config(sys.executable, knobs),
        "bench/bench.py": BENCH.format(good=repr(good), bad=repr(bad)),
        "params.json": json.dumps({f"k{i}": 0 for i in range(knobs)}, indent=2) + "\n",
    }

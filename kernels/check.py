"""Check what a side's worker wrote against the trusted references (a script; no side code runs here).

    python kernels/check.py [--rounds R] [--salted] CASES.json SAMPLES.npz [SAMPLES.npz ...]

Each samples file holds ``out{i}_{j}`` (output j of case i) and, from a correctness run, ``in{i}_{j}``
(argument j after the call). The inputs are rebuilt from the cases' seeds; the reference runs on
them (``--salted``: each timing round's inputs salted as the worker salted them at ``go``, from the
salts the orchestrator sent, which it keeps beside each samples file as ``SAMPLES.npz.salts.json``);
the outputs must match within the op's tolerance and the inputs must be unchanged. Prints one
JSON object: ``{"ok": bool, "checked": n, "failures": [...]}``.
"""

from __future__ import annotations

import json
import os
import sys
import zipfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from kernels import specs  # noqa: E402

MAX_BYTES = 1 << 30


def salts_of(path: str, rounds: int) -> tuple[list[int], list[list[float]]] | None:
    """The round salts the orchestrator kept beside ``path``, and the output sums the worker's ``done`` of each
    round committed to (None: missing or malformed)."""
    try:
        with open(path + ".salts.json") as f:
            kept = json.load(f)
        salts, sums = kept["salts"], kept["sums"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    ok = isinstance(salts, list) and len(salts) == rounds and all(type(x) is int and x >= 0 for x in salts)
    ok = ok and isinstance(sums, list) and len(sums) == rounds and all(isinstance(x, list) for x in sums)
    return (salts, sums) if ok else None


def check_file(
    cases: list, path: str, salts: list[int] | None = None, sums: list[list[float]] | None = None
) -> tuple[int, list[str]]:
    """``salts``: one per timing round of ``cases`` (their calls salted as the worker salted them); ``sums``: per
    round, the sum of all its outputs as the worker committed to them inside the round (the outputs written here
    must be those)."""
    if os.path.islink(path) or not os.path.isfile(path):
        return 0, [f"{os.path.basename(path)}: missing (the worker wrote no samples)"]
    with zipfile.ZipFile(path) as z:  # sizes before loading: a side cannot make the checker load gigabytes
        if sum(i.file_size for i in z.infolist()) > MAX_BYTES:
            return 0, [f"{os.path.basename(path)}: larger than {MAX_BYTES} bytes"]
    data = np.load(path, allow_pickle=False)
    failures: list[str] = []
    checked = 0
    every = [specs.make_inputs(case) for case in cases]
    per_round = len(cases) // len(salts) if salts else len(cases)
    if salts:
        for r, salt in enumerate(salts):  # the round built and salted as the worker built and salted it
            round_in = specs.RoundInputs(every[r * per_round : (r + 1) * per_round])
            round_in.salt(salt)
            every[r * per_round : (r + 1) * per_round] = round_in.batch
    written: list[list] = [[] for _ in sums] if sums is not None else []  # per round: the outputs written
    for i, case in enumerate(cases):
        args = every[i]
        want = specs.outputs_of(specs.REFERENCES[case["op"]](*args))
        got = []
        for j in range(len(want)):
            key = f"out{i}_{j}"
            if key not in data.files:
                got = None
                break
            got.append(torch.from_numpy(data[key]).to(want[j].dtype))
        if got is None:
            failures.append(f"{specs.describe(case)}: output missing")
            continue
        if sums is not None:
            written[i // per_round] += [data[f"out{i}_{j}"] for j in range(len(got))]
        why = specs.compare(case, got, want)
        if not why and f"in{i}_0" in data.files:
            for j, a in enumerate(args):
                if isinstance(a, torch.Tensor):
                    after = data.get(f"in{i}_{j}")
                    if after is None or not np.array_equal(after, a.to(torch.float32).numpy()):
                        why = f"argument {j} changed by the call (inputs must not be modified)"
                        break
        if why:
            failures.append(f"{specs.describe(case)}: {why}")
        checked += 1
    for r, outs in enumerate(
        written if sums is not None else []
    ):  # what the worker wrote must be what its done committed to inside the round
        if len(sums[r]) != 1 or not specs.checksum_agrees(sums[r][0], outs):
            failures.append(
                f"round {r + 1}: the outputs written are not those the worker committed to inside the round "
                "(their sum differs): work done after the round, or outputs replaced"
            )
    return checked, failures


def main() -> int:
    argv = sys.argv[1:]
    rounds, salted = 1, False
    if argv[:1] == ["--rounds"]:
        rounds, argv = int(argv[1]), argv[2:]
    if argv[:1] == ["--salted"]:
        salted, argv = True, argv[1:]
    with open(argv[0]) as f:
        cases = specs.expand_rounds(json.load(f), rounds)
    checked, failures = 0, []
    for path in argv[1:]:
        kept = salts_of(path, rounds) if salted else None
        if salted and kept is None:
            failures.append(f"{os.path.basename(path)}: its round salts are missing")
            continue
        n, fails = check_file(cases, path, *(kept or (None, None)))
        checked += n
        failures += [f"{os.path.basename(path)}: {x}" if len(argv) > 2 else x for x in fails]
    print(json.dumps({"ok": not failures, "checked": checked, "failures": failures[:20], "failed": len(failures)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

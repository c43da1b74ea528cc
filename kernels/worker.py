"""Run one side's IR-op providers, in that side's sandbox, in a fresh process (a script, not imported).

    python kernels/worker.py {correct|time} --op OP --priority P1,P2 --cases CASES.json --samples OUT.npz --out METRICS.json

The side's own vLLM is imported (``PYTHONPATH`` = its worktree): its ``vllm.kernels`` registers its
providers, and the op is called the way the engine calls it — ``set_priority`` then dispatch per call
(``supports_args`` decides, the last provider catches the rest). This process judges nothing: it
writes every output (and, in ``correct`` mode, every input after the call) to ``--samples``; the
checker (``kernels/check.py``, no side code in it) rebuilds the inputs from their seeds and compares.

``time``: every timed call gets its own fresh inputs (built before the clock runs, none reused),
after a warm-up on other inputs; the mix runs ``--rounds`` times (each round on fresh inputs) and the
metric ``us`` is the median round's summed wall time of the calls (CPU:
``perf_counter`` bound before the side's code is imported; GPU: CUDA events around each call with
the L2 flushed before it and a device-wide synchronize after it, so work on a side stream counts).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

_clock = time.perf_counter  # bound before any side code runs

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from kernels import specs  # noqa: E402


def _arrays(prefix: str, tensors: list, store: dict) -> None:
    for j, t in enumerate(tensors):
        if isinstance(t, torch.Tensor):
            store[f"{prefix}_{j}"] = t.detach().to("cpu", torch.float32).contiguous().numpy()


def _round_seed(seed: int, r: int) -> int:
    """The data seed of a case in timing round ``r`` > 0 (the checker derives the same)."""
    return specs.round_seed(seed, r)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("correct", "time"))
    ap.add_argument("--op", required=True)
    ap.add_argument("--priority", required=True)
    ap.add_argument("--cases", required=True)
    ap.add_argument("--samples", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5, help="time: rounds of the mix (each on its own fresh inputs); the median counts")
    a = ap.parse_args()
    with open(a.cases) as f:
        cases = json.load(f)
    device = a.device
    priority = [p for p in a.priority.split(",") if p]
    if "native" not in priority:  # what the engine does: the platform default (native on CPU) comes last
        priority.append("native")

    # build every input before the side's code is imported: it cannot see or prepare them
    rounds = a.rounds if a.mode == "time" else 1
    inputs = [specs.make_inputs(c if r == 0 else {**c, "seed": _round_seed(c["seed"], r)}, device) for r in range(rounds) for c in cases]
    warm = [specs.make_inputs({**c, "seed": c["seed"] ^ 0x5A5A5A5A}, device) for c in cases[: a.warmup]]

    from vllm import ir  # noqa: E402  (the side's vLLM)
    from vllm.platforms import current_platform  # noqa: E402

    current_platform.import_ir_kernels()
    op = getattr(ir.ops, a.op)
    unknown = [p for p in priority if p not in op.impls]
    if unknown:
        print(f"provider {', '.join(unknown)} of {a.op} is not registered in this side (it has {', '.join(op.impls)})", file=sys.stderr)
        return 3
    store: dict = {}
    used: dict[str, int] = {}
    aliased = 0
    metrics: dict = {}
    with op.set_priority(priority), torch.no_grad():
        if a.mode == "correct":
            for i, args in enumerate(inputs):
                spans = specs.storages(args)
                used[op.dispatch(*args).provider] = used.get(op.dispatch(*args).provider, 0) + 1
                outs = specs.outputs_of(op._inner_call(*args))
                aliased += specs.aliases(outs, spans)
                _arrays(f"out{i}", outs, store)
                _arrays(f"in{i}", list(args), store)  # the inputs after the call: were they changed?
            metrics = {"cases": len(inputs), "aliased": aliased}
        else:
            cuda = device.startswith("cuda")
            flush = torch.empty(256 << 20, dtype=torch.int8, device=device) if cuda else None
            for args in warm:
                op._inner_call(*args)
            totals = [0.0] * rounds
            for i, args in enumerate(inputs):
                used[op.dispatch(*args).provider] = used.get(op.dispatch(*args).provider, 0) + 1
                if cuda:
                    assert flush is not None
                    flush.zero_()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    torch.cuda.synchronize()
                    start.record()
                    res = op._inner_call(*args)
                    end.record()
                    torch.cuda.synchronize()  # device-wide: a side stream's work is waited for too
                    totals[i // len(cases)] += start.elapsed_time(end) * 1e3
                else:
                    t0 = _clock()
                    res = op._inner_call(*args)
                    totals[i // len(cases)] += (_clock() - t0) * 1e6
                outs = specs.outputs_of(res)
                aliased += specs.aliases(outs, specs.storages(args))
                _arrays(f"out{i}", outs, store)
            totals.sort()
            metrics = {"us": totals[len(totals) // 2], "rounds": rounds, "calls": len(inputs), "aliased": aliased}
    metrics["providers"] = ",".join(f"{k}:{v}" for k, v in sorted(used.items()))[:200]
    np.savez(a.samples, **store)
    with open(a.out, "w") as f:
        json.dump(metrics, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())

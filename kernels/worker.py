"""Run one side's IR-op providers, in that side's sandbox, in a fresh process (a script, not imported).

    python kernels/worker.py {correct|time} --side WORKTREE --op OP --priority P1,P2 --cases CASES.json
        --samples OUT.npz --out METRICS.json [--fd N]

The side's own vLLM is imported from ``--side`` (its worktree), which goes on ``sys.path`` only once every
module of this instrument is loaded (this script's helpers, numpy, torch, what ``np.savez`` imports): a
module of the side's named like one of ours (a ``kernels`` package, a ``zipfile.py``) is never the
instrument's. Its ``vllm.kernels`` registers its providers, and the op is called the way the engine calls it
— ``set_priority`` then dispatch per call (``supports_args`` decides, the last provider catches the rest).
This process judges nothing: it writes every output (and, in ``correct`` mode, every input after the call)
to ``--samples``; the checker (``kernels/check.py``, no side code in it) rebuilds the inputs from their
seeds and compares.

``time`` (``--fd``: the orchestrator's result pipe; its commands on stdin): no number this process reports is
a timing. Every timed call gets its own fresh inputs (built before the side's code is imported, none reused),
after a warm-up on other inputs. The mix runs ``--rounds`` times, each on its own fresh inputs, each on the
orchestrator's word: it sends ``go r SALT``, this process salts the round's inputs (``specs.RoundInputs``: one
element of every row of every call moved, at a column and by an amount drawn from the salt, which no side code
could know before: a result computed before the round is wrong on every row), runs the round's calls back to
back (the engine's way: GPU launches queue, one device-wide synchronize ends the round, so work on a side
stream counts) and answers ``done``; the orchestrator times that round trip on its own clock
(``agentsearch/micro.py``). Each call's outputs are copied the moment it returns, inside the round, and
``done`` commits to them: it carries the float64 sum of every copy, read inside the round, which the checker
compares with the outputs this process writes after the rounds. This process runs the side's code, which can
rewrite anything in it (the red team's round 4b replaced its helpers and answered ``done`` from a thread
before any work): what holds is that the sums in ``done`` are only right if the outputs existed when it was
sent, and only the checker (a separate process) and the orchestrator judge. An output must also be a plain
``torch.Tensor`` and no torch function or dispatch mode may be active (else the trial fails at once; a side
that removes this check still has to produce the values before ``done``). ``done`` also carries this process's
own readings for the orchestrator to check against its clock (the round on ``perf_counter``, bound before any
side code; the summed calls on it, or on CUDA events on a GPU): a clock that disagrees fails the trial. The L2
is flushed before each round (GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

_clock = time.perf_counter  # bound before any side code runs

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)  # the instrument's helpers first; the side's worktree is added after they are loaded

import io  # noqa: E402
import zipfile  # noqa: E402, F401  (np.savez's: loaded before the side's path exists)

import numpy as np  # noqa: E402
import torch  # noqa: E402

from kernels import specs  # noqa: E402

_modes = (torch._C._len_torch_function_stack, torch._C._len_torch_dispatch_stack)  # bound before any side code


class Tampered(Exception):
    """A provider's output or the process's torch state is not what a kernel may leave."""


def _plain(outs: list) -> list:
    """``outs`` after the checks that make their copies the values the call returned."""
    for o in outs:
        if type(o) is not torch.Tensor:
            raise Tampered(f"the provider returned a {type(o).__name__}, not a plain torch.Tensor")
    if any(f() for f in _modes):
        raise Tampered("a torch function or dispatch mode is active after the provider's call")
    return outs


def _arrays(prefix: str, tensors: list, store: dict) -> None:
    """Copies (never views: what the caller got when the call returned) of ``tensors`` into ``store``."""
    for j, t in enumerate(tensors):
        if isinstance(t, torch.Tensor):
            store[f"{prefix}_{j}"] = t.detach().to("cpu", torch.float32, copy=True).contiguous().numpy()


def _timed(
    a: argparse.Namespace,
    op,
    inputs: list,
    warm: list,
    per_round: int,
    rounds: int,
    device: str,
    used: dict,
    store: dict,
) -> dict | None:
    """The timed rounds, each on the orchestrator's ``go`` (stdin) and answered ``done`` on ``--fd``; the
    metrics (None: the orchestrator stopped asking). ``inputs``: each round's ``specs.RoundInputs``."""
    cuda = device.startswith("cuda")
    flush = torch.empty(256 << 20, dtype=torch.int8, device=device) if cuda else None
    for args in warm:
        op._inner_call(*args)
    specs.RoundInputs(warm, device).salt(1)  # the salt's own first-call costs, paid outside the rounds
    results: list = []
    calls_us: list[float] = []

    def send(obj: dict) -> None:
        os.write(a.fd, (json.dumps(obj) + "\n").encode())

    send({"event": "ready"})
    for r in range(rounds):
        round_in = inputs[r]
        batch = round_in.batch
        for args in batch:
            provider = op.dispatch(*args).provider
            used[provider] = used.get(provider, 0) + 1
        if flush is not None:
            flush.zero_()
            torch.cuda.synchronize()
        words = sys.stdin.readline().split()
        if len(words) != 3 or words[:2] != ["go", str(r)] or not words[2].isdigit():
            return None
        t0 = _clock()
        round_in.salt(int(words[2]))  # inside the round: what the calls get was unknown until now
        events = []
        total = 0.0
        copied: list = []
        for args in batch:
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                res = op._inner_call(*args)
                end.record()
                events.append((start, end))
            else:
                c0 = _clock()
                res = op._inner_call(*args)
                total += _clock() - c0
            outs = _plain(specs.outputs_of(res))
            copies = [o.detach().clone() for o in outs]  # the outputs as the call left them
            copied += copies
            results.append((outs, copies, args))
        if cuda:
            torch.cuda.synchronize()  # device-wide: a side stream's work is waited for too
            total = sum(s.elapsed_time(e) for s, e in events) / 1e3
        digest = specs.commit(copied)  # read inside the round (the checker sums what this process writes later)
        t1 = _clock()
        calls_us.append(total * 1e6)
        send({"event": "done", "round": r, "span_us": (t1 - t0) * 1e6, "calls_us": total * 1e6, "sums": digest})
    aliased = 0
    for i, (outs, copies, args) in enumerate(results):
        aliased += specs.aliases(outs, specs.storages(args))
        _arrays(f"out{i}", copies, store)
    calls_us.sort()
    return {
        "worker_us": calls_us[len(calls_us) // 2],
        "rounds": rounds,
        "calls": rounds * per_round,
        "aliased": aliased,
    }


def _round_seed(seed: int, r: int) -> int:
    """The data seed of a case in timing round ``r`` > 0 (the checker derives the same)."""
    return specs.round_seed(seed, r)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("correct", "time"))
    ap.add_argument("--side", required=True, help="the side's worktree (its vllm)")
    ap.add_argument("--op", required=True)
    ap.add_argument("--priority", required=True)
    ap.add_argument("--cases", required=True)
    ap.add_argument("--samples", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="time: rounds of the mix (each on its own fresh inputs); the median counts",
    )
    ap.add_argument("--fd", type=int, default=-1, help="time: the orchestrator's result pipe")
    a = ap.parse_args()
    with open(a.cases) as f:
        cases = json.load(f)
    device = a.device
    priority = [p for p in a.priority.split(",") if p]
    if "native" not in priority:  # what the engine does: the platform default (native on CPU) comes last
        priority.append("native")

    # build every input before the side's code is imported: it cannot see or prepare them
    rounds = a.rounds if a.mode == "time" else 1
    inputs = [
        specs.make_inputs(c if r == 0 else {**c, "seed": _round_seed(c["seed"], r)}, device)
        for r in range(rounds)
        for c in cases
    ]
    if a.mode == "time":  # each round's inputs in the buffers its salt moves (specs.RoundInputs)
        n = len(cases)
        inputs = [specs.RoundInputs(inputs[r * n : (r + 1) * n], device) for r in range(rounds)]
    warm = [specs.make_inputs({**c, "seed": c["seed"] ^ 0x5A5A5A5A}, device) for c in cases[: a.warmup]]
    np.savez(io.BytesIO(), probe=np.zeros(1))  # every module the samples' writing needs, loaded now

    sys.path.insert(0, os.path.abspath(a.side))
    from vllm import ir  # noqa: E402  (the side's vLLM)
    from vllm.platforms import current_platform  # noqa: E402

    current_platform.import_ir_kernels()
    op = getattr(ir.ops, a.op)
    unknown = [p for p in priority if p not in op.impls]
    if unknown:
        print(
            f"provider {', '.join(unknown)} of {a.op} is not registered in this side (it has {', '.join(op.impls)})",
            file=sys.stderr,
        )
        return 3
    store: dict = {}
    used: dict[str, int] = {}
    try:
        metrics = _run(a, op, priority, inputs, warm, len(cases), rounds, device, used, store)
    except Tampered as exc:
        print(f"{a.op}: {exc}", file=sys.stderr)
        return 5
    if metrics is None:
        return 4
    metrics["providers"] = ",".join(f"{k}:{v}" for k, v in sorted(used.items()))[:200]
    np.savez(a.samples, **store)
    with open(a.out, "w") as f:
        json.dump(metrics, f)
    return 0


def _run(a, op, priority, inputs, warm, per_round, rounds, device, used, store) -> dict | None:
    aliased = 0
    metrics: dict | None = {}
    with op.set_priority(priority), torch.no_grad():
        if a.mode == "correct":
            for i, args in enumerate(inputs):
                spans = specs.storages(args)
                used[op.dispatch(*args).provider] = used.get(op.dispatch(*args).provider, 0) + 1
                outs = _plain(specs.outputs_of(op._inner_call(*args)))
                aliased += specs.aliases(outs, spans)
                _arrays(f"out{i}", outs, store)
                _arrays(f"in{i}", list(args), store)  # the inputs after the call: were they changed?
            metrics = {"cases": len(inputs), "aliased": aliased}
        else:
            metrics = _timed(a, op, inputs, warm, per_round, rounds, device, used, store)
    return metrics


if __name__ == "__main__":
    sys.exit(main())

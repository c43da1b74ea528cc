"""Red team, round 4b: the hardened micro stage, attacked again (kernels/worker.py, kernels/specs.py, agentsearch/micro.py).

Each cheat is a kernel proposal branch of the real fork (built like tests/redteam/test_kernel_cheats.py): the
`rms_norm` def of the agentsearch_cpu provider replaced. None of these kernels is faster than the baseline's
`native` chain: whatever arithmetic they do is that same eager chain (`_slow`), so any speedup the stage reported
would be unearned. The provider runs inside the worker's process, so it can rewrite anything there; what closes
these is outside it: each `done` carries the sum of the round's outputs, read inside the round, which the checker
(a separate process) compares with the outputs the worker writes afterwards, and every row of every call is salted.

What the red team's round 4b got through before (2-core machine under load 3-5, `kernels bench --pairs 2`):
    defer-arrays  pass 2.21x: `__main__._arrays` replaced, outputs filled after the rounds   -> now a sum mismatch
    fake-done     pass 3.65x: a thread answered `done` before any work                        -> now a sum mismatch
    salt-peek     pass 2.97x: `salt_round` wrapped to learn which 1 call in 8 was salted      -> every call salted
    lazy-unplain  pass 1.81x: round 4's lazy subclass with `__main__._plain` replaced          -> the in-round sum
                  reads the values, so the lazy work happens inside the round (no gain: not a test here)
    row-probe     row 0 told the salted calls apart                                           -> every row salted,
                  each at its own column (test_round4b_one_row_no_longer_tells_a_salted_call)
    salt-off      caught (control): the checker salts from the orchestrator's salts
    sidecar       caught: the orchestrator's micro-samples directory is not visible in the sandbox
"""

from __future__ import annotations

import json
import os

import pytest

from ..conftest import commit, git
from .test_kernel_cheats import DEF, LAZY, MODULE, bench, fork  # noqa: F401 (the fixture, module-scoped here too)

# the native chain (what the baseline runs): the cheats' only arithmetic, so they earn no speedup
SLOW = """
def _slow(x, weight, epsilon):
    orig = x.dtype
    xf = x.to(torch.float32)
    var = xf.pow(2).mean(dim=-1, keepdim=True)
    xf = xf * torch.rsqrt(var + epsilon)
    if weight is not None:
        xf = xf.to(weight.dtype) * weight
    return xf.to(orig)
"""

# 1. Work after the rounds, through the worker's own globals: the provider returns empty outputs in the timed
# rounds; `_arrays` (a module global of `__main__`, looked up at call time) is replaced at import by one that
# fills the round's copies with the right values (from the salted inputs, still alive in `results`) after the
# rounds, before the samples are written.
DEFER_ARRAYS = (
    SLOW
    + """
import sys

_pending = {}


def rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> Tensor:
    if "time" not in sys.argv:
        return _slow(x, weight, epsilon)
    out = torch.empty_like(x)
    _pending[id(out)] = (out, x, weight, epsilon)
    return out


def _install():
    main = sys.modules.get("__main__")
    real = getattr(main, "_arrays", None)
    if real is None:
        return

    def _arrays(prefix, tensors, store):
        outs = sys._getframe(1).f_locals.get("outs")
        if outs is not None and prefix.startswith("out"):
            for o, c in zip(outs, tensors):
                todo = _pending.pop(id(o), None)
                if todo is not None:
                    c.copy_(_slow(*todo[1:]))
        return real(prefix, tensors, store)

    main._arrays = _arrays


_install()
"""
)

# 2. The round trip without the round: a thread reads the orchestrator's `go` itself and answers `done` at once
# (with its own elapsed time as the worker's readings, so no clock disagrees), hands the line to the worker's
# loop through a replaced `sys.stdin`, and the worker's own `done` is dropped by a replaced `os.write`. The
# calls (the baseline's own native chain, correct on the salted inputs) run after the orchestrator has stopped
# its clock; it waits for the exit untimed. The answer is delayed by half the native time of a round, measured
# at import on the prepared inputs, so the speedup reads ~2x: a plain PASS below the plausibility bound.
FAKE_DONE = (
    SLOW
    + """
import json
import os
import os
import queue
import sys
import threading
import time


def rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> Tensor:
    return _slow(x, weight, epsilon)


def _round_cost():
    f = sys._getframe()
    while f is not None:
        inputs, cases = f.f_locals.get("inputs"), f.f_locals.get("cases")
        if isinstance(inputs, list) and isinstance(cases, list) and cases:
            first = inputs[0]
            batch = [a for a in (first.batch if hasattr(first, "batch") else inputs[: len(cases)]) if len(a) == 4]
            best = None
            for _ in range(3):
                t = time.perf_counter()
                for x, w, eps, _v in batch:
                    _slow(x, w, eps)
                el = time.perf_counter() - t
                best = el if best is None else min(best, el)
            return best or 0.0
        f = f.f_back
    return 0.0


def _install():
    if "time" not in sys.argv or "--fd" not in sys.argv:
        return
    fd = int(sys.argv[sys.argv.index("--fd") + 1])
    delay = 0.5 * _round_cost()
    real_write, real_in, lines = os.write, sys.stdin, queue.Queue()

    def write(f, data):
        if f == fd and b'"done"' in bytes(data):
            return len(data)  # the worker's own answer, late: dropped
        return real_write(f, data)

    def pump():
        while True:
            line = real_in.readline()
            lines.put(line)
            if not line:
                return
            t = time.perf_counter()
            time.sleep(delay)
            el = (time.perf_counter() - t) * 1e6
            # a commitment made up: the real one needs the outputs, which do not exist yet
            msg = {"event": "done", "round": int(line.split()[1]), "span_us": el, "calls_us": 0.9 * el, "sums": [0.0]}
            real_write(fd, (json.dumps(msg) + "\\n").encode())

    class _In:
        def readline(self):
            return lines.get()

    sys.setswitchinterval(1e-5)
    os.write = write
    sys.stdin = _In()
    threading.Thread(target=pump, daemon=True).start()


_install()
"""
)

# 3. Salted calls told apart by one row: `salt_round` moves one element of *every row* of a salted call's input,
# all in the same column; so row 0 alone says whether a call was salted. At import the provider walks up to the
# prepared inputs (as the round-4 PRECOMPUTE cheat did), computes every result and keeps each input's row 0; a
# call whose row 0 is unchanged gets its precomputed answer (7 calls in 8), the others are computed. No worker
# internals are touched.
ROW_PROBE = (
    SLOW
    + """
import sys

_done = {}


def _precompute():
    f = sys._getframe()
    while f is not None:
        inputs = f.f_locals.get("inputs")
        if isinstance(inputs, list) and inputs:
            for args in [a for x in inputs for a in (x.batch if hasattr(x, "batch") else [x])]:
                if len(args) == 4 and rms_norm_supports(*args):
                    x, w, eps, _ = args
                    _done[x.data_ptr()] = (x[0].clone(), _slow(x, w, eps))
            return
        f = f.f_back


def rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> Tensor:
    hit = _done.pop(x.data_ptr(), None)
    if hit is not None and torch.equal(x[0], hit[0]):
        return hit[1]
    return _slow(x, weight, epsilon)


_precompute()
"""
)

# 4. The salt itself, read: `specs.salt_round` (an attribute of the worker's `kernels.specs`, looked up at call
# time) is wrapped at import; the wrapper salts as before and derives, from the salt, which calls it picked.
# Those are computed; every other call gets its answer precomputed at import.
SALT_PEEK = (
    SLOW
    + """
import random
import sys

_done = {}
_salted = set()


def _precompute():
    f = sys._getframe()
    while f is not None:
        inputs = f.f_locals.get("inputs")
        if isinstance(inputs, list) and inputs:
            for args in [a for x in inputs for a in (x.batch if hasattr(x, "batch") else [x])]:
                if len(args) == 4 and rms_norm_supports(*args):
                    x, w, eps, _ = args
                    _done[x.data_ptr()] = _slow(x, w, eps)
            return
        f = f.f_back


def _install():
    specs = sys.modules.get("kernels.specs")
    real = getattr(specs, "salt_round", None)
    if real is None:
        return

    def salt_round(batch, salt):
        n = len(batch)
        picked = random.Random(salt).sample(range(n), max(1, n // specs.SALTED_SHARE)) if n else []
        for i in picked:
            _salted.add(batch[i][0].data_ptr())
        return real(batch, salt)

    specs.salt_round = salt_round


def rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> Tensor:
    hit = _done.pop(x.data_ptr(), None)
    if hit is not None and x.data_ptr() not in _salted:
        return hit
    return _slow(x, weight, epsilon)


_precompute()
_install()
"""
)

# 5. (control) the salt switched off in the worker (`specs.salt_round` a no-op) and every result precomputed: the
# checker salts the reference from the orchestrator's salts, so this must fail
SALT_OFF = (
    SLOW
    + """
import sys

_done = {}


def _precompute():
    f = sys._getframe()
    while f is not None:
        inputs = f.f_locals.get("inputs")
        if isinstance(inputs, list) and inputs:
            for args in [a for x in inputs for a in (x.batch if hasattr(x, "batch") else [x])]:
                if len(args) == 4 and rms_norm_supports(*args):
                    x, w, eps, _ = args
                    _done[x.data_ptr()] = _slow(x, w, eps)
            return
        f = f.f_back


def rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> Tensor:
    hit = _done.pop(x.data_ptr(), None)
    return hit if hit is not None else _slow(x, weight, epsilon)


_precompute()
_specs = sys.modules.get("kernels.specs")
if _specs is not None:
    _specs.RoundInputs.salt = lambda self, salt: None
"""
)

# 6. Round 4's lazy subclass, reopened: `_plain` (a module global of `__main__`, looked up at call time) replaced by the
# identity at import, so the plain-Tensor check never runs; the round-4 LAZY cheat then passes as before
LAZY_UNPLAIN = (
    LAZY
    + """

import sys as _sys

_main = _sys.modules.get("__main__")
if getattr(_main, "_plain", None) is not None:
    _main._plain = lambda outs: outs
"""
)

# 7. (probe) the orchestrator's copies: the checker reads `<scratch>/micro-samples/<side>-<n>.npz` and its
# `.salts.json`, written by the orchestrator after the trial; the worker's `--samples` path names `<scratch>/out/...`.
# A provider that could see that directory could plant links there (`write_text`/`write_bytes` follow them). It
# fails its trial loudly if it can see or write anything above its own output directory; otherwise it is honest.
SIDECAR = (
    SLOW
    + """
import os
import sys


def rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> Tensor:
    return _slow(x, weight, epsilon)


def _probe():
    if "--samples" not in sys.argv:
        return
    samples = os.path.abspath(sys.argv[sys.argv.index("--samples") + 1])
    scratch = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(samples))))
    seen = []
    for p in (scratch, os.path.join(scratch, "micro-samples"), os.path.join(scratch, "in")):
        if os.path.isdir(p):
            seen.append(p + ":" + ",".join(sorted(os.listdir(p))[:5]))
    keep = os.path.join(scratch, "micro-samples")
    try:
        os.symlink("/tmp/nowhere", os.path.join(keep, "candidate-0.npz.salts.json"))
        seen.append("planted a link in " + keep)
    except OSError:
        pass
    if any("micro-samples" in s for s in seen):
        raise RuntimeError("the orchestrator's directory is reachable: " + "; ".join(seen))


_probe()
"""
)

CHEATS_4B = {  # (row-probe, salt-peek and lazy-unplain: kept above as written; see the module's docstring)
    "defer-arrays": DEFER_ARRAYS,
    "fake-done": FAKE_DONE,
    "salt-off": SALT_OFF,
    "sidecar": SIDECAR,
}


@pytest.fixture(scope="module")
def rfork(fork):  # noqa: F811 (the imported fixture)
    git(fork, "checkout", "-q", "kernels/agentsearch_cpu-rms_norm")
    honest = (fork / MODULE).read_text()
    git(fork, "checkout", "-q", "main")
    for name, body in CHEATS_4B.items():
        text, n = DEF.subn(lambda _m, body=body: "\n" + body, honest)  # a function: no escapes in body
        assert n == 1
        commit(fork, {MODULE: text}, f"cheat: {name}", branch=f"r4b-{name}", start="kernels/agentsearch_cpu-rms_norm")
    return fork


def _run(rfork, name):
    rc, out = bench(rfork, "--candidate", f"r4b-{name}", "--pairs", os.environ.get("R4B_PAIRS", "2"))
    r = out["micro"]["ops"][0]
    print(
        json.dumps(
            {
                "cheat": name,
                "rc": rc,
                "status": out["status"],
                "detail": out["detail"],
                "speedup": r.get("speedup"),
                "baseline_us": r.get("baseline_us"),
                "candidate_us": r.get("candidate_us"),
                "providers": r.get("providers"),
            }
        )
    )
    return rc, out


PROBES = {"sidecar"}  # honest kernels that only look for a way out: they must find none (a pass at ~1x is right)


@pytest.mark.parametrize("name", list(CHEATS_4B))
@pytest.mark.vllm
def test_round4b_cheat_is_rejected(rfork, name):
    rc, out = _run(rfork, name)
    if name in PROBES:
        assert "reachable" not in out["detail"], out["detail"]
        return
    assert rc == 4 and out["status"] == "fail", out
    if name in ("defer-arrays", "fake-done"):  # caught by the commitment, not by luck
        assert "not those the worker committed to inside the round" in out["detail"], out["detail"]


def test_round4b_one_row_no_longer_tells_a_salted_call():
    """The salt's design, in-process (seconds, no fork): round 4b's probe kept each input's row 0 at import and
    handed back a precomputed answer whenever row 0 was unchanged (one call in eight was salted, one column per
    tensor). Every row of every call is salted now, each at its own column: the probe finds every call changed in
    row 0 and in every other row, and a precomputed answer is wrong on every row."""
    import random

    import torch

    from kernels import catalog, specs

    cases = catalog.bench_cases("rms_norm", 128, seed=5)
    rounds = 3
    flat = [specs.make_inputs(c) for c in specs.expand_rounds(cases, rounds)]
    n = len(cases)
    for r in range(rounds):
        round_in = specs.RoundInputs(flat[r * n : (r + 1) * n])
        before = [(a[0].clone(), specs.ref_rms_norm(*a)) for a in round_in.batch]  # "at import"
        round_in.salt(random.getrandbits(62))
        for (x0, ans), a in zip(before, round_in.batch, strict=True):
            moved = (a[0] != x0).sum(dim=1)
            assert bool((moved == 1).all()), moved  # one element of every row
            assert not torch.equal(a[0][0], x0[0])  # row 0 tells nothing: it always moved
            assert specs.compare(cases[0], [ans], [specs.ref_rms_norm(*a)]) != ""  # the precomputed answer: wrong

"""Op specs (torch): the trusted reference of each IR op, the inputs of a case, and the comparison.

The references are the fork's native implementations (``vllm/ir/ops``) copied here: a candidate's
fork may change its own ``native``, never these (``tests/test_kernels.py`` checks they equal the
installed fork's). A case's inputs are a pure function of the case (its data seed): the worker in a
side's sandbox and the checker outside it build the same tensors.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .catalog import OPS

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
EPSILON = 1e-6  # the Llama family's rms_norm_eps (the fork's generator uses 1e-5; both are checked)


def ref_rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> Tensor:
    orig_dtype = x.dtype
    x = x.to(torch.float32)
    x_var = x if variance_size is None else x[..., :variance_size]
    variance = x_var.pow(2).mean(dim=-1, keepdim=True)
    x = x * torch.rsqrt(variance + epsilon)
    if weight is not None:
        x = x.to(weight.dtype) * weight
    return x.to(orig_dtype)


def ref_fused_add_rms_norm(
    x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
) -> tuple[Tensor, Tensor]:
    orig_dtype = x.dtype
    x = x.to(torch.float32)
    x = x + x_residual.to(torch.float32)
    x_residual = x.to(orig_dtype)
    x_var = x if variance_size is None else x[..., :variance_size]
    variance = x_var.pow(2).mean(dim=-1, keepdim=True)
    x = x * torch.rsqrt(variance + epsilon)
    if weight is not None:
        x = x.to(weight.dtype) * weight
    return x.to(orig_dtype), x_residual


def ref_gelu_and_mul_sparse(x: Tensor, std_multiplier: float, approximate: str = "none") -> Tensor:
    d = x.shape[-1] // 2
    gate = x[..., :d]
    mean = torch.mean(gate, dim=-1, keepdim=True)
    std = torch.std(gate, dim=-1, keepdim=True, unbiased=False)
    sparse_gate = F.relu(gate - (mean + std * std_multiplier))
    return F.gelu(sparse_gate, approximate=approximate) * x[..., d:]


REFERENCES: dict[str, Callable[..., Any]] = {
    "rms_norm": ref_rms_norm,
    "fused_add_rms_norm": ref_fused_add_rms_norm,
    "gelu_and_mul_sparse": ref_gelu_and_mul_sparse,
}


def _randn(
    gen: torch.Generator, shape: Sequence[int], dtype: torch.dtype, contiguous: bool, device: str, scale: float = 1.0
) -> Tensor:
    if contiguous:
        return (scale * torch.randn(*shape, generator=gen, dtype=torch.float32)).to(dtype).to(device)
    # a strided view: every row of a wider buffer (what a q/k split hands a norm)
    wide = (scale * torch.randn(shape[0], shape[-1] + 8, generator=gen, dtype=torch.float32)).to(dtype).to(device)
    return wide[:, 4 : 4 + shape[-1]]


def make_inputs(case: dict[str, Any], device: str = "cpu") -> tuple[Any, ...]:
    """The arguments of one call for ``case`` (deterministic in the case's seed)."""
    op, t, h = case["op"], int(case["tokens"]), int(case["hidden"])
    dtype = DTYPES[case["dtype"]]
    gen = torch.Generator().manual_seed(int(case["seed"]))
    contiguous = bool(case.get("contiguous", True))
    eps = float(case.get("epsilon", EPSILON))
    scale = float(case.get("scale", 1.0))
    if op == "rms_norm":
        x = _randn(gen, (t, h), dtype, contiguous, device, scale)
        w = (1 + 0.1 * torch.randn(h, generator=gen)).to(dtype).to(device)
        return x, w, eps, case.get("variance_size")
    if op == "fused_add_rms_norm":
        x = _randn(gen, (t, h), dtype, contiguous, device, scale)
        r = _randn(gen, (t, h), dtype, contiguous, device, scale)
        w = (1 + 0.1 * torch.randn(h, generator=gen)).to(dtype).to(device)
        return x, r, w, eps, case.get("variance_size")
    if op == "gelu_and_mul_sparse":
        x = _randn(gen, (t, 2 * h), dtype, contiguous, device)
        return x, 1.6448536269514722, "tanh"
    raise KeyError(f"unknown op {op!r}")


def round_seed(seed: int, r: int) -> int:
    """The data seed of a case in timing round ``r`` (round 0: the case's own)."""
    return seed if r == 0 else (seed * 1000003 + r * 7919) % (1 << 62)


SALTED_SHARE = 8  # one call in this many (at least one) of a timing round is salted at ``go``


def salt_round(batch: Sequence[Sequence[Any]], salt: int) -> None:
    """Salt a timing round's calls at ``go``, in place: the calls ``salt`` picks (one in SALTED_SHARE, at least
    one) get one element of every row of each 2-D floating tensor argument moved by an amount drawn from
    ``salt``. A row's norm, gate or output changes with any of its elements, so a result computed before the
    round from the inputs as prepared is wrong on every row of a salted call, and no process of the side can
    tell which calls those are before the round (a precomputed answer handed back on 8 calls of a round
    survives a round with probability (7/8)^8 = 0.34, 20 rounds with 4e-10). A subset, not every call: a
    salt is a few small ops inside the timed round (same for both sides), about 5 us per call on this CPU,
    which diluted a 2x kernel to 1.5x when every call of a mix of small cases was salted."""
    rnd = random.Random(salt)
    n = len(batch)
    for i in sorted(rnd.sample(range(n), max(1, n // SALTED_SHARE)) if n else []):
        for a in batch[i]:
            if isinstance(a, Tensor) and a.dim() == 2 and a.dtype.is_floating_point and a.numel():
                a.select(1, rnd.randrange(a.shape[1])).add_(rnd.choice((-1.0, 1.0)) * rnd.uniform(0.5, 2.0))


def expand_rounds(cases: list[dict[str, Any]], rounds: int) -> list[dict[str, Any]]:
    """The cases of ``rounds`` timing rounds, in call order (what the worker ran)."""
    return [c if r == 0 else {**c, "seed": round_seed(int(c["seed"]), r)} for r in range(rounds) for c in cases]


def outputs_of(result: Any) -> list[Tensor]:
    if isinstance(result, Tensor):
        return [result]
    if isinstance(result, (tuple, list)) and all(isinstance(r, Tensor) for r in result):
        return list(result)
    raise TypeError(f"an op must return a tensor or a tuple of tensors, got {type(result).__name__}")


def compare(case: dict[str, Any], got: Sequence[Tensor], want: Sequence[Tensor]) -> str:
    """'' when ``got`` matches ``want`` within the op's tolerance for the case's dtype, else why not."""
    tol = OPS[case["op"]].tolerance(case["dtype"])
    if len(got) != len(want):
        return f"{len(got)} outputs, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if tuple(g.shape) != tuple(w.shape):
            return f"output {i}: shape {tuple(g.shape)}, expected {tuple(w.shape)}"
        if g.dtype != w.dtype:
            return f"output {i}: dtype {g.dtype}, expected {w.dtype}"
        g32, w32 = g.detach().to("cpu", torch.float32), w.detach().to("cpu", torch.float32)
        if not torch.isfinite(g32).all() and torch.isfinite(w32).all():
            return f"output {i}: non-finite values"
        bad = (g32 - w32).abs() > tol["atol"] + tol["rtol"] * w32.abs()
        if bool(bad.any()):
            worst = float((g32 - w32).abs().max())
            return (
                f"output {i}: {int(bad.sum())} of {bad.numel()} elements outside "
                f"atol {tol['atol']:g} / rtol {tol['rtol']:g}"
                f" (max abs error {worst:.3g})"
            )
    return ""


def describe(case: dict[str, Any]) -> str:
    bits = [f"{case['tokens']}x{case['hidden']}", case["dtype"]]
    if not case.get("contiguous", True):
        bits.append("non-contiguous")
    if case.get("scale", 1.0) != 1.0:
        bits.append(f"scale {case['scale']:g}")
    if case.get("variance_size") is not None:
        bits.append(f"variance_size={case['variance_size']}")
    return " ".join(bits)


def storages(args: Sequence[Any]) -> list[tuple[int, int]]:
    """(start, end) of every tensor argument's storage."""
    out = []
    for a in args:
        if isinstance(a, Tensor):
            s = a.untyped_storage()
            out.append((s.data_ptr(), s.data_ptr() + s.nbytes()))
    return out


def aliases(outputs: Sequence[Tensor], spans: Sequence[tuple[int, int]]) -> bool:
    for o in outputs:
        s = o.untyped_storage()
        lo, hi = s.data_ptr(), s.data_ptr() + s.nbytes()
        if any(lo < e and b < hi for b, e in spans):
            return True
    return False


def check_fn(fn: Callable[..., Any], cases: Sequence[dict[str, Any]], device: str = "cpu") -> list[str]:
    """Every failure of ``fn`` on ``cases`` (in this process; the gate checks in a separate one):
    wrong values, inputs changed, an output aliasing an input."""
    failures = []
    for case in cases:
        args = make_inputs(case, device)
        before = [a.clone() if isinstance(a, Tensor) else a for a in args]
        spans = storages(args)
        try:
            got = outputs_of(fn(*args))
        except Exception as exc:  # noqa: BLE001 - any error is a failure of this case
            failures.append(f"{describe(case)}: raised {type(exc).__name__}: {exc}")
            continue
        want = outputs_of(REFERENCES[case["op"]](*before))
        if any(isinstance(a, Tensor) and not torch.equal(a, b) for a, b in zip(args, before, strict=True)):
            failures.append(f"{describe(case)}: changed its inputs")
        elif aliases(got, spans):
            failures.append(f"{describe(case)}: returned a view of an input")
        else:
            why = compare(case, got, want)
            if why:
                failures.append(f"{describe(case)}: {why}")
    return failures


def check_impl(
    fn: Callable[..., Any],
    supports: Callable[..., bool] | None,
    cases: Sequence[dict[str, Any]],
    inplace: bool = False,
    device: str = "cpu",
) -> tuple[int, list[str]]:
    """(cases covered, failures) of a library implementation on ``cases``, dispatched as the fork does:
    a case its ``supports`` refuses goes to the next provider (not this one's to get right); an in-place
    implementation gets copies of the activations (what the fork's functional path passes)."""
    covered = [c for c in cases if supports is None or supports(*make_inputs(c, device))]

    def call(*args: Any) -> Any:
        if inplace:
            args = tuple(a.clone() if isinstance(a, Tensor) and i in (0, 1) else a for i, a in enumerate(args))
        return fn(*args)

    return len(covered), check_fn(call, covered, device)

"""Op specs (torch): the trusted reference of each IR op, the inputs of a case, and the comparison.

The references are the fork's native implementations (``vllm/ir/ops``) copied here: a candidate's
fork may change its own ``native``, never these (``tests/test_kernels.py`` checks they equal the
installed fork's). A case's inputs are a pure function of the case (its data seed): the worker in a
side's sandbox and the checker outside it build the same tensors.
"""

from __future__ import annotations

import math
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


ALIGN = 64  # elements: each tensor of a round's buffer starts on this boundary (as an allocation would)


def _salted(a: Any) -> bool:
    return isinstance(a, Tensor) and a.dim() == 2 and a.dtype.is_floating_point and a.numel() > 0


class RoundInputs:
    """A timing round's calls, their 2-D floating tensor arguments moved into one buffer per dtype (each keeps its
    shape, strides and values), and the salt of the round: in every call, every row of each such tensor gets one
    element moved, at a column and by an amount (0.5 to 2, either sign) drawn from the salt for that row. A row's
    norm, gate or output changes with any of its elements, so a result computed before the round from the inputs
    as prepared is wrong on every row, and no few rows or columns tell a call unsalted (each row moved at its own
    column: finding the moved element is a full read). The red team's round 4b told a salt of one call in eight,
    one column per tensor, from row 0 alone. One buffer per dtype makes the salt a few vectorized ops per round
    inside the timed round (the same for both sides), not one per tensor. The worker and the checker build the
    round the same way (``batch``, then ``salt``), so the checker's inputs are the worker's, bit for bit."""

    def __init__(self, batch: Sequence[Sequence[Any]], device: str = "cpu"):
        targets = [(i, j, a) for i, args in enumerate(batch) for j, a in enumerate(args) if _salted(a)]
        spans = []
        for _, _, a in targets:
            (n, w), (s0, s1) = a.shape, a.stride()
            spans.append((n - 1) * s0 + (w - 1) * s1 + 1)
        new = [list(args) for args in batch]
        sizes: dict[torch.dtype, int] = {}
        where: list[tuple[torch.dtype, int]] = []
        for (_, _, a), span in zip(targets, spans, strict=True):
            at = -(-sizes.get(a.dtype, 0) // ALIGN) * ALIGN
            where.append((a.dtype, at))
            sizes[a.dtype] = at + span
        self.buffers = {dt: torch.empty(n, dtype=dt, device=device) for dt, n in sizes.items()}
        rows: dict[torch.dtype, list[Tensor]] = {}
        step: dict[torch.dtype, list[Tensor]] = {}
        width: dict[torch.dtype, list[Tensor]] = {}
        order: dict[torch.dtype, list[Tensor]] = {}
        first = 0
        for (i, j, a), span, (dt, at) in zip(targets, spans, where, strict=True):
            buf = self.buffers[dt]
            buf[at : at + span].copy_(torch.as_strided(a, (span,), (1,), a.storage_offset()))
            new[i][j] = torch.as_strided(buf, tuple(a.shape), a.stride(), at)
            n, w = a.shape
            rows.setdefault(dt, []).append(at + torch.arange(n, dtype=torch.long) * a.stride(0))
            step.setdefault(dt, []).append(torch.full((n,), a.stride(1), dtype=torch.long))
            width.setdefault(dt, []).append(torch.full((n,), float(w), dtype=torch.float64))
            order.setdefault(dt, []).append(torch.arange(first, first + n, dtype=torch.long))
            first += n
        self.rows = first
        self.batch: list[tuple[Any, ...]] = [tuple(args) for args in new]
        self.plan = {
            dt: (torch.cat(order[dt]), torch.cat(rows[dt]), torch.cat(step[dt]), torch.cat(width[dt]))
            for dt in self.buffers
        }

    def salt(self, salt: int) -> None:
        """Salt every call of the round in place (see the class)."""
        if not self.rows:
            return
        gen = torch.Generator().manual_seed(salt % (1 << 63))
        where = torch.rand(self.rows, generator=gen, dtype=torch.float64)
        how = torch.rand(self.rows, generator=gen, dtype=torch.float64)
        amount = torch.where(how < 0.5, -(0.5 + 3 * how), 0.5 + 3 * (how - 0.5))
        for dt, (order, rows, step, width) in self.plan.items():
            col = torch.minimum((where[order] * width).long(), width.long() - 1)
            idx, d = rows + col * step, amount[order].to(dt)
            buf = self.buffers[dt]
            if buf.device.type != "cpu":
                idx, d = idx.to(buf.device), d.to(buf.device)
            buf.index_add_(0, idx, d)


def commit(outputs: Sequence[Tensor]) -> list[float | None]:
    """What a timed round's ``done`` commits to: the float64 sum of all of the round's ``outputs``, read now (one
    concatenation and one sum per round). Right only if the outputs exist when it is read: a kernel whose values
    come later (a lazy tensor, a thread, the worker's helpers replaced) cannot commit to them, and the checker sums
    what the worker writes afterwards. One number per round: for these ops finding it without the outputs costs
    about what computing them does (every row's norm and a weighted sum of every element)."""
    if not outputs:
        return [0.0]
    total = float(torch.cat([o.reshape(-1) for o in outputs]).sum(dtype=torch.float64))
    return [total if math.isfinite(total) else None]  # JSON has no NaN: a garbage output commits to nothing


def checksum_agrees(reported: float | None, values: Sequence[Any]) -> bool:
    """Whether ``reported`` (a round's in-round sum, ``commit``) is the sum of ``values`` (the round's outputs as
    written to the samples file, float32 arrays): within 1e-6 of their absolute sum (summation order, float64
    outputs stored as float32)."""
    import numpy as np

    total = sum(float(np.asarray(v, dtype=np.float64).sum()) for v in values)
    size = sum(float(np.abs(np.asarray(v, dtype=np.float64)).sum()) for v in values)
    return reported is not None and abs(total - reported) <= 1e-6 * (size + 1.0)


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

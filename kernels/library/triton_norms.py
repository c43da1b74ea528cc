"""Triton providers for the RMS-norm IR ops (GPU; on CPU tensors they run under ``TRITON_INTERPRET=1``).

One program per row: the row is loaded once (``BLOCK`` = the next power of two of the hidden size,
the tail masked), the mean square accumulated in float32, and the row scaled and weighted with the
native implementation's rounding: ``(x * rsqrt(var + eps)).to(weight.dtype) * weight``.
``fused_add_rms_norm`` also writes the residual sum (rounded to the input dtype) in the same pass.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

MAX_HIDDEN = 65536


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    x_stride,
    r_ptr,
    r_stride,
    w_ptr,
    out_ptr,
    res_out_ptr,
    n_cols,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + row * r_stride + cols, mask=mask, other=0.0).to(tl.float32)
        x = x + r
        x_rounded = x.to(res_out_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * n_cols + cols, x_rounded, mask=mask)
    var = tl.sum(x * x, axis=0) / n_cols
    y = x * tl.rsqrt(var + eps)
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
        # the native rounding: y in the weight's dtype, times the weight, rounded again (below)
        y = y.to(w.dtype).to(tl.float32) * w.to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def _launch(x: Tensor, residual: Tensor | None, weight: Tensor | None, epsilon: float, block: int | None = None):
    h = x.shape[-1]
    x2 = x.reshape(-1, h)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    res_out = None
    r2 = x2
    if residual is not None:
        r2 = residual.reshape(-1, h)
        if r2.stride(-1) != 1:
            r2 = r2.contiguous()
        res_out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    block = block or triton.next_power_of_2(h)
    if x2.shape[0]:
        _rms_norm_kernel[(x2.shape[0],)](
            x2,
            x2.stride(0),
            r2,
            r2.stride(0),
            weight if weight is not None else x2,
            out,
            res_out if res_out is not None else out,
            h,
            epsilon,
            HAS_RESIDUAL=residual is not None,
            HAS_WEIGHT=weight is not None,
            BLOCK=block,
        )
    return out.reshape(x.shape), (res_out.reshape(x.shape) if res_out is not None else None)


def rms_norm_supports(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> bool:
    return (
        variance_size is None
        and x.shape[-1] <= MAX_HIDDEN
        and (weight is None or (weight.dtype == x.dtype and weight.is_contiguous()))
    )


def rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> Tensor:
    return _launch(x, None, weight, epsilon)[0]


def fused_add_rms_norm_supports(
    x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
) -> bool:
    return (
        variance_size is None
        and x.shape[-1] <= MAX_HIDDEN
        and x_residual.dtype == x.dtype
        and (weight is None or (weight.dtype == x.dtype and weight.is_contiguous()))
    )


def fused_add_rms_norm(
    x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
) -> tuple[Tensor, Tensor]:
    out, residual = _launch(x, x_residual, weight, epsilon)
    assert residual is not None
    return out, residual

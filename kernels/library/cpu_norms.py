"""CPU providers for the RMS-norm IR ops.

``rms_norm``: the native implementation is a chain of six eager ops (cast, pow, mean, add, rsqrt, mul,
mul), each a pass over memory with its own dispatch; torch's ``rms_norm`` does the same float32
arithmetic in one fused CPU kernel. ``fused_add_rms_norm``: one add, then the same fused kernel.
Arguments this does not cover (``variance_size``, a weight of another dtype) fall back to the next
provider in the priority list (``supports_args``).
"""

import torch
import torch.nn.functional as F
from torch import Tensor


def rms_norm_supports(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> bool:
    return variance_size is None and x.dtype == torch.float32 and (weight is None or weight.dtype == x.dtype)


def rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, epsilon)


def fused_add_rms_norm_supports(
    x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
) -> bool:
    return (
        variance_size is None
        and x.dtype == torch.float32
        and x_residual.dtype == x.dtype
        and (weight is None or weight.dtype == x.dtype)
    )


def fused_add_rms_norm(
    x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
) -> tuple[Tensor, Tensor]:
    residual = x + x_residual
    return F.rms_norm(residual, (residual.shape[-1],), weight, epsilon), residual

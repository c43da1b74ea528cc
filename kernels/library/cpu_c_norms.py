"""CPU providers for the RMS-norm IR ops through vLLM's own compiled CPU kernels (``torch.ops._C``).

The fork registers its C kernels as the ``vllm_c`` provider only on GPUs; the CPU extension has the
same ops (vectorised, one pass per row). Contiguous 2-D float32/bfloat16 inputs with a hidden size divisible
by 16 only (the kernels assert whole vectors); anything else
falls back to the next provider (``supports_args``).
"""

import torch
from torch import Tensor


def _plain(x: Tensor) -> bool:
    # the kernels work in whole vectors: the hidden size must be a multiple of the vector width
    return x.dim() == 2 and x.is_contiguous() and x.dtype in (torch.float32, torch.bfloat16) and x.shape[-1] % 16 == 0


def rms_norm_supports(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> bool:
    return (
        variance_size is None
        and _plain(x)
        and weight is not None
        and weight.dtype == x.dtype
        and weight.is_contiguous()
    )


def rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> Tensor:
    out = torch.empty_like(x)
    torch.ops._C.rms_norm(out, x, weight, epsilon)
    return out


def fused_add_rms_norm_supports(
    x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
) -> bool:
    # float32 only: in bfloat16 the C kernel normalises the rounded sum, not the float32 one, and misses
    # the native result by an ulp now and then (1 element of 65,536 at 512x128, beyond the tolerance)
    return (
        variance_size is None
        and _plain(x)
        and _plain(x_residual)
        and x.dtype == torch.float32
        and x_residual.dtype == x.dtype
        and weight is not None
        and weight.dtype == x.dtype
        and weight.is_contiguous()
    )


def fused_add_rms_norm(
    x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
) -> tuple[Tensor, Tensor]:
    # in place on its arguments (registered inplace=True: the functional path passes copies)
    torch.ops._C.fused_add_rms_norm(x, x_residual, weight, epsilon)
    return x, x_residual

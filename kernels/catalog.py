"""The kernel library's catalogue, torch-free (the orchestrator reads it; torch runs only in children).

- ``OPS``: the vLLM fork's IR ops the library covers (``vllm/ir/ops``), with the dtypes they are
  checked in and the fork's tolerances per dtype (``vllm/ir/tolerances.py`` plus the op's
  ``override_tolerance``). The copies here are the **trusted** ones: a candidate's fork may loosen
  its own; ``tests/test_kernels.py`` checks that these equal the installed fork's.
- ``LIBRARY``: implementations (providers) that a kernel proposal can add to the fork.
- ``cases``: the input cases of a check: shapes from the model's config (hidden size), token counts
  from a Zipf batch-size distribution, odd sizes, non-contiguous inputs, ``variance_size``; a hidden
  set comes from a seed the candidate never sees.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CATALOG_SCHEMA = 1
ROOT = Path(__file__).resolve().parent
LIBRARY_DIR = ROOT / "library"
WORKER = ROOT / "worker.py"
CHECKER = ROOT / "check.py"
# the dtypes as the fork's tolerance table names them
TOLERANCES: dict[str, dict[str, float]] = {
    "float64": {"atol": 1e-8, "rtol": 1e-8},
    "float32": {"atol": 1e-5, "rtol": 1.3e-6},
    "float16": {"atol": 1e-3, "rtol": 1e-3},
    "bfloat16": {"atol": 1e-3, "rtol": 1.6e-2},
}


@dataclass(frozen=True)
class OpInfo:
    name: str
    summary: str
    signature: str  # the native implementation's signature (a provider must match it exactly)
    dtypes: tuple[str, ...]
    tolerance_overrides: tuple[tuple[str, float, float], ...] = ()  # (dtype, atol, rtol)
    inplace: bool = False  # the op allows in-place providers (outputs reuse the activations)
    width_factor: int = 1  # x's last dimension = width_factor x hidden

    def tolerance(self, dtype: str) -> dict[str, float]:
        for d, atol, rtol in self.tolerance_overrides:
            if d == dtype:
                return {"atol": atol, "rtol": rtol}
        return dict(TOLERANCES[dtype])


OPS: dict[str, OpInfo] = {
    "rms_norm": OpInfo(
        "rms_norm",
        "Weighted root-mean-square layer normalization.",
        "(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> Tensor",
        ("float32", "bfloat16", "float16"),
        (("float16", 1e-2, 2e-3),),
    ),
    "fused_add_rms_norm": OpInfo(
        "fused_add_rms_norm",
        "Fused add and weighted root-mean-square layer normalization (returns output, residual).",
        "(x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None)"
        " -> tuple[Tensor, Tensor]",
        ("float32", "bfloat16", "float16"),
        (("float16", 1e-2, 2e-3),),
        inplace=True,
    ),
    "gelu_and_mul_sparse": OpInfo(
        "gelu_and_mul_sparse",
        "Gaussian sparsification, GELU, and gated multiplication.",
        "(x: Tensor, std_multiplier: float, approximate: str = 'none') -> Tensor",
        ("float32", "bfloat16"),
        width_factor=2,
    ),
}


@dataclass(frozen=True)
class Provider:
    """One implementation in the library: where its source lives and how it registers in the fork."""

    name: str  # the provider name in the fork's registry (``[a-z_][a-z_0-9]*``)
    op: str
    kind: str  # "cpu" | "triton"
    module: str  # file under kernels/library/
    function: str  # the implementation's function in that file
    supported: str  # a Python expression evaluated in the fork module (platform support)
    supports_args: str = ""  # the name of a function in that file, or "" (all arguments)
    inplace: bool = False
    summary: str = ""

    @property
    def path(self) -> Path:
        return LIBRARY_DIR / self.module


PROVIDERS: tuple[Provider, ...] = (
    Provider(
        "agentsearch_cpu",
        "rms_norm",
        "cpu",
        "cpu_norms.py",
        "rms_norm",
        "current_platform.is_cpu()",
        "rms_norm_supports",
        summary="torch's fused rms_norm kernel (one pass, float32 accumulation) instead of the native 6-op chain",
    ),
    Provider(
        "agentsearch_cpu",
        "fused_add_rms_norm",
        "cpu",
        "cpu_norms.py",
        "fused_add_rms_norm",
        "current_platform.is_cpu()",
        "fused_add_rms_norm_supports",
        summary="one add and torch's fused rms_norm kernel",
    ),
    Provider(
        "agentsearch_cpu_c",
        "rms_norm",
        "cpu",
        "cpu_c_norms.py",
        "rms_norm",
        "current_platform.is_cpu()",
        "rms_norm_supports",
        summary="vLLM's own compiled CPU kernel (torch.ops._C.rms_norm), registered only for GPUs by the fork",
    ),
    Provider(
        "agentsearch_cpu_c",
        "fused_add_rms_norm",
        "cpu",
        "cpu_c_norms.py",
        "fused_add_rms_norm",
        "current_platform.is_cpu()",
        "fused_add_rms_norm_supports",
        inplace=True,
        summary="vLLM's own compiled CPU kernel (torch.ops._C.fused_add_rms_norm), in place",
    ),
    Provider(
        "agentsearch_triton",
        "rms_norm",
        "triton",
        "triton_norms.py",
        "rms_norm",
        "current_platform.is_cuda_alike()",
        "rms_norm_supports",
        summary="one Triton program per row, float32 accumulation, masked tail",
    ),
    Provider(
        "agentsearch_triton",
        "fused_add_rms_norm",
        "triton",
        "triton_norms.py",
        "fused_add_rms_norm",
        "current_platform.is_cuda_alike()",
        "fused_add_rms_norm_supports",
        summary="add, residual store and RMS norm in one Triton program per row",
    ),
)


def provider(op: str, name: str) -> Provider:
    for p in PROVIDERS:
        if p.op == op and p.name == name:
            return p
    known = ", ".join(sorted({p.name for p in PROVIDERS if p.op == op})) or "none"
    raise KeyError(f"the kernel library has no implementation {name!r} of {op!r} (it has: {known})")


def providers(op: str | None = None, kind: str | None = None) -> list[Provider]:
    return [p for p in PROVIDERS if (op is None or p.op == op) and (kind is None or p.kind == kind)]


# ---------------------------------------------------------------------- cases
def zipf_tokens(rng: random.Random, n: int, a: float = 1.2, top: int = 2048) -> list[int]:
    """Token counts of ``n`` batches: Zipf-distributed (most batches are small decode steps, a few
    are large prefills), capped at ``top``."""
    weights = [1.0 / (k**a) for k in range(1, top + 1)]
    return rng.choices(range(1, top + 1), weights=weights, k=n)


def cases(
    op: str,
    hidden: int,
    seed: int,
    *,
    n_zipf: int = 6,
    dtypes: tuple[str, ...] | None = None,
    max_tokens: int = 512,
    small: bool = False,
) -> list[dict[str, Any]]:
    """The input cases for ``op`` at the model's ``hidden`` size: every dtype of the op, Zipf token
    counts, odd hidden sizes, a non-contiguous input, small-magnitude rows (where epsilon matters), a
    ``variance_size`` case (rms ops). ``small``
    keeps every case tiny (the Triton interpreter is slow). Each case carries its own data seed."""
    info = OPS[op]
    rng = random.Random(seed)
    top = 16 if small else max_tokens
    hid = min(hidden, 96) if small else hidden
    odd = [hid + 3, 37] if small else [hid + 3, 1000 + rng.randrange(0, 48) * 2 + 1]
    tokens = [1, *zipf_tokens(rng, n_zipf, top=top), top]
    out: list[dict[str, Any]] = []

    def add(
        t: int, h: int, dtype: str, contiguous: bool = True, variance_size: int | None = None, scale: float = 1.0
    ) -> None:
        out.append(
            {
                "op": op,
                "tokens": int(t),
                "hidden": int(h),
                "dtype": dtype,
                "contiguous": contiguous,
                "variance_size": variance_size,
                "scale": scale,
                "seed": rng.randrange(1 << 62),
            }
        )

    for dtype in dtypes or info.dtypes:
        for t in tokens:
            add(t, hid, dtype)
        for h in odd:
            add(rng.choice(tokens), h, dtype)
        add(rng.choice(tokens), hid, dtype, contiguous=False)
        add(rng.choice(tokens), hid, dtype, scale=1e-3)  # rows whose mean square is near epsilon: epsilon matters
        if op in ("rms_norm", "fused_add_rms_norm"):
            add(rng.choice(tokens), hid, dtype, variance_size=max(1, hid // 2))
    return out


def bench_cases(
    op: str, hidden: int, seed: int, dtype: str = "float32", calls: int = 64, max_tokens: int = 256
) -> list[dict[str, Any]]:
    """The timed mix: ``calls`` calls at the model's hidden size and serving dtype, token counts from
    the Zipf distribution; every call gets its own fresh random inputs (its own data seed)."""
    rng = random.Random(seed)
    return [
        {
            "op": op,
            "tokens": t,
            "hidden": hidden,
            "dtype": dtype,
            "contiguous": True,
            "variance_size": None,
            "seed": rng.randrange(1 << 62),
        }
        for t in zipf_tokens(rng, calls, top=max_tokens)
    ]


def hidden_size(model_dir: str | None, default: int = 128) -> int:
    """The model's hidden size from its ``config.json`` (the tiny model's 128 when unknown)."""
    if not model_dir:
        return default
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
        return int(cfg.get("hidden_size") or default)
    except (OSError, ValueError, TypeError):
        return default

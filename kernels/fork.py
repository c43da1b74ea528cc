"""A library provider as files of the vLLM fork (torch-free: the orchestrator writes proposals with it).

A kernel proposal adds ``vllm/kernels/<provider>_<op>.py`` (the library file's source plus a
registration block), imports it from ``vllm/kernels/__init__.py`` and puts the provider first in the
op's ``ir_op_priority`` in ``serving.json`` (the engine argument that picks providers per op).
"""

from __future__ import annotations

import json
import re
from typing import Any

from .catalog import Provider

KERNELS_INIT = "vllm/kernels/__init__.py"
REGISTERED = re.compile(r"ir\.ops\.(\w+)\.register_impl\(\s*[\"'](\w+)[\"']")


def module_path(p: Provider) -> str:
    return f"vllm/kernels/{p.name}_{p.op}.py"


def module_text(p: Provider) -> str:
    src = p.path.read_text()
    # the fork's own Triton import: a placeholder where Triton has no backend (CPU), so importing is safe
    src = src.replace("import triton\nimport triton.language as tl\n", "from vllm.triton_utils import tl, triton\n")
    supports = f", supports_args={p.supports_args}" if p.supports_args else ""
    inplace = ", inplace=True" if p.inplace else ""
    return (
        f"# Added by `agentsearch kernels propose {p.op} --impl {p.name}` from agentsearch's kernel library\n"
        f"# (kernels/library/{p.module}).\n{src}\n\n"
        "# ---- registration with the fork's IR op registry\n"
        "from vllm import ir  # noqa: E402\n"
        "from vllm.platforms import current_platform  # noqa: E402\n\n"
        f"ir.ops.{p.op}.register_impl(\n    \"{p.name}\", supported={p.supported}{supports}{inplace}\n)({p.function})\n"
    )


def kernels_init(text: str, p: Provider) -> str:
    """``vllm/kernels/__init__.py`` importing the new module (unchanged if it already does)."""
    mod = f"{p.name}_{p.op}"
    line = f"from . import {mod}  # noqa: F401,E402  (agentsearch kernel library)\n"
    if line in text:
        return text
    return text.rstrip("\n") + "\n" + line


def with_priority(serving_text: str | None, op: str, first: str) -> str:
    """serving.json with ``first`` at the head of ``op``'s ``ir_op_priority`` (native kept last)."""
    data: dict[str, Any] = json.loads(serving_text) if serving_text else {}
    engine = data.setdefault("engine", {})
    prio = engine.setdefault("ir_op_priority", {})
    current = [x for x in (prio.get(op) or []) if x != first]
    if "native" not in current:
        current.append("native")
    prio[op] = [first, *current]
    return json.dumps(data, indent=2) + "\n"


def priorities(serving_text: str | None) -> dict[str, list[str]]:
    """``engine.ir_op_priority`` of a serving.json (``{}`` when unset or unreadable)."""
    try:
        data = json.loads(serving_text) if serving_text else {}
        prio = (data.get("engine") or {}).get("ir_op_priority") or {}
    except (ValueError, AttributeError):
        return {}
    if not isinstance(prio, dict):
        return {}
    out = {}
    for op, v in prio.items():
        if isinstance(v, str):
            v = [x for x in v.replace(" ", "").split(",") if x]
        if isinstance(v, list) and all(isinstance(x, str) for x in v):
            out[str(op)] = list(v)
    return out


def registered(sources: dict[str, str]) -> dict[str, list[str]]:
    """op -> providers registered by these module sources (``register_impl("name"`` calls)."""
    out: dict[str, list[str]] = {}
    for text in sources.values():
        for op, name in REGISTERED.findall(text):
            out.setdefault(op, [])
            if name not in out[op]:
                out[op].append(name)
    return out

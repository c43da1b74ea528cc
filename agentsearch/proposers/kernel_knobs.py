"""The sweep's kernel knobs: one ``ir_op_priority.<op>`` knob per IR op for which the **baseline**
registers providers from agentsearch's kernel library (``vllm/kernels/*.py`` imported by
``vllm/kernels/__init__.py``; ``agentsearch kernels propose`` adds them). Its values: the platform
default (``["native"]``) and each registered provider first with ``native`` behind it. CPU providers
only, unless the machine has a GPU (then the Triton ones too)."""

from __future__ import annotations

import re
from collections.abc import Callable

from kernels import catalog
from kernels import fork as kfork

from ..config import KnobConfig

PREFIX = "ir_op_priority."
DEFAULT = ["native"]
_IMPORT = re.compile(r"^from \. import ([\w, ]+)", re.M)


def registered(read_file: Callable[[str], str | None]) -> dict[str, list[str]]:
    """op -> providers the baseline registers from the kernel library."""
    init = read_file(kfork.KERNELS_INIT) or ""
    sources = {}
    for names in _IMPORT.findall(init):
        for mod in (n.strip() for n in names.split(",")):
            text = read_file(f"vllm/kernels/{mod}.py") if mod else None
            if text:
                sources[mod] = text
    return kfork.registered(sources)


def knobs(read_file: Callable[[str], str | None], file: str, gpu: bool) -> list[KnobConfig]:
    kinds = ("cpu", "triton") if gpu else ("cpu",)
    library = {(p.op, p.name): p for p in catalog.PROVIDERS}
    out = []
    for op, names in sorted(registered(read_file).items()):
        usable = [n for n in names if (op, n) in library and library[(op, n)].kind in kinds]
        if op not in catalog.OPS or not usable:
            continue
        out.append(
            KnobConfig(
                name=PREFIX + op,
                values=(list(DEFAULT), *([n, "native"] for n in usable)),
                where="json",
                key=f"engine.ir_op_priority.{op}",
                file=file,
                category="kernel",
                rationale=f"Providers of vllm.ir.ops.{op} registered in the baseline: " + ", ".join(usable) + "; "
                "the micro stage checks the op before the engines start.",
            )
        )
    return out

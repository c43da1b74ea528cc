"""The architecture page against the code: its layer table is generated from the import contract, and every
file, module and function it names exists. A page that disagrees with the contract or names what is gone fails."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "ARCHITECTURE.md"
sys.path.insert(0, str(ROOT / "docs"))
import hooks  # noqa: E402 (docs/hooks.py: what the site's build runs)

NAMED = re.compile(r"`((?:agentsearch|harness|history|kernels|benchmarks|tests)[./][A-Za-z_./]*)`")


def _modules_of_agentsearch() -> set[str]:
    pkg = ROOT / "agentsearch"
    files = {p.stem for p in pkg.glob("*.py") if p.stem != "__init__"}
    packages = {p.parent.name for p in pkg.glob("*/__init__.py")}
    return files | packages


def test_the_layer_table_is_the_contract_and_every_module_is_in_it():
    text = PAGE.read_text()
    assert hooks.LAYERS_MARK in text, "the agentsearch layers are generated from the contract, not written by hand"
    in_contract = [m for layer in hooks.contract_layers() for m in layer]
    assert len(in_contract) == len(set(in_contract))
    assert set(in_contract) == _modules_of_agentsearch(), "every module of agentsearch/ has exactly one layer"
    table = hooks.layers_markdown()
    rows = [line.split("|")[1:3] for line in table.splitlines()[2:]]
    assert [m.strip().strip("`") for _, m in rows] == in_contract  # top first, in the contract's order
    assert [int(n) for n, _ in rows] == sorted(int(n) for n, _ in rows)


def test_a_module_without_a_docstring_fails_the_docs_build(tmp_path, monkeypatch):
    (tmp_path / "agentsearch").mkdir()
    (tmp_path / "agentsearch" / "bare.py").write_text("X = 1\n")
    monkeypatch.setattr(hooks, "ROOT", tmp_path)
    with pytest.raises(ValueError, match=r"agentsearch/bare: no module docstring"):
        hooks.module_role("agentsearch", "bare")


def test_the_package_drawing_follows_the_packages_contract():
    text = PAGE.read_text()
    drawing = text.split("```", 2)[1]
    drawn = [m.group(1) for m in re.finditer(r"^(?:  ├──▶ |  └──▶ )?(\w+)/ ", drawing, re.M)]
    layers = hooks.contract_layers("packages")
    rank = {pkg: n for n, layer in enumerate(layers) for pkg in layer}
    assert set(drawn) == set(rank), f"the drawing names {drawn}, the contract {layers}"
    spine, arrows = drawn[:3], drawn[3:]  # tests above benchmarks above agentsearch, its arrows to the rest
    assert spine == sorted(spine, key=rank.__getitem__) and spine[-1] == "agentsearch"
    assert all(rank[a] > rank["agentsearch"] for a in arrows)


def test_every_file_module_and_function_the_page_names_exists():
    missing = [name for name in sorted(set(NAMED.findall(PAGE.read_text()))) if not _exists(name.rstrip("/."))]
    assert missing == [], f"docs/ARCHITECTURE.md names what does not exist: {missing}"


def _exists(name: str) -> bool:
    """A path of the repository, or a dotted name: the longest importable module, then attributes."""
    if (ROOT / name).exists():
        return True
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False

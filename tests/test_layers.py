"""The import contract of what runs inside a side's sandbox (pyproject.toml, `sandbox-side`): the workers, the
kernel worker and check, and the coverage tracer import nothing of ours beyond kernels.specs — a side's
containment relies on it (what they import runs with the candidate's code on the path)."""

from __future__ import annotations

import ast
import tomllib

from .conftest import ROOT

OURS = ("agentsearch", "history", "templates", "harness", "kernels")


def contract() -> dict:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return next(c for c in config["tool"]["importlinter"]["contracts"] if c["id"] == "sandbox-side")


def test_the_contract_forbids_every_harness_module_by_name():
    """import-linter does not let an ancestor (`harness`) forbid a source's own relatives, so each module is
    named: a new harness module must be added there."""
    forbidden = set(contract()["forbidden_modules"])
    for path in (ROOT / "harness").glob("*.py"):
        if path.stem != "__init__":
            assert f"harness.{path.stem}" in forbidden, f"add harness.{path.stem} to the sandbox-side contract"
    workers = {f"harness.workers.{p.stem}" for p in (ROOT / "harness" / "workers").glob("*.py") if p.stem != "__init__"}
    assert workers <= set(contract()["source_modules"]), "every worker is a source of the contract"


def test_the_coverage_tracer_imports_only_the_standard_library():
    """harness/tracer is a data directory (its sitecustomize.py is put on a side's path), out of import-linter's reach."""
    for path in (ROOT / "harness" / "tracer").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            for name in names:
                assert name.split(".")[0] not in OURS, f"{path.name} imports {name}"
            assert not (isinstance(node, ast.ImportFrom) and node.level), f"{path.name}: a relative import"


def test_no_module_imports_another_modules_private_names():
    """One module's private names (`_name`) are its own: another module that needs one needs a public name. (ruff's
    SLF rule refuses `obj._name` outside the object's class; this refuses `from x import _name`.)"""
    found = []
    for pkg in OURS:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom):
                    found += [
                        f"{path.relative_to(ROOT)}:{node.lineno} imports {a.name} from {'.' * node.level}{node.module or ''}"
                        for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")
                    ]
    assert not found, "\n".join(found)


def test_the_orchestrator_reads_records_typed_never_an_entrys_raw_data():
    """A history entry's ``data`` is what was written, perhaps by an older version; ``entry.record`` is the same
    record upgraded and validated. Only the history layer reads ``data`` (the upgrader, the hash chain)."""
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in sorted((ROOT / "agentsearch").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr == "data"
    ]
    assert not found, "read entry.record instead of entry.data at " + ", ".join(found)


def test_the_orchestrator_never_reads_a_record_back_from_its_json():
    """A record's fields are read by attribute; ``record.to_json()`` is for writing and showing, never for reading a
    field back by key (``r.to_json().get("speedup")``, ``r.to_json()["workloads"]``)."""
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in sorted((ROOT / "agentsearch").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if (isinstance(node, ast.Subscript) or (isinstance(node, ast.Attribute) and node.attr == "get"))
        and isinstance(inner := node.value, ast.Call)
        and isinstance(inner.func, ast.Attribute)
        and inner.func.attr == "to_json"
    ]
    assert not found, "read the record's attribute instead of its JSON at " + ", ".join(found)


MAX_FUNCTION_LINES = 100  # docs/contributing.md: what the limit is for and how to split


def test_no_product_function_is_over_100_lines():
    """A function that does not fit on a screen holds several concerns (issue #60); its steps get names."""
    long = []
    for package in ("agentsearch", "harness", "history", "kernels"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert long == [], "split these (docs/contributing.md, Function length):\n" + "\n".join(long)

"""Check that every corpus patch applies to the installed vLLM in its stated direction.

    python benchmarks/upstream/check_patches.py [--keep DIR]

Copies the installed ``vllm`` package's ``.py`` files into a scratch git repository laid out like an
``agentsearch init --from-installed vllm`` fork (``vllm/...`` at the root) and runs ``git apply --check``
(``backward``: the patch onto stock; ``forward``: ``-R``, i.e. the fork state is constructible) for each entry of
``manifest.toml``. Nothing is imported or run; the installed package is only read.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent


def scratch_copy(dest: Path) -> Path:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("vllm is not installed in this Python")
    pkg = Path(list(spec.submodule_search_locations)[0])
    shutil.copytree(
        pkg,
        dest / "vllm",
        ignore=lambda d, names: [n for n in names if n == "__pycache__" or n.endswith((".so", ".pyc"))],
    )
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)
    return dest


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", type=Path, help="build the scratch copy here and keep it")
    args = ap.parse_args()
    manifest = tomllib.loads((HERE / "manifest.toml").read_text())
    tmp = None
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=False)
        root = scratch_copy(args.keep)
    else:
        tmp = tempfile.TemporaryDirectory()
        root = scratch_copy(Path(tmp.name))
    bad = 0
    for e in manifest["entry"]:
        patch = HERE / e["patch"]
        flags = ["-R"] if e["direction"] == "forward" else []
        r = subprocess.run(["git", "apply", *flags, "--check", str(patch)], cwd=root, capture_output=True, text=True)
        ok = r.returncode == 0
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {e['id']:34s} {e['kind']:12s} {e['direction']:8s} {r.stderr.strip()[:200]}")
    print(f"{len(manifest['entry']) - bad}/{len(manifest['entry'])} apply")
    if tmp:
        tmp.cleanup()
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())

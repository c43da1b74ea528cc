"""Red team: the server's launcher (harness/workers/vllm_serve.py) runs with a side's worktree on PYTHONPATH. It
imports its sibling vllm_worker by name: a side's own ``vllm_worker.py`` must not be the one it gets, and the model
inspection hook it replaces is the side's vLLM's (the same replacement on both sides), nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from harness.serve_session import SERVER

FILES = {
    # the side's decoy: imported instead of ours, it would run here (a marker) and skip the replacement
    "vllm_worker.py": "open('SHADOW', 'w').write('imported')\ndef inspect_models_in_process():\n    return False\n",
    "vllm/__init__.py": "",
    "vllm/platforms/__init__.py": "class _P:\n    def is_cpu(self):\n        return True\n\ncurrent_platform = _P()\n",
    "vllm/model_executor/__init__.py": "",
    "vllm/model_executor/models/__init__.py": "",
    "vllm/model_executor/models/registry.py": (
        "def _run_in_subprocess(fn):\n    raise SystemExit('the subprocess hook ran')\n"
    ),
    "vllm/entrypoints/__init__.py": "",
    "vllm/entrypoints/cli/__init__.py": "",
    "vllm/entrypoints/cli/main.py": (
        "import sys\n"
        "from vllm.model_executor.models import registry\n"
        "def main():\n"
        "    print('argv', sys.argv[1:], 'inspected', registry._run_in_subprocess(lambda: 42))\n"
    ),
}


def launch(tmp_path: Path, files: dict[str, str], *args: str) -> tuple[Path, subprocess.CompletedProcess]:
    """The launcher with a side's worktree made of ``files`` on PYTHONPATH (as serve_session starts it, unsandboxed)."""
    side = tmp_path / "worktree"
    for rel, text in files.items():
        (side / rel).parent.mkdir(parents=True, exist_ok=True)
        (side / rel).write_text(text)
    env = {**os.environ, "PYTHONPATH": str(side), "PYTHONDONTWRITEBYTECODE": "1"}
    argv = [sys.executable, str(SERVER), *args]
    return side, subprocess.run(argv, cwd=side, env=env, capture_output=True, text=True, timeout=60)


def test_the_launcher_uses_its_own_worker_and_replaces_only_the_sides_inspection_hook(tmp_path: Path) -> None:
    side, proc = launch(tmp_path, FILES, "serve", "model", "--port", "1")
    assert proc.returncode == 0, proc.stderr
    # vLLM's command line got the arguments as `vllm serve ...` would, and the inspection ran in this process
    assert proc.stdout.strip() == "argv ['serve', 'model', '--port', '1'] inspected 42", proc.stdout
    assert not (side / "SHADOW").exists()  # the side's vllm_worker.py was never imported


def test_on_another_platform_the_hook_is_left_as_it_is(tmp_path: Path) -> None:
    gpu = FILES["vllm/platforms/__init__.py"].replace("True", "False")
    _, proc = launch(tmp_path, {**FILES, "vllm/platforms/__init__.py": gpu}, "serve", "model")
    assert "the subprocess hook ran" in proc.stderr + proc.stdout  # vLLM's own behaviour: its subprocess

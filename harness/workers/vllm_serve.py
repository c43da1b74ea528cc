"""vLLM's command line (``vllm serve MODEL ...``) as a side's server runs it, in that side's sandbox with the side's
vLLM on its path, with the model-class inspection answered in this process (``vllm_worker.inspect_models_in_process``:
about 10 s of CPU less per server start on a CPU; the same for both sides).

Self-contained: standard library + vllm only (never imports agentsearch or harness).

    python vllm_serve.py serve MODEL --host 127.0.0.1 --port N [engine flags]
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # this folder first: its vllm_worker, not a side's
    from vllm_worker import inspect_models_in_process  # type: ignore[import-not-found]  # (run as a script)

    inspect_models_in_process()
    sys.argv = ["vllm", *sys.argv[1:]]
    from vllm.entrypoints.cli.main import main

    main()

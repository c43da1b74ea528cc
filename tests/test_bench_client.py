"""The warm load generator's protocol, on a stand-in for ``vllm.benchmarks.serve`` (the real one runs in
tests/test_vllm_serving.py against real servers): one process serves many trials; a failed run leaves it
up; a hung run times out and the process is replaced; it never runs inside a side's sandbox."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from harness.engine_session import WorkerError
from harness.serve_session import BenchClient, ClientTimeout

FAKE_SERVE = '''
import os, time
def add_cli_args(parser):
    parser.add_argument("--seed", type=int)
    parser.add_argument("--num-prompts", type=int, default=4)
def main(args):
    if args.seed == 13:
        time.sleep(3600)  # a run that never ends (a server that never answers)
    if args.seed == 7:
        raise RuntimeError("all connections refused")
    return {"completed": args.num_prompts, "failed": 0, "duration": 0.01, "output_throughput": 100.0 + args.seed,
            "pid": os.getpid(), "odd": float("nan")}
'''
FAKE_ARGPARSE = "import argparse\nclass FlexibleArgumentParser(argparse.ArgumentParser):\n    pass\n"


@pytest.fixture
def fake_vllm(tmp_path: Path) -> Path:
    root = tmp_path / "baseline"
    for rel, text in {"vllm/__init__.py": "", "vllm/benchmarks/__init__.py": "", "vllm/benchmarks/serve.py": FAKE_SERVE,
                      "vllm/utils/__init__.py": "", "vllm/utils/argparse_utils.py": FAKE_ARGPARSE}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_one_generator_serves_many_trials_and_survives_a_failed_run(fake_vllm, tmp_path):
    import sys

    logs = tmp_path / "logs"
    logs.mkdir()
    c = BenchClient(lambda argv: argv, sys.executable, fake_vllm, {}, logs, timeout_s=20)
    try:
        assert c.start() >= 0
        first = c.bench(["--seed", "1", "--num-prompts", "4"])
        assert first["completed"] == 4 and first["output_throughput"] == 101.0
        assert first["odd"] is None  # NaN never crosses the pipe
        with pytest.raises(WorkerError, match="all connections refused"):
            c.bench(["--seed", "7"])
        assert c.alive()
        again = c.bench(["--seed", "2"])
        assert again["pid"] == first["pid"] and c.served == 2  # the same process: imported once
        with pytest.raises(WorkerError, match="unrecognized arguments"):
            c.bench(["--no-such-flag"])  # argparse's exit is reported, not fatal
        assert c.alive()
    finally:
        c.close()
    assert not c.alive()


def test_a_hung_run_times_out_at_the_trials_limit(fake_vllm, tmp_path):
    import sys

    c = BenchClient(lambda argv: argv, sys.executable, fake_vllm, {}, tmp_path, timeout_s=2)
    try:
        c.start()
        t0 = time.monotonic()
        with pytest.raises(ClientTimeout, match="timed out after 2 s"):
            c.bench(["--seed", "13"])
        assert time.monotonic() - t0 < 10
        pid = c.proc.pid if c.proc else None
    finally:
        c.close()
    assert pid is not None and not Path(f"/proc/{pid}/cmdline").exists() or b"bench_client" not in Path(f"/proc/{pid}/cmdline").read_bytes()

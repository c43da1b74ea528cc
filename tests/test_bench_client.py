"""The warm load generator's protocol, against a real HTTP server on loopback (real vLLM servers are in
tests/test_vllm_serving.py): one process serves many trials; a run whose requests fail, or a malformed load,
leaves it up; a hung run times out and the process is replaced; what a server streams is hashed, not carried."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from harness import serving_load
from harness.serve_session import BenchClient, ClientReported, ClientTimeout, served_requests
from harness.worker_protocol import WorkerError


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if body["prompt"][0] == 13:
            time.sleep(3600)  # a server that never answers
        if body["prompt"][0] == 7:
            self.send_response(503)
            self.end_headers()
            return
        self.send_response(200)
        self.end_headers()
        n = int(body["max_tokens"])
        text = f"answer to {body['prompt'][:3]} " * 40
        step = len(text) // n
        parts = [text[i * step : (i + 1) * step] for i in range(n - 1)] + [text[(n - 1) * step :]]
        for part in parts:
            self.wfile.write(b"data: " + json.dumps({"choices": [{"text": part}]}).encode() + b"\n\n")
        self.wfile.write(
            b"data: "
            + json.dumps({"choices": [], "usage": {"completion_tokens": n}}).encode()
            + b"\n\ndata: [DONE]\n\n"
        )


@pytest.fixture(scope="module")
def url():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def plan(first_token: int | None = None, prompts: int = 4):
    load = serving_load.plan({"prompts": prompts, "input_len": 8, "output_len": 8}, 1, 1000)
    if first_token is not None:
        load = serving_load.LoadPlan(
            tuple((first_token, *p[1:]) for p in load.prompts),
            load.output_lens,
            load.arrivals,
            load.max_concurrency,
            load.warmup,
            load.rate,
        )
    return load


def test_one_generator_serves_many_trials_and_survives_a_failed_run(url, tmp_path):
    c = BenchClient(lambda argv: argv, sys.executable, None, {}, tmp_path, timeout_s=20)
    try:
        assert c.start() >= 0
        # it runs ahead of the servers where it may (root): a busy machine delays the answers, not the sends
        assert c.nice == (-10 if os.geteuid() == 0 else os.getpriority(os.PRIO_PROCESS, 0)), c.nice
        assert os.getpriority(os.PRIO_PROCESS, c.proc.pid) == c.nice
        load = plan()
        first = c.run(load.command(url, "m"))
        timings, outputs, why = served_requests(first, load)
        assert not why and len(timings) == 4 and outputs is not None
        # the texts cross as one hash per 16 characters (at most 64 of them, then one of the whole text)
        text = f"answer to {list(load.prompts[0][:3])} " * 40
        assert list(outputs[0]) == [zlib.crc32(text[i : i + 16].encode()) for i in range(0, len(text), 16)]
        failed = c.run(plan(first_token=7).command(url, "m"))  # every request refused: rows that say so
        assert not any(r["ok"] for r in failed["requests"]) and "HTTP 503" in failed["requests"][0]["error"]
        assert "4 of 4 requests failed: HTTP 503" in served_requests(failed, plan(first_token=7))[2]
        with pytest.raises(ClientReported, match="malformed load"):
            c.run({**load.command(url, "m"), "arrivals": [0.0]})  # reported by the generator: it stays in use
        with pytest.raises(ClientReported, match="unknown command"):
            c.run({"cmd": "bench", "argv": []})
        assert c.alive()
        c.run(load.command(url, "m"))
        assert c.served == 3  # the same process: started once
    finally:
        c.close()
    assert not c.alive()


def test_a_hung_run_times_out_at_the_trials_limit(url, tmp_path):
    c = BenchClient(lambda argv: argv, sys.executable, None, {}, tmp_path, timeout_s=2)
    try:
        c.start()
        t0 = time.monotonic()
        with pytest.raises(ClientTimeout, match="timed out after 2 s"):
            c.run(plan(first_token=13, prompts=1).command(url, "m"))
        assert time.monotonic() - t0 < 10
        pid = c.proc.pid if c.proc else None
    finally:
        c.close()
    assert (
        pid is not None
        and not Path(f"/proc/{pid}/cmdline").exists()
        or b"bench_client" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    )


def test_outputs_that_differ_fail_the_outputs_check():
    """A server that stops early yet reports every token passes the counts; the other side's texts catch it."""
    from agentsearch.workloads import OutputsMatch
    from harness.trials import TrialOutcome

    honest = ((1, 2, 3), (4, 5, 6))
    short = ((1,), (4,))
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


class TokenHandler(BaseHTTPRequestHandler):
    """A server that gives token ids (vLLM's ``return_token_ids``) and prompt logprobs: a Markov model whose greedy
    next token is (t * 31 + 7) % 997, logprob log 0.5; any other token log 1e-4."""

    def log_message(self, *args):
        pass

    def do_POST(self):  # noqa: N802
        import math

        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        ids = list(body["prompt"])
        self.send_response(200)
        self.end_headers()
        nxt = lambda t: (t * 31 + 7) % 997  # noqa: E731
        if body.get("prompt_logprobs"):
            plp = [None] + [
                {
                    str(nxt(ids[i - 1])): {"logprob": math.log(0.5), "rank": 1},
                    str(ids[i]): {
                        "logprob": math.log(0.5) if ids[i] == nxt(ids[i - 1]) else math.log(1e-4),
                        "rank": 1 if ids[i] == nxt(ids[i - 1]) else 7,
                    },
                }
                for i in range(1, len(ids))
            ]
            self.wfile.write(json.dumps({"choices": [{"text": "x", "prompt_logprobs": plp}]}).encode())
            return
        t = ids[-1]
        if ids[0] == 5:  # a "first token" sent before any work: text that no token id carries
            self.wfile.write(b"data: " + json.dumps({"choices": [{"text": " ", "token_ids": []}]}).encode() + b"\n\n")
        for j in range(int(body["max_tokens"])):
            t = nxt(t)
            chunk = {"text": f"<{t}>", **({"token_ids": [t]} if body.get("return_token_ids") else {})}
            if ids[0] == 6 and j == 0:  # a token id dropped from the stream
                chunk["token_ids"] = []
                chunk["text"] = ""
            self.wfile.write(b"data: " + json.dumps({"choices": [chunk]}).encode() + b"\n\n")
        usage = {"completion_tokens": int(body["max_tokens"])}
        self.wfile.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\ndata: [DONE]\n\n")


def test_answers_arrive_as_token_ids_and_are_scored_by_teacher_forcing(tmp_path):
    """The outputs rule on a server (harness/outputs_rule.py): the generator keeps each answer's token ids, and
    scores answers after their prompts, twice (the second time in reverse order), one row per answer token."""
    from harness.outputs_rule import gaps, parse_scores

    srv = ThreadingHTTPServer(("127.0.0.1", 0), TokenHandler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    c = BenchClient(lambda argv: argv, sys.executable, None, {}, tmp_path, timeout_s=20)
    try:
        c.start()
        load = plan()
        data = c.run(load.command(url, "m"), load.report_bytes())
        assert {r["outputs_kind"] for r in data["requests"]} == {"tokens"}
        timings, outputs, why = served_requests(data, load)
        assert why == "" and outputs is not None
        prompt = load.prompts[load.warmup]
        assert outputs[0][0] == (prompt[-1] * 31 + 7) % 997 and len(outputs[0]) == load.output_lens[load.warmup]
        greedy, padded = list(outputs[0]), list(outputs[0][:3]) + [outputs[0][2]] * (len(outputs[0]) - 3)
        items = [{"prompt": list(prompt), "tokens": greedy}, {"prompt": list(prompt), "tokens": padded}]
        got = c.ask({"cmd": "score", "base_url": url, "model": "m", "items": items})
        first, err = parse_scores(got["scores"], [greedy, padded])
        again, err2 = parse_scores(got["again"], [greedy, padded])
        assert first is not None and again == first, (err, err2)
        assert max(gaps(first[0])) == 0.0 and max(gaps(first[1])) > 8  # the padded tail is not what the model says
        assert c.served == 1  # scoring is not a trial
        for first, why in ((5, "a chunk carries text but no token id"), (6, "token ids for the")):
            data = c.run(plan(first).command(url, "m"), load.report_bytes())
            assert all(not r["ok"] and why in r["error"] for r in data["requests"]), data["requests"][0]
    finally:
        c.close()
        srv.shutdown()


def test_a_server_without_token_ids_is_compared_by_the_hashes_of_its_texts(url, tmp_path):
    c = BenchClient(lambda argv: argv, sys.executable, None, {}, tmp_path, timeout_s=20)
    try:
        c.start()
        load = plan()
        data = c.run(load.command(url, "m"), load.report_bytes())
        assert {r["outputs_kind"] for r in data["requests"]} == {"text"}
    finally:
        c.close()

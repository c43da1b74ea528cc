"""The serving load generator against a server that lies (#41): the candidate's server controls every byte it
streams, so each timing is taken by our definitions and every count is checked against the plan.

A real HTTP server on loopback streams OpenAI-style completions (server-sent events) and plays a candidate's
tricks; the real warm generator (``harness/workers/bench_client.py``, vLLM installed) measures it through
``BenchClient``, and ``served_requests`` judges its report, exactly as a serving trial does."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from harness import serving_load, tails
from harness.serve_session import BenchClient, served_requests

TOKEN_S = 0.004  # the fake server's time per token


class Server(ThreadingHTTPServer):
    daemon_threads = True
    trick = "honest"


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass

    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n, trick = int(body["max_tokens"]), self.server.trick  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()

        def send(obj) -> None:
            self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
            self.wfile.flush()

        if trick == "empty-first":  # a "first token" before any work: an empty chunk at once
            send({"choices": [{"text": ""}]})
        time.sleep(0.03)  # prefill
        tokens = [f"t{i} " for i in range(n)] if trick != "all-empty" else [""] * n
        if trick == "split":  # each token as two chunks: twice the gaps, each half as long
            tokens = [part for t in tokens for part in (t[:1], t[1:])]
        for i, t in enumerate(tokens):
            if i:
                time.sleep(TOKEN_S)
            send({"choices": [{"text": t}]})
        reported = n + 3 if trick == "more-tokens" else n
        if trick != "no-usage":
            send({"choices": [], "usage": {"completion_tokens": reported, "prompt_tokens": len(body["prompt"])}})
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.fixture(scope="module")
def server():
    srv = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    logs = tmp_path_factory.mktemp("client")
    c = BenchClient(lambda argv: argv, __import__("sys").executable, None, {}, Path(logs), 120.0)
    c.start()
    yield c
    c.close()


def measure(server, client, trick: str, params: dict):
    server.trick = trick
    load = serving_load.plan(params, 3, 1000)
    data = client.run(load.command(f"http://127.0.0.1:{server.server_address[1]}", "m"))
    return load, data, served_requests(data, load)


def test_an_honest_server_is_timed_by_the_definitions_and_the_schedule_is_kept(server, client):
    load, data, (timings, outputs, why) = measure(
        server, client, "honest", {"prompts": 40, "output_len": 5, "request_rate": 100}
    )
    assert not why, why
    assert len(timings) == 40 and all(len(t.gaps) == 4 for t in timings)
    m = tails.serving_metrics(timings, ("ttft_p50_ms", "itl_p50_ms"))
    assert 25 < m["ttft_p50_ms"] < 200, m  # the 30 ms prefill, loopback and a busy CI machine
    assert TOKEN_S * 1000 * 0.8 < m["itl_p50_ms"] < 60, m
    # open loop: each request left at its scheduled offset (not before; late only by the generator's lag)
    for r, at in zip(data["requests"], load.arrivals, strict=False):
        assert r["sent"] / 1e6 >= at - 0.001 and r["lag"] >= 0
        assert r["sent"] / 1e6 - at < 0.5


def test_an_empty_chunk_sent_at_once_is_not_a_first_token(server, client):
    _, _, (honest, _, _) = measure(server, client, "honest", {"prompts": 20, "output_len": 4})
    _, _, (tricked, _, why) = measure(server, client, "empty-first", {"prompts": 20, "output_len": 4})
    assert not why
    fast = tails.serving_metrics(tricked, ("ttft_p50_ms",))["ttft_p50_ms"]
    assert fast > 25, f"the empty chunk was timed as the first token: TTFT p50 {fast:.1f} ms"
    assert fast > 0.5 * tails.serving_metrics(honest, ("ttft_p50_ms",))["ttft_p50_ms"]


def test_tokens_that_decode_to_nothing_are_not_a_failure(server, client):
    """An honest server whose tokens decode to no text (a tiny model's byte tokens do): the request is served; its
    first token is its last chunk, and it has no gaps."""
    _, _, (timings, _, why) = measure(server, client, "all-empty", {"prompts": 4, "output_len": 4})
    assert not why, why
    assert all(t.gaps == () and t.ttft == t.e2e and t.e2e > 0.03 for t in timings)


@pytest.mark.parametrize(
    "trick, says",
    [
        (
            "split",
            "more text chunks than the 4 tokens asked for",
        ),  # more chunks than tokens: halved gaps are not a faster ITL
        ("more-tokens", "a number of output tokens other than the one requested"),  # usage inflating the throughput
        ("no-usage", "malformed per-request results"),
    ],
)
def test_a_server_that_misreports_fails_the_trial(server, client, trick, says):
    _, _, (_, _, why) = measure(server, client, trick, {"prompts": 6, "output_len": 4})
    assert says in why, why

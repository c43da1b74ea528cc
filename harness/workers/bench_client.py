"""The warm load generator for the serving workload: our own open-loop client, started once per server.

It is the measuring instrument, so it runs code no proposal can change (this file, with the standard library and
aiohttp from the orchestrator's environment), in the orchestrator's hands and outside any side's sandbox; it only
joins the measured server's network namespace (loopback only) to reach it. Warm: one process serves every trial of
its server, so a trial costs its requests, not a start.

``load`` runs one planned load (``harness.serving_load`` plans it): it sends each request at its scheduled offset
(or all at once under ``max_concurrency``) as a streamed OpenAI completion (``complete``: the timing definitions of
``harness.tails``), and reports per request when it was sent, its lag behind the schedule, its client queue time,
its TTFT, every gap between chunks, its end-to-end latency, the tokens the server reported and its outputs: the
token ids of its answer where the server gives them (vLLM's ``return_token_ids``: the outputs rule can score them),
else the CRC-32 of each successive CHUNK characters of its generated text, at most MAX_CHUNKS of them and then one of
the whole text (the outputs check compares them between the sides). The orchestrator computes every metric from these
(``harness.tails``) and checks every count against the plan (``harness.serve_session.served_requests``).

Self-contained: standard library and aiohttp only (never imports agentsearch, harness or vllm).

Protocol: results go to the file descriptor ``--fd`` as JSON lines; commands arrive on stdin as JSON lines:
``{"cmd": "load", ...}`` (``LoadPlan.command``) -> ``{"event": "result", "result": {"requests": [...]}}`` or
``{"event": "error", "error": "..."}`` (the process stays up); ``{"cmd": "score", "base_url", "model", "items":
[{"prompt": [...], "tokens": [...]}]}`` -> ``{"event": "result", "result": {"scores": [...], "again": [...]}}`` (the
timed outputs rule's teacher forcing, ``score``); ``{"cmd": "quit"}``. On start-up:
``{"event": "ready", "import_s": ..., "nice": ...}``.

It runs at niceness NICE where it may (as root): ahead of the servers it measures (both sides' generators alike) and
of anything else on the machine, so that a busy machine delays the servers' answers, which is measured, not the
generator's sends, which would make the trial the run's error (its lag is checked).

    python bench_client.py --fd 3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
import zlib

NICE = -10  # the generator's scheduling priority where it may raise it (a CFS weight about 9x a default process's)
CHUNK = 16  # characters of generated text per hash: about 4 tokens
MAX_CHUNKS = 64  # hashes per request (its first 1,024 characters), then one of the whole text


def _chunks(text: object) -> list[int]:
    t = text if isinstance(text, str) else ""
    data = t.encode("utf-8", "surrogatepass")
    head = [
        zlib.crc32(t[i : i + CHUNK].encode("utf-8", "surrogatepass"))
        for i in range(0, min(len(t), CHUNK * MAX_CHUNKS), CHUNK)
    ]
    return head + [zlib.crc32(data)] if len(t) > CHUNK * MAX_CHUNKS else head


def _count(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**31


def _micros(x: float) -> int:
    return int(round(x * 1e6))


MAX_TEXT = 1 << 20  # characters of generated text per request; a server that streams more fails the request
MAX_LINE = 8 << 20  # bytes of one event-stream line (a chunk of MAX_TEXT characters, JSON-escaped, fits)


def _payload(model: str, prompt: list, output_len: int) -> dict:
    """The streamed OpenAI completion request: greedy, exactly ``output_len`` tokens, with usage and token ids."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": output_len,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,  # vLLM: each chunk's token ids, the answer the outputs rule can score
        # greedy means the raw argmax: no penalty from the model's generation config (the scoring reads raw logprobs)
        "repetition_penalty": 1.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
    }


class _Stream:
    """One completion's event stream as it arrives: split into lines, each chunk timed when it is read; a
    ValueError for a stream no honest server sends (too long a line, too many tokens, text without its ids)."""

    def __init__(self, prompt_len: int, output_len: int) -> None:
        self.output_len = output_len
        self.start = time.perf_counter()
        self.gaps: list[float] = []
        self.texts: list[str] = []
        self.chars = 0
        self.first: float | None = None
        self.last = self.end = 0.0
        self.tokens: object = None
        self.prompt_tokens: object = prompt_len
        self.ids: list[int] | None = []  # the answer's token ids; None once a chunk came without them (no ids served)
        self.buf = b""

    def feed(self, data: bytes) -> None:
        self.buf += data
        if b"\n" not in data and len(self.buf) > MAX_LINE:
            raise ValueError(f"a line of more than {MAX_LINE} bytes")
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            self._line(line.strip())

    def _line(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return  # blank lines, SSE comments
        body = line[5:].strip()
        if body == b"[DONE]":
            return
        msg = json.loads(body)
        if not isinstance(msg, dict):
            return
        choices = msg.get("choices")
        if choices and isinstance(choices, list) and isinstance(choices[0], dict):
            self._choice(choices[0])
        usage = msg.get("usage")
        if isinstance(usage, dict):
            self.tokens = usage.get("completion_tokens")
            if usage.get("prompt_tokens") is not None:
                self.prompt_tokens = usage.get("prompt_tokens")

    def _choice(self, choice: dict) -> None:
        self.end = time.perf_counter()
        text = choice.get("text") or ""
        if not isinstance(text, str):
            raise ValueError("a chunk's text is not a string")
        got = choice.get("token_ids")
        if self.ids is not None and isinstance(got, list) and all(_count(t) for t in got):
            if text and not got:
                # text without the token it decodes: a "first token" sent ahead of the work
                raise ValueError("a chunk carries text but no token id")
            self.ids.extend(got)
            if len(self.ids) > self.output_len:
                raise ValueError(f"more token ids than the {self.output_len} tokens asked for")
        elif text or got is not None:
            self.ids = None
        if text:
            self._text(text)

    def _text(self, text: str) -> None:
        if len(self.texts) >= self.output_len:  # one text chunk per token at most: never more gaps than tokens
            raise ValueError(f"more text chunks than the {self.output_len} tokens asked for")
        if self.first is None:
            self.first = self.end
        else:
            self.gaps.append(self.end - self.last)
        self.last = self.end
        self.texts.append(text)
        self.chars += len(text)
        if self.chars > MAX_TEXT:
            raise ValueError(f"more than {MAX_TEXT} characters of text")

    def failed(self, error: str) -> dict:
        return {
            "ok": False,
            "error": error,
            "start": self.start,
            "ttft": 0.0,
            "e2e": 0.0,
            "gaps": [],
            "text": "",
            "token_ids": None,
            "output_tokens": self.tokens,
            "input_tokens": self.prompt_tokens,
        }

    def result(self) -> dict:
        """The completion once its stream ended: timed, or failed when no token came or the ids fall short."""
        if not self.end:
            return self.failed("no token was streamed")
        if self.first is None:  # every token decoded to nothing: the first text is the (empty) end
            self.first = self.last = self.end
        if self.ids and len(self.ids) != self.output_len:
            return self.failed(
                f"the server streamed {len(self.ids)} token ids for the {self.output_len} tokens asked for"
            )
        return {
            "ok": True,
            "error": "",
            "start": self.start,
            "ttft": self.first - self.start,
            "e2e": max(self.last, self.end) - self.start,
            "gaps": self.gaps,
            "text": "".join(self.texts),
            "token_ids": self.ids or None,
            "output_tokens": self.tokens,
            "input_tokens": self.prompt_tokens,
        }


async def complete(session, api_url: str, model: str, prompt: list, output_len: int) -> dict:
    """One streamed completion, timed by the definitions of ``harness.tails``: TTFT is the first chunk that carries
    text (an empty chunk sent early is not a token; a request whose whole text is empty — tokens that decode to
    nothing — has its first token when its last chunk came), each gap is between two chunks that carry text, E2E
    ends at the last chunk. Tokens as the server's usage reports them. Times in seconds (``time.perf_counter``)."""
    import aiohttp

    payload = _payload(model, prompt, output_len)
    stream = _Stream(len(prompt), output_len)
    try:
        async with session.post(url=api_url, json=payload) as response:
            if response.status != 200:
                return stream.failed(f"HTTP {response.status} {response.reason or ''}".strip())
            async for data in response.content.iter_any():
                stream.feed(data)
    except (aiohttp.ClientError, ValueError, OSError) as exc:
        return stream.failed(f"{type(exc).__name__}: {exc}")
    return stream.result()


def load(cmd: dict) -> dict:
    """Run one planned load (see the module docstring); per request, times in microseconds."""
    import asyncio

    import aiohttp

    prompts, outs = cmd["prompts"], cmd["output_lens"]
    arrivals, warm, mc = cmd.get("arrivals"), int(cmd.get("warmup") or 0), cmd.get("max_concurrency")
    api_url, model = cmd["base_url"].rstrip("/") + "/v1/completions", cmd["model"]
    if len(prompts) != len(outs) or (arrivals is not None and len(arrivals) != len(prompts) - warm):
        raise ValueError("malformed load: prompts, output lengths and arrivals disagree")

    async def go() -> list[dict]:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60, force_close=False)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=6 * 3600)) as session:
            sem = asyncio.Semaphore(int(mc)) if mc else None
            if warm:  # not measured: the first requests after a start or a pause
                ws = asyncio.Semaphore(int(mc) if mc else 8)

                async def warm_one(i: int) -> None:
                    async with ws:
                        await complete(session, api_url, model, prompts[i], int(outs[i]))

                await asyncio.gather(*(warm_one(i) for i in range(warm)))
            rows: list[dict] = [{} for _ in range(len(prompts) - warm)]

            async def one(j: int, scheduled: float, t0: float) -> None:
                arrived = time.perf_counter()
                i = warm + j
                if sem is not None:
                    async with sem:
                        r = await complete(session, api_url, model, prompts[i], int(outs[i]))
                else:
                    r = await complete(session, api_url, model, prompts[i], int(outs[i]))
                rows[j] = {
                    "ok": r["ok"],
                    "error": str(r["error"])[-300:],
                    "sent": _micros(r["start"] - t0),
                    "lag": _micros(arrived - scheduled),
                    "queue": _micros(r["start"] - arrived),
                    "ttft": _micros(r["ttft"]),
                    "e2e": _micros(r["e2e"]),
                    "gaps": [_micros(g) for g in r["gaps"]],
                    "output_tokens": r["output_tokens"],
                    "input_tokens": r["input_tokens"],
                    # the token ids where the server gave them all (the outputs rule scores them), else text hashes
                    "outputs": r["token_ids"] if r["token_ids"] is not None else _chunks(r["text"]),
                    "outputs_kind": "tokens" if r["token_ids"] is not None else "text",
                }

            t0 = time.perf_counter() + 0.02
            tasks = []
            for j in range(len(prompts) - warm):
                scheduled = t0 + (float(arrivals[j]) if arrivals is not None else 0.0)
                delay = scheduled - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(one(j, scheduled, t0)))
            await asyncio.gather(*tasks)
            return rows

    return {"requests": asyncio.run(go())}


MAX_SCORE_BYTES = 64 << 20  # one scoring answer's JSON (the prompt logprobs of one answer)


def score(cmd: dict) -> dict:
    """The timed outputs rule's scoring (``harness.outputs_rule``): each item's ``tokens`` teacher-forced after its
    ``prompt`` by the server (``prompt_logprobs`` = 1, one completion token), per answer token ``[top id, top
    logprob, token logprob]``; twice, the second time in the reverse order (another batch composition and order)."""
    import asyncio

    import aiohttp

    items = cmd["items"]
    api_url, model = cmd["base_url"].rstrip("/") + "/v1/completions", cmd["model"]
    seqs = [[int(t) for t in it["prompt"]] + [int(t) for t in it["tokens"]] for it in items]
    starts = [len(it["prompt"]) for it in items]

    async def one(session, i: int) -> list:
        payload = {"model": model, "prompt": seqs[i], "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 1}
        async with session.post(url=api_url, json=payload) as response:
            if response.status != 200:
                raise ValueError(f"scoring answer {i}: HTTP {response.status}")
            body = await response.content.read(MAX_SCORE_BYTES + 1)
            if len(body) > MAX_SCORE_BYTES:
                raise ValueError(f"scoring answer {i}: more than {MAX_SCORE_BYTES} bytes")
        plp = json.loads(body)["choices"][0]["prompt_logprobs"]
        rows = []
        for pos in range(starts[i], len(seqs[i])):
            d = plp[pos]
            best = min(d.items(), key=lambda kv: (kv[1].get("rank") or 1 << 30, -float(kv[1]["logprob"])))
            rows.append([int(best[0]), float(best[1]["logprob"]), float(d[str(seqs[i][pos])]["logprob"])])
        return rows

    async def run(order: list[int]) -> list:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as session:
            got = await asyncio.gather(*(one(session, i) for i in order))
        by = dict(zip(order, got, strict=True))
        return [by[i] for i in range(len(seqs))]

    first = asyncio.run(run(list(range(len(seqs)))))
    again = asyncio.run(run(list(reversed(range(len(seqs))))))
    return {"scores": first, "again": again}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fd", type=int, required=True)
    args = ap.parse_args()
    out = os.fdopen(args.fd, "w", buffering=1)

    def send(msg: dict) -> None:
        out.write(json.dumps(msg) + "\n")
        out.flush()

    try:
        os.setpriority(os.PRIO_PROCESS, 0, NICE)
    except OSError:  # not permitted (not root): at the default priority, its lag still checked
        pass
    t0 = time.perf_counter()
    try:
        import aiohttp  # noqa: F401 - the one dependency, imported once
    except Exception:  # noqa: BLE001 - reported to the orchestrator
        send({"event": "error", "error": traceback.format_exc(limit=3)})
        return 1
    send({"event": "ready", "import_s": time.perf_counter() - t0, "nice": os.getpriority(os.PRIO_PROCESS, 0)})
    for line in sys.stdin:
        try:
            cmd = json.loads(line)
        except json.JSONDecodeError:
            send({"event": "error", "error": "malformed command"})
            continue
        if cmd.get("cmd") == "quit":
            return 0
        if cmd.get("cmd") not in ("load", "score"):
            send({"event": "error", "error": f"unknown command {cmd.get('cmd')!r}"})
            continue
        try:
            send({"event": "result", "result": load(cmd) if cmd["cmd"] == "load" else score(cmd)})
        except Exception as exc:  # noqa: BLE001 - a malformed load: report and stay up
            send({"event": "error", "error": "".join(traceback.format_exception_only(type(exc), exc)).strip()[-2000:]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A scripted Anthropic Messages API on loopback, to drive the real Claude Code CLI in tests.

``with ScriptedMessagesAPI(script) as api:`` serves ``api.url`` (``http://127.0.0.1:PORT``) from a
daemon thread; point the CLI at it with ``env=cli_env(api.url, home)``. The script is a list of
sessions, each a list of steps: ``{"tool": NAME, "input": {...}}`` (one tool_use block,
stop_reason "tool_use"), ``{"tools": [{"tool": .., "input": ..}, ...]}`` (several in one turn),
``{"text": "..."}`` (stop_reason "end_turn"; "text" may also sit beside "tool"/"tools" as a preamble).
Instead of a list, a dict ``{prompt_substring: steps}`` routes a conversation by its first user
message, which is what concurrent CLIs with racy start order need. A conversation is identified by
the hash of its first user message's text (``<system-reminder>`` blocks left out) and sessions are
numbered in order of first appearance; the step answered is the number of assistant messages already
in the request. An exhausted session answers the text "(script exhausted)". Every main-loop
answer reports the same usage (``input_tokens``/``output_tokens``, 1000 and 50 by default), so the
ResultMessage's usage is exactly N x that (N = model requests of the query).

What the bundled CLI (2.1.332, claude-agent-sdk 0.2.189) was seen to send, found by logging:

* ``POST /v1/messages?beta=true``, always ``"stream": true``, headers ``x-api-key`` (the dummy key),
  ``anthropic-version: 2023-06-01``, ``anthropic-beta: claude-code-20250219,...``,
  ``X-Claude-Code-Session-Id``, ``User-Agent: claude-cli/2.1.332 (external, sdk-py, agent-sdk/0.2.189)``.
  The body has model (default ``claude-opus-5-5``), max_tokens (128000; 32000 for older models),
  system (a billing-header text block first), tools (with ``tools=[]`` plus an SDK MCP server:
  ``DeferredToolPlaceholder`` and ``mcp__<server>__<tool>``; with no tools at all: ``[]``),
  thinking, context_management, output_config {effort}, metadata {user_id: JSON with session_id}.
  ``messages`` may contain ``{"role": "system"}`` turns (environment notes) between the user and
  assistant turns; several tool_use blocks of one turn come back as ONE assistant message (the CLI
  merges blocks sharing a message id) followed by one user message with all tool_result blocks.
  The connection is HTTP/1.1 keep-alive; the stream is answered with chunked transfer encoding.
* With ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1`` (set by cli_env) nothing else: no side request,
  no ``HEAD /api/hello``, no outbound connection. Without it: ``HEAD /api/hello`` (a reachability
  check on ANTHROPIC_BASE_URL, not every run), a session-title request at the first query, asked
  again at the next query while no valid title came back (no tools, no ``thinking``,
  ``output_config.format`` = json_schema ``{"title": string}``, the prompt wrapped in ``<session>``;
  model seen: the main one or ``claude-haiku-5-5``), and CONNECTs to api.anthropic.com:443
  (telemetry), which cli_env's proxy trap catches. A title request counts in the ResultMessage's
  ``total_cost_usd``/``model_usage`` but not in its ``usage``.

* The binary also holds max_tokens=1 probes (quota check "quota", model start-up check ".",
  API-key verification "test", model validation) and many other side queries (compact, summaries,
  prompt suggestions...); none was seen in these runs. Side requests are told apart by
  ``side_reason``: max_tokens <= 1, or no tools and no ``thinking`` key (the main loop always sends
  ``thinking``, ``{"type": "disabled"}`` included). They never consume the script: they get
  "ok", or an object satisfying ``output_config.format``'s schema (the title: ``{"title": "ok"}``).
* ``/v1/messages/count_tokens`` answers ``{"input_tokens": len(body)//4}``; ``HEAD /api/hello``
  200; anything else a 404 JSON error; a CONNECT or an absolute-URI request (the CLI using the
  server as its proxy) is recorded in ``api.outbound`` and refused with 403.

The environment (cli_env): ANTHROPIC_BASE_URL, a dummy ANTHROPIC_API_KEY (the init message then
says ``apiKeySource: ANTHROPIC_API_KEY``), HOME and CLAUDE_CONFIG_DIR under a temporary directory,
PATH; CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 is the switch that silences everything else (it
alone was enough), DISABLE_AUTOUPDATER, DISABLE_TELEMETRY and DISABLE_ERROR_REPORTING are set too.
The SDK lays options.env over the parent's environment, so inherited credentials and provider
switches (ANTHROPIC_AUTH_TOKEN, CLAUDE_CODE_USE_BEDROCK, ...) are blanked.

CLI behaviour worth knowing (all seen through the SDK): a tool_use for a tool the session lacks
(a built-in under ``tools=[]``, an unknown ``mcp__`` name) is not run and gets the tool_result
``<tool_use_error>Error: No such tool available: NAME ...</tool_use_error>`` with is_error, without
asking can_use_tool; bad input to an MCP tool gets ``Input validation error: ...``; a can_use_tool
deny message becomes the is_error tool_result text. MCP tools are named ``mcp__<server>__<tool>``.
``ResultMessage.num_turns`` is not the number of model requests (a two-tool turn counts 2), its
``usage`` covers the last query only while ``total_cost_usd`` adds up the whole client session.
An ``output_format`` json_schema makes the CLI add a ``StructuredOutput`` tool and insist on it:
script ``{"tool": "StructuredOutput", "input": {...}}``. The CLI waits up to 600 s for an answer
(``X-Stainless-Timeout``; ``API_TIMEOUT_MS``) and retries failures (``CLAUDE_CODE_MAX_RETRIES``).
At ``max_turns`` model requests the ResultMessage is ``error_max_turns`` (is_error, result None).

``api.requests`` records every request in arrival order: method, path, model, main (the agent
loop), side (why not), session, step, stream, headers, body, response (or status).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import sys
import threading
import uuid
import zlib
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

INPUT_TOKENS = 1000
OUTPUT_TOKENS = 50
SIDE_INPUT_TOKENS = 7
SIDE_OUTPUT_TOKENS = 3
SIDE_TEXT = "ok"
EXHAUSTED_TEXT = "(script exhausted)"

# Inherited variables that would send the CLI elsewhere than ANTHROPIC_BASE_URL or with other
# credentials (the SDK merges options.env over os.environ, so they are blanked, not dropped).
_BLANKED = (
    "ANTHROPIC_AUTH_TOKEN",
    "CLAUDE_CODE_OAUTH_TOKEN",
    "ANTHROPIC_UNIX_SOCKET",
    "ANTHROPIC_CUSTOM_HEADERS",
    "CLAUDE_CODE_USE_BEDROCK",
    "CLAUDE_CODE_USE_VERTEX",
    "CLAUDE_CODE_USE_FOUNDRY",
    "CLAUDE_CODE_USE_GATEWAY",
    "CLAUDE_CODE_USE_MANTLE",
    "CLAUDE_CODE_USE_ANTHROPIC_AWS",
    "CLAUDE_CODE_USE_ANTHROPIC_GOOGLE_CLOUD",
)


def cli_env(api_url: str, home: Path, *, trap_outbound: bool = True) -> dict[str, str]:
    """The environment for the CLI to talk to ``api_url`` only, with its state under ``home``.

    With ``trap_outbound`` the server is also the CLI's HTTP(S) proxy (loopback exempt), so any
    connection elsewhere ends at once in ``api.outbound`` instead of waiting on a network.
    """
    home = Path(home)
    (home / ".claude").mkdir(parents=True, exist_ok=True)
    env = {k: "" for k in _BLANKED}
    env.update(
        {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "HOME": str(home),
            "CLAUDE_CONFIG_DIR": str(home / ".claude"),
            "ANTHROPIC_BASE_URL": api_url,
            "ANTHROPIC_API_KEY": "sk-ant-api03-scripted-test-key",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",  # the one that matters: no title requests, telemetry, /api/hello
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
        }
    )
    if trap_outbound:
        for k in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
            env[k] = api_url
        env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    return env


def _text_of(content: Any) -> str:
    """The text of a message or tool_result content (a string or a list of blocks)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return ""


_REMINDER = re.compile(r"<system-reminder>.*?</system-reminder>", re.DOTALL)


def first_user_text(body: dict[str, Any]) -> str | None:
    """The text of the request's first user message, ``<system-reminder>`` blocks left out."""
    for m in body.get("messages", []):
        if isinstance(m, dict) and m.get("role") == "user":
            c = m.get("content")
            blocks = [{"type": "text", "text": c}] if isinstance(c, str) else (c if isinstance(c, list) else [])
            # the CLI may put <system-reminder> segments in the first message (a block of their own, or before the
            # prompt in the same block, and not on every turn alike): only the rest identifies the conversation
            text = "\n".join(str(b.get("text", "")) for b in blocks if isinstance(b, dict) and b.get("type") == "text")
            return _REMINDER.sub("", text).strip()
    return None


def side_reason(body: dict[str, Any]) -> str | None:
    """Why a POST /v1/messages is not the main agent loop (None: it is)."""
    if int(body.get("max_tokens") or 0) <= 1:
        return "probe"  # quota check, model start-up check, API-key verification
    if not body.get("tools") and "thinking" not in body:
        return "no tools"  # session title and the other one-shot helpers
    return None


def _fill(schema: Any) -> Any:
    """A minimal value satisfying a (simple) JSON schema."""
    if not isinstance(schema, dict):
        return SIDE_TEXT
    if "enum" in schema:
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    t = schema.get("type")
    t = t[0] if isinstance(t, list) else t
    if t == "object" or "properties" in schema:
        props = schema.get("properties", {})
        return {k: _fill(props.get(k, {})) for k in schema.get("required", list(props))}
    if t == "array":
        return [_fill(schema.get("items", {}))] if schema.get("minItems") else []
    if t in ("integer", "number"):
        return schema.get("minimum", 0)
    if t == "boolean":
        return False
    if t == "null":
        return None
    return SIDE_TEXT


class ScriptedMessagesAPI:
    """The scripted server; see the module docstring."""

    def __init__(
        self,
        script: Sequence[Sequence[dict[str, Any]]] | Mapping[str, Sequence[dict[str, Any]]],
        *,
        input_tokens: int = INPUT_TOKENS,
        output_tokens: int = OUTPUT_TOKENS,
    ):
        self.script = script
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self.requests: list[dict[str, Any]] = []  # every request, in order of arrival
        self.outbound: list[dict[str, Any]] = []  # proxied attempts to reach any other host
        self.sessions: list[dict[str, Any]] = []  # {"key", "prompt", "steps"} in order of first appearance
        self._lock = threading.Lock()
        self._ids = 0
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle
    def __enter__(self) -> ScriptedMessagesAPI:
        handler = type("Handler", (_Handler,), {"api": self})
        self._server = _Server(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="scripted-messages-api", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)

    @property
    def url(self) -> str:
        assert self._server is not None, "use the server as a context manager"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    # ---- what happened
    def session_index(self, prompt_part: str) -> int:
        """The session whose first user message contains ``prompt_part``."""
        with self._lock:
            hits = [i for i, s in enumerate(self.sessions) if prompt_part in s["prompt"]]
        if len(hits) != 1:
            raise KeyError(f"{len(hits)} sessions have a first user message containing {prompt_part!r}")
        return hits[0]

    def main_requests(self, session: int | str) -> list[dict[str, Any]]:
        idx = self.session_index(session) if isinstance(session, str) else session
        with self._lock:
            return [r for r in self.requests if r.get("main") and r.get("session") == idx]

    def tool_results(self, session: int | str) -> list[dict[str, Any]]:
        """The tool_result blocks the CLI sent back in a session, in order: tool_use_id, content (text), is_error."""
        seen: dict[str, dict[str, Any]] = {}
        for r in self.main_requests(session):
            for m in r["body"].get("messages", []):
                if m.get("role") != "user" or not isinstance(m.get("content"), list):
                    continue
                for b in m["content"]:
                    if isinstance(b, dict) and b.get("type") == "tool_result" and b.get("tool_use_id") not in seen:
                        seen[b["tool_use_id"]] = {
                            "tool_use_id": b["tool_use_id"],
                            "content": _text_of(b.get("content", "")),
                            "is_error": bool(b.get("is_error", False)),
                        }
        return list(seen.values())

    # ---- answering
    def _steps_for(self, prompt: str, index: int) -> Sequence[dict[str, Any]]:
        if isinstance(self.script, Mapping):
            return next((steps for part, steps in self.script.items() if part in prompt), [])
        return self.script[index] if index < len(self.script) else []

    def _next_id(self, prefix: str) -> str:
        with self._lock:
            self._ids += 1
            return f"{prefix}_{self._ids:04d}{uuid.uuid4().hex[:20]}"

    def answer(self, method: str, path: str, headers: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        """Record a POST /v1/messages and return the Message that answers it."""
        side = side_reason(body)
        prompt = first_user_text(body)
        key = hashlib.sha256(prompt.encode()).hexdigest()[:16] if prompt is not None else None
        step = sum(1 for m in body.get("messages", []) if isinstance(m, dict) and m.get("role") == "assistant")
        with self._lock:
            keys = [s["key"] for s in self.sessions]
            if side is None and key is not None and key not in keys:
                self.sessions.append({"key": key, "prompt": prompt, "steps": self._steps_for(prompt or "", len(keys))})
                keys.append(key)
            session = keys.index(key) if key in keys else None
            main = side is None and session is not None
            rec: dict[str, Any] = {
                "method": method,
                "path": path,
                "model": body.get("model"),
                "main": main,
                "side": side,
                "session": session,
                "step": step if main else None,
                "stream": bool(body.get("stream")),
                "headers": headers,
                "body": body,
            }
            self.requests.append(rec)
            steps = self.sessions[session]["steps"] if main and session is not None else []
        content: list[dict[str, Any]] = []
        if not main:
            fmt = (body.get("output_config") or {}).get("format") or {}
            text = json.dumps(_fill(fmt.get("schema"))) if fmt.get("type") == "json_schema" else SIDE_TEXT
            content.append({"type": "text", "text": text[:1] if side == "probe" else text})
            usage = {"input_tokens": SIDE_INPUT_TOKENS, "output_tokens": 1 if side == "probe" else SIDE_OUTPUT_TOKENS}
            stop = "max_tokens" if side == "probe" else "end_turn"
        else:
            st: dict[str, Any] = steps[step] if step < len(steps) else {"text": EXHAUSTED_TEXT}
            if st.get("text"):
                content.append({"type": "text", "text": st["text"]})
            uses = st.get("tools") or ([{"tool": st["tool"], "input": st.get("input", {})}] if "tool" in st else [])
            for u in uses:
                content.append(
                    {"type": "tool_use", "id": self._next_id("toolu"), "name": u["tool"], "input": u.get("input", {})}
                )
            usage = {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}
            stop = "tool_use" if uses else "end_turn"
        msg = {
            "id": self._next_id("msg"),
            "type": "message",
            "role": "assistant",
            "model": body.get("model") or "claude-scripted",
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {
                "input_tokens": usage["input_tokens"],
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "output_tokens": usage["output_tokens"],
                "service_tier": "standard",
            },
        }
        rec["response"] = msg
        return msg

    def record_other(
        self, method: str, path: str, headers: dict[str, str], raw: bytes, status: int, outbound: bool = False
    ) -> None:
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw[:2000].decode(errors="replace")
        rec = {
            "method": method,
            "path": path,
            "model": body.get("model") if isinstance(body, dict) else None,
            "main": False,
            "side": "outbound" if outbound else "other",
            "session": None,
            "step": None,
            "stream": False,
            "headers": headers,
            "body": body,
            "status": status,
        }
        with self._lock:
            self.requests.append(rec)
            if outbound:
                self.outbound.append(rec)


def sse_events(msg: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The server-sent events the Messages API streams for ``msg``, in order."""
    usage = msg["usage"]
    start = dict(msg, content=[], stop_reason=None, stop_sequence=None, usage=dict(usage, output_tokens=1))
    ev: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start}),
        ("ping", {"type": "ping"}),
    ]
    for i, b in enumerate(msg["content"]):
        if b["type"] == "text":
            ev.append(
                (
                    "content_block_start",
                    {"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}},
                )
            )
            t = b["text"]
            for j in range(0, len(t), 16):
                ev.append(
                    (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": i,
                            "delta": {"type": "text_delta", "text": t[j : j + 16]},
                        },
                    )
                )
        else:
            ev.append(
                (
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": i,
                        "content_block": {"type": "tool_use", "id": b["id"], "name": b["name"], "input": {}},
                    },
                )
            )
            js = json.dumps(b["input"])
            for j in range(0, len(js), 12):
                ev.append(
                    (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": i,
                            "delta": {"type": "input_json_delta", "partial_json": js[j : j + 12]},
                        },
                    )
                )
        ev.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
    ev.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": msg["stop_reason"], "stop_sequence": None},
                "usage": {k: v for k, v in usage.items() if k != "service_tier"},
            },
        )
    )
    ev.append(("message_stop", {"type": "message_stop"}))
    return ev


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):  # a client hanging up is no error here
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    api: ScriptedMessagesAPI

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _read_body(self) -> bytes:
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            data = b""
            while n := int(self.rfile.readline().strip().split(b";")[0] or b"0", 16):
                data += self.rfile.read(n)
                self.rfile.readline()
            while self.rfile.readline().strip():  # trailers
                pass
        else:
            n = int(self.headers.get("content-length") or 0)
            data = self.rfile.read(n) if n else b""
        enc = self.headers.get("content-encoding", "").lower()
        if enc == "gzip":
            data = gzip.decompress(data)
        elif enc == "deflate":
            data = zlib.decompress(data)
        return data

    def _json(self, status: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.send_header("request-id", "req_" + uuid.uuid4().hex[:24])
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _error(self, status: int, kind: str, message: str) -> None:
        self._json(status, {"type": "error", "error": {"type": kind, "message": message}})

    def _is_outbound(self) -> bool:
        if self.command == "CONNECT":
            return True
        if "://" in self.path:  # absolute-form: we are being used as a proxy
            return urlsplit(self.path).netloc != urlsplit(self.api.url).netloc
        return False

    def _dispatch(self) -> None:
        headers = dict(self.headers.items())
        if self._is_outbound():
            self.api.record_other(self.command, self.path, headers, b"", 403, outbound=True)
            self.send_response(403)
            self.send_header("content-length", "0")
            self.send_header("connection", "close")
            self.end_headers()
            self.close_connection = True
            return
        raw = self._read_body()
        path = urlsplit(self.path).path
        if self.command == "POST" and path == "/v1/messages":
            try:
                body = json.loads(raw)
                assert isinstance(body, dict) and isinstance(body.get("messages"), list)
            except (ValueError, AssertionError):
                self.api.record_other(self.command, self.path, headers, raw, 400)
                self._error(400, "invalid_request_error", "the body must be a JSON object with messages")
                return
            self._messages(headers, body)
        elif self.command == "POST" and path == "/v1/messages/count_tokens":
            self.api.record_other(self.command, self.path, headers, raw, 200)
            self._json(200, {"input_tokens": max(1, len(raw) // 4)})
        elif path == "/api/hello":
            self.api.record_other(self.command, self.path, headers, raw, 200)
            self._json(200, {"message": "hello"})
        else:
            self.api.record_other(self.command, self.path, headers, raw, 404)
            self._error(404, "not_found_error", f"not found: {self.command} {self.path}")

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = do_CONNECT = _dispatch

    def _messages(self, headers: dict[str, str], body: dict[str, Any]) -> None:
        msg = self.api.answer(self.command, self.path, headers, body)
        if not body.get("stream"):
            self._json(200, msg)
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.send_header("request-id", "req_" + uuid.uuid4().hex[:24])
        self.end_headers()
        for name, data in sse_events(msg):
            chunk = f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

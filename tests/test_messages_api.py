"""The real bundled Claude Code CLI, driven through claude_agent_sdk against tests/messages_api.py.

Each CLI session takes about half a second to a second (start, MCP handshake, a few loopback
requests); the whole file runs in a few seconds.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import anyio
import pytest
from claude_agent_sdk import (
    AssistantMessage,
    ClaudeAgentOptions,
    ClaudeSDKClient,
    PermissionResultAllow,
    PermissionResultDeny,
    ResultMessage,
    SystemMessage,
    TextBlock,
    ToolUseBlock,
    create_sdk_mcp_server,
    tool,
)
from claude_agent_sdk.types import CanUseToolShadowedWarning

from tests.messages_api import EXHAUSTED_TEXT, INPUT_TOKENS, OUTPUT_TOKENS, ScriptedMessagesAPI, cli_env, sse_events

CLI_VERSION = "2.1.337"  # the CLI claude-agent-sdk 0.2.190 bundles (pyproject.toml pins it)
FINAL = 'Done. {"verdict": "ok", "echoed": 2}'

pytestmark = pytest.mark.timeout(180)


def make_echo(calls: list[dict[str, Any]]) -> Any:
    @tool("echo", "Echo the text back", {"text": str})
    async def echo(args: dict[str, Any]) -> dict[str, Any]:
        calls.append(dict(args))
        return {"content": [{"type": "text", "text": f"echo: {args['text']}"}]}

    return echo


async def allow_wb_only(tool_name: str, args: dict[str, Any], _context: Any) -> Any:
    if tool_name.startswith("mcp__wb__"):
        return PermissionResultAllow()
    return PermissionResultDeny(message=f"{tool_name} is not allowed here")


def options(
    api: ScriptedMessagesAPI,
    tmp: Path,
    calls: list[dict[str, Any]],
    *,
    allowed_tools: tuple[str, ...] = ("mcp__wb__echo",),
    can_use_tool: Any = allow_wb_only,
) -> ClaudeAgentOptions:
    cwd = tmp / "cwd"
    cwd.mkdir(parents=True, exist_ok=True)
    return ClaudeAgentOptions(
        tools=[],
        mcp_servers={"wb": create_sdk_mcp_server("wb", tools=[make_echo(calls)])},
        allowed_tools=list(allowed_tools),
        setting_sources=[],
        strict_mcp_config=True,
        cwd=str(cwd),
        env=cli_env(api.url, tmp / "home"),
        max_turns=5,
        permission_mode="default",
        can_use_tool=can_use_tool,
    )


async def converse(opts: ClaudeAgentOptions, prompt: str) -> dict[str, Any]:
    """One query through the SDK client; what came back."""
    out: dict[str, Any] = {"init": None, "texts": [], "tool_uses": [], "result": None}
    with anyio.fail_after(60):
        async with ClaudeSDKClient(options=opts) as client:
            await client.query(prompt)
            async for msg in client.receive_response():
                if isinstance(msg, SystemMessage) and msg.subtype == "init":
                    out["init"] = msg.data
                elif isinstance(msg, AssistantMessage):
                    out["texts"] += [b.text for b in msg.content if isinstance(b, TextBlock)]
                    out["tool_uses"] += [(b.name, b.input) for b in msg.content if isinstance(b, ToolUseBlock)]
                elif isinstance(msg, ResultMessage):
                    out["result"] = msg
    return out


def run(opts: ClaudeAgentOptions, prompt: str) -> dict[str, Any]:
    return anyio.run(converse, opts, prompt)


@pytest.mark.claude
def test_cli_runs_scripted_mcp_tool_calls_and_reports_usage(tmp_path: Path) -> None:
    script: list[list[dict[str, Any]]] = [
        [
            {"tool": "mcp__wb__echo", "input": {"text": "first"}},
            {"tool": "mcp__wb__echo", "input": {"text": "second"}},
            {"text": FINAL},
        ]
    ]
    calls: list[dict[str, Any]] = []
    with ScriptedMessagesAPI(script) as api:
        opts = options(api, tmp_path, calls)
        # allowed_tools approves mcp__wb__echo before can_use_tool is asked; the SDK says so on connect
        with pytest.warns(CanUseToolShadowedWarning):
            out = run(opts, "Echo two words, then report.")

    assert out["init"]["claude_code_version"] == CLI_VERSION
    assert out["init"]["tools"] == ["mcp__wb__echo"]
    assert calls == [{"text": "first"}, {"text": "second"}]
    assert out["tool_uses"] == [("mcp__wb__echo", {"text": "first"}), ("mcp__wb__echo", {"text": "second"})]

    main = api.main_requests(0)
    assert [r["step"] for r in main] == [0, 1, 2]
    assert all(r["stream"] and r["path"] == "/v1/messages?beta=true" for r in main)
    assert main[0]["headers"]["User-Agent"].startswith(f"claude-cli/{CLI_VERSION} ")
    assert main[0]["headers"]["x-api-key"] == opts.env["ANTHROPIC_API_KEY"]
    assert [t["name"] for t in main[0]["body"]["tools"]] == ["DeferredToolPlaceholder", "mcp__wb__echo"]
    # each tool's result reached the server in the very next request
    for n, word in ((1, "first"), (2, "second")):
        last_user = [m for m in main[n]["body"]["messages"] if m["role"] == "user"][-1]
        block = last_user["content"][-1]
        assert block["type"] == "tool_result" and block["tool_use_id"] == main[n - 1]["response"]["content"][0]["id"]
        assert f"echo: {word}" in json.dumps(block["content"])
    assert [(r["content"], r["is_error"]) for r in api.tool_results(0)] == [
        ("echo: first", False),
        ("echo: second", False),
    ]
    # nothing but the main loop: no side request, no connection elsewhere
    assert len(api.requests) == 3 and api.outbound == []

    res = out["result"]
    assert res is not None and not res.is_error and res.subtype == "success"
    assert res.result == FINAL and out["texts"][-1] == FINAL
    assert json.loads(res.result[res.result.index("{") :]) == {"verdict": "ok", "echoed": 2}
    assert res.num_turns == 3
    assert res.usage["input_tokens"] == 3 * INPUT_TOKENS and res.usage["output_tokens"] == 3 * OUTPUT_TOKENS
    assert res.total_cost_usd and res.total_cost_usd > 0
    (model_usage,) = res.model_usage.values()
    assert model_usage["inputTokens"] == 3 * INPUT_TOKENS and model_usage["outputTokens"] == 3 * OUTPUT_TOKENS
    assert model_usage["costUSD"] == pytest.approx(res.total_cost_usd)


@pytest.mark.filterwarnings("ignore::claude_agent_sdk.types.CanUseToolShadowedWarning")
@pytest.mark.claude
def test_builtin_tool_is_not_run_when_tools_are_off(tmp_path: Path) -> None:
    target = tmp_path / "x"
    script: list[list[dict[str, Any]]] = [
        [
            {"tool": "Bash", "input": {"command": f"touch {target}"}},
            {"tool": "mcp__wb__nope", "input": {}},
            {"tool": "mcp__wb__echo", "input": {"wrong": 1}},
            {"text": "gave up"},
        ]
    ]
    asked: list[str] = []

    async def ask(tool_name: str, args: dict[str, Any], context: Any) -> Any:
        asked.append(tool_name)
        return await allow_wb_only(tool_name, args, context)

    calls: list[dict[str, Any]] = []
    with ScriptedMessagesAPI(script) as api:
        out = run(options(api, tmp_path, calls, can_use_tool=ask), "Touch a file.")

    assert not target.exists()
    assert calls == [] and asked == []  # refused before any permission question
    bash, unknown, invalid = api.tool_results(0)
    assert bash["is_error"] and "No such tool available: Bash" in bash["content"]
    assert unknown["is_error"] and "No such tool available: mcp__wb__nope" in unknown["content"]
    assert invalid["is_error"] and "'text' is a required property" in invalid["content"]
    assert out["result"].result == "gave up" and not out["result"].is_error


@pytest.mark.claude
def test_permission_callback_is_asked_for_tools_not_in_allowed_tools(tmp_path: Path) -> None:
    script: list[list[dict[str, Any]]] = [
        [
            {"tool": "mcp__wb__echo", "input": {"text": "fine"}},
            {"tool": "mcp__wb__echo", "input": {"text": "forbidden"}},
            {"text": "done"},
        ]
    ]
    asked: list[tuple[str, dict[str, Any]]] = []

    async def guard(tool_name: str, args: dict[str, Any], _context: Any) -> Any:
        asked.append((tool_name, dict(args)))
        if args.get("text") == "forbidden":
            return PermissionResultDeny(message="that word is off limits")
        return PermissionResultAllow()

    calls: list[dict[str, Any]] = []
    with ScriptedMessagesAPI(script) as api:
        out = run(options(api, tmp_path, calls, allowed_tools=(), can_use_tool=guard), "Echo twice.")

    assert asked == [("mcp__wb__echo", {"text": "fine"}), ("mcp__wb__echo", {"text": "forbidden"})]
    assert calls == [{"text": "fine"}]
    ok, denied = api.tool_results(0)
    assert (ok["content"], ok["is_error"]) == ("echo: fine", False)
    assert denied["is_error"] and "that word is off limits" in denied["content"]
    assert out["result"].result == "done"


def _post(url: str, body: dict[str, Any] | None, path: str = "/v1/messages") -> tuple[int, bytes, str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        url + path,
        data=data,
        method="POST" if data else "GET",
        headers={"content-type": "application/json", "x-api-key": "k", "anthropic-version": "2023-06-01"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read(), resp.headers.get("content-type", "")
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers.get("content-type", "")


def test_direct_requests_json_and_sse() -> None:
    script: list[list[dict[str, Any]]] = [
        [
            {"tool": "mcp__x__t", "input": {"q": "a long-ish argument to split across deltas", "n": [1, 2]}},
            {"text": "the end"},
        ]
    ]
    tools = [{"name": "mcp__x__t", "input_schema": {"type": "object"}}]
    first = {"role": "user", "content": "hello"}
    with ScriptedMessagesAPI(script, input_tokens=11, output_tokens=5) as api:
        status, raw, ctype = _post(api.url, {"model": "m", "max_tokens": 100, "tools": tools, "messages": [first]})
        assert status == 200 and ctype == "application/json"
        msg = json.loads(raw)
        assert msg["type"] == "message" and msg["role"] == "assistant" and msg["stop_reason"] == "tool_use"
        (use,) = msg["content"]
        assert use["type"] == "tool_use" and use["name"] == "mcp__x__t" and use["id"].startswith("toolu_")
        assert use["input"] == script[0][0]["input"]
        assert msg["usage"]["input_tokens"] == 11 and msg["usage"]["output_tokens"] == 5

        # side requests (a max_tokens=1 probe; no tools and no thinking) do not consume the script
        status, raw, _ = _post(
            api.url, {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "quota"}]}
        )
        assert status == 200 and json.loads(raw)["stop_reason"] == "max_tokens"
        schema = {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}
        status, raw, _ = _post(
            api.url,
            {
                "model": "m",
                "max_tokens": 50,
                "messages": [{"role": "user", "content": "<session>hello</session>"}],
                "output_config": {"format": {"type": "json_schema", "schema": schema}},
            },
        )
        assert json.loads(json.loads(raw)["content"][0]["text"]) == {"title": "ok"}

        history = [
            first,
            {"role": "assistant", "content": [use]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "42", "is_error": False}],
            },
        ]
        status, raw, ctype = _post(
            api.url, {"model": "m", "max_tokens": 100, "tools": tools, "messages": history, "stream": True}
        )
        assert status == 200 and ctype.startswith("text/event-stream")
        events = [
            (b.split("\n")[0].removeprefix("event: "), json.loads(b.split("\n")[1].removeprefix("data: ")))
            for b in raw.decode().strip().split("\n\n")
        ]
        assert [e for e, _ in events] == [
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
        assert events[3][1]["delta"] == {"type": "text_delta", "text": "the end"}
        assert events[5][1]["delta"]["stop_reason"] == "end_turn" and events[5][1]["usage"]["output_tokens"] == 5

        # the exhausted script, another conversation, the other endpoints
        status, raw, _ = _post(
            api.url,
            {
                "model": "m",
                "max_tokens": 100,
                "tools": tools,
                "messages": history
                + [{"role": "assistant", "content": "the end"}, {"role": "user", "content": "more?"}],
            },
        )
        assert json.loads(raw)["content"] == [{"type": "text", "text": EXHAUSTED_TEXT}]
        status, raw, _ = _post(
            api.url,
            {"model": "m", "max_tokens": 100, "tools": tools, "messages": [{"role": "user", "content": "other"}]},
        )
        assert json.loads(raw)["content"] == [{"type": "text", "text": EXHAUSTED_TEXT}]
        status, raw, _ = _post(api.url, {"model": "m", "messages": [first]}, "/v1/messages/count_tokens")
        assert status == 200 and json.loads(raw)["input_tokens"] > 0
        status, raw, _ = _post(api.url, None, "/v1/models")
        assert status == 404 and json.loads(raw)["error"]["type"] == "not_found_error"
        status, raw, _ = _post(api.url, {"no": "messages"})
        assert status == 400

    assert [(r["main"], r["side"], r["session"], r["step"]) for r in api.requests[:5]] == [
        (True, None, 0, 0),
        (False, "probe", None, None),
        (False, "no tools", None, None),
        (True, None, 0, 1),
        (True, None, 0, 2),
    ]
    assert api.tool_results(0) == [{"tool_use_id": use["id"], "content": "42", "is_error": False}]
    assert api.session_index("other") == 1 and api.outbound == []


def test_dict_script_routes_by_prompt() -> None:
    tools = [{"name": "t", "input_schema": {"type": "object"}}]
    with ScriptedMessagesAPI({"beta": [{"text": "for beta"}], "alpha": [{"text": "for alpha"}]}) as api:
        for prompt, want in (("task alpha", "for alpha"), ("task beta", "for beta"), ("task gamma", EXHAUSTED_TEXT)):
            _, raw, _ = _post(
                api.url,
                {"model": "m", "max_tokens": 9, "tools": tools, "messages": [{"role": "user", "content": prompt}]},
            )
            assert json.loads(raw)["content"][0]["text"] == want
    assert [api.session_index(p) for p in ("alpha", "beta", "gamma")] == [0, 1, 2]


def test_stream_reassembles_tool_input() -> None:
    msg: dict[str, Any] = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "/a/b/c.py", "limit": 20}},
            {"type": "tool_use", "id": "toolu_2", "name": "Grep", "input": {"pattern": "def \\w+\\("}},
        ],
        "usage": {"input_tokens": 3, "output_tokens": 4},
    }
    text, inputs = "", dict[int, str]()
    for name, ev in sse_events(msg):
        assert ev["type"] == name
        if name == "content_block_delta" and ev["delta"]["type"] == "text_delta":
            text += ev["delta"]["text"]
        elif name == "content_block_delta":
            inputs[ev["index"]] = inputs.get(ev["index"], "") + ev["delta"]["partial_json"]
    assert text == "Let me look." and {i: json.loads(s) for i, s in inputs.items()} == {
        1: msg["content"][1]["input"],
        2: msg["content"][2]["input"],
    }


@pytest.mark.filterwarnings("ignore::claude_agent_sdk.types.CanUseToolShadowedWarning")
@pytest.mark.claude
def test_two_clis_at_once_each_get_their_own_script(tmp_path: Path) -> None:
    script: list[list[dict[str, Any]]] = [
        [
            {"tool": "mcp__wb__echo", "input": {"text": "s0-a"}},
            {"tool": "mcp__wb__echo", "input": {"text": "s0-b"}},
            {"text": "final s0"},
        ],
        [
            {
                "tools": [
                    {"tool": "mcp__wb__echo", "input": {"text": "s1-a"}},
                    {"tool": "mcp__wb__echo", "input": {"text": "s1-b"}},
                ]
            },
            {"text": "final s1"},
        ],
    ]
    prompts = ["Task for the first agent.", "Task for the second agent."]
    calls: list[list[dict[str, Any]]] = [[], []]
    outs: list[dict[str, Any]] = [{}, {}]
    with ScriptedMessagesAPI(script) as api:

        async def both() -> None:
            async def one(i: int) -> None:
                outs[i] = await converse(options(api, tmp_path / f"agent{i}", calls[i]), prompts[i])

            async with anyio.create_task_group() as tg:
                tg.start_soon(one, 0)
                tg.start_soon(one, 1)

        anyio.run(both)

    sessions = [api.session_index(p) for p in prompts]
    assert sorted(sessions) == [0, 1]  # which CLI came first is a race; each stays on its own script
    for i, s in enumerate(sessions):
        echoed = [
            st["input"]["text"] for step in script[s] for st in step.get("tools", [step] if "tool" in step else [])
        ]
        assert [c["text"] for c in calls[i]] == echoed
        assert [r["content"] for r in api.tool_results(s)] == [f"echo: {t}" for t in echoed]
        res = outs[i]["result"]
        # num_turns counts assistant content blocks, not model requests: a 2-tool turn counts 2
        assert res.result == f"final s{s}" and res.num_turns == len(echoed) + 1
        assert res.usage["input_tokens"] == len(script[s]) * INPUT_TOKENS
    # same usage per model request, same model: the cost is proportional to the number of requests
    costs = {s: outs[i]["result"].total_cost_usd / len(script[s]) for i, s in enumerate(sessions)}
    assert costs[0] == pytest.approx(costs[1])
    # two tool_use blocks of one turn come back as one assistant message with both results after it
    last = api.main_requests(1)[-1]["body"]["messages"]
    assistants = [m for m in last if m["role"] == "assistant"]
    assert len(assistants) == 1 and [b["type"] for b in assistants[0]["content"]] == ["tool_use", "tool_use"]
    assert api.outbound == [] and all(r["main"] for r in api.requests)

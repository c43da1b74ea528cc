"""A scripted stand-in for the Claude Code CLI behind the agent SDK's Transport interface.

It speaks the CLI's stream-JSON protocol: answers the SDK's ``initialize`` control request,
and for each user turn plays a script — asking the SDK for permission for every tool call
(a real ``can_use_tool`` control request, answered by agentsearch's guard), performing the
edits it was allowed to make in the worktree (as the CLI would), and ending with a result
message carrying usage and cost. Load it with
AGENTSEARCH_AGENT_TRANSPORT=tests.scripted_agent:factory and AGENTSEARCH_TEST_AGENT_SCRIPT=<json>:
a list of sessions (one per proposal, in order), each a list of steps
{"tool": NAME, "input": {...}} or {"text": "..."}.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, AsyncIterator

import anyio
from claude_agent_sdk import Transport


def factory(worktree: Path) -> "ScriptedTransport":
    script = json.loads(Path(os.environ["AGENTSEARCH_TEST_AGENT_SCRIPT"]).read_text())
    counter = Path(os.environ["AGENTSEARCH_TEST_AGENT_SCRIPT"] + ".n")
    n = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(n + 1))
    return ScriptedTransport(script[n % len(script)], worktree, Path(os.environ["AGENTSEARCH_TEST_AGENT_SCRIPT"] + f".prompt{n}"))


class ScriptedTransport(Transport):
    def __init__(self, steps: list[dict[str, Any]], worktree: Path, prompt_file: Path | None = None):
        self.steps = steps
        self.prompt_file = prompt_file
        self.worktree = Path(worktree)
        self.send, self.recv = anyio.create_memory_object_stream(100)
        self.pending: dict[str, anyio.Event] = {}
        self.answers: dict[str, dict] = {}
        self.ready = False
        self.log: list[dict] = []
        self._n = 0

    async def connect(self) -> None:
        self.ready = True

    def is_ready(self) -> bool:
        return self.ready

    async def end_input(self) -> None:
        await self.send.aclose()

    async def close(self) -> None:
        self.ready = False
        await self.send.aclose()

    async def read_messages(self) -> AsyncIterator[dict[str, Any]]:
        async with self.recv:
            async for msg in self.recv:
                yield msg

    async def _emit(self, msg: dict) -> None:
        await self.send.send(msg)

    async def write(self, data: str) -> None:
        for line in data.splitlines():
            if not line.strip():
                continue
            msg = json.loads(line)
            self.log.append(msg)
            if msg.get("type") == "control_request" and msg["request"]["subtype"] == "initialize":
                await self._emit({"type": "control_response", "response": {"subtype": "success", "request_id": msg["request_id"],
                                                                           "response": {"commands": [], "output_style": "default"}}})
            elif msg.get("type") == "control_response":
                rid = msg["response"]["request_id"]
                self.answers[rid] = msg["response"]
                if rid in self.pending:
                    self.pending[rid].set()
            elif msg.get("type") == "user":
                if self.prompt_file is not None:
                    content = msg["message"]["content"]
                    self.prompt_file.write_text(content if isinstance(content, str) else json.dumps(content))
                # run the script concurrently: permission answers arrive through write() too
                import asyncio

                asyncio.get_running_loop().create_task(self._play())

    async def _ask(self, tool: str, args: dict) -> bool:
        self._n += 1
        rid = f"perm-{self._n}"
        self.pending[rid] = anyio.Event()
        await self._emit({"type": "control_request", "request_id": rid,
                          "request": {"subtype": "can_use_tool", "tool_name": tool, "input": args, "tool_use_id": f"tu-{self._n}"}})
        await self.pending[rid].wait()
        ans = self.answers[rid]
        return ans.get("subtype") == "success" and ans.get("response", {}).get("behavior") == "allow"

    def _apply(self, tool: str, args: dict) -> None:
        path = Path(args["file_path"])
        path = path if path.is_absolute() else self.worktree / path
        if tool == "Write":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(args["content"])
        elif tool == "Edit":
            text = path.read_text()
            path.write_text(text.replace(args["old_string"], args["new_string"], 1))

    async def _play(self) -> None:
        texts = []
        for step in self.steps:
            if "text" in step:
                texts.append(step["text"])
                await self._emit({"type": "assistant", "message": {"role": "assistant", "model": "scripted", "content": [{"type": "text", "text": step["text"]}]},
                                  "parent_tool_use_id": None, "session_id": "scripted"})
                continue
            tool, args = step["tool"], step["input"]
            await self._emit({"type": "assistant", "message": {"role": "assistant", "model": "scripted",
                                                               "content": [{"type": "tool_use", "id": f"tu-{self._n + 1}", "name": tool, "input": args}]},
                              "parent_tool_use_id": None, "session_id": "scripted"})
            allowed = await self._ask(tool, args)
            if allowed and tool in ("Write", "Edit"):
                self._apply(tool, args)
            await self._emit({"type": "user", "message": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"tu-{self._n}",
                                                                                         "content": "ok" if allowed else "denied", "is_error": not allowed}]},
                              "parent_tool_use_id": None, "session_id": "scripted"})
        await self._emit({"type": "result", "subtype": "success", "duration_ms": 10, "duration_api_ms": 5, "is_error": False,
                          "num_turns": len(self.steps), "session_id": "scripted", "total_cost_usd": 0.0125,
                          "usage": {"input_tokens": 1200, "output_tokens": 340}, "result": texts[-1] if texts else ""})

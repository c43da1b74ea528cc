"""The agent's workbench: the only tools an agent session has, each run inside the fence.

The Claude Code CLI's own file and shell tools are switched off (``agentsearch.agent``); the agent
calls these instead, served from the orchestrator through the SDK's in-process MCP server. Nothing a
tool runs is decided by a string allowlist: every file operation and every command runs in the
project's sandbox (``harness.sandbox``) with the policy of a candidate trial —

- only the session's scratch worktree writable (its ``.git`` link and the baseline's protected files
  bound read-only over it), plus a private output directory;
- no network, private ``/tmp``, ``/dev/shm`` and ``$HOME``, a user namespace of its own and the
  seccomp filter; the state directory, the history, the corpus and holdout key, ``.git`` internals,
  other worktrees and the warm baseline engines are not mounted;
- bounded time (``[agent] run_timeout_s``), address space (``memory_gib``) and output; no process
  outlives a call (a pid namespace per call, and the trial's leftover sweep).

The tools that judge (``test``, ``kernels_bench``, ``measure``, ``profile``, ``check_outputs``) take a
snapshot commit of the worktree and run the gate's own machinery on it, in sides built and sandboxed
as an evaluation's. ``measure`` is advice, never evidence: its seeds are drawn from a range no gate
seed uses (``harness.seeds.advisory_seeds``), it starts engines of its own (never the episode's warm
baseline), the holdout is never read, and nothing it measures is recorded as a verdict.

Every call is counted against the session's budget (``[agent]``) and recorded as a ``ToolCall`` in the
session's ``AgentSession`` (``history.records.agent_session``): its wall seconds are charged per call against
``max_tool_seconds`` — once they are spent every tool is refused, file tools included, and a file tool or ``run``
call is cut at what is left — and the calls are capped in all (``max_tool_calls``) and per model turn
(``max_calls_per_turn``, decided by ``admit`` from the session's PreToolUse hook, ``agentsearch.agent``), so a turn
that batches calls cannot stretch ``max_turns``. A refused call answers the agent one line.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import secrets
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import cgroups, sandbox, seeds
from harness.engine_pool import EnginePool
from harness.interleave import run_interleaved
from harness.safe_io import UnsafeFile, read_beneath, write_beneath
from harness.sequential import Decision, SequentialDesign
from harness.statistics import paired_estimate
from harness.trials import BASELINE, CANDIDATE, child_env, run_child
from history.proposals import Proposal
from history.records import text
from history.records.agent_session import ToolCall

from . import containment, micro
from .config import Config
from .errors import AgentsearchError
from .gate import Status
from .progress import Say
from .sides import built_sides, linked_files, model_dirs, pin_protected, remove_tree
from .workspace import Workspace, git
from .workspace.install import link_overlay

FILES_TOOL = Path(__file__).resolve().parents[1] / "harness" / "workers" / "workbench_files.py"
ADVISORY = "advisory — not the gate"


class WorkbenchError(AgentsearchError):
    """The workbench cannot be set up (no sandbox on this machine, a worktree that cannot be made)."""


@dataclass(frozen=True)
class Answer:
    """What one tool call gives back to the agent."""

    text: str
    ok: bool = True
    detail: str = ""  # one line for the session's record ('' : the first line of text)
    pairs: int = 0


# name -> (description, JSON schema of its arguments); the MCP server is built from this table
TOOLS: dict[str, tuple[str, dict[str, Any]]] = {
    "read": (
        "Read a text file of your worktree (numbered lines). Paths are relative to the worktree.",
        {
            "type": "object",
            "properties": {"path": {"type": "string"}, "offset": {"type": "integer"}, "limit": {"type": "integer"}},
            "required": ["path"],
        },
    ),
    "write": (
        "Write a whole file in your worktree (created or replaced).",
        {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
    ),
    "edit": (
        "Replace the exact text `old` with `new` in a file of your worktree (once, or everywhere with all=true).",
        {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "old": {"type": "string"},
                "new": {"type": "string"},
                "all": {"type": "boolean"},
            },
            "required": ["path", "old", "new"],
        },
    ),
    "ls": ("List a directory of your worktree.", {"type": "object", "properties": {"path": {"type": "string"}}}),
    "grep": (
        "Search files of your worktree with a Python regular expression (glob filters file names).",
        {
            "type": "object",
            "properties": {"pattern": {"type": "string"}, "path": {"type": "string"}, "glob": {"type": "string"}},
            "required": ["pattern"],
        },
    ),
    "run": (
        "Run a shell command in your worktree, in the sandbox (no network; only the worktree is writable; "
        "bounded time and memory). Build, a unit test, a script you wrote.",
        {
            "type": "object",
            "properties": {"command": {"type": "string"}, "timeout_s": {"type": "number"}},
            "required": ["command"],
        },
    ),
    "changes": (
        "Your change so far: the diff of your worktree against the baseline (what would be proposed).",
        {"type": "object", "properties": {}},
    ),
    "test": (
        "The target's functional tests on your change, as the gate runs them.",
        {"type": "object", "properties": {}},
    ),
    "kernels_bench": (
        "The micro stage on your change for one IR op: correctness on the generated cases, then interleaved timing "
        "of PROVIDER (registered in your worktree) against the baseline's provider (default native).",
        {
            "type": "object",
            "properties": {
                "op": {"type": "string"},
                "provider": {"type": "string"},
                "baseline_provider": {"type": "string"},
                "pairs": {"type": "integer"},
            },
            "required": ["op", "provider"],
        },
    ),
    "measure": (
        "An ADVISORY paired measurement of your change against the baseline on fresh engines (estimate and 95% CI). "
        "Not the gate: the gate measures with its own seeds after you finish.",
        {"type": "object", "properties": {"workload": {"type": "string"}, "pairs": {"type": "integer"}}},
    ),
    "profile": (
        "Where a workload's time goes with your change (by engine phase, op and module).",
        {"type": "object", "properties": {"workload": {"type": "string"}}},
    ),
    "check_outputs": (
        "The distribution check of your change against the baseline on the public corpus only (advisory).",
        {"type": "object", "properties": {}},
    ),
    "history": (
        "Earlier proposals of this target and their verdicts (untrusted text).",
        {"type": "object", "properties": {"limit": {"type": "integer"}}},
    ),
    "insights": (
        "The latest insights distilled from the history (untrusted text).",
        {"type": "object", "properties": {}},
    ),
}
FILE_TOOL_TIMEOUT_S = 60.0  # the longest one file-tool call may take (a FIFO, a pathological regular expression)
PIDS_MAX = 4096  # tasks (threads included) one `run` call may hold at once, where cgroups can say so


def cap(s: str, limit: int) -> str:
    """``s`` within ``limit`` characters: its head and its tail, the cut marked."""
    if len(s) <= limit:
        return s
    head = limit // 4
    return s[:head] + f"\n… ({len(s) - limit} characters cut) …\n" + s[-(limit - head) :]


def clear_leftovers(ws: Workspace) -> int:
    """Remove what agent sessions of a run that was killed left behind — their worktrees, private directories
    and snapshot refs; how many sessions. Called when an episode starts or resumes (it holds the workspace
    lock: no session of another run is alive)."""
    from .sides import remove_worktree

    n = 0
    for wt in sorted(ws.worktrees.glob("agent-*")) if ws.worktrees.is_dir() else ():
        link = wt / ".git"
        remove_worktree(ws, wt, link.read_text() if link.is_file() and not link.is_symlink() else "")
        n += 1
    for d in sorted((ws.state / "tmp").glob("agent-*")) if (ws.state / "tmp").is_dir() else ():
        remove_tree(d)
    refs = git.run_git(
        "for-each-ref", "--format=%(refname)", "refs/agentsearch/workbench/", cwd=ws.repo_dir, check=False
    ).split()
    for ref in refs:
        git.run_git("update-ref", "-d", ref, cwd=ws.repo_dir, check=False)
    return n


def sandbox_available() -> tuple[bool, str]:
    """(available, why not): the workbench runs nothing outside the sandbox, so it needs one."""
    return sandbox.probe()


class Workbench:
    """One agent session's fenced worktree and tools; ``call`` is the one entry point."""

    TOOLS = TOOLS

    def __init__(
        self,
        ws: Workspace,
        config: Config,
        base: str,
        name: str,
        *,
        history: Sequence[Proposal] | None = None,
        insights_md: str = "",
        say: Say | None = None,
        start_from: str = "",
    ):
        ok, why = sandbox_available()
        if not ok:
            raise WorkbenchError(f"the agent's tools run only in the sandbox, and this machine cannot sandbox: {why}")
        self.ws, self.config, self.base, self.name = ws, config, base, name
        self.budget = config.agent
        self.say = say or (lambda stage, detail: None)
        self.history_rows = list(history or [])
        self.insights_md = insights_md
        self.calls: list[ToolCall] = []
        self.tool_seconds = 0.0
        self.pairs_used = 0
        self.calls_run = 0  # calls that reached a tool (refused ones not counted)
        self._per_turn: dict[str, int] = {}  # model turn (its message id) -> calls it made
        self._started: float | None = None  # when the running call started
        self._lock = threading.Lock()
        self._snapshots = 0
        self.root = ws.state / "tmp" / f"agent-{name}"
        remove_tree(self.root)
        self.out = self.root / "out"  # the sandbox's private output directory (requests and answers of the file tool)
        self.cli_home = self.root / "home"  # the CLI's own $HOME and config (never the user's ~/.claude)
        self.cli_cwd = self.root / "cli"  # the CLI's working directory: empty, so no project file steers it
        for d in (self.out, self.cli_home, self.cli_cwd, self.root / "pinned"):
            d.mkdir(parents=True, exist_ok=True)
        self.worktree = ws.add_measurement_worktree(base, f"agent-{name}")
        self.git_link = ""
        try:
            self.git_link = (self.worktree / ".git").read_text()
            # a revision starts from its parent's change (applied by the orchestrator before any agent code runs there)
            self.start_error = git.apply_patch(self.worktree, start_from) if start_from.strip() else ""
            if config.target.install == "overlay" and config.target.overlay_from:
                link_overlay(self.worktree, Path(config.target.overlay_from))
            self.linked = linked_files(self.worktree)
            pins = pin_protected(ws, config, base, self.root / "pinned")
        except (AgentsearchError, OSError) as exc:
            self.close()
            raise WorkbenchError(f"could not prepare the agent's worktree: {exc}") from None
        wt = str(self.worktree.resolve())
        pinned = [(str(self.root / "pinned" / rel), f"{wt}/{rel}") for rel in pins]
        pinned += [(f"{wt}/{rel}", f"{wt}/{rel}") for rel in (".git", *self.linked)]  # read-only over themselves
        self.sandbox = sandbox.Sandbox(
            worktree=wt,
            outputs=str(self.out.resolve()),
            read_only=(str(FILES_TOOL), *model_dirs(config)),
            pinned=tuple(pinned),
        )

    # ------------------------------------------------------------------ the one entry point
    def call(self, tool: str, args: Mapping[str, Any]) -> Answer:
        """Run ``tool`` with ``args`` (one call at a time), count it and record it; never raises."""
        with self._lock:
            summary = text.clean(
                " ".join(f"{k}={str(v)[:80]!r}" for k, v in sorted(args.items()) if k != "content"), 200, one_line=True
            )
            if tool not in TOOLS:
                return self._refuse(tool, summary, f"{tool} is not a workbench tool")
            why = self._spent()
            if why:
                return self._refuse(tool, summary, why)
            self.calls_run += 1
            t0 = self._started = time.perf_counter()
            try:
                ans = getattr(self, f"_{tool}")(**{k: v for k, v in args.items() if k in TOOLS[tool][1]["properties"]})
            except TypeError as exc:
                ans = Answer(f"bad arguments for {tool}: {exc}", ok=False)
            except (AgentsearchError, UnsafeFile) as exc:
                ans = Answer(str(exc), ok=False)
            except Exception as exc:  # noqa: BLE001 - a tool's failure is the agent's answer, never the session's end
                ans = Answer(f"{tool} failed: {type(exc).__name__}: {exc}", ok=False)
            seconds = time.perf_counter() - t0
            self.tool_seconds += seconds
            self._started = None
            self.pairs_used += ans.pairs
            detail = ans.detail or (ans.text.strip().splitlines() or [""])[0]
            self.calls.append(
                ToolCall(tool, summary, round(seconds, 3), ans.ok, text.clean(detail, 200, one_line=True), ans.pairs)
            )
            self.say(
                "agent",
                f"{tool} {'ok' if ans.ok else 'failed'} in {seconds:.1f} s: {text.clean(detail, 80, one_line=True)}",
            )
            return dataclasses.replace(ans, text=cap(ans.text, self.budget.output_bytes))

    def _spent(self) -> str:
        """Why no further call may run ('' while the session's time and calls last)."""
        if self.budget.max_tool_seconds - self.tool_seconds <= 0:
            return (
                f"refused: the session's tool time ({self.budget.max_tool_seconds:g} s, [agent] max_tool_seconds) "
                "is spent: finish with your closing JSON line"
            )
        if self.calls_run >= self.budget.max_tool_calls:
            return (
                f"refused: the session's tool calls ({self.budget.max_tool_calls}, [agent] max_tool_calls) are "
                "spent: finish with your closing JSON line"
            )
        return ""

    def left_s(self) -> float:
        """Seconds of ``[agent] max_tool_seconds`` not yet spent, the running call's so far included."""
        running = time.perf_counter() - self._started if self._started is not None else 0.0
        return self.budget.max_tool_seconds - self.tool_seconds - running

    def admit(self, turn: str, tool: str, args: Mapping[str, Any]) -> str:
        """Whether one more call of the model turn ``turn`` (the id of the model's message that made it; ''
        when it could not be told) may run: '' when it may, else the one line that refuses it (recorded).
        Called by the session before the call reaches ``call``."""
        with self._lock:
            summary = text.clean(str(dict(args))[:200], 200, one_line=True)
            if not turn:
                return self._refuse(tool, summary, "refused: the model turn of this call could not be told").text
            n = self._per_turn[turn] = self._per_turn.get(turn, 0) + 1
            if n > self.budget.max_calls_per_turn:
                return self._refuse(
                    tool,
                    summary,
                    f"refused: one model turn may make {self.budget.max_calls_per_turn} workbench calls "
                    "([agent] max_calls_per_turn); ask for the rest in your next turn",
                ).text
            return ""

    def refused(self, tool: str, args: Mapping[str, Any], why: str) -> None:
        """Record a call the session refused before it reached the workbench (a tool that is not ours)."""
        with self._lock:
            self._refuse(tool, text.clean(str(dict(args))[:200], 200, one_line=True), why)

    def _refuse(self, tool: str, summary: str, why: str) -> Answer:
        why = text.clean(why, 300, one_line=True)
        self.calls.append(ToolCall(text.clean(tool, 60, one_line=True), summary, 0.0, False, why, 0, refused=True))
        return Answer(why, ok=False)

    # ------------------------------------------------------------------ the fence
    def _sandboxed(self, argv: list[str], timeout_s: float) -> tuple[int | None, str, str, float]:
        env = child_env(dict(self.config.target.env), self.worktree, None, self.out)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(self.worktree), self.config.target.env.get("PYTHONPATH", "")) if p
        )
        env["PATH"] = os.pathsep.join(
            p for p in (os.path.dirname(sys.executable), env.get("PATH", "/usr/bin:/bin")) if p
        )  # `python` is ours
        kib = int(self.budget.memory_gib * (1 << 20))
        blocks = (
            self.budget.max_file_mib * 2048
        )  # ulimit -f counts 512-byte blocks: every file a call writes, its output too
        inner = ["/bin/sh", "-c", f'ulimit -v {kib} && ulimit -f {blocks} && exec "$@"', "sh", *argv]
        # the whole call's memory (its private tmpfs /tmp and /dev/shm included) and its task count, where the
        # machine has writable cgroups; else each process's address space alone (ulimit -v)
        limits = cgroups.Limits.create("agent", int(self.budget.memory_gib * (1 << 30)), PIDS_MAX)
        try:
            with sandbox.use(sandbox.Containment({self.sandbox.worktree: self.sandbox})):
                rc, out, err, wall = run_child(
                    inner, self.worktree, env, timeout_s, prefix=limits.join_prefix() if limits else ()
                )
            if limits is not None and limits.oom_killed():
                err += f"\n(killed: the call's memory went past [agent] memory_gib = {self.budget.memory_gib:g} GiB)"
            return rc, out, err, wall
        finally:
            if limits is not None:
                limits.remove()

    def _bound(self, limit: float) -> tuple[float, str]:
        """(timeout, why) of one call: ``limit``, or what is left of the session's tool time when that is less."""
        left = self.left_s()
        if left < limit:
            return max(left, 0.0), f"what was left of [agent] max_tool_seconds = {self.budget.max_tool_seconds:g}"
        return limit, ""

    def _files(self, op: str, **req: Any) -> Answer:
        token = secrets.token_hex(6)
        request, answer = self.out / f"req-{token}.json", self.out / f"ans-{token}.json"
        write_beneath(self.out, request, json.dumps({"op": op, **req}).encode())
        try:
            limit, why = self._bound(FILE_TOOL_TIMEOUT_S)
            rc, _out, err, _wall = self._sandboxed([sys.executable, str(FILES_TOOL), str(request), str(answer)], limit)
            if rc is None:
                return Answer(
                    f"{op} timed out after {limit:.3g} s ({why or 'the longest a file tool may take'})", ok=False
                )
            try:
                got = json.loads(read_beneath(self.out, answer, 1 << 20).decode("utf-8", "replace"))
            except (UnsafeFile, ValueError, OSError):
                return Answer(f"{op} failed: {(err.strip().splitlines() or ['no answer'])[-1]}", ok=False)
            return Answer(str(got.get("text", "")), ok=bool(got.get("ok")))
        finally:
            for p in (request, answer):
                try:
                    os.unlink(p)  # the name, never what a link there points to
                except OSError:
                    pass

    # ------------------------------------------------------------------ file tools (in the sandbox)
    def _read(self, path: str, offset: int = 0, limit: int = 400) -> Answer:
        return self._files("read", path=str(path), offset=int(offset), limit=int(limit))

    def _write(self, path: str, content: str) -> Answer:
        return self._files("write", path=str(path), content=str(content))

    def _edit(self, path: str, old: str, new: str, all: bool = False) -> Answer:  # noqa: A002 - the tool's argument name
        return self._files("edit", path=str(path), old=str(old), new=str(new), all=bool(all))

    def _ls(self, path: str = ".") -> Answer:
        return self._files("ls", path=str(path))

    def _grep(self, pattern: str, path: str = ".", glob: str = "*") -> Answer:
        return self._files("grep", pattern=str(pattern), path=str(path), glob=str(glob))

    def _run(self, command: str, timeout_s: float | None = None) -> Answer:
        asked = float(timeout_s or self.budget.run_timeout_s)
        if not (math.isfinite(asked) and asked > 0):
            asked = self.budget.run_timeout_s
        limit, why = self._bound(min(asked, self.budget.run_timeout_s))
        rc, out, err, wall = self._sandboxed(["/bin/sh", "-c", str(command)], limit)
        status = f"timed out after {limit:.3g} s" + (f" ({why})" if why else "") if rc is None else f"exit {rc}"
        body = (out.strip() + ("\n--- stderr ---\n" + err.strip() if err.strip() else "")).strip()
        return Answer(f"[{status}, {wall:.1f} s]\n{body}", ok=rc == 0, detail=f"{status} in {wall:.1f} s")

    # ------------------------------------------------------------------ the change
    def _scan(self) -> str:
        """Why the worktree cannot be read into a change ('' when it can): an entry named .git below its top (a
        repository the agent planted), or a file larger than ``[agent] max_file_mib``. Iterative: a tree
        thousands of directories deep is walked like any other."""
        cap = self.budget.max_file_mib << 20
        stack = [str(self.worktree)]
        while stack:
            d = stack.pop()
            try:
                entries = list(os.scandir(d))
            except OSError as exc:
                return f"{os.path.relpath(d, self.worktree)}: cannot be read ({exc.strerror})"
            for e in entries:
                rel = os.path.relpath(e.path, self.worktree)
                if e.name == ".git" and d != str(self.worktree):
                    return f"{rel}: a .git entry inside the worktree is not allowed (remove it with `run`)"
                if e.is_dir(follow_symlinks=False):
                    if not (e.name == ".git" and d == str(self.worktree)):
                        stack.append(e.path)
                elif e.is_file(follow_symlinks=False) and e.stat(follow_symlinks=False).st_size > cap:
                    return f"{rel}: larger than {self.budget.max_file_mib} MiB ([agent] max_file_mib)"
        return ""

    def _index(self) -> dict[str, str]:
        """git's environment for reading the worktree into a private index of the repository: git never
        follows the worktree's own ``.git`` link, so nothing the agent wrote there steers it."""
        why = self._scan()
        if why:
            raise AgentsearchError(why)
        if (self.worktree / ".git").read_text() != self.git_link:
            raise AgentsearchError("the worktree's .git link changed; the session cannot continue")
        index = self.root / "index"
        # no user or system git config: an agent's .gitattributes could otherwise pick a filter or diff driver
        # defined there (git-lfs's, say) to run on the host
        env = {
            "GIT_DIR": str(self.ws.common),
            "GIT_WORK_TREE": str(self.worktree),
            "GIT_INDEX_FILE": str(index),
            "GIT_CONFIG_GLOBAL": "/dev/null",
            "GIT_CONFIG_NOSYSTEM": "1",
        }
        git.run_git("read-tree", self.base, cwd=self.root, env=env)
        exclude = self.root / "exclude"
        exclude.write_text("".join(f"/{rel}\n" for rel in self.linked))  # the overlay's compiled files are not a change
        git.run_git("-c", f"core.excludesFile={exclude}", "add", "-A", cwd=self.root, env=env)
        return env

    def diff(self) -> str:
        """The worktree's change against the base, as a patch (the proposal); AgentsearchError when it is larger
        than ``[agent] max_patch_mib``."""
        env = self._index()
        d = git.run_git(
            "-c",
            "core.quotepath=true",
            "diff",
            "--cached",
            "--binary",
            "--no-ext-diff",
            "--no-color",
            self.base,
            cwd=self.root,
            env=env,
        )
        if len(d) > self.budget.max_patch_mib << 20:
            raise AgentsearchError(
                f"the change is {len(d) >> 20} MiB as a patch, more than [agent] max_patch_mib = "
                f"{self.budget.max_patch_mib}"
            )
        return d

    def snapshot(self) -> str:
        """A commit of the worktree as it is now (parent: the base), for the tools that judge; '' when unchanged."""
        env = self._index()
        tree = git.run_git("write-tree", cwd=self.root, env=env).strip()
        if tree == git.tree_of(self.ws.repo_dir, self.base):
            return ""
        self._snapshots += 1
        sha = git.commit_tree(
            self.ws.repo_dir, tree, [self.base], f"agent workbench snapshot {self.name}/{self._snapshots}"
        )
        git.run_git("update-ref", f"refs/agentsearch/workbench/{self.name}", sha, cwd=self.ws.repo_dir)
        return sha

    def _changed(self) -> str:
        sha = self.snapshot()
        if not sha:
            raise AgentsearchError("your worktree has no change yet: nothing to test or measure")
        return sha

    def _contained(self) -> None:
        box = containment.decide(self.config)
        if not box.use:
            raise AgentsearchError(f"the judging tools run only in the sandbox: {box.detail}")

    def _changes(self) -> Answer:
        d = self.diff()
        return Answer(d or "(no change yet)", detail=f"{d.count(chr(10))} diff lines")

    # ------------------------------------------------------------------ the gate's machinery, as advice
    def _tag(self, what: str) -> str:
        return f"wb-{what}-{self.name}-{secrets.randbelow(100000):05d}"

    def _test(self) -> Answer:
        from .evaluation import functional_tests

        if not self.config.target.test:
            return Answer("the target declares no [target] test command", ok=False)
        self._contained()
        sha = self._changed()
        with built_sides(self.ws, self.config, {BASELINE: self.base, CANDIDATE: sha}, self._tag("test"), "test") as sd:
            # the tests' own run is cut at what is left of the session's tool time (the build before it is not)
            limit = max(min(self.config.target.test_timeout_s, self.left_s()), 0.001)
            bounded = dataclasses.replace(
                self.config, target=dataclasses.replace(self.config.target, test_timeout_s=limit)
            )
            status, detail, _failure, output = functional_tests(bounded, sd)
        return Answer(
            f"{status.value.upper()}: {detail}\n{output}", ok=status == Status.PASS, detail=f"{status.value}: {detail}"
        )

    def _kernels_bench(self, op: str, provider: str, baseline_provider: str = "native", pairs: int = 6) -> Answer:
        from kernels import catalog

        if op not in catalog.OPS:
            return Answer(f"unknown op {op!r}; the IR ops are: {', '.join(catalog.OPS)}", ok=False)
        for p in (provider, baseline_provider):
            if not str(p).replace("_", "a").isalnum():
                return Answer(f"provider {p!r}: expected a registered provider name such as native", ok=False)
        self._contained()
        sha = self._changed()
        n = max(2, min(int(pairs), 12))
        t = micro.Target(op, (str(baseline_provider),), (str(provider),), "workbench")
        with built_sides(
            self.ws, self.config, {BASELINE: self.base, CANDIDATE: sha}, self._tag("kbench"), "kernels_bench"
        ) as sd:
            check, result = micro.run(
                self.config,
                sd,
                [t],
                seeds.new_master(),
                self.config.gate.regression_alpha,
                self.say,
                pairs=(max(2, n // 2), n),
            )
        r = result.ops[0] if result.ops else None
        lines = [f"{check.status.value.upper()}: {check.detail}"]
        if r is not None:
            lines.append(
                f"correctness: {r.cases} generated cases" + (" correct" if r.correct else f", {len(r.failures)} failed")
            )
            lines += [f"  - {f}" for f in r.failures[:5]]
            if r.speedup is not None and r.ci is not None:
                lines.append(
                    f"timing: {r.baseline_us:.0f} -> {r.candidate_us:.0f} us per mix, speedup {r.speedup:.3f}x "
                    f"[95% CI {r.ci[0]:.3f}, {r.ci[1]:.3f}] over {r.pairs} pairs"
                )
        return Answer("\n".join(lines), ok=check.status == Status.PASS, detail=lines[0])

    def _measure(self, workload: str | None = None, pairs: int = 6) -> Answer:
        from .workloads import measure_options, session_factory

        left = self.budget.max_measure_pairs - self.pairs_used
        if left < 2:
            return Answer(
                f"the session's advisory pairs ({self.budget.max_measure_pairs}, [agent] max_measure_pairs) are spent",
                ok=False,
            )
        try:
            w = self.config.workload(workload) if workload else self.config.objective
        except KeyError:
            return Answer(
                f"no workload {workload!r}; the target has {', '.join(x.name for x in self.config.workloads)}", ok=False
            )
        n = max(2, min(int(pairs), left))
        self._contained()
        sha = self._changed()
        with built_sides(
            self.ws, self.config, {BASELINE: self.base, CANDIDATE: sha}, self._tag("measure"), "measure"
        ) as sd:
            pool = EnginePool()
            try:
                factory = session_factory(self.config, w, sd, pool)
                options = measure_options(self.config, w)
                design = SequentialDesign(alpha=0.05, min_pairs=n, max_pairs=n, look_every=n)

                def once(design: SequentialDesign, d: Any, prior: Any = None, clusters: Any = None) -> Decision:
                    return Decision("advisory", "", paired_estimate(d, clusters=clusters), 0.05)

                r = run_interleaved(
                    w.name,
                    factory,
                    design,
                    once,
                    seeds.advisory_seeds(seeds.new_master(), w.name),
                    w.higher_is_better,
                    **options,
                )
            finally:
                pool.close()
        if r.failure:
            return Answer(f"measurement failed: {r.failure}", ok=False, pairs=r.pairs)
        if r.pairs < 2:
            return Answer("measurement failed: fewer than two pairs completed", ok=False, pairs=r.pairs)
        est = paired_estimate(r.log_ratios, clusters=r.sessions if len(set(r.sessions)) > 1 else None)
        hi = est.upper(0.975)
        lo = math.exp(2 * est.mean) / hi
        base_v, cand_v = r.values(BASELINE), r.values(CANDIDATE)
        line = (
            f"{ADVISORY}: {w.name} speedup {est.speedup - 1:+.1%} [95% CI {lo - 1:+.1%}, {hi - 1:+.1%}] over {r.pairs} "
            f"pairs (baseline median {sorted(base_v)[len(base_v) // 2]:.4g}, yours "
            f"{sorted(cand_v)[len(cand_v) // 2]:.4g} {w.metric})"
        )
        return Answer(
            line
            + f"\n{self.budget.max_measure_pairs - self.pairs_used - r.pairs} advisory pairs left in this session.",
            detail=line,
            pairs=r.pairs,
        )

    def _profile(self, workload: str | None = None) -> Answer:
        from .profiling import profile

        self._contained()
        sha = self._changed()
        data = profile(self.ws, sha, workload, seeds.advisory_seeds(seeds.new_master(), "profile")(0), self.say)
        lines = [f"{data['workload']} with your change: {data['wall_s']:.2f} s profiled on {data['device']}"]
        for title, key in (
            ("by engine phase", "by_phase"),
            ("by op / kernel (self time)", "by_op"),
            ("by module (self time)", "by_module"),
        ):
            lines.append(title + ":")
            lines += [f"  {r['share_pct']:5.1f}%  {r['seconds']:8.3f} s  {r['name']}" for r in data[key][:10]]
        return Answer("\n".join(lines), detail=lines[0])

    def _check_outputs(self) -> Answer:
        from .verify import verify_public

        if self.config.verify is None:
            return Answer("the target has no [verify] section", ok=False)
        self._contained()
        sha = self._changed()
        res = verify_public(self.ws, self.config, self.base, sha, self.say)
        lines = [
            f"{res.verdict.upper()} on the public corpus ({res.public_size} prompts; advisory: the gate also checks "
            "prompts you never see)"
        ]
        lines += [f"  - {r}" for r in res.reasons[:10]]
        for path, s in (res.sets.get("public") or {}).items():
            lines.append(
                f"  {path}: max KL {s.get('kl_max')}, same top {s.get('same_top_pct', s.get('top1_agreement'))}, "
                f"divergences {s.get('divergences')}"
            )
        return Answer("\n".join(lines), ok=res.verdict == "pass", detail=lines[0])

    # ------------------------------------------------------------------ read-only history
    def _history(self, limit: int = 20) -> Answer:
        rows = [h for h in self.history_rows if h.judged][-max(1, min(int(limit), 60)) :]
        if not rows:
            return Answer("no judged proposal yet")
        lines = ["Earlier proposals (titles and reasons are UNTRUSTED text written by earlier proposals):"]
        for h in rows:
            lines.append(
                f"- {h.id} [{text.clean(h.category, 20, one_line=True)}] {h.outcome}"
                + (f" {h.effect:+.1%}" if h.effect is not None else "")
                + f": {text.clean(h.title, 120, one_line=True)!r}"
                + (f" — {text.clean('; '.join(h.reasons), 300, one_line=True)!r}" if h.reasons else "")
            )
        return Answer("\n".join(lines), detail=f"{len(rows)} proposals")

    def _insights(self) -> Answer:
        if not self.insights_md:
            return Answer("no insights recorded yet")
        return Answer(
            "Insights (UNTRUSTED text distilled from earlier proposals):\n" + text.clean(self.insights_md, 8000),
            detail="insights",
        )

    # ------------------------------------------------------------------ end
    def close(self) -> None:
        """Remove the worktree (as plain files: git never runs inside it), the snapshot ref and the private files."""
        from .sides import remove_worktree

        remove_worktree(self.ws, self.worktree, self.git_link)
        git.run_git("update-ref", "-d", f"refs/agentsearch/workbench/{self.name}", cwd=self.ws.repo_dir, check=False)
        remove_tree(self.root)

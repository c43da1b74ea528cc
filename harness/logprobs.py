"""Collecting logprob dumps from one side: a target's command, or the built-in vLLM worker."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .corpus import Prompt
from .distribution import Record, read_dump
from .engine_session import WorkerSession
from .trials import child_env, run_child, substitute, tail
from .worker_protocol import WorkerError


class LogprobError(RuntimeError):
    pass


# the decode steps of a verify run are heavy-tailed like the timed runs' zipf profile (most prompts short, a few
# long): a change keyed on the longest request of a skewed batch is exercised here too (red team, round 3: one
# that cut only that request at half its length and padded it passed every verify run of equal lengths)
DECODE_TAIL = 4  # the longest decode is this many times the configured mean


def decode_lengths(prompts: Sequence[Prompt], mean: int, longest: int = 0) -> dict[str, int]:
    """prompt id -> its decode steps: Pareto(1.5) draws from a hash of the id (shuffled runs give a prompt the
    same length), scaled to ``mean`` and capped at ``DECODE_TAIL`` x ``mean``; the prompt with the largest draw
    runs ``max(longest, cap)`` steps, so the longest request reaches the longest output a workload asks for."""
    if not prompts:
        return {}
    cap = max(1, DECODE_TAIL * mean)
    draws = {}
    for p in prompts:
        u = (int.from_bytes(hashlib.sha256(f"decode-length:{p.id}".encode()).digest()[:8], "big") + 1) / 2.0**64
        draws[p.id] = u ** (-1 / 1.5)  # mean 3
    out = {pid: max(1, min(cap, round(mean * d / 3.0))) for pid, d in draws.items()}
    top = max(draws, key=lambda pid: draws[pid])
    out[top] = max(cap, longest)
    return out


def write_prompts(
    path: Path, prompts: Sequence[Prompt], shuffle_seed: int | None = None, lengths: Mapping[str, int] | None = None
) -> Path:
    """The prompts as the logprob contract's JSONL; ``lengths``: each prompt's ``max_tokens`` (decode steps)."""
    items = list(prompts)
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(items)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join(
            json.dumps(
                {"id": p.id, "text": p.text, **({"max_tokens": lengths[p.id]} if lengths else {})}, ensure_ascii=False
            )
            + "\n"
            for p in items
        )
    )
    return path


def write_sample_prompts(
    path: Path,
    prompts: Sequence[Prompt],
    settings: int,
    shuffle_seed: int | None = None,
    lengths: Mapping[str, int] | None = None,
) -> Path:
    """The sample path's input: the prompts' sampling settings in turn (by their order in ``prompts``,
    so every setting gets its share of every language) and a seed that is a function of the id alone;
    shuffling reorders the requests, never what a prompt gets, so every run samples a prompt the same way."""
    items = []
    for i, p in enumerate(prompts):
        seed = int.from_bytes(hashlib.sha256(p.id.encode()).digest()[:4], "big") % (2**31 - 1)
        extra = {"max_tokens": lengths[p.id]} if lengths else {}
        items.append(
            json.dumps({"id": p.id, "text": p.text, "setting": i % settings, "seed": seed, **extra}, ensure_ascii=False)
            + "\n"
        )
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(items)
    lines = items
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(lines))
    return path


class CommandLogprobs:
    """The target's ``[verify] logprobs`` command, run in a worktree."""

    def __init__(
        self, command: str, worktree: Path, env: Mapping[str, str], timeout_s: float, out_root: Path | None = None
    ):
        self.command, self.worktree, self.env, self.timeout_s = command, worktree, dict(env), timeout_s
        self.out_root = out_root  # the side's output directory: dumps are read below it, no links followed

    def run(self, prompts: Path, out: Path, k: int, max_tokens: int) -> dict[tuple[str, str], Record]:
        values = {
            "worktree": str(self.worktree),
            "prompts": str(prompts),
            "out": str(out),
            "k": str(k),
            "max_tokens": str(max_tokens),
        }
        env = child_env(self.env, self.worktree, None, out)
        env["AGENTSEARCH_PROMPTS"] = str(prompts)
        rc, _o, err, _w = run_child(substitute(self.command, values), self.worktree, env, self.timeout_s, shell=True)
        if rc is None:
            raise LogprobError(f"logprob command timed out after {self.timeout_s:g} s")
        if rc != 0:
            raise LogprobError(f"logprob command exited with status {rc}: {tail(err, 1) or 'no stderr'}")
        if not out.exists() and not out.is_symlink():
            raise LogprobError("logprob command wrote no output")
        try:
            return read_dump(out, self.out_root)
        except (ValueError, OSError) as exc:
            raise LogprobError(str(exc)) from None

    def close(self) -> None:
        pass


class VllmLogprobs:
    """The built-in vLLM logprob worker (a warm engine in the side's worktree)."""

    def __init__(
        self,
        spec: Mapping[str, Any],
        worktree: Path,
        env: Mapping[str, str],
        log_path: Path,
        timeout_s: float,
        out_root: Path | None = None,
    ):
        self.session = WorkerSession(spec, worktree, env, log_path, metric="unused", timeout_s=timeout_s)
        self.timeout_s = timeout_s
        self.out_root = out_root
        self.session.start()

    def run(self, prompts: Path, out: Path, k: int, max_tokens: int) -> dict[tuple[str, str], Record]:
        try:
            self.session.request(
                {"cmd": "logprobs", "prompts": str(prompts), "out": str(out), "k": k, "max_tokens": max_tokens},
                self.timeout_s,
            )
        except WorkerError as exc:
            raise LogprobError(str(exc)) from None
        try:
            return read_dump(out, self.out_root)
        except (ValueError, OSError) as exc:
            raise LogprobError(str(exc)) from None

    def samples(
        self, prompts: Path, out: Path, settings: list[dict], n: int, seed: int
    ) -> dict[tuple[str, str], Record]:
        """The draw test: ``n`` one-token draws per context and setting; setting j uses the seeds
        ``seed + j*n`` to ``seed + (j+1)*n - 1``."""
        return self._dump(
            {"cmd": "samples", "prompts": str(prompts), "out": str(out), "settings": settings, "n": n, "seed": seed}
        )

    def processed(
        self, prompts: Path, out: Path, settings: list[dict], k: int, max_tokens: int
    ) -> dict[tuple[str, str], Record]:
        """The sample path: seeded sampled continuations with processed logprobs (see write_sample_prompts)."""
        return self._dump(
            {
                "cmd": "processed",
                "prompts": str(prompts),
                "out": str(out),
                "settings": settings,
                "k": k,
                "max_tokens": max_tokens,
            }
        )

    def _dump(self, cmd: dict) -> dict[tuple[str, str], Record]:
        out = Path(cmd["out"])
        try:
            self.session.request(cmd, self.timeout_s)
            return read_dump(out, self.out_root)
        except (WorkerError, ValueError, OSError) as exc:
            raise LogprobError(str(exc)) from None

    def close(self) -> None:
        self.session.close()

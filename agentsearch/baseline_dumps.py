"""The baseline's logprob dumps, reused by the next distribution check while nothing they depend on moved.

Every ``verify`` (and step 11 of every evaluation that reaches it) collects seven dumps from the
baseline — the corpus, the shuffled noise floor, the sample path twice, the draw test three times —
with its own engine, before the candidate's. While the baseline commit, the ``[verify]`` section, the
target's environment and install, the model's files, the machine's environment fingerprint (packages,
native extensions, devices) and agentsearch's logprob code are the same, those dumps are the same
computation: they are kept in the house (``.git/agentsearch/verify-baseline/``, outside every sandbox)
and the next check reuses them, so its baseline engine never starts.

Each dump is keyed by all of that plus what the call was asked (its kind, its arguments and the bytes
of its prompts file), so a change of corpus, holdout secret or setting is a miss, never a stale hit.
Written atomically with their SHA-256 (a damaged dump is a miss), read without following links; only
the newest ``KEEP`` baselines are kept.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from harness.distribution import MAX_DUMP_BYTES, Record, read_dump
from harness.safe_io import read_beneath

CACHE_DIR = "verify-baseline"
REFERENCE_DIR = (
    "verify-reference"  # the reference's dumps, per regime (agentsearch.verify): kept apart, merges do not move it
)
MAIN_DIR = "verify-main"  # main's dumps in regimes other than its own (agentsearch.verify)
KEEP = 4  # baselines whose dumps are kept (the newest by use)
KEEP_REFERENCE = 16  # reference regimes whose dumps are kept
COMPLETE = "complete"  # marker: every dump of a full check is there (the baseline's engine need not start)
CODE = ("harness",)  # every file of the harness (the worker, the requests, the sandbox, the engine session)

Dump = dict[tuple[str, str], Record]


class Runner(Protocol):
    def run(self, prompts: Path, out: Path, k: int, max_tokens: int) -> Dump: ...

    def close(self) -> None: ...


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """agentsearch's code that makes a dump: every Python file of the harness (the worker, the requests
    it is sent, the corpus, the sandbox and the engine session)."""
    base = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for pkg in CODE:
        for path in sorted((base / pkg).rglob("*.py")):
            h.update(str(path.relative_to(base)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def model_digest(model: str | None) -> str:
    """Name, size and modification time of every file of a model directory ('' for no local model)."""
    if not model or not Path(model).is_dir():
        return ""
    h = hashlib.sha256()
    for f in sorted(Path(model).rglob("*")):
        if f.is_file():
            st = f.stat()
            h.update(f"{f.relative_to(model)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def baseline_key(parts: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


class BaselineDumps:
    """The kept dumps of one baseline key, in ``root / key``."""

    def __init__(self, root: Path, key: str, keep: int = KEEP):
        self.root, self.dir, self.keep = root, root / key, keep

    @property
    def complete(self) -> bool:
        return (self.dir / COMPLETE).is_file()

    def path(self, call: Mapping[str, Any], prompts: Path) -> Path:
        digest = hashlib.sha256(json.dumps(call, sort_keys=True).encode() + b"\0" + prompts.read_bytes()).hexdigest()[
            :24
        ]
        return self.dir / f"{digest}.jsonl"

    def get(self, kept: Path, out: Path, out_root: Path) -> Dump | None:
        """The kept dump, copied to ``out`` (where the run would have written it) and parsed; None on a miss."""
        try:
            raw = read_beneath(self.dir, kept, MAX_DUMP_BYTES)
            digest = read_beneath(self.dir, kept.with_suffix(".sha256"), 128).decode().strip()
        except (OSError, ValueError):
            return None
        if hashlib.sha256(raw).hexdigest() != digest:
            return None  # damaged: collected again (and kept again)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(raw)
        try:
            return read_dump(out, out_root)
        except (OSError, ValueError):
            return None

    def put(self, kept: Path, out: Path, out_root: Path) -> None:
        """Keep the dump the baseline just wrote to ``out`` (read beneath its output directory)."""
        raw = read_beneath(out_root, out, MAX_DUMP_BYTES)
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        for path, data in ((kept, raw), (kept.with_suffix(".sha256"), hashlib.sha256(raw).hexdigest().encode())):
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)

    def discard(self) -> None:
        """Forget this key's dumps (a check whose baseline was not self-consistent keeps nothing)."""
        shutil.rmtree(self.dir, ignore_errors=True)

    def mark_complete(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        (self.dir / COMPLETE).write_text("")
        os.utime(self.dir)
        self.prune()

    def prune(self) -> None:
        """Only the newest ``keep`` baselines' dumps stay (a merge moves the baseline: its old dumps go)."""
        try:
            dirs = sorted(
                (d for d in self.root.iterdir() if d.is_dir() and not d.is_symlink()),
                key=lambda d: d.stat().st_mtime,
                reverse=True,
            )
        except OSError:
            return
        for d in dirs[self.keep :]:
            if d != self.dir:
                shutil.rmtree(d, ignore_errors=True)


class ReusingRunner:
    """A baseline runner that answers from ``dumps`` when it can and starts the real runner (``make()``)
    only at the first miss, keeping what it computes. ``reused`` counts the dumps answered from the house.

    With ``eager`` the real runner starts at once (no complete set is kept: the engine will be needed,
    and starting it now lets it boot beside the candidate's)."""

    def __init__(self, make: Callable[[], Any], dumps: BaselineDumps, out_root: Path, eager: bool, keep: bool = True):
        self._make, self.dumps, self.out_root, self.keep = make, dumps, out_root, keep
        self.inner: Any = make() if eager else None
        self.reused = self.collected = 0

    def _call(self, method: str, prompts: Path, out: Path, args: Mapping[str, Any]) -> Dump:
        kept = self.dumps.path({"call": method, **args}, prompts)
        got = self.dumps.get(kept, out, self.out_root)
        if got is not None:
            self.reused += 1
            return got
        if self.inner is None:
            self.inner = self._make()
        res: Dump = getattr(self.inner, method)(prompts, out, **args)
        if not self.keep:
            return res  # read-only: an advisory check (the agent's check_outputs) never writes or evicts kept dumps
        try:
            self.dumps.put(kept, out, self.out_root)
            self.collected += 1
        except (OSError, ValueError):
            pass  # not kept: the next check collects it again
        return res

    def run(self, prompts: Path, out: Path, k: int, max_tokens: int) -> Dump:
        return self._call("run", prompts, out, {"k": k, "max_tokens": max_tokens})

    def processed(self, prompts: Path, out: Path, settings: list[dict], k: int, max_tokens: int) -> Dump:
        return self._call("processed", prompts, out, {"settings": settings, "k": k, "max_tokens": max_tokens})

    def samples(self, prompts: Path, out: Path, settings: list[dict], n: int, seed: int) -> Dump:
        return self._call("samples", prompts, out, {"settings": settings, "n": n, "seed": seed})

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()

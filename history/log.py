"""The append-only, hash-chained history log (JSON lines). No git, no vllm.

Each line: ``{"v": 2, "seq": n, "ts": ..., "kind": ..., "episode": ..., "proposal": ...,
"data": {...}, "prev": <hash of the previous line>, "hash": <sha256 of this line without it>}``.

- one ``write`` + ``fsync`` per record; an exclusive lock against a second writer;
- opening for append repairs a torn last line (a crash mid-write) and reports it;
- every line's ``data`` is validated into its typed record (``history.records``; ``v`` is the schema
  version it was written with, older versions are upgraded on reading, never rewritten) and a
  line that does not fit is an error naming file:line;
- ``verify`` detects an edited, inserted or deleted line anywhere and names the first bad one;
- a truncated, emptied or deleted log is detected against the chain head (record count + last
  hash) kept outside the log by a ``HeadStore`` the caller provides (agentsearch keeps it in a git
  ref); the log is written first, then the head, so a log may run ahead of its head, never behind;
- a log open for writing remembers the file it last wrote (or read on open: device, inode, size and
  its last line) and checks it before every write: a file emptied, truncated, rewritten, appended to
  by someone else, deleted or replaced under a running writer refuses the write (``HistoryChanged``),
  and every later one, so nothing more is written to it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from . import records
from .records import KINDS, SCHEMA_VERSION, Record, RecordError, Repair

GENESIS = "0" * 64


class HistoryError(Exception):
    """The log is corrupt or locked; the message names the file and line."""


class HistoryChanged(HistoryError):
    """The file on disk is no longer what this log last wrote or read on open (``what`` says how).

    Raised by ``append`` before anything is written; the log then refuses every later append."""

    def __init__(self, path: Path, what: str):
        self.path, self.what = path, what
        super().__init__(self.under("its writer"))

    def under(self, writer: str) -> str:
        """The one-line message, naming who was writing (``the episode``)."""
        return (
            f"history {self.path} changed under {writer} ({self.what}); {writer} stopped and wrote nothing more "
            "to it: restore it from a backup (agentsearch never rewrites history)"
        )


class HeadStore(Protocol):
    """Where the chain head (record count, last hash) is kept, out of reach of the log's writers.

    ``name`` names it in messages; ``read`` returns None when no head was written yet (an older
    log) and raises HistoryError when the stored head is unreadable."""

    name: str

    def read(self) -> tuple[int, str] | None: ...

    def write(self, seq: int, hash: str) -> None: ...


@dataclass(frozen=True)
class Entry:
    seq: int
    ts: float
    kind: str
    episode: str | None
    proposal: str | None
    data: Mapping[str, Any] = field(default_factory=dict)
    prev: str = GENESIS
    hash: str = ""
    v: int = SCHEMA_VERSION
    # ``data`` validated into its class (upgraded to the current schema); ``data`` itself stays as
    # written, since the hash covers it
    record: Record = field(default=None, compare=False, repr=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown record kind {self.kind!r}")
        if self.seq < 1:
            raise ValueError("seq starts at 1")
        if self.record is None:
            object.__setattr__(self, "record", records.load(self.kind, self.data, self.v))

    def body(self) -> dict[str, Any]:
        return {
            "v": self.v,
            "seq": self.seq,
            "ts": self.ts,
            "kind": self.kind,
            "episode": self.episode,
            "proposal": self.proposal,
            "data": self.data,
            "prev": self.prev,
        }


def _digest(body: Mapping[str, Any]) -> str:
    return hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode()
    ).hexdigest()


def _line(entry: Entry) -> str:
    body = entry.body()
    return json.dumps({**body, "hash": _digest(body)}, sort_keys=True, ensure_ascii=False, default=str) + "\n"


def _parse(raw: str, where: str) -> Entry:
    d: dict[str, Any] = {}
    try:
        d = json.loads(raw)
        if not isinstance(d.get("v"), int) or not 1 <= d["v"] <= SCHEMA_VERSION:
            raise HistoryError(
                f"{where}: unsupported schema version {d.get('v')!r} (this agentsearch reads 1 to {SCHEMA_VERSION})"
            )
        e = Entry(
            seq=d["seq"],
            ts=d["ts"],
            kind=d["kind"],
            episode=d["episode"],
            proposal=d["proposal"],
            data=d["data"],
            prev=d["prev"],
            hash=d["hash"],
            v=d["v"],
        )
    except RecordError as exc:
        body = {k: d.get(k) for k in ("v", "seq", "ts", "kind", "episode", "proposal", "data", "prev")}
        if _digest(body) != d.get("hash"):  # an edited line says so first, whatever the edit broke
            raise HistoryError(f"{where}: hash mismatch (the line was edited)") from None
        raise HistoryError(f"{where}: invalid {d.get('kind')} record: {exc}") from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise HistoryError(f"{where}: not a history record ({exc})") from None
    return e


@dataclass(frozen=True)
class VerifyReport:
    ok: bool
    records: int
    bad_line: int | None = None
    reason: str = ""
    torn_tail: bool = False


def verify(path: Path, head: HeadStore | None = None) -> VerifyReport:
    """Check every line's hash and the chain; a torn last line is reported (not an error).

    With ``head``, the log must reach the stored head: fewer records (truncated, emptied,
    deleted) or another record at the head's position fails."""
    rep = _verify_chain(path)
    if not rep.ok or head is None:
        return rep
    problem = _check_head(path, rep.records, head)
    return VerifyReport(False, rep.records, None, problem, rep.torn_tail) if problem else rep


def _check_head(path: Path, records: int, head: HeadStore) -> str:
    """'' when the log agrees with the stored head, else the one-line problem and its repair."""
    try:
        stored = head.read()
    except HistoryError as exc:
        return str(exc)
    if stored is None:
        return ""  # an older log: no head yet; it gets one on its next append
    seq, want = stored
    restore = f"restore {path} from a backup (agentsearch never rewrites history)"
    if records < seq:
        what = "the log is missing" if not path.exists() else f"the log has {records} records"
        return f"history truncated: {what} but {head.name} says {seq}; {restore}"
    if seq and _hash_at(path, seq) != want:
        return f"history rewritten: record {seq} is not the one {head.name} names ({want[:12]}); {restore}"
    return ""


def _hash_at(path: Path, seq: int) -> str:
    raw = path.read_bytes().split(b"\n")[seq - 1]
    return _parse(raw.decode("utf-8"), f"{path}:{seq}").hash


def _verify_chain(path: Path) -> VerifyReport:
    if not path.exists():
        return VerifyReport(True, 0)
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    torn = bool(lines[-1])  # text after the last newline: an interrupted write
    complete = lines[:-1]
    prev, n = GENESIS, 0
    for i, b in enumerate(complete, 1):
        where = f"{path}:{i}"
        try:
            e = _parse(b.decode("utf-8"), where)
        except (HistoryError, UnicodeDecodeError) as exc:
            return VerifyReport(False, n, i, str(exc))
        if _digest(e.body()) != e.hash:
            return VerifyReport(False, n, i, f"{where}: hash mismatch (the line was edited)")
        if e.prev != prev:
            return VerifyReport(
                False, n, i, f"{where}: chain broken (a line before it was edited, inserted or deleted)"
            )
        if e.seq != i:
            return VerifyReport(
                False, n, i, f"{where}: sequence number {e.seq}, expected {i} (a line was deleted or inserted)"
            )
        prev, n = e.hash, n + 1
    return VerifyReport(True, n, None, "", torn)


class HistoryLog:
    """Append to (and read) a history file, holding its lock while open for writing."""

    def __init__(self, path: Path, head: HeadStore | None = None):
        self.path = path
        self.head_store = head
        self._lock_fd: int | None = None
        self._prev = GENESIS
        self._seq = 0
        self.repaired: str = ""
        # the file as this log last left it: (device, inode, size) — None while there is no file — and its
        # last line; checked before every write (``_open_unchanged``)
        self._disk: tuple[int, int, int] | None = None
        self._tail = b""
        self._changed: HistoryChanged | None = None  # once refused, always refused
        # the complete lines read last time and their entries: an append-only log is re-read from there
        self._read: tuple[bytes, list[Entry]] = (b"", [])

    # ----------------------------------------------------------------- writing
    def open(self) -> HistoryLog:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(str(self.path) + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise HistoryError(f"{self.path} is being written by another process") from None
        self._lock_fd = fd
        self._changed = None
        rep = verify(self.path, self.head_store)
        if not rep.ok:
            self.close()
            repair = (
                "" if "restore" in rep.reason else "; restore it from a backup (agentsearch never rewrites history)"
            )
            raise HistoryError(f"corrupt history: {rep.reason}{repair}")
        if rep.torn_tail:
            self._repair()
        entries = list(self.entries())
        if entries:
            self._prev, self._seq = entries[-1].hash, entries[-1].seq
        self._remember(self._read[0] if entries else b"")
        try:
            self._advance_head()
        except BaseException:
            self.close()
            raise
        if self.repaired:
            self.append(Repair(note=self.repaired), None, None)
        return self

    @property
    def head(self) -> tuple[int, str]:
        """(seq, hash) of the last record written or read on open; (0, GENESIS) when empty."""
        return self._seq, self._prev

    def _advance_head(self) -> None:
        """Bring the stored head up to the log (a crash between append and head write, or no head yet)."""
        if self.head_store is None or self._seq == 0:
            return
        stored = self.head_store.read()
        if stored is None or stored[0] < self._seq:
            self.head_store.write(self._seq, self._prev)

    def _remember(self, raw: bytes) -> None:
        """The file as read on open (``raw``, its complete lines): what every write checks against."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._disk, self._tail = None, b""
            return
        self._disk = (st.st_dev, st.st_ino, len(raw))
        self._tail = raw[raw.rfind(b"\n", 0, len(raw) - 1) + 1 :] if raw else b""

    def _open_unchanged(self) -> int:
        """The file opened for appending, once it is checked to be the one this log last wrote: the same
        inode, size and last line (only the tail is read). Otherwise HistoryChanged, now and ever after."""
        if self._changed is not None:
            raise self._changed
        flags = os.O_RDWR | os.O_APPEND | (os.O_CREAT if self._disk is None else 0)
        try:
            fd = os.open(self.path, flags, 0o644)
        except FileNotFoundError:
            self._changed = HistoryChanged(self.path, "deleted")
            raise self._changed from None
        try:
            what = self._difference(fd)
        except OSError as exc:
            what = f"unreadable: {exc}"
        if what:
            os.close(fd)
            self._changed = HistoryChanged(self.path, what)
            raise self._changed
        return fd

    def _difference(self, fd: int) -> str:
        """'' when the open file is the one this log last left, else how it differs."""
        st = os.fstat(fd)
        if self._disk is None:
            return f"it had no records, now it has {st.st_size} bytes" if st.st_size else ""
        dev, ino, size = self._disk
        if (st.st_dev, st.st_ino) != (dev, ino):
            return "replaced by another file"
        if st.st_size < size:
            return (
                f"emptied: 0 of the {size} bytes left"
                if st.st_size == 0
                else f"truncated to {st.st_size} of {size} bytes"
            )
        if st.st_size > size:
            return f"{st.st_size - size} bytes written by someone else"
        if self._tail and os.pread(fd, len(self._tail), size - len(self._tail)) != self._tail:
            return f"rewritten: its last line is not record {self._seq} as written"
        return ""

    def _repair(self) -> None:
        raw = self.path.read_bytes()
        keep = raw[: raw.rfind(b"\n") + 1]
        dropped = len(raw) - len(keep)
        with open(self.path, "r+b") as fh:
            fh.truncate(len(keep))
            fh.flush()
            os.fsync(fh.fileno())
        self.repaired = f"removed a torn last line ({dropped} bytes) left by an interrupted write"

    def append(
        self, record: Record | str, episode: str | None, proposal: str | None, data: Mapping[str, Any] | None = None
    ) -> Entry:
        """Write ``record`` (a typed record; or a kind and its ``data``, validated into its class)."""
        if self._lock_fd is None:
            raise HistoryError("history is not open for writing")
        if isinstance(record, str):
            try:
                record = records.load(record, {**(data or {}), "schema_version": SCHEMA_VERSION}, SCHEMA_VERSION)
            except RecordError as exc:
                raise HistoryError(f"refusing to write an invalid record: {exc}") from None
        kind, data = record.KIND, record.to_json()
        entry = Entry(self._seq + 1, time.time(), kind, episode, proposal, data, self._prev, record=record)
        line = _line(entry)
        entry = Entry(
            entry.seq, entry.ts, kind, episode, proposal, data, self._prev, json.loads(line)["hash"], record=record
        )
        raw = line.encode()
        fd = self._open_unchanged()
        try:
            st = os.fstat(fd)
            size = self._disk[2] if self._disk is not None else st.st_size
            os.write(fd, raw)
            os.fsync(fd)
        finally:
            os.close(fd)
        self._disk, self._tail = (st.st_dev, st.st_ino, size + len(raw)), raw
        self._prev, self._seq = entry.hash, entry.seq
        if self.head_store is not None:
            self.head_store.write(entry.seq, entry.hash)
        return entry

    def close(self) -> None:
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> HistoryLog:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- reading
    def entries(self) -> Iterator[Entry]:
        """Complete records in order (a torn last line is skipped; verify() reports it)."""
        if not self.path.exists():
            return
        raw = self.path.read_bytes()
        raw = raw[: raw.rfind(b"\n") + 1]
        seen, parsed = self._read
        if not raw.startswith(seen):  # rewritten under us: read it all again
            seen, parsed = b"", []
        entries = list(parsed)
        for i, b in enumerate(raw[len(seen) :].split(b"\n")[:-1], len(parsed) + 1):
            entries.append(_parse(b.decode("utf-8"), f"{self.path}:{i}"))
        self._read = (raw, entries)
        yield from entries

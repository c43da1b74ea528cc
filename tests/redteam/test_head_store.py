"""history/log.py's head interface on its own (no git): the log is written first, then the head."""

from __future__ import annotations

from pathlib import Path

import pytest

from history import HistoryError, HistoryLog, verify


class MemoryHead:
    """A HeadStore in memory; ``fail_writes`` simulates a crash right after an append."""

    name = "the test head"

    def __init__(self) -> None:
        self.value: tuple[int, str] | None = None
        self.fail_writes = False

    def read(self) -> tuple[int, str] | None:
        return self.value

    def write(self, seq: int, hash: str) -> None:
        if self.fail_writes:
            raise OSError("crash before the head write")
        self.value = (seq, hash)


def fill(path: Path, head: MemoryHead, n: int) -> None:
    with HistoryLog(path, head=head) as log:
        for i in range(n):
            log.append(
                "evaluation",
                "e1",
                f"e1/{i:03d}",
                {
                    "verdict": "reject",
                    "reasons": [],
                    "ref": "r",
                    "baseline": "b",
                    "candidate": "c",
                    "seed": 0,
                    "checks": [],
                    "i": i,
                },
            )


def test_every_append_moves_the_head_and_truncation_is_caught(tmp_path: Path) -> None:
    path, head = tmp_path / "h.jsonl", MemoryHead()
    fill(path, head, 4)
    assert head.value is not None and head.value[0] == 4
    assert verify(path, head).ok and verify(path).ok
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:3]))
    rep = verify(path, head)
    assert not rep.ok and "history truncated" in rep.reason and "has 3 records" in rep.reason
    assert verify(path).ok  # without the head the chain alone cannot tell
    with pytest.raises(HistoryError, match="history truncated"):
        HistoryLog(path, head=head).open()
    path.unlink()
    assert "missing" in verify(path, head).reason


def test_a_lost_head_write_is_caught_up_on_the_next_open(tmp_path: Path) -> None:
    path, head = tmp_path / "h.jsonl", MemoryHead()
    fill(path, head, 2)
    head.fail_writes = True
    with pytest.raises(OSError):
        fill(path, head, 1)  # the record is written, the head write is lost
    head.fail_writes = False
    assert head.value[0] == 2 and verify(path, head).ok
    with HistoryLog(path, head=head) as log:
        assert head.value == log.head and log.head[0] == 3

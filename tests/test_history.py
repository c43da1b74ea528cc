from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from history import HistoryError, HistoryLog, verify

from .conftest import ROOT

# a valid evaluation record (records are validated on write); extra keys are kept
EV = {"reasons": [], "ref": "r", "baseline": "b", "candidate": "c", "seed": 0, "checks": []}


def fill(path, n=5):
    with HistoryLog(path) as log:
        for i in range(n):
            log.append("evaluation", "e1", f"e1/{i:03d}", {**EV, "verdict": "reject", "i": i})


def test_append_chain_and_verify(tmp_path):
    path = tmp_path / "history.jsonl"
    fill(path)
    rep = verify(path)
    assert rep.ok and rep.records == 5 and not rep.torn_tail
    lines = [json.loads(ln) for ln in path.read_text().splitlines()]
    assert [ln["seq"] for ln in lines] == [1, 2, 3, 4, 5]
    assert all(b["prev"] == a["hash"] for a, b in zip(lines, lines[1:], strict=False))
    fill(path, 2)  # reopening continues the chain
    assert verify(path).records == 7


@pytest.mark.parametrize("line", [1, 3, 5])
def test_editing_one_byte_is_detected_at_that_line(tmp_path, line):
    path = tmp_path / "history.jsonl"
    fill(path)
    raw = bytearray(path.read_bytes())
    starts = [0] + [i + 1 for i, b in enumerate(raw) if b == ord("\n")]
    pos = raw.index(b'"reject"', starts[line - 1]) + 2
    raw[pos] = ord("x")  # reject -> rxject
    path.write_bytes(bytes(raw))
    rep = verify(path)
    assert not rep.ok and rep.bad_line == line and "edited" in rep.reason


def test_deleting_a_line_is_detected(tmp_path):
    path = tmp_path / "history.jsonl"
    fill(path)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:2] + lines[3:]))
    rep = verify(path)
    assert not rep.ok and rep.bad_line == 3


def test_torn_last_line_is_repaired_and_reported(tmp_path):
    path = tmp_path / "history.jsonl"
    fill(path, 3)
    with open(path, "ab") as fh:
        fh.write(b'{"v": 1, "seq": 4, "kind": "eval')  # a crash mid-write
    rep = verify(path)
    assert rep.ok and rep.torn_tail and rep.records == 3
    with HistoryLog(path) as log:
        assert "torn last line" in log.repaired
        log.append("evaluation", "e1", "e1/003", {**EV, "verdict": "merge"})
    kinds = [json.loads(ln)["kind"] for ln in path.read_text().splitlines()]
    assert kinds == ["evaluation"] * 3 + ["repair", "evaluation"]
    assert verify(path).ok and not verify(path).torn_tail


def test_corrupt_history_refuses_to_open(tmp_path):
    path = tmp_path / "history.jsonl"
    fill(path, 2)
    path.write_text(path.read_text().replace('"i": 0', '"i": 9'))
    with pytest.raises(HistoryError, match="history.jsonl:1"):
        HistoryLog(path).open()


def test_second_writer_is_refused(tmp_path):
    path = tmp_path / "history.jsonl"
    code = (
        "import sys, time; sys.path.insert(0, sys.argv[1]); from history import HistoryLog; from pathlib import Path;"
        "l = HistoryLog(Path(sys.argv[2])).open(); print('open', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(ROOT), str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(HistoryError, match="another process"):
            HistoryLog(path).open()
    finally:
        holder.kill()
        holder.wait()


def test_kill_9_mid_stream_leaves_a_verifiable_log(tmp_path):
    path = tmp_path / "history.jsonl"
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from history import HistoryLog; from pathlib import Path\n"
        f"EV = {EV!r}\n"
        "with HistoryLog(Path(sys.argv[2])) as l:\n"
        "    i = 0\n"
        "    while True:\n"
        "        l.append('evaluation', 'e1', 'e1/001', {**EV, 'verdict': 'reject', 'i': i, 'pad': 'x' * 500}); i += 1\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(ROOT), str(path)])
    import time

    while not path.exists() or path.stat().st_size < 20000:
        time.sleep(0.01)
    os.kill(proc.pid, 9)
    proc.wait()
    rep = verify(path)
    assert rep.ok and rep.records > 10
    with HistoryLog(path) as log:
        log.append("evaluation", "e1", None, {**EV, "verdict": "merge"})
    assert verify(path).ok

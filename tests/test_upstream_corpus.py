"""vLLM's own history as the judge's test suite (issue #57): the corpus of real upstream changes applies to the fork
of the installed vLLM, and a slice of it runs end to end through the runner (benchmarks/upstream_corpus.py): a
reverted bug fix is failed by `verify`, a refactor is rejected as no gain. The full corpus is a benchmark."""

from __future__ import annotations

import json
import subprocess
from collections import Counter

import pytest

from benchmarks import upstream_corpus as uc
from tests.test_vllm_integration import FAST_CONFIG, make_fork

pytestmark = pytest.mark.vllm

VERIFY = '\n[verify]\nkind = "vllm"\ncorpus_size = 16\nmax_tokens = 8\nsample = false\n'


def test_the_corpus_has_what_the_issue_asks_and_every_patch_applies_in_its_direction(tmp_path_factory):
    entries = uc.load()
    kinds = Counter(e.kind for e in entries)
    assert len(entries) >= 24 and kinds["bugfix"] >= 12 and kinds["performance"] + kinds["refactor"] >= 12, kinds
    assert len({e.id for e in entries}) == len(entries)
    assert all(e.direction == ("backward" if e.kind == "bugfix" else "forward") for e in entries)
    fork = make_fork(tmp_path_factory, "corpus")
    for e in entries:
        args = ["apply", "--check", *(["-R"] if e.direction == "forward" else []), str(e.patch)]
        proc = subprocess.run(["git", "-C", str(fork), *args], capture_output=True, text=True)
        assert proc.returncode == 0, f"{e.id}: {proc.stderr.strip()}"


@pytest.mark.parametrize(
    "entry,verdict,verify,agrees",
    [
        # the CPU model runner's assert on non-tensor members, restored: the engine does not start, verify fails it
        ("cpu-runner-nontensor-members", "reject", "fail", "yes"),
        # dead code removed upstream (#35318), put back as the fork's start: no gain
        ("core-dead-code", "reject", "", "yes"),
    ],
)
def test_a_slice_of_the_corpus_end_to_end(tmp_path_factory, entry, verdict, verify, agrees):
    (e,) = [x for x in uc.load() if x.id == entry]
    fork = make_fork(tmp_path_factory, f"corpus-{entry}", FAST_CONFIG + VERIFY)
    row = uc.judge(fork, e, seed=1)
    assert (row.verdict, row.verify, row.agrees) == (verdict, verify, agrees), row
    assert row.decided_by == "objective", row  # measured, not stopped by a check before it
    if e.direction == "forward":  # the fork's start is the change reverted, the proposal the change
        assert "reverted (the fork's start)" in uc.git(fork, "log", "-1", "--format=%s", "main")
    # the runner's table and its resumable results
    work = tmp_path_factory.mktemp(f"rows-{entry}")
    (work / "results.jsonl").write_text(json.dumps(uc.asdict(row)) + "\n")
    assert uc.main([str(work), "--only", entry, "--table", str(work / "t.md")]) == 0  # judged before: not again
    assert f"| `{entry}` | {e.kind} | {verdict} |" in (work / "t.md").read_text()

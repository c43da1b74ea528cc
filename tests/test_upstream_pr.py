"""`agentsearch pr` for an upstream project's rules ([forge] upstream = "vllm"): a real episode on the toy target, a
real bare remote, the fake forge on loopback (benchmarks/fakeforge.py) answering the duplicate search and the pull
request, and the commit's trailers read back with git."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentsearch.workspace import Workspace
from history import HistoryLog
from history.records.text import md_inline

from .conftest import ROOT, commit, git, make_repo, run_cli
from .test_episode import BENCH, CONFIG, ENGINE, LM, patch_from
from .test_provenance import assert_provenance

sys.path.insert(0, str(ROOT))
from benchmarks.fakeforge import FakeForge  # noqa: E402

OWNER = "Ada Lovelace <ada@example.com>"
KERNEL_FILES = {
    "vllm/kernels/fast_rms_norm.py": (
        "FAST_TOKENS = 1\n\n\n"
        "def supports_args(x, weight, epsilon, variance_size=None):\n"
        "    return x.shape[-1] % 16 == 0 and x.shape[-1] != 4096\n\n\n"
        "def fast(x, weight, epsilon, variance_size=None):\n"
        "    # agentsearch: shape-specific one token per sequence (a decode step) takes the fused path\n"
        "    if x.shape[0] == 1:\n"
        "        return x\n"
        "    return x\n"
    ),
    "serving.json": '{"engine": {"ir_op_priority": {"rms_norm": ["fast", "native"]}}}\n',
}
SECTIONS = (
    "## Purpose",
    "## Why this is not a duplicate",
    "## Test Plan",
    "## Test Result",
    "## AI assistance",
    "Essential Elements of an Effective PR Description Checklist",
)


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    """The toy target with [forge] upstream = "vllm" after an episode: 001 a real win in src/engine.py (merged),
    002 a change of the serving file only (rejected: no effect)."""
    tmp = tmp_path_factory.mktemp("upstream")
    bare = tmp / "remote.git"
    fake = FakeForge(bare).start()
    config = CONFIG.format(python=sys.executable) + (
        f'\n[forge]\nkind = "github"\nurl = "{fake.url}"\nrepo = "acme/fork"\nupstream = "vllm"\n'
    )
    repo = make_repo(
        tmp / "toy",
        {
            "agentsearch.toml": config,
            "bench/bench.py": BENCH,
            "lm.py": LM,
            "src/__init__.py": "",
            "src/engine.py": ENGINE,
        },
    )
    assert run_cli("init", "-C", str(repo)).returncode == 0
    subprocess.run(["git", "clone", "-q", "--bare", str(repo), str(bare)], check=True)
    git(repo, "remote", "add", "origin", str(bare))
    queue = tmp / "queue"
    queue.mkdir()
    (queue / "01-fast.patch").write_text(
        patch_from(
            repo, {"src/engine.py": ENGINE.replace("SPEED = 1.0", "SPEED = 1.3")}, "fast", "Make the engine 30% faster"
        )
    )
    (queue / "02-serving.patch").write_text(
        patch_from(repo, {"serving.json": '{"engine": {}}\n'}, "serving", "Tune the serving file")
    )
    ep = run_cli("episode", "-C", str(repo), "--patches", str(queue), "--seed", "5", "--json", timeout=900)
    assert ep.stdout, ep.stderr[-3000:]
    verdicts = [r["verdict"] for r in json.loads(ep.stdout)["proposals"]]
    assert verdicts == ["merge", "reject"], verdicts
    try:
        yield repo, fake
    finally:
        fake.stop()


def refused(proc: subprocess.CompletedProcess) -> str:
    said = [ln for ln in proc.stderr.splitlines() if ln.startswith("agentsearch:")]
    assert proc.returncode == 2 and len(said) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return said[0]


def verdict(repo: Path, number: int) -> dict:
    ws = Workspace.open(repo)
    log = HistoryLog(ws.state / "history.jsonl")
    return [e.data for e in log.entries() if e.kind == "verdict" and e.data["number"] == number][0]


def test_an_upstream_pull_request_without_a_named_owner_is_refused(upstream, monkeypatch):
    repo, fake = upstream
    monkeypatch.setenv("AGENTSEARCH_FORGE_TOKEN", fake.token)
    line = refused(run_cli("pr", "-C", str(repo), "001", "--dry-run"))
    assert "needs a named human owner" in line and "--owner 'Name <email>'" in line
    assert "malformed" not in line and "Name <email>" in refused(
        run_cli("pr", "-C", str(repo), "001", "--owner", "Ada")
    )
    line = refused(run_cli("pr", "-C", str(repo), "001", "--owner", OWNER, "--via", "gh", "--dry-run"))
    assert "--via forge" in line
    # a change of the fork's own serving file is no code of vLLM's (and its verdict is no win: --force to get there)
    line = refused(run_cli("pr", "-C", str(repo), "002", "--owner", OWNER, "--force", "--dry-run"))
    assert "changes only serving.json" in line and "nothing to send upstream" in line
    assert not fake.prs and not fake.searches  # nothing was asked of the forge


def test_the_vllm_profile_opens_a_pull_request_with_every_section_real_numbers_and_trailers(upstream, monkeypatch):
    repo, fake = upstream
    monkeypatch.setenv("AGENTSEARCH_FORGE_TOKEN", fake.token)
    git(repo, "push", "-q", "origin", "main:engine-tweak")
    other = fake.open_pr("engine-tweak", title="Engine tweak", body="Rewrites the engine loop.", author="someone")
    # the dry run writes the body, asks no forge: its searches read "not run"
    dry = run_cli("pr", "-C", str(repo), "001", "--owner", OWNER, "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr[-2000:]
    got = json.loads(dry.stdout)
    assert got["upstream"]["searches"] == [{"term": "engine", "found": None}]
    assert "| `engine` | not run |" in Path(got["body_file"]).read_text() and not fake.searches
    # the search finds the open pull request on engine: refused until the owner says why this is not it
    line = refused(run_cli("pr", "-C", str(repo), "001", "--owner", OWNER))
    assert "found 1 open pull request(s): #1 'Engine tweak'" in line and "--not-duplicate" in line
    assert fake.searches == ["repo:acme/fork is:pr is:open engine"] and len(fake.prs) == 1
    why = "#1 rewrites the engine loop; this one changes only its speed constant"
    proc = run_cli("pr", "-C", str(repo), "001", "--owner", OWNER, "--not-duplicate", why, "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    pr = next(p for n, p in fake.prs.items() if n != other)
    assert out["url"] == pr["html_url"] and pr["head"]["ref"] == "agentsearch/upstream/" + out["proposal"].replace(
        "/", "-"
    )
    assert pr["title"] == "[Perf] Make the engine 30% faster"
    body = pr["body"]
    assert assert_provenance(body) == 2  # the performance and the model-evaluation tables say how they were measured
    positions = [body.index(s) for s in SECTIONS]
    assert positions == sorted(positions), positions
    # this proposal's own numbers: the objective's change and interval, its pairs, the distribution check's KL
    v = verdict(repo, 1)
    w = v["workloads"]["speed"]
    assert f"**speed {w['speedup'] - 1:+.2%}**" in body and f"{w['ci'][0] - 1:+.2%} … {w['ci'][1] - 1:+.2%}" in body
    assert f"{w['pairs']} interleaved pairs" in body
    kl = v["distribution"]["public"]["prefill"]["kl_mean"]
    assert f"| public | prefill | yes | {v['distribution']['public']['prefill']['positions']} | {kl:.4g} |" in body
    assert f"agentsearch verify {v['candidate']}" in body and "agentsearch evaluate" in body
    # the search and the owner's words; the owner vouches; AI assistance stated with the proposer
    assert "| `engine` | #1 Engine tweak |" in body and md_inline(why) in body
    assert f"**{md_inline(OWNER)} submits it, has reviewed every changed line" in body
    assert "The change came from a patch queue" in body and "vouches for it end to end" in body
    # the commit: the owner's, the judged tree on the judged base, the trailers last
    head = pr["head"]["sha"]
    assert (
        out["upstream"]["head"] == head
        and fake._git("rev-parse", f"{head}^{{tree}}") == git(repo, "rev-parse", f"{v['candidate']}^{{tree}}").strip()
    )
    assert fake._git("rev-parse", f"{head}^") == v["baseline"]
    assert fake._git("log", "-1", "--format=%an <%ae>|%cn <%ce>", head) == f"{OWNER}|{OWNER}"
    trailers = subprocess.run(
        ["git", "interpret-trailers", "--parse"],
        input=fake._git("log", "-1", "--format=%B", head),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    author = "Test <test@example.com>"  # the patch's From: line (benchmarks.toy.GIT_ENV wrote it)
    assert trailers == [f"Co-authored-by: {author}", f"Signed-off-by: {OWNER}"], trailers
    assert f"`Co-authored-by: {author}`" in body


def test_a_kernel_goes_upstream_with_its_micro_benchmark_in_the_upstream_layout(tmp_path):
    """A change that puts an IR-op provider first for an op: the upstream commit holds the judged tree plus
    benchmarks/kernels/benchmark_<op>_<provider>.py and nothing else, by the owner. (A kernel proposal's own gate
    runs are the micro stage's tests: tests/test_kernels.py and tests/redteam/test_kernel_cheats.py.)"""
    from agentsearch.upstream import PROFILES, Owner, kernel_benchmark, kernel_changes, upstream_commit

    repo = make_repo(tmp_path / "fork", {"src/engine.py": ENGINE, "serving.json": '{"engine": {}}\n'})
    base = git(repo, "rev-parse", "main").strip()
    cand = commit(repo, KERNEL_FILES, "Fuse the norm")
    assert kernel_changes(repo, base, cand) == [("rms_norm", "fast")]
    assert kernel_changes(repo, cand, cand) == []  # a priority already first is no new kernel
    extra = kernel_benchmark("rms_norm", "fast", PROFILES["vllm"], "rms_norm: fast 1.31x over 8 pairs", "0.0.0")
    bench = "benchmarks/kernels/benchmark_rms_norm_fast.py"
    owner = Owner.of(OWNER, "vLLM")
    head = upstream_commit(repo, base, cand, "Fuse the norm\n", owner, extra, tmp_path / "scratch")
    assert extra[0] == bench and git(repo, "diff", "--name-status", cand, head).split() == ["A", bench]
    assert git(repo, "rev-parse", f"{head}^").strip() == base
    script = git(repo, "show", f"{head}:{bench}")
    compile(script, bench, "exec")
    assert 'OP = "rms_norm"' in script and 'PROVIDER = "fast"' in script and "1.31x over 8 pairs" in script
    assert git(repo, "status", "--porcelain").strip() == ""  # built in a scratch index: the work tree is untouched

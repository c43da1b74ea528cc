"""Evidence reports, pull requests and review of merges on a toy target with a real episode."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from agentsearch.workspace import Workspace
from history import HistoryLog

from .conftest import ROOT, git, run_cli
from .test_episode import BENCH, ENGINE, episode_json, make_target, patch_from

SECTIONS_MD = ["## Verdict", "## Workloads", "## Distribution checks", "## Gate and anti-cheat checks", "## Change", "## Environment", "## Reproduce"]


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    """A toy target after an episode: 001 lossy (rejected by the distribution check), 002 merged, 003 protected."""
    tmp = tmp_path_factory.mktemp("report")
    repo = make_target(tmp / "toy")
    queue = tmp / "queue"
    queue.mkdir()
    (queue / "01-lossy.patch").write_text(patch_from(repo, {"src/engine.py": ENGINE.replace("SPEED = 1.0", "SPEED = 1.3").replace("EPS = 1e-5", "EPS = 3e-1")},
                                                     "lossy", "Faster with a coarser normalization"))
    (queue / "02-fast.patch").write_text(patch_from(repo, {"src/engine.py": ENGINE.replace("SPEED = 1.0", "SPEED = 1.3")}, "fast", "Make the engine 30% faster"))
    (queue / "03-cheat.patch").write_text(patch_from(repo, {"bench/bench.py": BENCH.replace("1000.0", "2000.0")}, "cheat", "Speed up the benchmark"))
    rc, out = episode_json(repo, "--patches", str(queue), "--seed", "21")
    assert rc == 0 and [r["verdict"] for r in out["proposals"]] == ["reject", "merge", "reject"], out
    return repo, out


def verdict_of(repo: Path, number: int) -> dict:
    ws = Workspace.open(repo)
    return [e.data for e in HistoryLog(ws.state / "history.jsonl").entries() if e.kind == "verdict" and e.data["number"] == number][0]


def reproduce_command(md: str) -> list[str]:
    cmd = re.search(r"## Reproduce\n```bash\n(.+)\n```", md).group(1)
    argv = shlex.split(cmd)
    assert argv[0] == "agentsearch"
    return [sys.executable, "-m", "agentsearch.cli", *argv[1:]]


def test_markdown_and_html_reports_of_a_merge_carry_every_section_and_reproduce(judged, tmp_path):
    repo, out = judged
    v = verdict_of(repo, 2)
    md_path = tmp_path / "merge.md"
    proc = run_cli("report", "-C", str(repo), "002", "-o", str(md_path))
    assert proc.returncode == 0, proc.stderr
    md = md_path.read_text()
    for s in SECTIONS_MD:
        assert s in md, s
    assert md.startswith("# MERGE: Make the engine 30% faster")
    w = v["workloads"]["speed"]
    assert f"{w['speedup'] - 1:+.2%}" in md and f"{w['pairs']}/{w['max_pairs']}" in md
    assert v["candidate"] in md and v["baseline"] in md and "src/engine.py" in md
    for check in ("sandbox", "coverage", "confirmation", "plausibility", "distribution", "protected-paths"):
        assert f"| {check} | pass |" in md, check
    plots = sorted((tmp_path / "merge-plots").glob("*.png"))
    names = {p.stem for p in plots}
    assert {"trials-speed-objective", "trials-speed-confirmation", "distribution-prefill", "distribution-decode"} <= names
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in plots)
    assert "](merge-plots/trials-speed-objective.png)" in md

    html = run_cli("report", "-C", str(repo), "002", "--format", "html").stdout
    assert 'class="verdict merge"' in html and html.count("data:image/png;base64,") >= 4
    assert f"{w['speedup'] - 1:+.2%}" in html

    # the printed command reproduces the verdict
    proc = subprocess.run(reproduce_command(md), cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "MERGE" in proc.stdout


def test_reports_of_rejections_name_the_reason_and_reproduce(judged, tmp_path):
    repo, _ = judged
    md = run_cli("report", "-C", str(repo), "001").stdout
    for s in SECTIONS_MD:
        assert s in md, s
    assert md.startswith("# REJECT: Faster with a coarser normalization")
    assert "- distribution:" in md and "| distribution | fail |" in md
    assert "| public | prefill | no |" in md  # the per-path table with the real numbers
    proc = subprocess.run(reproduce_command(md), cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 4 and "distribution" in proc.stdout

    html = run_cli("report", "-C", str(repo), "001", "--format", "html").stdout
    assert 'class="verdict reject"' in html and "distribution:" in html and 'id="distribution"' in html
    for section in ("Verdict", "Workloads", "Distribution checks", "Gate and anti-cheat checks", "Change", "Environment", "Reproduce"):
        assert f"<h2>{section}</h2>" in html, section
    assert html.count("data:image/png;base64,") >= 3  # objective trials + divergence by position

    md = run_cli("report", "-C", str(repo), "003").stdout
    assert md.startswith("# REJECT: Speed up the benchmark") and "bench/bench.py" in md and "protected" in md
    proc = subprocess.run(reproduce_command(md), cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 4 and "protected" in proc.stdout

    proc = run_cli("report", "-C", str(repo), "nope-nothing")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1


def test_html_report_loads_in_headless_chromium_with_verdict_and_plots(judged, tmp_path):
    repo, _ = judged
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "chromium is installed by .ci/setup (Debian package chromium)"
    page = tmp_path / "report.html"
    assert run_cli("report", "-C", str(repo), "002", "--format", "html", "-o", str(page)).returncode == 0
    proc = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'chrome'}", "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    dom = proc.stdout
    assert proc.returncode == 0 and "<body" in dom, proc.stderr[-2000:]
    assert 'id="verdict"' in dom and ">MERGE<" in dom
    plots = int(re.search(r'data-plots="(\d+)"', dom).group(1))
    loaded = int(re.search(r'data-plots-loaded="(\d+)"', dom).group(1))
    assert plots >= 4 and loaded == plots
    assert not re.search(r"<html[^>]*data-errors=", dom)


def _env_with(path_dir: Path) -> dict:
    return {**os.environ, "PATH": f"{path_dir}{os.pathsep}{os.environ['PATH']}"}


def test_pr_pushes_to_a_bare_remote_and_calls_gh_with_the_report(judged, tmp_path):
    repo, out = judged
    cli = [sys.executable, "-m", "agentsearch.cli"]
    proc = subprocess.run([*cli, "pr", "-C", str(repo), "002", "--remote", "nowhere"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "no git remote 'nowhere'" in proc.stderr

    remote = tmp_path / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    git(repo, "remote", "add", "pr-remote", str(remote))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    record = tmp_path / "gh-calls.json"
    gh = bindir / "gh"
    gh.write_text(f"""#!{sys.executable}
import json, sys
args = sys.argv[1:]
body = open(args[args.index("--body-file") + 1]).read()
json.dump({{"args": args, "body": body}}, open({str(record)!r}, "w"))
print("https://github.example/pr/1")
""")
    gh.chmod(gh.stat().st_mode | stat.S_IEXEC)

    no_gh = {**os.environ, "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([*cli, "pr", "-C", str(repo), "002", "--remote", "pr-remote"], cwd=ROOT, capture_output=True, text=True, env=no_gh)
    assert proc.returncode == 2 and "`gh` not found" in proc.stderr

    proc = subprocess.run([*cli, "pr", "-C", str(repo), "002", "--remote", "pr-remote", "--dry-run"], cwd=ROOT, capture_output=True, text=True, env=_env_with(bindir))
    assert proc.returncode == 0 and "git -C" in proc.stdout and "gh pr create" in proc.stdout and not record.exists()

    proc = subprocess.run([*cli, "pr", "-C", str(repo), "002", "--remote", "pr-remote"], cwd=ROOT, capture_output=True, text=True, env=_env_with(bindir))
    assert proc.returncode == 0, proc.stderr
    assert "https://github.example/pr/1" in proc.stdout
    branch = out["proposals"][1]["branch"]
    assert branch in subprocess.run(["git", "--git-dir", str(remote), "branch", "--list", "agentsearch/*"], capture_output=True, text=True).stdout
    call = json.loads(record.read_text())
    assert call["args"][:2] == ["pr", "create"] and call["args"][call["args"].index("--head") + 1] == branch
    assert call["args"][call["args"].index("--base") + 1] == "main"
    assert call["body"].startswith("# MERGE: Make the engine 30% faster") and "## Reproduce" in call["body"]


def test_review_recheck_and_revert_a_real_merge(judged):
    repo, out = judged
    proc = run_cli("review", "-C", str(repo), "--json")
    rows = json.loads(proc.stdout)["merges"]
    assert len(rows) == 1 and rows[0]["proposal"] == out["proposals"][1]["proposal"]
    merge = rows[0]["merge"]
    assert rows[0]["on_baseline"] and not rows[0]["reverted"] and "Verdict: merge" in rows[0]["evidence"]

    proc = run_cli("review", "-C", str(repo), merge[:12], "--recheck", "--json", timeout=600)
    assert proc.returncode == 0, proc.stderr
    rc = json.loads(proc.stdout)
    assert rc["holds"] is True and rc["verdict"] == "merge" and 1.2 < rc["speedup"] < 1.4

    ws = Workspace.open(repo)
    before = ws.baseline_commit()
    proc = run_cli("revert", "-C", str(repo), "002")
    assert proc.returncode == 0, proc.stderr
    after = ws.baseline_commit()
    assert after != before and git(repo, "rev-parse", f"{after}^") .strip() == before
    assert "SPEED = 1.0" in git(repo, "show", f"{after}:src/engine.py")
    assert "SPEED = 1.0" in (repo / "src" / "engine.py").read_text()  # the checkout follows
    rows = json.loads(run_cli("review", "-C", str(repo), "--json").stdout)["merges"]
    assert rows[0]["reverted"] and rows[0]["recheck"] is True
    # history and insights know: a reverted merge is not a win
    hist = [r for r in json.loads(run_cli("history", "-C", str(repo), "--json").stdout)["evaluations"] if r["merged"]]
    assert len(hist) == 1 and hist[0]["reverted"] and hist[0]["recheck"] is True and hist[0]["revert"] == after
    assert "reverted, recheck holds" in run_cli("history", "-C", str(repo)).stdout
    ins = json.loads(run_cli("insights", "-C", str(repo), "--json").stdout)
    assert ins["merged"] == 0 and ins["reverted"] == 1 and any("then reverted" in x for x in ins["lessons"]["avoid"])
    kinds = [e.kind for e in HistoryLog(ws.state / "history.jsonl").entries()]
    assert "revert" in kinds and "recheck" in kinds
    proc = run_cli("revert", "-C", str(repo), "002")
    assert proc.returncode == 2 and "already reverted" in proc.stderr
    assert run_cli("history", "verify", "-C", str(repo)).returncode == 0

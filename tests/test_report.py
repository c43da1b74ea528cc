"""Evidence reports, pull requests and review of merges on a toy target with a real episode."""

from __future__ import annotations

import dataclasses
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
from history.records import TrialRecord

from .conftest import ROOT, evaluation_record, git, run_cli
from .test_episode import BENCH, ENGINE, episode_json, make_target, patch_from

# the one-line verdict: metric, both medians with the unit, change, CI, p and pairs
HEADLINE = re.compile(
    r"^(MERGE|REJECT) — ops_s [\d,.]+ → [\d,.]+ ops/s \([+-]\d+\.\d%, 95% CI [+-][\d.]+…[+-][\d.]+%, p=[\d.e+-]+, \d+ pairs\)"
)
AXIS_UNITS = {"ops/s", "%", "index", "nats"}  # every plot axis of the toy target's report says one of these
SECTIONS_MD = [
    "## Verdict",
    "## Workloads",
    "## Distribution checks",
    "## Gate and anti-cheat checks",
    "## Change",
    "## Environment",
    "## Reproduce",
]


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    """A toy target after an episode: 001 lossy (rejected by the distribution check), 002 merged, 003 protected."""
    tmp = tmp_path_factory.mktemp("report")
    repo = make_target(tmp / "toy", trial_timeout_s=30)  # its reports are under test, not the timeout: loaded CI cores
    queue = tmp / "queue"
    queue.mkdir()
    (queue / "01-lossy.patch").write_text(
        patch_from(
            repo,
            {"src/engine.py": ENGINE.replace("SPEED = 1.0", "SPEED = 1.3").replace("EPS = 1e-5", "EPS = 3e-1")},
            "lossy",
            "Faster with a coarser normalization",
        )
    )
    (queue / "02-fast.patch").write_text(
        patch_from(
            repo, {"src/engine.py": ENGINE.replace("SPEED = 1.0", "SPEED = 1.3")}, "fast", "Make the engine 30% faster"
        )
    )
    (queue / "03-cheat.patch").write_text(
        patch_from(repo, {"bench/bench.py": BENCH.replace("1000.0", "2000.0")}, "cheat", "Speed up the benchmark")
    )
    rc, out = episode_json(repo, "--patches", str(queue), "--seed", "21")
    assert rc == 0 and [r["verdict"] for r in out["proposals"]] == ["reject", "merge", "reject"], out
    return repo, out


def verdict_of(repo: Path, number: int) -> dict:
    ws = Workspace.open(repo)
    return [
        e.data
        for e in HistoryLog(ws.state / "history.jsonl").entries()
        if e.kind == "verdict" and e.data["number"] == number
    ][0]


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
    title = md.splitlines()[0]
    assert title.startswith("# ") and HEADLINE.match(title[2:]) and "confirmed +" in title, title
    assert "**Make the engine 30% faster**" in md
    w = v["workloads"]["speed"]
    assert f"{w['speedup'] - 1:+.2%}" in md and f"{w['pairs']}/{w['max_pairs']}" in md
    # medians with their unit; every p-value names its test
    assert re.search(r"\| speed \| objective \| ops_s \| [\d,.]+ ops/s \| [\d,.]+ ops/s \|", md)
    assert re.search(r"\| [\d.e-]+ \(t-test, H1 faster\) \|", md) and re.search(
        r"\| [\d.e-]+ \(t-test, H1 slower\) \|", md
    )
    assert "p of the confirmation row: one-sided paired t-test" in md
    assert "<details><summary>Per language (" in md  # the per-language rows are folded
    assert "+SPEED = 1.3" in md  # a small diff is shown
    assert v["candidate"] in md and v["baseline"] in md and "src/engine.py" in md
    for check in ("sandbox", "coverage", "confirmation", "plausibility", "distribution", "protected-paths"):
        assert f"| {check} | pass |" in md, check
    plots = sorted((tmp_path / "merge-plots").glob("*.png"))
    names = {p.stem for p in plots}
    assert {
        "trials-speed-objective",
        "trials-speed-confirmation",
        "distribution-prefill",
        "distribution-decode",
    } <= names
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in plots)
    assert "](merge-plots/trials-speed-objective.png)" in md
    # the objective's session and the confirmation's fresh one, each with its pairs and change
    sessions = md.split("### Sessions", 1)[1].split("\n## ", 1)[0]
    pairs = rf"{w['pairs']} \| \+[\d.]+% \| measured in {w['pairs']} pairs \(advisory\) \|$"
    assert re.search(rf"^\| objective \| 1 \| {pairs}", sessions, re.M), sessions
    c = v["confirmation"]["pairs"]
    assert re.search(
        rf"^\| confirmation \| fresh 1 \| {c} \| \+[\d.]+% \| measured in {c} pairs \(advisory\) \|$", sessions, re.M
    ), sessions
    # the git note on the merge commit reproduces it with the same baseline, seed and alpha (no local path)
    merge = [e.data for e in HistoryLog(Workspace.open(repo).state / "history.jsonl").entries() if e.kind == "merge"][0]
    note = git(repo, "notes", "--ref=agentsearch", "show", merge["new"])
    assert (
        f"Reproduce: agentsearch evaluate {v['candidate']} --baseline {v['baseline']} --seed {v['seed']} --alpha "
        in note
    )
    assert str(repo) not in note

    html = run_cli("report", "-C", str(repo), "002", "--format", "html").stdout
    assert 'class="verdict merge"' in html and len(re.findall(r'<figure class="plot"[^>]*><svg', html)) >= 4
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
    assert HEADLINE.match(md.splitlines()[0][2:]) and "**Faster with a coarser normalization**" in md
    assert "- distribution:" in md and "| distribution | fail |" in md
    assert "| public | prefill | no |" in md  # the per-path table with the real numbers
    proc = subprocess.run(reproduce_command(md), cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 4 and "distribution" in proc.stdout

    html = run_cli("report", "-C", str(repo), "001", "--format", "html").stdout
    assert 'class="verdict reject"' in html and "distribution:" in html and 'id="distribution"' in html
    for section in (
        "Verdict",
        "Workloads",
        "Distribution checks",
        "Gate and anti-cheat checks",
        "Change",
        "Environment",
        "Reproduce",
    ):
        assert f"<h2>{section}</h2>" in html, section
    assert len(re.findall(r'<figure class="plot"[^>]*><svg', html)) >= 3  # objective trials + divergence by position

    md = run_cli("report", "-C", str(repo), "003").stdout
    assert (
        md.startswith("# REJECT — ")
        and "**Speed up the benchmark**" in md
        and "bench/bench.py" in md
        and "protected" in md
    )
    proc = subprocess.run(reproduce_command(md), cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 4 and "protected" in proc.stdout

    proc = run_cli("report", "-C", str(repo), "nope-nothing")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1


@pytest.mark.browser
def test_html_report_loads_in_headless_chromium_with_verdict_and_plots(judged, tmp_path):
    """The page as a browser builds it: the headline with number and unit, every plot drawn, and
    every axis of every plot labelled "quantity (unit)" (inline SVG keeps the labels as text)."""
    repo, _ = judged
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "chromium is installed by .ci/setup (Debian package chromium)"
    page = tmp_path / "report.html"
    assert run_cli("report", "-C", str(repo), "002", "--format", "html", "-o", str(page)).returncode == 0
    proc = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'chrome'}",
            "--virtual-time-budget=5000",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    dom = proc.stdout
    assert proc.returncode == 0 and "<body" in dom, proc.stderr[-2000:]
    assert 'id="verdict"' in dom and ">MERGE<" in dom
    plots = int(re.search(r'data-plots="(\d+)"', dom).group(1))
    loaded = int(re.search(r'data-plots-loaded="(\d+)"', dom).group(1))
    assert plots >= 4 and loaded == plots
    assert not re.search(r"<html[^>]*data-errors=", dom)
    head = re.search(r'<h1 id="headline">([^<]*)</h1>', dom).group(1)
    assert HEADLINE.match(head) and head.startswith("MERGE — ") and "confirmed +" in head, head
    assert re.search(r"<title>MERGE — ops_s [^<]* ops/s", dom)
    figures = re.findall(r'<figure class="plot".*?</figure>', dom, re.S)
    assert len(figures) == plots
    for fig in figures:
        axes = len(re.findall(r'<g id="axes_\d+"', fig))
        labels = re.findall(r'<g id="([xy])label">\s*<text[^>]*>([^<]*)</text>', fig)
        assert axes >= 1 and sorted(k for k, _ in labels) == sorted("xy" * axes), (axes, labels)
        for _, text in labels:
            m = re.fullmatch(r"\S.* \(([^()]+)\)", text)
            assert m and m.group(1) in AXIS_UNITS, text
        if 'id="plot-trials-' in fig:  # pairs are counted (integer ticks); the ratio panel is in % as the tables
            ticks = re.findall(r'<g id="xtick_\d+">.*?<text[^>]*>([^<]*)</text>', fig, re.S)
            assert ticks and all(re.fullmatch(r"\d+", t) for t in ticks), ticks
            ratio = fig.split('<g id="axes_')[2]
            yticks = re.findall(r'<g id="ytick_\d+">.*?<text[^>]*>([^<]*)</text>', ratio, re.S)
            assert yticks and all(t.endswith("%") for t in yticks), yticks


def _env_with(path_dir: Path) -> dict:
    return {**os.environ, "PATH": f"{path_dir}{os.pathsep}{os.environ['PATH']}"}


def test_pr_pushes_to_a_bare_remote_and_calls_gh_with_the_report(judged, tmp_path):
    repo, out = judged
    cli = [sys.executable, "-m", "agentsearch.cli"]
    proc = subprocess.run(
        [*cli, "pr", "-C", str(repo), "002", "--remote", "nowhere"], cwd=ROOT, capture_output=True, text=True
    )
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
    proc = subprocess.run(
        [*cli, "pr", "-C", str(repo), "002", "--remote", "pr-remote", "--via", "gh"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=no_gh,
    )
    assert proc.returncode == 2 and "`gh` not found" in proc.stderr

    # a rejected proposal gets no PR unless forced
    proc = subprocess.run(
        [*cli, "pr", "-C", str(repo), "001", "--remote", "pr-remote", "--dry-run"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=_env_with(bindir),
    )
    assert (
        proc.returncode == 2
        and "not a win (verdict reject" in proc.stderr
        and "--force" in proc.stderr
        and proc.stderr.count("\n") == 1
    )
    proc = subprocess.run(
        [*cli, "pr", "-C", str(repo), "001", "--remote", "pr-remote", "--dry-run", "--force", "--no-plots", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=_env_with(bindir),
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert (
        doc["schema_version"] == 1
        and doc["verdict"] == "reject"
        and doc["dry_run"]
        and doc["plots"] == []
        and doc["url"] is None
    )
    assert doc["title"].startswith("[agentsearch] Faster with a coarser normalization: REJECT — ops_s ")

    proc = subprocess.run(
        [*cli, "pr", "-C", str(repo), "002", "--remote", "pr-remote", "--dry-run", "--no-plots", "--via", "gh"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=_env_with(bindir),
    )
    assert proc.returncode == 0 and "git -C" in proc.stdout and "gh pr create" in proc.stdout and not record.exists()

    proc = subprocess.run(
        [
            *cli,
            "pr",
            "-C",
            str(repo),
            "002",
            "--remote",
            "pr-remote",
            "--draft",
            "-o",
            str(tmp_path / "body.md"),
            "--via",
            "gh",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=_env_with(bindir),
    )
    assert proc.returncode == 0, proc.stderr
    assert "https://github.example/pr/1" in proc.stdout
    branch = out["proposals"][1]["branch"]
    pushed = subprocess.run(
        ["git", "--git-dir", str(remote), "branch", "--list", "agentsearch*"], capture_output=True, text=True
    ).stdout
    assert branch in pushed
    # the plots travel on their own parentless branch, named in the body
    evidence = "agentsearch-evidence/" + out["proposals"][1]["proposal"]
    assert evidence in pushed
    files = subprocess.run(
        ["git", "--git-dir", str(remote), "ls-tree", "--name-only", evidence], capture_output=True, text=True
    ).stdout.split()
    assert "trials-speed-objective.png" in files and "trials-speed-confirmation.png" in files
    assert sorted(files) == sorted(p.name for p in (tmp_path / "body-plots").glob("*.png"))
    call = json.loads(record.read_text())
    args = call["args"]
    assert args[:2] == ["pr", "create"] and args[args.index("--head") + 1] == branch and "--draft" in args
    assert args[args.index("--base") + 1] == "main"
    assert args[args.index("--title") + 1].startswith("[agentsearch] Make the engine 30% faster: MERGE — ops_s ")
    body = call["body"]
    assert body.startswith("### ") and HEADLINE.match(body[4:]), body[:200]
    assert "| speed (objective) |" in body and "ops/s" in body and "(t-test, H1 faster)" in body
    for fold in ("Gate and anti-cheat checks: ", "Distribution checks: pass", "Environment", "Diff ("):
        assert f"<details><summary>{fold}" in body, fold
    assert f"`{evidence}`" in body and "`trials-speed-objective.png`" in body
    assert "+SPEED = 1.3" in body  # the diff itself, it is small
    # no local path: the reproduce command is run from a checkout of the target
    assert str(repo) not in body and str(tmp_path) not in body and str(Path.home()) not in body
    v = verdict_of(repo, 2)
    assert f"agentsearch evaluate {v['candidate']} --baseline {v['baseline']} --seed {v['seed']} --alpha " in body


def test_pr_links_plots_by_commit_on_github_remotes():
    from agentsearch.commands.report import github_repo

    for url in (
        "https://github.com/acme/vllm.git",
        "git@github.com:acme/vllm.git",
        "ssh://git@github.com/acme/vllm",
        "https://github.com/acme/vllm/",
    ):
        assert github_repo(url) == "acme/vllm", url
    for url in (
        "/srv/git/vllm.git",
        "https://gitlab.com/acme/vllm.git",
        "https://github.com.evil.example/acme/vllm",
        None,
    ):
        assert github_repo(url) is None, url


def test_review_recheck_and_revert_a_real_merge(judged):
    repo, out = judged
    proc = run_cli("review", "-C", str(repo), "--json")
    rows = json.loads(proc.stdout)["merges"]
    assert len(rows) == 1 and rows[0]["proposal"] == out["proposals"][1]["proposal"]
    merge = rows[0]["merge"]
    assert rows[0]["on_baseline"] and not rows[0]["reverted"] and "Verdict: merge" in rows[0]["evidence"]
    # the objective's sessions (its own and the confirmation's), as the report's Sessions table judges them
    assert rows[0]["sessions"] in ("agree", "differ")
    sessions = rows[0]["sessions"]
    listing = run_cli("review", "-C", str(repo))
    row = next(line for line in listing.stdout.splitlines() if merge[:12] in line)
    assert listing.returncode == 0 and "sessions" in listing.stdout and f" {rows[0]['sessions']} " in row, (
        listing.stdout
    )

    proc = run_cli("review", "-C", str(repo), merge[:12], "--recheck", "--json", timeout=600)
    assert proc.returncode == 0, proc.stderr
    rc = json.loads(proc.stdout)
    assert rc["holds"] is True and rc["verdict"] == "merge" and 1.2 < rc["speedup"] < 1.4

    ws = Workspace.open(repo)
    before = ws.baseline_commit()
    proc = run_cli("revert", "-C", str(repo), "002")
    assert proc.returncode == 0, proc.stderr
    after = ws.baseline_commit()
    assert after != before and git(repo, "rev-parse", f"{after}^").strip() == before
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
    # the report says so, and a reverted win gets no pull request unless forced
    doc = json.loads(run_cli("report", "-C", str(repo), "002", "--json").stdout)
    assert (
        doc["schema_version"] == 1
        and doc["reverted"] is True
        and doc["revert_commit"] == after
        and "reverted since" in doc["headline"]
    )
    md = run_cli("report", "-C", str(repo), "002").stdout
    assert md.startswith("# MERGE — ") and "**Reverted since**" in md and "**MERGE, REVERTED**" in md
    proc = run_cli("pr", "-C", str(repo), "002", "--dry-run")
    assert proc.returncode == 2 and "reverted since" in proc.stderr and "--force" in proc.stderr
    # the objective renamed since: review judges a merge's sessions by the config it was judged under, not main's
    toml = repo / "agentsearch.toml"
    toml.write_text(toml.read_text().replace('name = "speed"', 'name = "ops"'))
    git(repo, "commit", "-qam", "Rename the objective workload")
    assert Workspace.open(repo).config().objective.name == "ops"
    rows = json.loads(run_cli("review", "-C", str(repo), "--json").stdout)["merges"]
    assert rows[0]["sessions"] == sessions and rows[0]["objective"] == "speed"


def _session_trials(workload: str, changes: list[tuple[str, int, float]], rng, higher: bool = True) -> list:
    """Paired trial records of ``workload``: per (phase, session, change) six pairs at 1% noise."""
    import math

    out, pair = [], {}
    for phase, session, change in changes:
        for _ in range(6):
            i = pair[phase] = pair.get(phase, -1) + 1
            b = 1000 * math.exp(rng.normal(0, 0.01))
            c = b * (1 + change) ** (1 if higher else -1) * math.exp(rng.normal(0, 0.01))
            for side, v in (("baseline", b), ("candidate", c)):
                out.append(
                    TrialRecord(
                        workload, side, 1000 + i, i, int(side == "candidate"), "AB", session, True, v, phase=phase
                    )
                )
    return out


def test_report_shows_each_engine_session_and_flags_sessions_that_disagree(tmp_path):
    """Two objective sessions that drew +6% and a fresh confirmation instance at -4%: the win depends on the instance."""
    import numpy as np

    from agentsearch.report import Evidence, render

    rng = np.random.default_rng(3)
    trials = (
        _session_trials("tput", [("objective", 0, 0.06), ("objective", 1, 0.06), ("confirmation", 0, -0.04)], rng)
        + _session_trials(
            "ttft", [("objective", 0, 0.02), ("objective", 1, 0.02)], rng, higher=False
        )  # a latency: lower is better
        + _session_trials("old", [("objective", 0, 0.3), ("objective", 1, -0.3)], rng)
    )  # no direction in the config: left out
    ev = Evidence(
        "x", "evaluation", evaluation_record(verdict="merge"), trials, directions={"tput": True, "ttft": False}
    )
    md, _ = render(ev, "md")
    section = md.split("### Sessions", 1)[1].split("## Distribution checks", 1)[0]
    tput, ttft = section.split("**tput**", 1)[1].split("**ttft**", 1)
    assert "**differ** (one-way ANOVA p=" in tput and "agentsearch review --recheck" in tput
    rows = re.findall(
        r"^\| (\w+) \| ([\w ]+) \| (\d+) \| ([+-][\d.]+)% \| measured in \d+ pairs \(advisory\) \|$", tput, re.M
    )
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("objective", "1", "6"),
        ("objective", "2", "6"),
        ("confirmation", "fresh 1", "6"),
    ]
    assert [round(float(r[3])) for r in rows] == [6, 6, -4]
    assert "agree (one-way ANOVA p=" in ttft and [
        round(float(x)) for x in re.findall(r"\| ([+-][\d.]+)% \| measured in \d+ pairs \(advisory\) \|$", ttft, re.M)
    ] == [2, 2]
    assert "**old**" not in section
    html, _ = render(ev, "html")
    assert 'id="sessions-tput"' in html and "<b>differ</b>" in html
    # an evaluation resumed after a crash measured the same seeds again: only the last attempt counts (the crashed one read -10%
    # on two sessions of 6 pairs; the resumed one +6% on 6 + 4 pairs and its confirmation)
    crashed = _session_trials("tput", [("objective", 0, -0.10), ("objective", 1, -0.10)], rng)  # pairs 0..11
    resumed = _session_trials("tput", [("objective", 0, 0.06), ("objective", 1, 0.06), ("confirmation", 0, 0.06)], rng)
    resumed = [
        t for t in resumed if not (t.phase == "objective" and t.pair >= 10)
    ]  # 6 pairs in session 0, 4 in session 1
    ev2 = Evidence("x", "evaluation", evaluation_record(verdict="merge"), crashed + resumed, directions={"tput": True})
    section = render(ev2, "md")[0].split("### Sessions", 1)[1]
    rows = re.findall(
        r"^\| (\w+) \| ([\w ]+) \| (\d+) \| ([+-][\d.]+)% \| measured in \d+ pairs \(advisory\) \|$", section, re.M
    )
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("objective", "1", "6"),
        ("objective", "2", "4"),
        ("confirmation", "fresh 1", "6"),
    ], rows
    assert all(float(r[3]) > 0 for r in rows) and "agree (one-way ANOVA p=" in section, section
    # a baseline trial the load generator was disturbed on, measured again (harness.interleave): the same attempt,
    # every pair kept
    again = _session_trials("tput", [("objective", 0, 0.06), ("objective", 1, 0.06)], rng)
    first = next(i for i, t in enumerate(again) if t.side == "baseline" and t.pair == 3)
    disturbed = dataclasses.replace(
        again[first], ok=False, value=None, failure="measurement-error", error="fell behind"
    )
    ev3 = Evidence(
        "x",
        "evaluation",
        evaluation_record(verdict="merge"),
        [*again[:first], disturbed, *again[first:]],
        directions={"tput": True},
    )
    section = render(ev3, "md")[0].split("### Sessions", 1)[1]
    rows = re.findall(
        r"^\| (\w+) \| ([\w ]+) \| (\d+) \| ([+-][\d.]+)% \| measured in \d+ pairs \(advisory\) \|$", section, re.M
    )
    assert [(r[0], r[1], r[2]) for r in rows] == [("objective", "1", "6"), ("objective", "2", "6")], rows
    # one session per workload: no section
    single = Evidence(
        "x",
        "evaluation",
        evaluation_record(verdict="merge"),
        _session_trials("tput", [("objective", 0, 0.06)], rng),
        directions={"tput": True},
    )
    assert "### Sessions" not in render(single, "md")[0]


def test_an_old_records_headline_takes_the_direction_from_the_config():
    """A verdict recorded before summaries kept their direction: the report's title moves the baseline's median by the
    paired estimate the way the config says (a latency: divided), like a new record's."""
    from agentsearch.report import Evidence

    summary = {
        "role": "objective",
        "decision": "win",
        "speedup": 1.25,
        "ci": [1.1, 1.4],
        "p_value": 0.001,
        "pairs": 12,
        "baseline_median": 100.0,
        "candidate_median": 81.0,
        "metric": "ttft_ms",
        "unit": "ms",
    }
    ev = Evidence(
        "x",
        "evaluation",
        evaluation_record(verdict="merge", objective="ttft", workloads={"ttft": summary}),
        [],
        directions={"ttft": False},
    )
    assert ev.headline().startswith("MERGE — ttft_ms 100 → 80 ms (+25.0%"), ev.headline()
    unknown = Evidence(
        "x", "evaluation", evaluation_record(verdict="merge", objective="ttft", workloads={"ttft": summary}), []
    )
    assert unknown.headline().startswith(
        "MERGE — ttft_ms 100 → 81 ms (+25.0%"
    )  # no direction anywhere: the two medians


def test_every_figure_of_every_verdict_says_how_it_was_obtained(judged, tmp_path):
    """Provenance on every number (issue #59), on the real episode's three verdicts: a distribution reject, a merge
    and a protected-path reject before any trial — Markdown, HTML, the PR body and `--json`."""
    from .test_provenance import assert_json_figures, assert_provenance

    repo, _ = judged
    ws = Workspace.open(repo)
    from agentsearch.report import gather, render, render_pr

    for pid in ("001", "002", "003"):
        ev = gather(ws, pid)
        md, html, body = render(ev, "md")[0], render(ev, "html")[0], render_pr(ev, {})
        tables = assert_provenance(md), assert_provenance(html, "html"), assert_provenance(body)
        assert all(tables) if ev.verdict.workloads else not any(tables), (pid, tables)
        proc = run_cli("report", "-C", str(repo), pid, "--json")
        assert proc.returncode == 0, proc.stderr
        got = json.loads(proc.stdout)
        assert_json_figures(got)
        how = {f["name"]: f["provenance"] for f in got["figures"]}
        if pid == "002":  # the merge: its objective and confirmation paired, its distribution check once per side
            assert how["workload.speed.objective.change"] == how["workload.speed.confirmation.change"] == "paired"
            assert how["distribution.public.prefill.kl_mean"] in ("once", "carried")
            assert how["timing.wall_s"] == "once"
        if pid == "003":  # refused before any trial: nothing measured, nothing shown as a number
            assert not [f for f in got["figures"] if f["name"].startswith(("workload.", "distribution"))]

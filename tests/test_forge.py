"""The review bot on a forge: `review-pr` and `bot` against a real HTTP server on loopback (benchmarks/fakeforge.py)
speaking the GitHub and Gitea REST APIs, the real adapter (agentsearch.forge, httpx), a real bare git remote
holding the pull requests' heads, and the gate's own evaluations of a toy target."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentsearch.forge import Forge, ForgeError
from agentsearch.workspace import Workspace
from history import HistoryLog
from history.records import PrCommand, PrPosted, PrReview

from .conftest import ROOT, commit, git, make_repo, run_cli
from .test_provenance import assert_provenance

sys.path.insert(0, str(ROOT))
from benchmarks.fakeforge import FakeForge  # noqa: E402
from benchmarks.toy import TOY_BENCH, toy_config  # noqa: E402

MARKER = "<!-- agentsearch:pr-review -->"


def forge_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str = "github", bench: str = TOY_BENCH, forge_keys: str = ""
) -> tuple[Path, FakeForge]:
    """A toy target whose remote `origin` is a bare repository the fake forge serves pull requests from."""
    bare = tmp_path / "remote.git"
    fake = FakeForge(bare, kind=kind).start()
    extra = f'\n[forge]\nkind = "{kind}"\nurl = "{fake.url}"\nrepo = "acme/fork"\n{forge_keys}'
    repo = make_repo(
        tmp_path / "toy",
        {
            "agentsearch.toml": toy_config(extra=extra),
            "bench/bench.py": bench,
            "speed.txt": "1.0\n",
            "src/model.py": "X = 1\n",
        },
    )
    subprocess.run(["git", "clone", "-q", "--bare", str(repo), str(bare)], check=True)
    git(repo, "remote", "add", "origin", str(bare))
    assert run_cli("init", "-C", str(repo)).returncode == 0
    monkeypatch.setenv("AGENTSEARCH_FORGE_TOKEN", fake.token)
    return repo, fake


def pr_branch(repo: Path, fake: FakeForge, branch: str, files: dict[str, str], msg: str = "change", **kw) -> int:
    commit(repo, files, msg, branch=branch)
    git(repo, "push", "-q", "origin", f"{branch}:{branch}")
    return fake.open_pr(branch, **kw)


def records(repo: Path, kind: type) -> list:
    ws = Workspace.open(repo)
    return [e.record for e in HistoryLog(ws.state / "history.jsonl").entries() if isinstance(e.record, kind)]


def test_review_pr_posts_one_comment_and_a_status_per_verdict(tmp_path, monkeypatch):
    """A real win posts success with the verdict line; an A/A change never success; a protected path fails naming
    it; a re-run edits the same comment."""
    repo, fake = forge_target(tmp_path, monkeypatch)
    try:
        win = pr_branch(repo, fake, "faster", {"speed.txt": "1.3\n"}, "Faster")
        proc = run_cli("review-pr", str(win), "-C", str(repo), "--json", "--seed", "1", timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        got = json.loads(proc.stdout)
        assert got["outcome"] == "success" and got["verdict"] == "merge"
        head = fake.prs[win]["head"]["sha"]
        (ours,) = fake.ours(win)
        assert (
            ours["body"].startswith(MARKER)
            and "**agentsearch: merge-worthy**" in ours["body"]
            and "MERGE" in ours["body"]
        )
        assert "A/A" in ours["body"] and "designed false-merge level" in ours["body"]
        assert assert_provenance(ours["body"]) >= 1  # every figure in the comment says how it was obtained
        st = fake.status(head)
        assert (
            st["state"] == "success"
            and st["description"].startswith("merge-worthy")
            and st["target_url"] == ours["html_url"]
        )
        # pending first, then the verdict
        assert [s["state"] for s in fake.statuses[head]] == ["pending", "success"]

        again = run_cli("review-pr", str(win), "-C", str(repo), "--json", "--seed", "2", timeout=600)
        assert again.returncode == 0, again.stderr[-2000:]
        assert [c["id"] for c in fake.ours(win)] == [ours["id"]]  # the same comment, edited
        assert f"`pr-{win}/{head[:12]}/2`" in fake.ours(win)[0]["body"]

        aa = pr_branch(repo, fake, "docs", {"README.md": "words only\n"}, "Docs")
        proc = run_cli("review-pr", str(aa), "-C", str(repo), "--json", "--seed", "3", timeout=600)
        assert proc.returncode == 4, proc.stderr[-2000:]
        st = fake.status(fake.prs[aa]["head"]["sha"])
        assert json.loads(proc.stdout)["outcome"] in ("neutral", "failure") and st["state"] in ("pending", "failure")

        bad = pr_branch(
            repo, fake, "bench-edit", {"bench/bench.py": TOY_BENCH.replace("1000.0", "2000.0")}, "Faster bench"
        )
        proc = run_cli("review-pr", str(bad), "-C", str(repo), "--json", timeout=600)
        assert proc.returncode == 4 and json.loads(proc.stdout)["outcome"] == "failure"
        st = fake.status(fake.prs[bad]["head"]["sha"])
        assert st["state"] == "failure" and "bench/bench.py" in fake.ours(bad)[0]["body"]
        # nothing was merged: review-pr never merges unless told to
        assert git(repo, "rev-parse", "main").strip() == fake._git("rev-parse", "refs/heads/main")
        reviews = records(repo, PrReview)
        assert [(r.number, r.outcome) for r in reviews][:2] == [(win, "success"), (win, "success")]
        assert run_cli("history", "verify", "-C", str(repo)).returncode == 0
        report = run_cli("report", reviews[0].evaluation, "-C", str(repo))
        assert report.returncode == 0 and "MERGE" in report.stdout
    finally:
        fake.stop()


def test_bot_killed_mid_run_judges_each_head_once(tmp_path, monkeypatch):
    """`bot --watch` with two PRs, SIGKILL once the first verdict is recorded; `bot --once` ends with each head
    judged once, one comment each, final statuses. A new push is judged again and the comment says it supersedes."""
    repo, fake = forge_target(tmp_path, monkeypatch)
    try:
        a = pr_branch(repo, fake, "a", {"speed.txt": "1.3\n"}, "A")
        b = pr_branch(repo, fake, "b", {"src/model.py": "X = 2\n"}, "B")
        history = Workspace.open(repo).state / "history.jsonl"
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentsearch.cli", "bot", "-C", str(repo), "--watch", "1", "--seed", "4"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 300
        while '"kind": "pr-review"' not in (history.read_text() if history.exists() else ""):
            assert proc.poll() is None and time.monotonic() < deadline, "the bot stopped before its first verdict"
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        done = run_cli("bot", "-C", str(repo), "--once", "--json", timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        reviews = records(repo, PrReview)
        heads = {n: fake.prs[n]["head"]["sha"] for n in (a, b)}
        assert sorted((r.number, r.head) for r in reviews) == sorted(heads.items())  # once per head, both
        for n, sha in heads.items():
            assert len(fake.ours(n)) == 1 and fake.ours(n)[0]["body"].startswith(MARKER)
            assert fake.status(sha)["state"] in ("success", "failure", "pending")
            assert "measuring" not in fake.status(sha)["description"]  # final, not the pending of a killed run
        assert fake.status(heads[a])["state"] == "success"
        posted = records(repo, PrPosted)
        assert {p.number for p in posted} == {a, b}
        # nothing new: a pass judges nothing
        idle = run_cli("bot", "-C", str(repo), "--once", "--json", timeout=600)
        assert idle.returncode == 0 and json.loads(idle.stdout)["judged"] == []
        # a new push to `a`: judged again, the same comment edited and saying what it supersedes
        commit(repo, {"speed.txt": "1.35\n"}, "A, more", branch="a")
        git(repo, "push", "-q", "origin", "a:a")
        new = fake.pushed(a)
        again = run_cli("bot", "-C", str(repo), "--once", "--json", timeout=600)
        assert again.returncode == 0 and [j["number"] for j in json.loads(again.stdout)["judged"]] == [a]
        (comment,) = fake.ours(a)
        assert f"supersedes the evaluation of `{heads[a][:12]}`" in comment["body"] and new[:12] in comment["body"]
        assert records(repo, PrReview)[-1].supersedes == heads[a]
    finally:
        fake.stop()


def test_comment_commands_from_writers_only_answered_once(tmp_path, monkeypatch):
    repo, fake = forge_target(tmp_path, monkeypatch, kind="gitea")
    try:
        n = pr_branch(repo, fake, "same", {"README.md": "x\n"}, "Docs only")
        fake.add_comment(n, "contributor", "please\n/agentsearch recheck")  # the PR's author: read permission
        fake.add_comment(n, "maintainer", "/agentsearch frobnicate")
        asked = fake.add_comment(n, "maintainer", "Looks odd.\n/agentsearch recheck")
        proc = run_cli("bot", "-C", str(repo), "--once", "--json", "--seed", "5", timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        cmds = {c.comment_id: c for c in records(repo, PrCommand)}
        assert len(cmds) == 3 and cmds[asked].action == "run"
        assert sorted(c.action for c in cmds.values()) == ["ignored", "ignored", "run"]
        replies = [c["body"] for c in fake.ours(n) if not c["body"].startswith(MARKER)]
        assert any("write permission" in r for r in replies) and any("unknown command" in r for r in replies)
        reviews = records(repo, PrReview)
        # the recheck judged the head; the bot's own pass found it judged and did not judge it again
        assert [r.trigger for r in reviews] == [f"command:{asked}"]
        # Gitea: an undecided verdict is a `warning` status (GitHub's statuses have no neutral)
        st = fake.status(fake.prs[n]["head"]["sha"])
        assert st["state"] in ("warning", "failure") and reviews[0].outcome in ("neutral", "failure")
        again = run_cli("bot", "-C", str(repo), "--once", "--json", timeout=600)
        assert again.returncode == 0 and len(records(repo, PrCommand)) == 3 and len(records(repo, PrReview)) == 1
    finally:
        fake.stop()


def test_the_adapter_retries_rate_limits_and_server_errors_and_pages(tmp_path):
    fake = FakeForge(tmp_path / "none.git").start()
    waits: list[float] = []
    try:
        f = Forge("github", fake.url, "acme/fork", fake.token, sleep=waits.append, backoff_s=0.5)
        fake.prs[1] = {
            "number": 1,
            "title": "t",
            "state": "open",
            "user": {"login": "u"},
            "head": {"ref": "x", "sha": "a" * 40},
            "base": {"ref": "main", "sha": "b" * 40},
            "labels": [],
        }
        fake.faults = [
            (500, {}),
            (429, {"Retry-After": "7"}),
            (403, {"x-ratelimit-remaining": "0", "x-ratelimit-reset": "0"}),
        ]
        assert f.pull(1).head_sha == "a" * 40
        assert waits[:2] == [0.5, 7.0] and len(waits) == 3
        for i in range(120):
            fake.add_comment(1, "u", f"c{i}")
        assert [c.body for c in f.comments(1)] == [f"c{i}" for i in range(120)]  # three pages, followed by Link
        with pytest.raises(ForgeError, match="HTTP 404"):
            f.pull(2)
        fake.faults = [(500, {})] * 6
        with pytest.raises(ForgeError, match="HTTP 500"):
            f.pull(1)
        bad = Forge("github", fake.url, "acme/fork", "wrong")
        with pytest.raises(ForgeError, match="HTTP 401.*Bad credentials"):
            bad.me()
        # GitHub statuses have no neutral: pending; a description is cut to 140 characters
        f.set_status("c" * 40, "neutral", "agentsearch", "x" * 300)
        assert fake.status("c" * 40)["state"] == "pending" and len(fake.status("c" * 40)["description"]) == 140
        # a next link to another host is not followed (the token would go with it)
        from agentsearch.forge import _next_link

        assert _next_link('<https://evil.example/api/v3/repos/a/b/pulls?page=2>; rel="next"', f.root) is None
    finally:
        fake.stop()


def test_pr_opens_a_pull_request_through_the_forge_api(tmp_path, monkeypatch):
    """`agentsearch pr` without `gh`: the branch and its plots pushed to the remote, the pull request created over
    the REST API with the evidence as its body and the plots linked where the forge serves them."""
    from .test_stack import queue_of

    repo, fake = forge_target(tmp_path, monkeypatch)
    try:
        queue_of(repo, tmp_path / "queue", [("Faster", {"speed.txt": "1.3\n"})])
        ep = run_cli(
            "episode", "-C", str(repo), "--patches", str(tmp_path / "queue"), "--seed", "2", "--json", timeout=600
        )
        assert ep.stdout, ep.stderr[-3000:]
        assert json.loads(ep.stdout)["proposals"][0]["verdict"] == "merge", ep.stderr[-2000:]
        monkeypatch.delenv("AGENTSEARCH_FORGE_TOKEN")
        no_token = run_cli("pr", "-C", str(repo), "001")
        assert (
            no_token.returncode == 2
            and "AGENTSEARCH_FORGE_TOKEN" in no_token.stderr
            and len(no_token.stderr.strip().splitlines()) == 1
        )
        monkeypatch.setenv("AGENTSEARCH_FORGE_TOKEN", fake.token)
        proc = run_cli("pr", "-C", str(repo), "001", "--draft", "--json")
        assert proc.returncode == 0, proc.stderr[-2000:]
        (pr,) = fake.prs.values()
        assert json.loads(proc.stdout)["url"] == pr["html_url"] and pr["draft"] and pr["base"]["ref"] == "main"
        assert pr["title"].startswith("[agentsearch] Faster: MERGE") and pr["body"].startswith("### MERGE")
        assert pr["head"]["sha"] == fake._git("rev-parse", f"refs/heads/{pr['head']['ref']}")
        evidence = fake._git("rev-parse", "refs/heads/agentsearch-evidence/" + json.loads(proc.stdout)["proposal"])
        assert f"]({fake.url}/acme/fork/raw/{evidence}/trials-speed-objective.png)" in pr["body"]
    finally:
        fake.stop()


def test_check_runs_with_an_apps_token_and_a_one_line_refusal_without(tmp_path, monkeypatch):
    """[forge] check_runs: an in-progress check run, then a completed one whose conclusion can be neutral (which a
    commit status cannot say on GitHub). A token that is no App's gets one line saying what to do; Gitea refuses
    the key in the config."""
    repo, fake = forge_target(tmp_path, monkeypatch, forge_keys="check_runs = true\n")
    try:
        n = pr_branch(repo, fake, "docs", {"README.md": "words\n"}, "Docs")
        refused = run_cli("review-pr", str(n), "-C", str(repo))
        said = [ln for ln in refused.stderr.splitlines() if ln.startswith("agentsearch:")]
        assert refused.returncode == 2 and len(said) == 1 and "App's installation token" in said[0]
        assert fake.status(fake.prs[n]["head"]["sha"]) is None  # refused before the head showed anything
        fake.app_tokens.add(fake.token)
        proc = run_cli("review-pr", str(n), "-C", str(repo), "--json", "--seed", "6", timeout=600)
        assert proc.returncode == 4, proc.stderr[-2000:]
        runs = fake.check_runs[fake.prs[n]["head"]["sha"]]
        assert [r["status"] for r in runs] == ["in_progress", "completed"] and runs[-1]["name"] == "agentsearch"
        outcome = json.loads(proc.stdout)["outcome"]
        assert runs[-1]["conclusion"] == outcome and outcome in ("neutral", "failure")
        assert (
            runs[-1]["output"]["summary"].startswith(MARKER) and runs[-1]["details_url"] == fake.ours(n)[0]["html_url"]
        )
    finally:
        fake.stop()
    from agentsearch.config import ConfigError, load_config_text

    with pytest.raises(ConfigError, match="check_runs"):
        load_config_text(
            toy_config(extra='\n[forge]\nkind = "gitea"\nurl = "https://gitea.example"\ncheck_runs = true\n'),
            "agentsearch.toml",
        )


def test_merge_applies_the_gates_merge_pushes_it_and_the_stack_counts_it(tmp_path, monkeypatch):
    """`review-pr --merge` on a merge-worthy head: the compare-and-swap merge onto the local baseline, pushed, said
    in the comment, recorded; `agentsearch stack` then counts it with the estimate it was merged on. A head that is
    not merge-worthy is never merged."""
    repo, fake = forge_target(tmp_path, monkeypatch)
    try:
        start = git(repo, "rev-parse", "main").strip()
        aa = pr_branch(repo, fake, "docs", {"README.md": "x\n"}, "Docs")
        proc = run_cli("review-pr", str(aa), "-C", str(repo), "--merge", "--seed", "2", timeout=600)
        assert proc.returncode == 4 and git(repo, "rev-parse", "main").strip() == start
        win = pr_branch(repo, fake, "faster", {"speed.txt": "1.3\n"}, "Faster")
        proc = run_cli("review-pr", str(win), "-C", str(repo), "--merge", "--json", "--seed", "3", timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        merged = git(repo, "rev-parse", "main").strip()
        head = fake.prs[win]["head"]["sha"]
        assert merged != start and git(repo, "rev-parse", "main^2").strip() != head  # our commit of it, not its head
        trees = git(repo, "rev-parse", "main^2^{tree}", "main^{tree}", f"{head}^{{tree}}").split()
        assert len(set(trees)) == 1 and git(repo, "log", "-1", "--format=%P", "main^2").strip() == start
        assert fake.prs[win]["state"] == "closed"
        assert fake._git("rev-parse", "refs/heads/main") == merged  # pushed
        assert f"as `{merged[:12]}` (asked with `--merge`)" in fake.ours(win)[0]["body"]
        got = json.loads(
            run_cli("stack", "-C", str(repo), "--since", start, "--json", "--seed", "4", timeout=600).stdout
        )
        (m,) = got["merges"]
        assert (
            m["merge"] == merged
            and m["speedup"] > 1.1
            and m["source"] == "confirmation"
            and m["title"].startswith("pull request #")
        )
        # the base moved on the forge since: the next win is judged against the new base, but the local baseline is
        # behind it, so --merge refuses; the verdict is posted all the same and says why it was not merged
        commit(repo, {"src/model.py": "X = 3\n"}, "elsewhere", branch="other")
        git(repo, "push", "-q", "origin", "other:main")
        commit(repo, {"speed.txt": "1.6\n"}, "Faster still", branch="faster-still", start="other")
        git(repo, "push", "-q", "origin", "faster-still:faster-still")
        again = fake.open_pr("faster-still")
        proc = run_cli("review-pr", str(again), "-C", str(repo), "--merge", "--seed", "5", timeout=600)
        said = [ln for ln in proc.stderr.splitlines() if ln.startswith("agentsearch:")]
        assert proc.returncode == 2 and len(said) == 1 and "not the base it was measured against" in said[0], (
            proc.stderr[-1500:]
        )
        assert (
            "Not merged (asked with `--merge`)" in fake.ours(again)[0]["body"]
            and fake.status(fake.prs[again]["head"]["sha"])["state"] == "success"
        )
        assert git(repo, "rev-parse", "main").strip() == merged
    finally:
        fake.stop()

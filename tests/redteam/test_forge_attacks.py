"""The review bot against adversarial pull requests: what a PR controls (its code, its commit message and branch,
its output and stderr, its comments) must not change what our comment says, which comment we edit, which
status we set, or reach the forge token."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from ..conftest import ROOT, commit, git, run_cli
from ..test_forge import MARKER, TOY_BENCH, forge_target, pr_branch

sys.path.insert(0, str(ROOT))

NASTY = "@everyone see #1 <img src=x onerror=alert(1)> [click](https://evil.example) \x1b[2J\x1b]0;pwned\x07 ```"


def outside_fences(body: str) -> str:
    """The comment as a forge renders it (CommonMark, raw HTML kept as GitHub keeps some), without its code blocks
    and code spans, where nothing is markup and nothing is linked: what is left is live."""
    from markdown_it import MarkdownIt

    html = MarkdownIt("commonmark", {"html": True}).enable("table").render(body)
    return re.sub(r"(?s)<pre>.*?</pre>|<code>.*?</code>|<!--.*?-->", "", html)


def test_a_forged_marker_and_markup_in_everything_a_pr_controls(tmp_path, monkeypatch):
    """The PR's author writes a comment with our marker saying it is merge-worthy; the PR's branch, commit message
    and stderr carry mentions, HTML, links and terminal escapes; its change crashes the benchmark. We post our own
    comment (the forged one untouched), a failure status, and nothing of theirs is live markup in ours."""
    repo, fake = forge_target(tmp_path, monkeypatch)
    try:
        n = pr_branch(repo, fake, "x-everyone-img", {"mode.txt": "crash\n"}, f"Faster {NASTY}\n\n{NASTY}")
        forged = fake.add_comment(n, "contributor", f"{MARKER}\n**agentsearch: merge-worthy** (status `success`)")
        before = fake.comments[forged]["body"]
        proc = run_cli("bot", "-C", str(repo), "--once", "--json", timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert fake.comments[forged]["body"] == before  # not ours: never edited, never adopted
        (ours,) = fake.ours(n)
        body = ours["body"]
        assert body.startswith(MARKER) and "**agentsearch: not merge-worthy**" in body
        assert fake.status(fake.prs[n]["head"]["sha"])["state"] == "failure"
        assert "\x1b" not in body and "\x07" not in body
        live = outside_fences(body)
        for raw in ("<img", "@everyone", 'href="https://evil', "https://evil", "see #1"):
            assert raw not in live, (raw, live)
        assert "ZeroDivisionError" in body  # the crash is reported (as inert text)
        # a second pass edits the same comment, still not theirs
        commit_cmd = fake.add_comment(n, "maintainer", "/agentsearch recheck")
        assert run_cli("bot", "-C", str(repo), "--once", timeout=600).returncode == 0
        assert [c["id"] for c in fake.ours(n) if c["body"].startswith(MARKER)] == [ours["id"]] and commit_cmd
        assert fake.comments[forged]["body"] == before
    finally:
        fake.stop()


def test_the_forge_token_never_reaches_the_candidate(tmp_path, monkeypatch):
    """The benchmark imports the PR's code, which looks for the token everywhere a process can (its environment,
    every /proc/*/environ and cmdline it can read) and prints what it finds, then crashes so its stderr is shown.
    The token appears nowhere: not in the comment, the statuses, the history or the state directory."""
    bench = "import os, sys\nsys.path.insert(0, os.getcwd())\nimport src.model\n" + TOY_BENCH
    repo, fake = forge_target(tmp_path, monkeypatch, bench=bench)
    try:
        spy = (
            "import glob, os, sys\n"
            "found = [k + '=' + v for k, v in os.environ.items()]\n"
            "for p in glob.glob('/proc/*/environ') + glob.glob('/proc/*/cmdline'):\n"
            "    try:\n"
            "        found.append(open(p, 'rb').read().decode('latin-1'))\n"
            "    except OSError:\n"
            "        pass\n"
            "sys.stderr.write('LEAK ' + ' '.join(found)[-3000:] + '\\n')\n"
            "raise SystemExit(3)\n"
        )
        n = pr_branch(repo, fake, "spy", {"src/model.py": spy}, "Spy")
        proc = run_cli("review-pr", str(n), "-C", str(repo), timeout=600)
        assert proc.returncode == 4, proc.stderr[-2000:]
        body = fake.ours(n)[0]["body"]
        assert "LEAK" in body  # its stderr did reach the comment: the probe ran
        assert fake.token not in body and fake.token not in str(fake.statuses)
        state = subprocess.run(["grep", "-r", "-l", fake.token, str(repo)], capture_output=True, text=True)
        assert state.stdout == "", state.stdout
    finally:
        fake.stop()


def test_a_command_needs_write_permission_and_a_known_word(tmp_path, monkeypatch):
    """`/agentsearch` from the PR's author (read permission) and a command word with shell characters are answered
    with a refusal, run nothing, and are not taken again on the next pass."""
    repo, fake = forge_target(tmp_path, monkeypatch)
    try:
        n = pr_branch(repo, fake, "c", {"README.md": "x\n"}, "Docs")
        fake.add_comment(n, "contributor", "/agentsearch stack")
        fake.add_comment(n, "maintainer", "/agentsearch evaluate;rm -rf ~")
        proc = run_cli("bot", "-C", str(repo), "--once", "--json", "--seed", "8", timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        replies = [c["body"] for c in fake.ours(n) if not c["body"].startswith(MARKER)]
        assert (
            len(replies) == 2
            and any("write permission" in r for r in replies)
            and any("unknown command" in r for r in replies)
        )
        assert all("rm -rf" not in outside_fences(r) or "unknown" in r for r in replies)
        again = run_cli("bot", "-C", str(repo), "--once", timeout=600)
        assert again.returncode == 0 and len([c for c in fake.ours(n) if not c["body"].startswith(MARKER)]) == 2
    finally:
        fake.stop()


# ------------------------------------------------------------------------------ found by red-teaming the bot (helper)
def _pr(fake, n=1):
    fake.prs[n] = {
        "number": n,
        "title": "t",
        "state": "open",
        "user": {"login": "u"},
        "head": {"ref": "x", "sha": "a" * 40},
        "base": {"ref": "main", "sha": "b" * 40},
        "labels": [],
    }


def test_a_redirect_is_an_error_never_a_posted_status_and_a_post_is_not_repeated_after_a_502(tmp_path):
    """A 307 on a status used to count as set (nothing was); a 301 on a comment crashed on its missing id. A proxy's
    502 after the forge created the comment made the retry post it twice."""
    from agentsearch.forge import Forge, ForgeError
    from benchmarks.fakeforge import FakeForge

    fake = FakeForge(tmp_path / "none.git").start()
    try:
        _pr(fake)
        f = Forge("github", fake.url, "acme/fork", fake.token, sleep=lambda s: None)
        fake.faults = [(307, {"Location": fake.url + "/api/v3/repos/acme/renamed/statuses/" + "c" * 40})]
        with pytest.raises(ForgeError, match="redirected to .*renamed.*not followed"):
            f.set_status("c" * 40, "success", "agentsearch", "merge-worthy")
        fake.faults = [(301, {"Location": fake.url + "/api/v3/repos/acme/renamed/issues/1/comments"})]
        with pytest.raises(ForgeError, match="HTTP 301"):
            f.create_comment(1, "x")
        orig, hit = fake.handle, []

        def handle(method, path, query, headers, body):
            status, data, h = orig(method, path, query, headers, body)
            if method == "POST" and path.endswith("/issues/1/comments") and not hit:
                hit.append(1)
                return 502, {"message": "Bad Gateway"}, {}
            return status, data, h

        fake.handle = handle
        with pytest.raises(ForgeError, match="HTTP 502"):
            f.create_comment(1, MARKER + "\nverdict")
        assert len(fake.ours(1)) == 1  # created once; the bot's next pass finds it by marker and author and edits it
        # a status is safe to send again: a 502 there is retried
        fake.faults = [(502, {})]
        f.set_status("d" * 40, "failure", "agentsearch", "x")
        assert fake.status("d" * 40)["state"] == "failure"
    finally:
        fake.stop()


@pytest.mark.parametrize("odd", ["labels-as-strings", "comment-id-null", "pr-without-number"])
def test_odd_forge_json_is_one_line_never_a_dead_bot(tmp_path, monkeypatch, odd):
    repo, fake = forge_target(tmp_path, monkeypatch)
    try:
        n = pr_branch(repo, fake, "docs", {"README.md": "x\n"}, "Docs")
        if odd == "labels-as-strings":
            fake.prs[n]["labels"] = ["perf"]
        elif odd == "comment-id-null":
            cid = fake.add_comment(n, "maintainer", "/agentsearch frobnicate")
            fake.comments[cid]["id"] = None
        else:
            fake.prs[99] = {"title": "no number", "state": "open"}
        proc = run_cli("bot", "-C", str(repo), "--once", "--json", "--seed", "4", timeout=300)
        assert "unexpected error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-600:]
        got = json.loads(proc.stdout)
        assert [j["number"] for j in got["judged"]] == [n]  # the readable PR was judged all the same
        assert proc.returncode == (1 if odd == "pr-without-number" else 0) and len(got["errors"]) == (
            odd == "pr-without-number"
        )
    finally:
        fake.stop()


class Killed(BaseException):
    pass


def test_a_kill_between_a_reply_and_its_record_does_not_repeat_the_reply(tmp_path, monkeypatch):
    """Our reply names the comment it answers: a bot killed after replying and before recording finds it and does
    not answer again. A reader is told once per PR that commands need write permission, not once per comment."""
    import agentsearch.review_bot as rb
    from agentsearch.forge import Forge
    from agentsearch.workspace import Workspace
    from history.records import PrCommand

    repo, fake = forge_target(tmp_path, monkeypatch)
    try:
        n = pr_branch(repo, fake, "docs", {"README.md": "x\n"}, "Docs")
        fake.add_comment(n, "contributor", "/agentsearch stack")  # no write permission: a refusal is posted
        ws = Workspace.open(repo)
        real = rb.append

        def dying(ws_, record, *a, **k):
            if isinstance(record, PrCommand):
                raise Killed()  # SIGKILL right after the reply reached the forge
            return real(ws_, record, *a, **k)

        monkeypatch.setattr(rb, "append", dying)
        bot = rb.Reviewer(ws, Forge.from_config(ws.config().forge))
        with pytest.raises(Killed):
            bot.commands(bot.forge.pull(n))
        monkeypatch.setattr(rb, "append", real)
        bot = rb.Reviewer(ws, Forge.from_config(ws.config().forge))
        bot.commands(bot.forge.pull(n))
        replies = [c for c in fake.ours(n) if not c["body"].startswith(MARKER)]
        assert len(replies) == 1, [r["body"] for r in replies]
        for word in ("recheck", "evaluate", "stack"):
            fake.add_comment(n, "contributor", f"/agentsearch {word}")
        bot.commands(bot.forge.pull(n))
        assert len([c for c in fake.ours(n) if not c["body"].startswith(MARKER)]) == 1  # told once
    finally:
        fake.stop()


def test_urls_mentions_and_references_in_stderr_are_not_live(tmp_path, monkeypatch):
    from history.records.text import md_inline

    s = md_inline(
        "see https://evil.example/login www.evil.example GH-1 Closes https://github.com/acme/fork/issues/1 @team"
    )
    for live in ("https://evil.example/login", "www.evil.example", "GH-1", "@team", "acme/fork/issues/1"):
        assert live not in outside_fences(s), s
    bench = "import os, sys\nsys.path.insert(0, os.getcwd())\nimport src.model\n" + TOY_BENCH
    repo, fake = forge_target(tmp_path, monkeypatch, bench=bench)
    try:
        evil = (
            "import sys\nsys.stderr.write('see https://evil.example/login www.evil.example GH-1 "
            "Closes https://github.com/acme/fork/issues/1 @acme/team\\n')\nraise SystemExit(3)\n"
        )
        n = pr_branch(repo, fake, "evil", {"src/model.py": evil}, "Evil")
        assert run_cli("bot", "-C", str(repo), "--once", timeout=600).returncode == 0
        body = [c["body"] for c in fake.ours(n) if c["body"].startswith(MARKER)][0]
        live = outside_fences(body)
        assert "evil.example" in body and "evil.example" not in live and "GH-1" not in live and "@acme" not in live
    finally:
        fake.stop()


def test_a_retargeted_pr_is_judged_again_and_its_old_base_never_passes_the_baselines_check(tmp_path, monkeypatch):
    """Opened against an old branch (main before a real win), the head is a win there; retargeted to main it is a
    typo fix. The old judgment's status lives under its own context; the retargeted PR is judged again."""
    repo, fake = forge_target(tmp_path, monkeypatch)
    try:
        git(repo, "branch", "old", "main")
        git(repo, "push", "-q", "origin", "old:old")
        commit(repo, {"speed.txt": "1.3\n"}, "a real win, merged long ago")
        git(repo, "push", "-q", "origin", "main:main")
        n = pr_branch(repo, fake, "docs", {"README.md": "typo\n"}, "Fix a typo", base="old")
        head = fake.prs[n]["head"]["sha"]
        assert run_cli("bot", "-C", str(repo), "--once", "--seed", "1", timeout=600).returncode == 0
        assert fake.status(head, "agentsearch (base old)")["state"] == "success" and fake.status(head) is None
        fake.prs[n]["base"] = {
            "ref": "main",
            "sha": fake._git("rev-parse", "refs/heads/main"),
            "repo": {"full_name": fake.repo},
        }
        again = run_cli("bot", "-C", str(repo), "--once", "--json", "--seed", "2", timeout=600)
        assert [j["number"] for j in json.loads(again.stdout)["judged"]] == [n]
        assert fake.status(head)["state"] in ("pending", "failure")
        body = fake.ours(n)[0]["body"]
        assert "**agentsearch: merge-worthy**" not in body and "`main`" in body
    finally:
        fake.stop()


def test_a_force_push_back_brings_that_heads_verdict_back_to_the_comment(tmp_path, monkeypatch):
    repo, fake = forge_target(tmp_path, monkeypatch)
    try:
        n = pr_branch(repo, fake, "x", {"mode.txt": "crash\n"}, "X")
        x = fake.prs[n]["head"]["sha"]
        assert run_cli("bot", "-C", str(repo), "--once", "--seed", "1", timeout=600).returncode == 0
        commit(repo, {"mode.txt": "", "speed.txt": "1.3\n"}, "Y", branch="x")
        git(repo, "push", "-q", "origin", "x:x")
        fake.pushed(n)
        assert run_cli("bot", "-C", str(repo), "--once", "--seed", "2", timeout=600).returncode == 0
        assert "**agentsearch: merge-worthy**" in fake.ours(n)[0]["body"]
        git(repo, "push", "-q", "-f", "origin", f"{x}:refs/heads/x")
        assert fake.pushed(n) == x
        assert run_cli("bot", "-C", str(repo), "--once", "--seed", "3", timeout=600).returncode == 0
        (ours,) = [c for c in fake.ours(n) if c["body"].startswith(MARKER)]
        assert re.search(r"— head `([0-9a-f]{12})` of #", ours["body"]).group(1) == x[:12]
        assert "**agentsearch: not merge-worthy**" in ours["body"] and fake.status(x)["state"] == "failure"
    finally:
        fake.stop()

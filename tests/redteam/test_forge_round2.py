"""Red team, round 2 on the forge fixes: md_inline's code spans for what GitHub links, the reader rule, the
adapter's error path and retry rules, the bot's loop."""

from __future__ import annotations

import html
import re
import sys

import pytest

from ..conftest import ROOT, run_cli
from ..test_forge import forge_target, pr_branch

sys.path.insert(0, str(ROOT))


# ------------------------------------------------------------------------------------------ md_inline on GitHub
def gh_live(md: str) -> list[str]:
    """What GitHub would still link in the rendered text outside code (cmark-gfm's autolink extension and the
    mention filter, approximated): url_match rewinds the scheme over ASCII letters only (so '_http://', '1http://',
    'éhttp://' link 'http://…'); www_match accepts a preceding space or one of '*_~('; the email postprocess links
    'x@host.tld'; the mention filter is (?:^|\\W)@name with Ruby's ASCII-only \\W (a backtick or 'é' precedes a
    mention)."""
    from markdown_it import MarkdownIt

    out = MarkdownIt("commonmark", {"html": True}).enable("table").render(md)
    out = re.sub(r"(?s)<pre>.*?</pre>|<code>.*?</code>|<!--.*?-->", " ", out)
    text = html.unescape(re.sub(r"<[^>]+>", " ", out))
    pats = {
        "url": r"(?i)(?:https?|ftp)://[A-Za-z0-9]",
        "www": r"(?i)(?:^|[\s*_~(])www\.[A-Za-z0-9]",
        "email": r"[A-Za-z0-9.+_-]+@[A-Za-z0-9_-]+\.[A-Za-z]",
        "mention": r"(?:^|[^A-Za-z0-9_])@[A-Za-z0-9]",
    }
    return [k for k, p in pats.items() if re.search(p, text)]


@pytest.mark.parametrize(
    "text",
    [
        "_http://evil.example/x",
        "1http://evil.example/x",
        "éhttp://evil.example/x",
        "_www.evil.example",
        "é@octocat",
        "`@octocat",
        "x@evil.example",
    ],
)
def test_md_inline_leaves_nothing_github_links(text):
    from history.records.text import md_inline

    md = md_inline(text)
    assert gh_live(f"| why |\n|---|\n| {md} |\n") == [], (text, md)


# ------------------------------------------------------------------------------------------ readers told once
def test_a_reader_cannot_make_the_bot_reply_to_every_comment_with_an_unknown_command(tmp_path, monkeypatch):
    """Readers are told once per PR that commands need write permission; an unknown word is checked first, so a
    reader gets one 'unknown command' reply per comment."""
    repo, fake = forge_target(tmp_path, monkeypatch)
    try:
        n = pr_branch(repo, fake, "docs", {"README.md": "x\n"}, "Docs")
        for i in range(4):
            fake.add_comment(n, "contributor", f"/agentsearch spam{i}")  # the PR's author: read permission
        proc = run_cli("bot", "-C", str(repo), "--once", "--json", "--seed", "5", timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        replies = [c["body"] for c in fake.ours(n) if "agentsearch:reply" in c["body"]]
        assert len(replies) <= 1, replies
    finally:
        fake.stop()


# ------------------------------------------------------------------------------------------ adapter
def _forge(fake):
    from agentsearch.forge import Forge

    return Forge("github", fake.url, "acme/fork", fake.token, sleep=lambda s: None, backoff_s=0.01)


@pytest.mark.parametrize("body", ["Bad Gateway", ["upstream", "timeout"], 7])
def test_an_error_answer_whose_json_is_no_object_is_a_forge_error(tmp_path, body):
    """A proxy or an odd forge answers an error with JSON that is not an object: `_message` calls .get on it."""
    from agentsearch.forge import ForgeError
    from benchmarks.fakeforge import FakeForge

    fake = FakeForge(tmp_path / "none.git").start()
    try:
        fake.handle = lambda *a: (502, body, {})
        with pytest.raises(ForgeError):
            _forge(fake).pulls()
        fake.handle = lambda *a: (404, body, {})
        with pytest.raises(ForgeError):
            _forge(fake).pull(1)
    finally:
        fake.stop()


def test_a_login_answer_that_is_a_list_is_a_forge_error(tmp_path):
    from agentsearch.forge import ForgeError
    from benchmarks.fakeforge import FakeForge

    fake = FakeForge(tmp_path / "none.git").start()
    try:
        fake.handle = lambda *a: (200, ["agentsearch-bot"], {})
        with pytest.raises(ForgeError):
            _forge(fake).me()
        with pytest.raises(ForgeError):
            _forge(fake).permission("someone")
    finally:
        fake.stop()


def test_githubs_secondary_rate_limit_is_waited_for(tmp_path):
    """GitHub's secondary rate limit: 403 (or 429) with Retry-After while x-ratelimit-remaining is not 0; the docs
    say wait Retry-After and retry. The adapter gives up at once (a lost post, a bot pass that fails)."""
    from benchmarks.fakeforge import FakeForge

    fake = FakeForge(tmp_path / "none.git").start()
    waits: list[float] = []
    try:
        from agentsearch.forge import Forge

        f = Forge("github", fake.url, "acme/fork", fake.token, sleep=waits.append)
        fake.prs[1] = {
            "number": 1,
            "title": "t",
            "state": "open",
            "user": {"login": "u"},
            "head": {"ref": "x", "sha": "a" * 40},
            "base": {"ref": "main", "sha": "b" * 40},
            "labels": [],
        }
        fake.faults = [(403, {"Retry-After": "3", "x-ratelimit-remaining": "4321"})]
        assert f.pull(1).number == 1
        assert waits == [3.0]
    finally:
        fake.stop()


# ------------------------------------------------------------------------------------------ the bot's loop
def test_bot_watch_survives_one_failed_listing(tmp_path, monkeypatch):
    """`bot --watch`: one pass whose pull request listing fails (a 403 the adapter does not retry, a forge outage
    longer than the retries) ends the daemon instead of being reported and tried again next pass."""
    import agentsearch.commands.forge as cmd
    from agentsearch.errors import AgentsearchError

    repo, fake = forge_target(tmp_path, monkeypatch)
    try:
        fake.faults = [(403, {})]

        class Stop(Exception):
            pass

        class FakeTime:
            @staticmethod
            def sleep(s):
                raise Stop

        monkeypatch.setattr(cmd, "time", FakeTime)
        try:
            cmd.run_bot(repo, True, 1.0, None, None, False)
        except Stop:
            pass  # the loop went on to its next pass: what should happen
        except AgentsearchError as exc:
            pytest.fail(f"bot --watch stopped on one failed pass: {exc}")
    finally:
        fake.stop()


# ------------------------------------------------------------------------------------------ check runs
def test_a_check_run_is_not_left_in_progress_when_the_head_cannot_be_judged(tmp_path, monkeypatch):
    """[forge] check_runs: review() opens an in-progress check run, then the evaluation fails: the commit status
    says error, the check run stays 'in progress' for ever (a required check never concludes)."""
    import agentsearch.review_bot as rb
    from agentsearch.errors import AgentsearchError
    from agentsearch.forge import Forge
    from agentsearch.workspace import Workspace

    repo, fake = forge_target(tmp_path, monkeypatch, forge_keys="check_runs = true\n")
    try:
        fake.app_tokens.add(fake.token)
        n = pr_branch(repo, fake, "docs", {"README.md": "x\n"}, "Docs")

        def boom(*a, **k):
            raise AgentsearchError("the benchmark's sandbox could not start")

        monkeypatch.setattr(rb, "evaluate", boom)
        ws = Workspace.open(repo)
        forge = Forge("github", fake.url, "acme/fork", fake.token)
        with pytest.raises(AgentsearchError):
            rb.Reviewer(ws, forge).review(forge.pull(n))
        head = fake.prs[n]["head"]["sha"]
        assert fake.status(head)["state"] == "error"
        assert fake.check_runs[head][-1]["status"] == "completed", fake.check_runs[head]
    finally:
        fake.stop()

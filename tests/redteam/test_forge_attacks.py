"""The review bot against adversarial pull requests: what a PR controls (its code, its commit message and branch,
its output and stderr, its comments) must not change what our comment says, which comment we edit, which
status we set, or reach the forge token."""

from __future__ import annotations

import re
import subprocess
import sys

from ..conftest import ROOT, run_cli
from ..test_forge import MARKER, TOY_BENCH, forge_target, pr_branch

sys.path.insert(0, str(ROOT))

NASTY = "@everyone see #1 <img src=x onerror=alert(1)> [click](https://evil.example) \x1b[2J\x1b]0;pwned\x07 ```"


def outside_fences(body: str) -> str:
    """The comment without its fenced code blocks (where nothing is markup and nobody is mentioned)."""
    return re.sub(r"(?ms)^(`{3,})[^\n]*\n.*?^\1\s*$", "", body)


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
        for raw in ("<img", "@everyone", "](https://evil", "see #1"):
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
        spy = ("import glob, os, sys\n"
               "found = [k + '=' + v for k, v in os.environ.items()]\n"
               "for p in glob.glob('/proc/*/environ') + glob.glob('/proc/*/cmdline'):\n"
               "    try:\n"
               "        found.append(open(p, 'rb').read().decode('latin-1'))\n"
               "    except OSError:\n"
               "        pass\n"
               "sys.stderr.write('LEAK ' + ' '.join(found)[-3000:] + '\\n')\n"
               "raise SystemExit(3)\n")
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
        assert len(replies) == 2 and any("write permission" in r for r in replies) and any("unknown command" in r for r in replies)
        assert all("rm -rf" not in outside_fences(r).replace("`", "") or "unknown" in r for r in replies)
        again = run_cli("bot", "-C", str(repo), "--once", timeout=600)
        assert again.returncode == 0 and len([c for c in fake.ours(n) if not c["body"].startswith(MARKER)]) == 2
    finally:
        fake.stop()

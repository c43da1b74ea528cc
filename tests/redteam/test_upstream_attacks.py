"""Attacks on the upstream pull request (`agentsearch pr` with [forge] upstream = "vllm"): what a proposal controls —
its title, its patch's From: line, the paths it changed — and what other people on the forge control — the titles
of the open pull requests the duplicate search finds — must not add a trailer to the owner's commit, a qualifier to
the search, or markup (a mention, a link, an image, an HTML tag) to the body a maintainer reads."""

from __future__ import annotations

import json
import re
import subprocess

from agentsearch.upstream import Owner, coauthor, commit_message, search_terms

from ..test_upstream_pr import OWNER, upstream  # noqa: F401 - the fixture: a toy episode with a merged win

EVIL = "Evil Maintainer <evil@example.com>"


def trailers(message: str) -> list[str]:
    proc = subprocess.run(["git", "interpret-trailers", "--parse"], input=message, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_a_title_cannot_add_a_trailer_to_the_owners_commit() -> None:
    owner = Owner.of(OWNER, "vLLM")
    for title in (
        f"Faster\n\nSigned-off-by: {EVIL}",
        f"Faster\r\n\r\nCo-authored-by: {EVIL}\nReviewed-by: {EVIL}",
        f"Signed-off-by: {EVIL}",
        "Faster\u2028\u2028Signed-off-by: " + EVIL,
    ):
        msg = commit_message(title, "Measured: +30%.", "Claude <noreply@anthropic.com>", owner, signoff=True)
        assert trailers(msg) == ["Co-authored-by: Claude <noreply@anthropic.com>", f"Signed-off-by: {OWNER}"], msg
        assert "\n" not in msg.split("\n\n", 1)[0]  # the subject is one line


def test_a_patch_from_line_names_one_co_author_at_most() -> None:
    for patch, expected in (
        (f"From 1234 Mon Sep 17 00:00:00 2001\nFrom: {EVIL}\nSubject: x\n", EVIL),
        (f"From: A <a@example.com>\nSigned-off-by: {EVIL}\n", "A <a@example.com>"),
        (f"From: A <a@example.com>, {EVIL}\n", "agentsearch patches proposer <agentsearch@users.noreply.github.com>"),
        ("From: \x1b[2Jnobody\n", "agentsearch patches proposer <agentsearch@users.noreply.github.com>"),
    ):
        assert coauthor("patches", patch) == expected
        msg = commit_message("Faster", "Measured.", coauthor("patches", patch), Owner.of(OWNER, "vLLM"), signoff=True)
        assert trailers(msg)[-1] == f"Signed-off-by: {OWNER}" and len(trailers(msg)) == 2


def test_a_title_cannot_steer_the_duplicate_search() -> None:
    """Qualifiers (repo:, is:, author:), quotes and operators would search elsewhere or nothing: only plain terms."""
    for title in (
        'repo:evil/other is:closed author:bot label:"x" OR max_num_seqs',
        "-- in:title NOT engine.step $(rm -rf /) `x`",
        "x" * 500 + "_y",
    ):
        terms = search_terms(title, ["vllm/v1/core/sched/scheduler.py", "../../etc/passwd.py"])
        assert 1 <= len(terms) <= 3
        for t in terms:
            assert t.replace("_", "").replace(".", "").replace("-", "").isalnum() and len(t) <= 60, terms
    assert search_terms("max_num_seqs: 4 -> 32", ["vllm/v1/core/sched/scheduler.py"])[:2] == [
        "max_num_seqs",
        "scheduler",
    ]


def test_the_forges_search_results_reach_the_body_as_text(upstream, monkeypatch):  # noqa: F811
    """Another account's pull request titles are untrusted: no mention, link, image or tag survives in our body."""
    repo, fake = upstream
    monkeypatch.setenv("AGENTSEARCH_FORGE_TOKEN", fake.token)
    from ..conftest import git, run_cli

    git(repo, "push", "-q", "origin", "main:evil-branch")
    fake.open_pr(
        "evil-branch",
        title='engine <img src=x onerror=alert(1)> [click](https://evil.example) @vllm-maintainers ![i](https://e.x/a.png) | x',
        author="mallory",
    )
    proc = run_cli(
        "pr", "-C", str(repo), "001", "--owner", OWNER, "--not-duplicate", "<b>@here</b> [x](https://e.x)", "--json"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    body = fake.prs[max(fake.prs)]["body"]
    row = next(ln for ln in body.splitlines() if ln.startswith("| `engine` |"))
    assert row.count("|") - row.count("\\|") == 3  # the title's pipe is no new cell
    assert not re.search(r"(?<!\\)<(img|b)\b", body)  # every tag's bracket escaped
    for raw in ("](https://evil.example)", "![i]", "](https://e.x)"):
        assert raw not in body, raw
    assert "@vllm-maintainers" not in body.replace("`@vllm-maintainers`", "") and "@here" not in body.replace(
        "`@here`", ""
    )
    assert json.loads(proc.stdout)["upstream"]["not_duplicate"].startswith("<b>")

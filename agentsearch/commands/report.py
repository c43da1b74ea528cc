"""`agentsearch report` and `agentsearch pr`: the evidence of one verdict, as a file or a PR body."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import click

from ..errors import AgentsearchError
from ..records import read_entries
from ..report import gather, render
from ..workspace import Workspace, git
from ..headline import headline
from .output import out, print_json
from .proposal_ids import refuse_ambiguous_verdict


def run(target: Path, what: str, fmt: str, output: Path | None, as_json: bool = False) -> int:
    ws = Workspace.open(target)
    refuse_ambiguous_verdict(read_entries(ws), what)
    ev = gather(ws, what)
    image_dir = output.with_name(output.stem + "-plots") if (output and fmt == "md") else None
    text, files = render(ev, fmt, image_dir)
    if as_json:
        _report_json(ev, fmt, output, text, files)
    if output is None:
        if not as_json:
            click.echo(text)
        return 0
    output.parent.mkdir(parents=True, exist_ok=True)
    for rel, data in files.items():
        path = output.parent / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    output.write_text(text)
    if as_json:
        return 0
    out.print(f"wrote {output}" + (f" and {len(files)} plots in {image_dir}" if files else ""))
    return 0


def _report_json(ev: Any, fmt: str, output: Path | None, text: str, files: dict[str, bytes]) -> None:
    """`report --json`: what was rendered, and where (the text itself when no -o)."""
    print_json({"what": ev.what, "kind": ev.kind, "proposal": ev.verdict.get("proposal"), "verdict": ev.verdict.get("verdict"),
                "headline": headline(ev.verdict), "format": fmt, "output": str(output) if output else None,
                "plots": [str(output.parent / rel) for rel in files] if output else [], "text": None if output else text})


def pr(target: Path, what: str, remote: str, dry_run: bool, output: Path | None, as_json: bool = False) -> int:
    ws = Workspace.open(target)
    refuse_ambiguous_verdict(read_entries(ws), what)
    ev = gather(ws, what)
    branch = ev.verdict.get("branch") or ev.proposal.get("branch")
    if not branch or ev.kind != "proposal":
        raise AgentsearchError(f"{what!r} is not an episode proposal with a branch; `pr` opens a PR for a proposal branch")
    if not git.branch_exists(ws.repo_dir, branch):
        raise AgentsearchError(f"branch {branch!r} no longer exists in {ws.repo_dir}")
    text, _ = render(ev, "md")
    body = output or (ws.state / "tmp" / f"pr-{ev.verdict['proposal'].replace('/', '-')}.md")
    body.parent.mkdir(parents=True, exist_ok=True)
    body.write_text(text)
    base = ws.config().target.baseline
    title = f"[agentsearch {ev.verdict.get('verdict')}] {ev.verdict.get('title') or branch}"
    push = ["git", "-C", str(ws.repo_dir), "push", remote, f"{branch}:{branch}"]
    create = ["gh", "pr", "create", "--head", branch, "--base", base, "--title", title, "--body-file", str(body)]
    doc = {"proposal": ev.verdict.get("proposal"), "branch": branch, "base": base, "title": title, "body_file": str(body),
           "push": push, "create": create, "dry_run": dry_run, "url": None}
    if dry_run and as_json:
        print_json(doc)
        return 0
    if dry_run:
        out.print(f"PR body written to {body}")
        click.echo(shlex.join(push))
        click.echo(shlex.join(create))
        return 0
    url = git.remote_url(ws.repo_dir, remote)
    if url is None:
        raise AgentsearchError(f"the target has no git remote {remote!r}; add one with `git remote add {remote} URL` or pass --remote NAME (or --dry-run)")
    gh = shutil.which("gh")
    if gh is None:
        raise AgentsearchError("GitHub CLI `gh` not found on PATH; install it (https://cli.github.com) and run `gh auth login`, or use --dry-run")
    err = git.push(ws.repo_dir, remote, branch)
    if err:
        raise AgentsearchError(f"git push {remote} {branch} failed: {err}; check the remote's URL and your access")
    proc = subprocess.run([gh, *create[1:]], cwd=str(ws.repo_dir), capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1]
        raise AgentsearchError(f"gh pr create failed: {last}")
    if as_json:
        print_json({**doc, "url": proc.stdout.strip() or None})
        return 0
    click.echo(proc.stdout.strip() or f"pull request opened for {branch}")
    return 0

"""`agentsearch report` and `agentsearch pr`: the evidence of one verdict, as a file or a PR body (opened on the
forge through its REST API, agentsearch.forge, or with the GitHub CLI: --via gh)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import click

from ..errors import AgentsearchError
from ..records import read_entries
from ..report import Evidence, gather, plots, render, render_pr, to_json
from ..workspace import Workspace, git
from .output import out, print_json
from .proposal_ids import refuse_ambiguous_verdict

EVIDENCE_PREFIX = "agentsearch-evidence/"  # + proposal id: a parentless branch holding the PR's plots
PR_TITLE_CHARS = 250  # GitHub allows 256


def run(target: Path, what: str, fmt: str, output: Path | None, as_json: bool = False) -> int:
    ws = Workspace.open(target)
    refuse_ambiguous_verdict(read_entries(ws), what)
    ev = gather(ws, what)
    image_dir = output.with_name(output.stem + "-plots") if (output and fmt == "md") else None
    text, files = render(ev, fmt, image_dir)
    if output is None:
        if as_json:
            print_json(to_json(ev, format=fmt, output=None, plots=[], text=text))
        else:
            click.echo(text)
        return 0
    output.parent.mkdir(parents=True, exist_ok=True)
    written = []
    for rel, data in files.items():
        path = output.parent / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        written.append(str(path))
    output.write_text(text)
    if as_json:
        print_json(to_json(ev, format=fmt, output=str(output), plots=written))
    else:
        out.print(f"wrote {output}" + (f" and {len(files)} plots in {image_dir}" if files else ""))
    return 0


def github_repo(url: str | None) -> str | None:
    """``owner/name`` of a GitHub remote URL (https, ssh or scp-like), else None."""
    m = re.match(
        r"^(?:https?://(?:[^@/]+@)?github\.com/|ssh://git@github\.com/|git@github\.com:)([\w.-]+)/([\w.-]+?)(?:\.git)?/?$",
        url or "",
    )
    return f"{m.group(1)}/{m.group(2)}" if m else None


def pr_title(ev: Evidence) -> str:
    title = ev.title or ev.branch or ev.what
    text = f"[agentsearch] {title}: {ev.headline()}"
    return text if len(text) <= PR_TITLE_CHARS else text[: PR_TITLE_CHARS - 1].rstrip() + "…"


def refuse_unless_forced(ev: Evidence, force: bool) -> None:
    """`pr` is for wins that stand: a rejection, a review verdict or a reverted merge needs --force."""
    if force:
        return
    pid = ev.proposal_id or ev.what
    verdict = ev.verdict.verdict
    if verdict != "merge":
        why = str(next(iter(ev.verdict.reasons), "no reason recorded"))
        why = why if len(why) <= 120 else why[:119].rstrip() + "…"
        raise AgentsearchError(
            f"{pid} was not a win (verdict {verdict}: {why}); `pr` opens pull requests for merges — pass --force to "
            "open one anyway"
        )
    if ev.revert is not None:
        raise AgentsearchError(
            f"{pid} was merged but reverted since by {ev.revert.new[:12]}; pass --force to open a pull request anyway"
        )


def pr(
    target: Path,
    what: str,
    remote: str,
    dry_run: bool,
    output: Path | None,
    force: bool = False,
    draft: bool = False,
    with_plots: bool = True,
    as_json: bool = False,
    via: str = "forge",
) -> int:
    ws = Workspace.open(target)
    refuse_ambiguous_verdict(read_entries(ws), what)
    ev = gather(ws, what)
    branch = ev.branch
    if not branch or ev.kind != "proposal":
        raise AgentsearchError(
            f"{what!r} is not an episode proposal with a branch; `pr` opens a PR for a proposal branch"
        )
    refuse_unless_forced(ev, force)
    if not git.branch_exists(ws.repo_dir, branch):
        raise AgentsearchError(f"branch {branch!r} no longer exists in {ws.repo_dir}")
    url = git.remote_url(ws.repo_dir, remote)
    if url is None and not dry_run:
        raise AgentsearchError(
            f"the target has no git remote {remote!r}; add one with `git remote add {remote} URL` or pass --remote "
            "NAME (or --dry-run)"
        )
    gh = shutil.which("gh") if via == "gh" else None
    if via == "gh" and gh is None and not dry_run:
        raise AgentsearchError(
            "GitHub CLI `gh` not found on PATH; install it (https://cli.github.com) and run `gh auth login`, or use "
            "--dry-run"
        )
    forge = None
    if via == "forge" and not dry_run:  # before any push: a missing token is said first
        from ..forge import Forge

        forge = Forge.from_config(ws.config().forge, url)

    pid = ev.proposal_id or ev.what
    body = output or (ws.state / "tmp" / f"pr-{pid.replace('/', '-')}.md")
    body.parent.mkdir(parents=True, exist_ok=True)
    pngs = {f"{k}.png": b for k, b in plots(ev, "png").items()} if with_plots else {}
    evidence = evidence_commit = None
    images: dict[str, str] = {}
    note = ""
    if pngs:
        plot_dir = body.with_name(body.stem + "-plots")  # a local copy next to the body
        plot_dir.mkdir(parents=True, exist_ok=True)
        for name, data in pngs.items():
            (plot_dir / name).write_bytes(data)
        evidence = EVIDENCE_PREFIX + pid
        evidence_commit = git.commit_files(
            ws.repo_dir, evidence, pngs, f"agentsearch: plots of {pid}\n\nEvidence for branch {branch}; not code.\n"
        )
        gh_repo = github_repo(url)
        if forge is not None:
            images = {name[:-4]: forge.raw_url(evidence_commit, name) for name in pngs}
        elif gh_repo:
            images = {name[:-4]: f"https://github.com/{gh_repo}/raw/{evidence_commit}/{name}" for name in pngs}
        note = (
            f"<sub>Plots: branch `{evidence}` (commit `{evidence_commit[:12]}`), files "
            + ", ".join(f"`{n}`" for n in pngs)
            + ".</sub>"
        )
    body.write_text(render_pr(ev, images, note))
    base = ws.config().target.baseline
    title = pr_title(ev)
    pushes = [["git", "push", remote, f"refs/heads/{branch}:refs/heads/{branch}"]]
    if evidence:
        pushes.append(["git", "push", remote, f"+refs/heads/{evidence}:refs/heads/{evidence}"])
    if via == "gh":
        create = [
            "gh",
            "pr",
            "create",
            "--head",
            branch,
            "--base",
            base,
            "--title",
            title,
            "--body-file",
            str(body),
        ] + (["--draft"] if draft else [])
    else:
        cfg = ws.config().forge
        create = ["POST", f"{cfg.kind} {cfg.url} pulls", f"head={branch}", f"base={base}", f"body={body}"] + (
            ["draft"] if draft else []
        )
    record = {
        "branch": branch,
        "base": base,
        "title": title,
        "draft": draft,
        "dry_run": dry_run,
        "body_file": str(body),
        "evidence_branch": evidence,
        "evidence_commit": evidence_commit,
        "plots": sorted(pngs),
        "push": [shlex.join(p) for p in pushes],
        "create": shlex.join(create),
        "url": None,
    }
    if dry_run:
        if as_json:
            print_json(to_json(ev, **record))
        else:
            out.print(f"PR body written to {body}")
            for p in pushes:
                click.echo(shlex.join(["git", "-C", str(ws.repo_dir), *p[1:]]))
            click.echo(shlex.join(create))
        return 0
    for name, force_push in [(branch, False)] + ([(evidence, True)] if evidence else []):
        err = git.push(ws.repo_dir, remote, name, force=force_push)
        if err:
            raise AgentsearchError(f"git push {remote} {name} failed: {err}; check the remote's URL and your access")
    if forge is not None:
        try:
            link = forge.create_pull(branch, base, title, body.read_text(), draft).html_url
        finally:
            forge.close()
    else:
        assert gh is not None  # checked above for every run that is not a dry run
        proc = subprocess.run([gh, *create[1:]], cwd=str(ws.repo_dir), capture_output=True, text=True)
        if proc.returncode != 0:
            last = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1]
            raise AgentsearchError(f"gh pr create failed: {last}")
        link = proc.stdout.strip()
    if as_json:
        print_json(to_json(ev, **{**record, "url": link or None}))
    else:
        click.echo(link or f"pull request opened for {branch}")
    return 0

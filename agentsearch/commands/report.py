"""`agentsearch report` and `agentsearch pr`: the evidence of one verdict, as a file or a PR body (opened on the
forge through its REST API, agentsearch.forge, or with the GitHub CLI: --via gh)."""

from __future__ import annotations

import dataclasses
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from history.records.text import clean

from ..errors import AgentsearchError
from ..headline import pct
from ..records import read_entries
from ..report import (
    Evidence,
    RevertCase,
    gather,
    plots,
    render,
    render_pr,
    render_upstream_pr,
    revert_markdown,
    revert_title,
    to_json,
)
from ..upstream import (
    DECLARED,
    Owner,
    Profile,
    branch_name,
    coauthor,
    commit_message,
    kernel_benchmark,
    kernel_changes,
    profile_of,
    prompt_hash,
    refuse_duplicates,
    search,
    search_terms,
    serving_only,
    shape_literals,
    upstream_commit,
)
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


@dataclass(frozen=True)
class PullRequestOptions:
    """How `agentsearch pr` opens a pull request (its options, shared by a proposal's and a revert's)."""

    remote: str = "origin"
    dry_run: bool = False
    output: Path | None = None  # where the body goes (default: the state dir)
    force: bool = False
    draft: bool = False
    via: str = "forge"  # forge (its REST API) | gh
    as_json: bool = False
    upstream: str | None = None  # an upstream project's rules (agentsearch.upstream); None: [forge] upstream
    owner: str = ""  # the human who vouches for an upstream pull request (else [forge] owner)
    not_duplicate: str = ""  # the owner's words: why the open pull requests the search found are not this one


def pr(target: Path, what: str, how: PullRequestOptions, with_plots: bool = True) -> int:
    ws = Workspace.open(target)
    refuse_ambiguous_verdict(read_entries(ws), what)
    ev = gather(ws, what)
    branch = ev.branch
    if not branch or ev.kind != "proposal":
        raise AgentsearchError(
            f"{what!r} is not an episode proposal with a branch; `pr` opens a PR for a proposal branch"
        )
    cfg = ws.config().forge
    upstream = cfg.upstream if how.upstream is None else how.upstream
    if upstream:  # the owner first: without one nothing else is asked, written or pushed
        profile = profile_of(upstream)
        owner = Owner.of(how.owner or cfg.owner, profile.project)
        if how.via != "forge":
            raise AgentsearchError(
                f"an upstream pull request searches {profile.project}'s open pull requests for duplicates through the "
                "forge's API: use --via forge (a token in [forge] token_env)"
            )
    refuse_unless_forced(ev, how.force)
    if not git.branch_exists(ws.repo_dir, branch):
        raise AgentsearchError(f"branch {branch!r} no longer exists in {ws.repo_dir}")
    if upstream:
        refuse_not_upstreamable(ws, ev, profile)
    url, gh, forge = channel(ws, how)
    try:
        if upstream:
            return _pr_upstream(ws, ev, how, profile, owner, forge)
        return _pr(ws, ev, how, with_plots, url, gh, forge)
    finally:
        if forge is not None:
            forge.close()


def refuse_not_upstreamable(ws: Workspace, ev: Evidence, profile: Profile) -> None:
    """What an upstream project cannot take, in one line: a change of the fork's own configuration only, or one
    without the model evaluation its rules ask for."""
    pid = ev.proposal_id or ev.what
    files = tuple(ev.proposal.files) if ev.proposal else ()
    if serving_only(files, ws.config()):
        raise AgentsearchError(
            f"{pid} changes only {', '.join(files)} (the fork's serving configuration), not {profile.project}'s code: "
            "there is nothing to send upstream; share the setting as a deployment note instead"
        )
    if ev.verdict.distribution is None:
        raise AgentsearchError(
            f"{pid} has no distribution check in its evidence, and {profile.project}'s rules ask for model-evaluation "
            "results when a change can affect output or serving; configure [verify] and judge it again"
        )
    hard = shape_literals(ws.repo_dir, ev.baseline or "", ev.candidate or "")
    if hard:
        more = f" (and {len(hard) - 1} more)" if len(hard) > 1 else ""
        raise AgentsearchError(
            f"{pid} hard-codes a shape in kernel code, which {profile.project} cannot merge: {hard[0]}{more}; route "
            "other shapes to native in the provider's supports_args, or declare it with the comment "
            f"`# {DECLARED} <why>` on the line"
        )
    if len(kernel_changes(ws.repo_dir, ev.baseline or "", ev.candidate or "")) > 1:
        raise AgentsearchError(f"{pid} brings kernels for several IR ops: send one kernel per upstream pull request")


def upstream_title(ev: Evidence, profile: Profile) -> str:
    category = ev.proposal.category if ev.proposal else ""
    title = clean(ev.title or ev.branch or ev.what, PR_TITLE_CHARS, one_line=True)
    text = f"{profile.tags.get(category, '[Perf]')} {title}"
    return text if len(text) <= PR_TITLE_CHARS else text[: PR_TITLE_CHARS - 1].rstrip() + "…"


def _pr_upstream(
    ws: Workspace, ev: Evidence, how: PullRequestOptions, profile: Profile, owner: Owner, forge: Any
) -> int:
    """The upstream form of `pr`: the duplicate search, one commit of the judged tree by the owner with the
    trailers on its own branch (agentsearch/upstream/<proposal>), the body in the profile's sections."""
    assert ev.candidate and ev.baseline and ev.proposal  # a proposal's merge verdict (checked by pr)
    pid = ev.proposal_id or ev.what
    searches = search(forge, search_terms(ev.title or "", ev.proposal.files))
    refuse_duplicates(searches, how.not_duplicate)
    co = coauthor(ev.proposal.proposer, ev.proposal.patch)
    summary = f"Measured with agentsearch {ev.versions.get('agentsearch', '?')} against {ev.baseline[:12]}: " + clean(
        ev.headline().split(" — ", 1)[-1], 600, one_line=True
    )
    title = upstream_title(ev, profile)  # the subject starts with the project's tag: never a trailer's shape
    message = commit_message(title, summary, co, owner, profile.signoff)
    extra = None
    for op, provider in kernel_changes(ws.repo_dir, ev.baseline, ev.candidate):  # one at most (checked above)
        micro = next((str(c.detail) for c in ev.verdict.checks if c.name == "micro"), "")
        extra = kernel_benchmark(op, provider, profile, micro, ev.versions.get("agentsearch", "?"))
    head = upstream_commit(ws.repo_dir, ev.baseline, ev.candidate, message, owner, extra, ws.state / "tmp")
    branch = branch_name(pid)
    git.run_git("update-ref", f"refs/heads/{branch}", head, cwd=ws.repo_dir)
    body = how.output or (ws.state / "tmp" / f"pr-upstream-{pid.replace('/', '-')}.md")
    body.parent.mkdir(parents=True, exist_ok=True)
    meta = ev.proposal.meta
    body.write_text(
        render_upstream_pr(
            ev,
            profile.template,
            owner=str(owner),
            searches=searches,
            not_duplicate=how.not_duplicate.strip(),
            coauthor=co,
            model=meta.get("model") if isinstance(meta.get("model"), str) else None,
            prompt_sha=prompt_hash(meta),
            judged_tree=git.tree_of(ws.repo_dir, ev.candidate),
            repo=forge.repo if forge is not None else (ws.config().forge.repo or "the upstream repository"),
            signoff=profile.signoff,
            kernel_bench=extra[0] if extra else None,
        )
    )
    record, link = publish(ws, how, branch, [], title, body, None, forge, replace=True)
    if how.as_json:
        upstream = {
            "profile": profile.name,
            "owner": str(owner),
            "head": head,
            "tree": git.tree_of(ws.repo_dir, head),
            "coauthor": co,
            "searches": [s.to_json() for s in searches],
            "not_duplicate": how.not_duplicate.strip() or None,
            "kernel_benchmark": extra[0] if extra else None,
        }
        print_json(to_json(ev, **record, url=link, upstream=upstream))
    elif not how.dry_run:
        click.echo(link or f"pull request opened for {branch}")
    return 0


def _pr(
    ws: Workspace, ev: Evidence, how: PullRequestOptions, with_plots: bool, url: str | None, gh: str | None, forge: Any
) -> int:
    branch = ev.branch
    assert branch is not None  # checked by pr
    pid = ev.proposal_id or ev.what
    body = how.output or (ws.state / "tmp" / f"pr-{pid.replace('/', '-')}.md")
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
    extra = [(evidence, True)] if evidence else []
    record, link = publish(ws, how, branch, extra, pr_title(ev), body, gh, forge)
    if how.as_json:
        print_json(
            to_json(
                ev, **record, url=link, evidence_branch=evidence, evidence_commit=evidence_commit, plots=sorted(pngs)
            )
        )
    elif not how.dry_run:
        click.echo(link or f"pull request opened for {branch}")
    return 0


def channel(ws: Workspace, how: PullRequestOptions) -> tuple[str | None, str | None, Any]:
    """Before anything is pushed: the remote's URL, the `gh` binary (--via gh) and the forge adapter (--via forge),
    each missing one said in one line (a dry run needs none of them)."""
    remote, dry_run, via = how.remote, how.dry_run, how.via
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
    return url, gh, forge


def pr_revert(target: Path, what: str, how: PullRequestOptions) -> int:
    """`agentsearch pr --revert MERGE`: a branch with MERGE's revert on top of the baseline's tip, pushed, and a pull
    request with the evidence against it (the latest stack check's leave-one-out, its interference, a recheck). The
    baseline itself does not move (`agentsearch revert` moves it). Without --force, only for a merge that a check of
    today's tip calls a passenger or harmful, or a win whose recheck did not hold."""
    from .review import REVERT_PREFIX, interferes_with, latest_rechecks, latest_removals, resolve_merge, revert_message

    ws = Workspace.open(target)
    row = resolve_merge(ws, what)
    merge = row["merge"]
    if row["reverted"]:
        raise AgentsearchError(f"{merge[:12]} was already reverted by {str(row['revert_commit'])[:12]}")
    if not row["on_baseline"]:
        raise AgentsearchError(f"{merge[:12]} is not on the baseline {ws.baseline_branch!r}; nothing to revert")
    entries = read_entries(ws)
    check, removal = latest_removals(entries).get(merge, (None, None))
    case = RevertCase(
        merge=merge,
        proposal=row["proposal"],
        title=row["title"],
        base=ws.baseline_branch,
        tip=ws.baseline_commit(),
        commit="",
        branch=REVERT_PREFIX + merge[:12],
        remote=how.remote,
        check=check,
        removal=removal,
        partners=tuple(interferes_with(check, merge)) if check is not None else (),
        recheck=latest_rechecks(entries).get(merge),
    )
    if not case.grounds and not how.force:
        if removal is None:
            today = "no stack check has removed it"
        elif check is not None and not case.current:
            today = (
                f"the latest stack check that removed it measured {check.tip[:12]}, not today's tip {case.tip[:12]} "
                f"(it called it {removal.decision} there)"
            )
        else:
            today = f"the latest stack check calls it {removal.decision} at today's tip ({pct(removal.marginal)})"
        raise AgentsearchError(
            f"nothing measured calls for reverting {merge[:12]}: {today}"
            + ("" if case.recheck is None else ", and its recheck holds")
            + "; measure it with `agentsearch stack --leave-one-out` (or `agentsearch review MERGE --recheck`), or "
            "pass --force"
        )
    _, gh, forge = channel(ws, how)
    try:
        with ws.lock():
            tip, commit = ws.revert_commit(merge, revert_message(row))
            if tip != case.tip:
                raise AgentsearchError(
                    f"the baseline moved ({case.tip[:12]} -> {tip[:12]}) while the revert was prepared; run it again"
                )
            held = git.branch_commit(ws.repo_dir, case.branch)
            if held is not None and git.same_commit_but_dates(ws.repo_dir, held, commit):
                commit = held  # the same revert on the same tip: the branch (and its pull request's head) stays
            elif held is None or not how.dry_run:  # a dry run never moves a branch a pull request may have
                git.run_git("update-ref", f"refs/heads/{case.branch}", commit, cwd=ws.repo_dir)
        case = dataclasses.replace(case, commit=commit)
        body = how.output or (ws.state / "tmp" / f"pr-revert-{merge[:12]}.md")
        body.parent.mkdir(parents=True, exist_ok=True)
        body.write_text(revert_markdown(case))
        # the branch is ours (agentsearch/revert-*): a second `pr --revert` replaces it, and updates its pull request
        record, link = publish(ws, how, case.branch, [], revert_title(case), body, gh, forge, replace=True)
    finally:
        if forge is not None:
            forge.close()
    if how.as_json:
        print_json(
            {
                **record,
                "merge": merge,
                "proposal": row["proposal"],
                "grounds": list(case.grounds),
                "revert": commit,
                "url": link,
            }
        )
    elif not how.dry_run:
        click.echo(link or f"pull request opened for {case.branch}")
    return 0


def publish(
    ws: Workspace,
    how: PullRequestOptions,
    branch: str,
    extra: list[tuple[str, bool]],
    title: str,
    body: Path,
    gh: str | None,
    forge: Any,
    replace: bool = False,
) -> tuple[dict[str, Any], str | None]:
    """Push ``branch`` (``replace``: over whatever is there) and the ``extra`` branches (name, force) to ``remote``
    and open a pull request from ``branch`` onto the baseline with ``body`` (a file): through the forge's REST API,
    or `gh`. With ``dry_run`` nothing is pushed: the commands are printed (unless --json). Returns the record
    `pr --json` prints and the pull request's link."""
    remote, draft, dry_run = how.remote, how.draft, how.dry_run
    base = ws.config().target.baseline
    branches = [(branch, replace), *extra]
    pushes = [["git", "push", remote, f"{'+' * force}refs/heads/{name}:refs/heads/{name}"] for name, force in branches]
    if how.via == "gh":
        create = ["gh", "pr", "create", "--head", branch, "--base", base, "--title", title, "--body-file", str(body)]
        create += ["--draft"] if draft else []
    else:
        cfg = ws.config().forge
        create = ["POST", f"{cfg.kind} {cfg.url} pulls", f"head={branch}", f"base={base}", f"body={body}"]
        create += ["draft"] if draft else []
    record: dict[str, Any] = {
        "branch": branch,
        "base": base,
        "title": title,
        "draft": draft,
        "dry_run": dry_run,
        "body_file": str(body),
        "push": [shlex.join(p) for p in pushes],
        "create": shlex.join(create),
    }
    if dry_run:
        if not how.as_json:
            out.print(f"PR body written to {body}")
            for p in pushes:
                click.echo(shlex.join(["git", "-C", str(ws.repo_dir), *p[1:]]))
            click.echo(shlex.join(create))
        return record, None
    # the open pull request of this head, if any (a forge refuses a second one): listed before anything is pushed
    mine = (
        [p for p in forge.pulls()[0] if p.head_ref == branch and p.head_repo in (None, forge.repo)]
        if forge is not None and replace
        else []
    )
    for name, force_push in branches:
        err = git.push(ws.repo_dir, remote, name, force=force_push)
        if err:
            raise AgentsearchError(f"git push {remote} {name} failed: {err}; check the remote's URL and your access")
    if forge is not None:
        if mine:  # its head was just replaced: its title and body follow
            link = forge.edit_pull(mine[0].number, title, body.read_text()).html_url
        else:
            link = forge.create_pull(branch, base, title, body.read_text(), draft).html_url
    else:
        assert gh is not None  # checked by the caller for every run that is not a dry run
        proc = subprocess.run([gh, *create[1:]], cwd=str(ws.repo_dir), capture_output=True, text=True)
        if proc.returncode != 0:
            last = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1]
            raise AgentsearchError(f"gh pr create failed: {last}")
        link = proc.stdout.strip()
    return record, link or None

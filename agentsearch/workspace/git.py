"""The only place that runs git.

Every git command goes through ``_git``: no shell, inherited ``GIT_*`` variables removed, no
repository hook or fsmonitor. ``run_git`` raises ``GitError`` carrying the command and its
output; the verbs below are named by intent.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import GitError, TargetError

AGENT_NAME = "agentsearch"
AGENT_EMAIL = "agentsearch@localhost"


def _clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        {
            "GIT_AUTHOR_NAME": AGENT_NAME,
            "GIT_AUTHOR_EMAIL": AGENT_EMAIL,
            "GIT_COMMITTER_NAME": AGENT_NAME,
            "GIT_COMMITTER_EMAIL": AGENT_EMAIL,
            "GIT_TERMINAL_PROMPT": "0",
            # every git call: no repository hook, no fsmonitor (nothing a proposal wrote runs as us)
            "GIT_CONFIG_COUNT": "4",
            "GIT_CONFIG_KEY_0": "core.hooksPath",
            "GIT_CONFIG_VALUE_0": "/dev/null",
            "GIT_CONFIG_KEY_1": "core.fsmonitor",
            "GIT_CONFIG_VALUE_1": "false",
            # commits as stored: a commit-graph file is read unchecked and can show another tree or parents
            "GIT_CONFIG_KEY_2": "core.commitGraph",
            "GIT_CONFIG_VALUE_2": "false",
            # no automatic gc (a repack) under readers in other threads: agent sessions run at once
            "GIT_CONFIG_KEY_3": "gc.auto",
            "GIT_CONFIG_VALUE_3": "0",
            "LC_ALL": "C",
            # the objects as stored: a replace ref or a graft would show other content under a judged sha
            "GIT_NO_REPLACE_OBJECTS": "1",
            "GIT_GRAFT_FILE": "/dev/null",
        }
    )
    if extra:
        env.update(extra)
    return env


def _git(
    args: list[str],
    cwd: Path | str,
    input: str | bytes | None = None,
    env: dict[str, str] | None = None,
    binary: bool = False,
) -> subprocess.CompletedProcess[Any]:
    """Run ``git args`` in ``cwd``: the one place a git process starts. Output is text decoded
    leniently (file names and contents are whatever a proposal made them) unless ``binary``."""
    decode: dict[str, Any] = {} if binary else {"text": True, "encoding": "utf-8", "errors": "replace"}
    return subprocess.run(["git", *args], cwd=str(cwd), env=_clean_env(env), input=input, capture_output=True, **decode)


def run_git(
    *args: str, cwd: Path | str, check: bool = True, input: str | None = None, env: dict[str, str] | None = None
) -> str:
    """Run ``git args`` in ``cwd``; return stdout. Raise GitError on a non-zero exit."""
    proc = _git(["-c", "commit.gpgsign=false", "-c", "core.quotepath=false", *args], cwd, input, env)
    if check and proc.returncode != 0:
        raise GitError(args, proc.returncode, proc.stdout, proc.stderr)
    return proc.stdout


def toplevel_of(path: Path) -> Path:
    """The top of the work tree at (or above) ``path``; a one-line TargetError if there is none.
    One ``git rev-parse`` (no gitpython import: read commands start fast)."""
    if not path.exists():
        raise TargetError(f"{path}: no such directory; pass an existing git repository with -C")
    proc = _git(["rev-parse", "--show-toplevel"], path if path.is_dir() else path.parent)
    top = proc.stdout.strip()
    if proc.returncode != 0 or not top:
        why = (proc.stderr.strip().splitlines() or [""])[-1].removeprefix("fatal: ")
        if "work tree" in why:  # a bare repository, or inside a .git directory
            raise TargetError(
                f"{path}: a git directory without a working tree; pass the repository's working tree with -C"
            )
        extra = "" if not why or "not a git repository" in why else f" ({why})"
        raise TargetError(f"{path}: not a git repository{extra}; run `git init` there or pass another path with -C")
    return Path(top)


def toplevel(path: Path) -> Path:
    return Path(run_git("rev-parse", "--show-toplevel", cwd=path).strip())


def common_dir(path: Path) -> Path:
    """The repository's shared git dir (the same for every worktree)."""
    out = run_git("rev-parse", "--path-format=absolute", "--git-common-dir", cwd=path).strip()
    return Path(out)


def resolve_commit(repo_dir: Path, ref: str) -> str:
    proc = _git(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], repo_dir)
    out = proc.stdout.strip()
    if not out:
        why = (proc.stderr.strip().splitlines() or [""])[-1] or (
            f"git exited with {proc.returncode}" if proc.returncode < 0 else ""
        )
        raise TargetError(f"{ref!r} is not a branch, tag or commit of {repo_dir}" + (f" ({why})" if why else ""))
    return out


def branch_exists(repo_dir: Path, branch: str) -> bool:
    return branch_commit(repo_dir, branch) is not None


def branch_commit(repo_dir: Path, branch: str) -> str | None:
    """The commit ``branch`` points to; None when there is no such branch."""
    out = run_git("rev-parse", "--verify", "--quiet", f"refs/heads/{branch}^{{commit}}", cwd=repo_dir, check=False)
    return out.strip() or None


def show_file(repo_dir: Path, commit: str, path: str) -> str | None:
    """Content of ``path`` at ``commit``, or None when it does not exist there."""
    kind = run_git("cat-file", "-t", f"{commit}:{path}", cwd=repo_dir, check=False).strip()
    if kind != "blob":
        return None
    return run_git("cat-file", "blob", f"{commit}:{path}", cwd=repo_dir)


def is_ancestor(repo_dir: Path, ancestor: str, descendant: str) -> bool:
    return _git(["merge-base", "--is-ancestor", ancestor, descendant], repo_dir).returncode == 0


def tree_of(repo_dir: Path, commit: str) -> str:
    return run_git("rev-parse", f"{commit}^{{tree}}", cwd=repo_dir).strip()


@dataclass(frozen=True)
class Change:
    """One entry of a diff: status letter (A, M, D, R, C, T) and the paths involved."""

    status: str
    paths: tuple[str, ...]


def diff_changes(repo_dir: Path, old: str, new: str) -> list[Change]:
    """Files changed between two commits, renames detected (both old and new paths listed)."""
    out = run_git("diff", "--name-status", "-z", "-M", "-C", "--no-ext-diff", old, new, cwd=repo_dir)
    items = out.split("\0")
    changes: list[Change] = []
    i = 0
    while i < len(items) and items[i]:
        status = items[i]
        letter = status[0]
        if letter in ("R", "C"):
            changes.append(Change(letter, (items[i + 1], items[i + 2])))
            i += 3
        else:
            changes.append(Change(letter, (items[i + 1],)))
            i += 2
    return changes


def diff_stat(repo_dir: Path, old: str, new: str) -> str:
    return run_git("diff", "--stat", "-M", old, new, cwd=repo_dir)


def diff_text(repo_dir: Path, old: str, new: str) -> str:
    """A patch from ``old`` to ``new`` that ``apply_patch`` can re-apply: binary files as binary
    patches, unusual file names C-quoted (ASCII) so no decoding can alter them."""
    return run_git(
        "-c", "core.quotepath=true", "diff", "-M", "--binary", "--no-ext-diff", "--no-color", old, new, cwd=repo_dir
    )


def is_clean(worktree: Path) -> bool:
    return run_git("status", "--porcelain", "-z", "--untracked-files=normal", cwd=worktree) == ""


def add_worktree(repo_dir: Path, path: Path, commit: str, branch: str | None = None) -> None:
    """Check out ``commit`` at ``path``: on a new ``branch``, or detached when branch is None."""
    if branch:
        run_git("worktree", "add", "--quiet", "-B", branch, str(path), commit, cwd=repo_dir)
    else:
        run_git("worktree", "add", "--quiet", "--detach", str(path), commit, cwd=repo_dir)


def remove_worktree(repo_dir: Path, path: Path) -> None:
    if path.exists():
        run_git("worktree", "remove", "--force", "--force", str(path), cwd=repo_dir, check=False)
        if path.exists():  # not a registered worktree (a crash mid-add): plain files
            import shutil

            shutil.rmtree(path, ignore_errors=True)
    run_git("worktree", "prune", cwd=repo_dir, check=False)


def commit_all(worktree: Path, message: str) -> str | None:
    """Stage every change in ``worktree`` and commit it; None when there is nothing to commit."""
    run_git("add", "-A", cwd=worktree)
    if not run_git("diff", "--cached", "--name-only", "-z", cwd=worktree):
        return None
    run_git("commit", "--quiet", "--no-verify", "-F", "-", cwd=worktree, input=message)
    return run_git("rev-parse", "HEAD", cwd=worktree).strip()


def commit_tree(repo_dir: Path, tree: str, parents: list[str], message: str, env: dict[str, str] | None = None) -> str:
    """A commit of ``tree`` on ``parents``; ``env``: another author and committer than agentsearch (GIT_AUTHOR_*)."""
    args = ["commit-tree", tree]
    for p in parents:
        args += ["-p", p]
    return run_git(*args, "-F", "-", cwd=repo_dir, input=message, env=env).strip()


def update_ref_cas(repo_dir: Path, ref: str, new: str, expected_old: str, reason: str) -> bool:
    """Move ``ref`` to ``new`` only if it still points at ``expected_old`` (atomic)."""
    return _git(["update-ref", "-m", reason, ref, new, expected_old], repo_dir).returncode == 0


def delete_branch(repo_dir: Path, branch: str) -> None:
    run_git("branch", "-D", branch, cwd=repo_dir, check=False)


def checked_out_branch(worktree: Path) -> str | None:
    out = run_git("symbolic-ref", "--quiet", "--short", "HEAD", cwd=worktree, check=False).strip()
    return out or None


def fast_forward_checkout(worktree: Path, old: str, new: str) -> bool:
    """Update a checked-out working tree from ``old`` to ``new`` (two-tree merge); False on conflict."""
    try:
        run_git("read-tree", "-m", "-u", old, new, cwd=worktree)
        return True
    except GitError:
        return False


def add_note(repo_dir: Path, commit: str, text: str, ref: str = "agentsearch") -> None:
    run_git("notes", f"--ref={ref}", "add", "-f", "-F", "-", commit, cwd=repo_dir, input=text)


def init_repo(path: Path, branch: str = "main") -> None:
    run_git("init", "--quiet", "-b", branch, str(path), cwd=path.parent)


def show_note(repo_dir: Path, commit: str, ref: str = "agentsearch") -> str | None:
    proc = _git(["notes", f"--ref={ref}", "show", commit], repo_dir)
    return proc.stdout if proc.returncode == 0 else None


def unquote_path(text: str) -> str:
    """A path as git prints it in a diff header: as is, or C-quoted (``"a\\tb"``) when it holds a tab, a quote, a
    backslash or a control character (non-ASCII stays as is: core.quotepath=false)."""
    if len(text) < 2 or not (text.startswith('"') and text.endswith('"')):
        return text
    raw = text[1:-1].encode("latin-1", "backslashreplace").decode("unicode_escape")
    try:
        return raw.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return raw


def changed_lines(repo_dir: Path, old: str, new: str) -> dict[str, set[int]]:
    """{path: line numbers in ``new``} of the lines added or modified between two commits.

    A ``+++`` line is a file's header only between its ``diff --git`` line and its first hunk: inside a hunk an added
    line whose text starts with ``++`` reads the same (``+++ 0``), and must not end the file's hunks. Paths git quotes
    (a tab, a quote, a backslash in the name) are unquoted."""
    out = run_git("diff", "-U0", "--no-ext-diff", "--no-color", "-M", old, new, cwd=repo_dir)
    result: dict[str, set[int]] = {}
    path: str | None = None
    header = False
    for line in out.split("\n"):  # not splitlines(): a line's text may hold U+2028 or \x1c, no line break to git
        if line.startswith("diff --git "):
            header, path = True, None
        elif header and line.startswith("+++ "):
            target = unquote_path(line[4:].rstrip("\n"))
            path = target[2:] if target.startswith("b/") else None
        elif line.startswith("@@") and path is not None:
            header = False
            # @@ -a,b +c,d @@
            plus = line.split("+", 1)[1].split(" ", 1)[0]
            start, _, count = plus.partition(",")
            n = int(count) if count else 1
            if n:
                result.setdefault(path, set()).update(range(int(start), int(start) + n))
    return result


def apply_patch(worktree: Path, patch: str) -> str:
    """Apply a plain or format-patch diff to ``worktree`` (three-way where possible).

    Returns '' on success, else the reason it does not apply (worktree left clean)."""
    proc = _git(["apply", "--3way", "--whitespace=nowarn", "-"], worktree, input=patch)
    if proc.returncode == 0 and "conflict" not in proc.stderr.lower():
        return ""
    lines = [ln.strip() for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
    errors = (
        [ln for ln in lines if ln.startswith("error:") or "conflict" in ln.lower()] or lines or ["git apply failed"]
    )
    run_git("reset", "--hard", "--quiet", cwd=worktree, check=False)
    run_git("clean", "-fdq", cwd=worktree, check=False)
    return "; ".join(dict.fromkeys(errors))[:400]


def merge_base(repo_dir: Path, a: str, b: str) -> str | None:
    out = run_git("merge-base", a, b, cwd=repo_dir, check=False).strip()
    return out or None


def branches_matching(repo_dir: Path, pattern: str) -> list[tuple[str, str]]:
    """[(branch, sha)] of local branches whose name matches the fnmatch-style ``pattern``."""
    out = run_git("for-each-ref", "--format=%(refname:short) %(objectname)", f"refs/heads/{pattern}", cwd=repo_dir)
    rows = [ln.split(" ", 1) for ln in out.splitlines() if ln.strip()]
    return sorted((name, sha) for name, sha in rows)


def commit_message(repo_dir: Path, commit: str) -> str:
    return run_git("log", "-1", "--format=%B", commit, cwd=repo_dir)


def remote_url(repo_dir: Path, remote: str) -> str | None:
    out = run_git("remote", "get-url", remote, cwd=repo_dir, check=False).strip()
    return out or None


def push(repo_dir: Path, remote: str, branch: str, force: bool = False) -> str:
    """Push ``branch`` to ``remote`` (``force``: replace what is there); '' on success, else git's last error line."""
    spec = ("+" if force else "") + f"refs/heads/{branch}:refs/heads/{branch}"
    proc = _git(["push", "--quiet", remote, spec], repo_dir)
    if proc.returncode == 0:
        return ""
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else f"exit {proc.returncode}"


def revert_merge(repo_dir: Path, worktree: Path, merge: str, message: str) -> str:
    """In ``worktree`` (checked out at the baseline tip), commit the revert of ``merge``; returns the commit.

    Raises GitError when the revert does not apply cleanly."""
    parents = run_git("rev-list", "--parents", "-n", "1", merge, cwd=repo_dir).split()
    args = ["revert", "--no-edit", "--no-commit"] + (["-m", "1"] if len(parents) > 2 else []) + [merge]
    run_git(*args, cwd=worktree)
    run_git("commit", "--quiet", "--no-verify", "-F", "-", cwd=worktree, input=message)
    return run_git("rev-parse", "HEAD", cwd=worktree).strip()


def same_commit_but_dates(repo_dir: Path, a: str, b: str) -> bool:
    """Whether commits ``a`` and ``b`` are the same but for their author and committer dates: the same tree,
    parents, identities and message, and no header one has that the other lacks (a signature, an encoding)."""

    dated = re.compile(r"^((?:author|committer) .*>) [0-9]+ [+-][0-9]{4}$", re.ASCII)

    def shape(commit: str) -> list[str] | None:
        raw = run_git("cat-file", "commit", commit, cwd=repo_dir)
        head, _, message = raw.partition("\n\n")
        lines = []
        for ln in head.split("\n"):
            if ln.startswith(("author ", "committer ")):
                m = dated.match(ln)
                if m is None:  # an identity line without a well-formed date: nothing to compare it by
                    return None
                ln = m.group(1) + " <date>"
            lines.append(ln)
        return lines + ["", message]

    sa, sb = shape(a), shape(b)
    return sa is not None and sa == sb


def first_parent(repo_dir: Path, commit: str) -> str:
    return run_git("rev-parse", f"{commit}^1", cwd=repo_dir).strip()


# ---------------------------------------------------------------------------- blobs under refs
def read_ref_blob(repo_dir: Path, ref: str) -> str | None:
    """The text of the blob ``ref`` points to; None when the ref does not exist."""
    sha = run_git("rev-parse", "--verify", "--quiet", ref, cwd=repo_dir, check=False).strip()
    return run_git("cat-file", "blob", sha, cwd=repo_dir) if sha else None


def write_ref_blob(repo_dir: Path, ref: str, text: str, reason: str) -> None:
    """Store ``text`` as a blob and point ``ref`` at it."""
    sha = run_git("hash-object", "-w", "--stdin", cwd=repo_dir, input=text).strip()
    run_git("update-ref", "-m", reason, ref, sha, cwd=repo_dir)


# ---------------------------------------------------------------------------- checkouts of a branch
def worktrees_on(repo_dir: Path, branch: str) -> list[Path]:
    """Every worktree (the main one included) that has ``branch`` checked out."""
    out = run_git("worktree", "list", "--porcelain", "-z", cwd=repo_dir)
    found, path = [], None
    for line in out.split("\0"):
        if line.startswith("worktree "):
            path = Path(line[len("worktree ") :])
        elif line == f"branch refs/heads/{branch}" and path is not None and path.is_dir():  # not a pruned one
            found.append(path)
    return found


def has_local_changes(worktree: Path) -> bool:
    """Tracked files modified, staged or unmerged (untracked files are not counted)."""
    return run_git("status", "--porcelain", "-z", "--untracked-files=no", cwd=worktree) != ""


def index_tree(worktree: Path) -> str | None:
    """The tree the index holds (written to the object store); None with unmerged entries."""
    return run_git("write-tree", cwd=worktree, check=False).strip() or None


def files_match_index(worktree: Path) -> bool:
    return run_git("diff", "--name-only", "-z", cwd=worktree) == ""


def first_parents(repo_dir: Path, commit: str, limit: int) -> list[tuple[str, str]]:
    """[(commit, tree)] along the first-parent line from ``commit``, newest first."""
    out = run_git("log", "--first-parent", f"-n{limit}", "--format=%H %T", commit, cwd=repo_dir)
    return [tuple(ln.split(" ", 1)) for ln in out.splitlines() if ln.strip()]  # type: ignore[misc]


def first_parent_line(repo_dir: Path, tip: str, since: str) -> list[tuple[str, str, tuple[str, ...]]]:
    """[(commit, tree, parents)] along ``tip``'s first-parent line, leaving out what ``since`` reaches, oldest first."""
    out = run_git("log", "--first-parent", "--reverse", "--format=%H %T %P", tip, f"^{since}", cwd=repo_dir)
    rows = [ln.split() for ln in out.splitlines() if ln.strip()]
    return [(r[0], r[1], tuple(r[2:])) for r in rows]


def object_overrides(repo_dir: Path) -> list[str]:
    """What makes git show other content under a sha than the object stored: replace refs and a grafts file."""
    out = [r for r in run_git("for-each-ref", "--format=%(refname)", "refs/replace/", cwd=repo_dir).splitlines() if r]
    common = Path(run_git("rev-parse", "--git-common-dir", cwd=repo_dir).strip())
    grafts = (common if common.is_absolute() else Path(repo_dir) / common) / "info" / "grafts"
    if grafts.exists():
        out.append(str(grafts))
    return out


def subject(repo_dir: Path, commit: str) -> str:
    """The first line of ``commit``'s message, as written (untrusted text: clean it before showing it)."""
    return run_git("log", "-1", "--format=%B", commit, cwd=repo_dir).strip("\n").split("\n", 1)[0]


def trailer_merges(repo_dir: Path, tip: str, since: str | None, key: str) -> list[tuple[str, dict[str, str]]]:
    """[(commit, {trailer: value})] of the merge commits on ``tip``'s first-parent line in ``since..tip`` whose message
    has ``key``. What a merge brought in through its second parent is not read: a pull request's own history (its
    merges, whatever trailers they forge) neither speaks for nor against the history."""
    span = [tip] + ([f"^{since}"] if since else [])
    out = run_git("log", "--first-parent", "--merges", f"--grep=^{key}:", "--format=%H%x00%B%x01", *span, cwd=repo_dir)
    found = []
    for chunk in out.split("\x01"):
        sha, _, body = chunk.strip("\n").partition("\x00")
        if sha:
            pairs = (ln.split(":", 1) for ln in body.splitlines() if ln.startswith("Agentsearch-") and ":" in ln)
            found.append((sha, {k.strip(): v.strip() for k, v in pairs}))
    return found


def run_git_bytes(*args: str, cwd: Path | str) -> bytes:
    """``run_git`` for binary output (blob contents); raises GitError on a non-zero exit."""
    proc = _git(list(args), cwd, binary=True)
    if proc.returncode != 0:
        raise GitError(
            args, proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")
        )
    return proc.stdout


def commit_files(repo_dir: Path, branch: str, files: dict[str, bytes], message: str) -> str:
    """Point ``branch`` at a new parentless commit holding exactly ``files`` (flat names -> bytes,
    stored as they are); returns the commit. For evidence that travels with a branch (plots)."""
    entries = []
    for name, data in sorted(files.items()):
        if "/" in name or not name or "\n" in name or "\t" in name:
            raise ValueError(f"flat file name expected, got {name!r}")
        proc = _git(["hash-object", "-w", "--no-filters", "--stdin"], repo_dir, input=data, binary=True)
        if proc.returncode != 0:
            raise GitError(("hash-object",), proc.returncode, "", proc.stderr.decode(errors="replace"))
        entries.append(f"100644 blob {proc.stdout.decode().strip()}\t{name}\n")
    tree = run_git("mktree", cwd=repo_dir, input="".join(entries)).strip()
    sha = commit_tree(repo_dir, tree, [], message)
    run_git("update-ref", "-m", "agentsearch: evidence", f"refs/heads/{branch}", sha, cwd=repo_dir)
    return sha


def tree_with_file(repo_dir: Path, commit: str, path: str, data: bytes, scratch: Path) -> str:
    """The tree of ``commit`` with one more file (``path``, mode 100644) written into it; ``scratch``: a directory
    for the temporary index (nothing else in the repository changes)."""
    if not path or path.startswith("/") or ".." in path.split("/") or any(c in path for c in "\n\t\0"):
        raise ValueError(f"a relative path inside the tree expected, got {path!r}")
    proc = _git(["hash-object", "-w", "--no-filters", "--stdin"], repo_dir, input=data, binary=True)
    if proc.returncode != 0:
        raise GitError(("hash-object",), proc.returncode, "", proc.stderr.decode(errors="replace"))
    blob = proc.stdout.decode().strip()
    scratch.mkdir(parents=True, exist_ok=True)
    index = {"GIT_INDEX_FILE": str(scratch / f"index-{os.getpid()}-{blob[:12]}")}
    try:
        run_git("read-tree", f"{commit}^{{tree}}", cwd=repo_dir, env=index)
        run_git("update-index", "--add", "--cacheinfo", f"100644,{blob},{path}", cwd=repo_dir, env=index)
        return run_git("write-tree", cwd=repo_dir, env=index).strip()
    finally:
        Path(index["GIT_INDEX_FILE"]).unlink(missing_ok=True)


def tree_files(repo_dir: Path, commit: str) -> list[tuple[str, str]]:
    """(mode, path) of every file in ``commit``'s tree (paths as stored, never quoted)."""
    out = []
    for item in run_git_bytes("ls-tree", "-r", "-z", "--full-tree", commit, cwd=repo_dir).split(b"\0"):
        if item:
            meta, _, path = item.partition(b"\t")
            out.append((meta.split(b" ")[0].decode(), path.decode("utf-8", "surrogateescape")))
    return out


def blob_bytes(repo_dir: Path, commit: str, path: str) -> bytes:
    """The raw committed bytes of ``path`` at ``commit`` (no attributes, filters or eol conversion)."""
    return run_git_bytes("cat-file", "blob", f"{commit}:{path}", cwd=repo_dir)


def prune_worktrees(repo_dir: Path) -> None:
    """Forget worktrees whose directories are gone (run in the repository, never in a worktree)."""
    run_git("worktree", "prune", cwd=repo_dir, check=False)


# ------------------------------------------------------------------ shipping commits to a node (git bundles)
SHIP_REFS = "refs/agentsearch/ship"


def bundle(repo_dir: Path, commits: dict[str, str], exclude: tuple[str, ...] = ()) -> bytes:
    """A git bundle (bytes) holding ``commits`` (name -> commit) under ``refs/agentsearch/ship/<name>``
    and everything they need that ``exclude`` (commits the receiver has) does not already hold."""
    tag = f"{SHIP_REFS}/{os.getpid()}"
    refs = {f"{tag}/{name}": sha for name, sha in commits.items()}
    for ref, sha in refs.items():
        run_git("update-ref", ref, sha, cwd=repo_dir)
    try:
        excluded = [f"^{x}" for x in exclude if x not in commits.values()]
        return run_git_bytes("bundle", "create", "-q", "-", *refs, *excluded, cwd=repo_dir)
    finally:
        for ref in refs:
            run_git("update-ref", "-d", ref, cwd=repo_dir, check=False)


def has_commit(repo_dir: Path, commit: str) -> bool:
    return _git(["cat-file", "-e", f"{commit}^{{commit}}"], repo_dir).returncode == 0


def fetch_bundle(repo_dir: Path, data: bytes, scratch: Path) -> None:
    """Fetch every commit of the bundle ``data`` into ``repo_dir`` (kept under ``refs/agentsearch/ship/``);
    a GitError if the bundle needs commits the repository lacks."""
    scratch.mkdir(parents=True, exist_ok=True)
    path = scratch / f"ship-{os.getpid()}.bundle"
    path.write_bytes(data)
    try:
        run_git("fetch", "-q", "--no-tags", str(path), f"+{SHIP_REFS}/*:{SHIP_REFS}/received/*", cwd=repo_dir)
    finally:
        path.unlink(missing_ok=True)


def init_cache_clone(path: Path, branch: str) -> None:
    """An empty repository (no checkout needed) whose HEAD names ``branch``: a node's cache of the target."""
    path.mkdir(parents=True, exist_ok=True)
    if not (path / ".git").exists():
        run_git("init", "-q", "-b", branch, cwd=path)


def point_branch(repo_dir: Path, branch: str, commit: str) -> None:
    """Set ``branch`` to ``commit`` and make it HEAD (a node's cache clone follows the judged baseline)."""
    run_git("update-ref", f"refs/heads/{branch}", commit, cwd=repo_dir)
    run_git("symbolic-ref", "HEAD", f"refs/heads/{branch}", cwd=repo_dir)

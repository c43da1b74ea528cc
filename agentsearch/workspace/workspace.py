"""A target repository prepared for agentsearch: state dir, lock, proposal branches, CAS merge.

The state directory lives inside the repository's common git dir (``.git/agentsearch``),
outside every worktree; proposal and measurement worktrees live in
``.git/agentsearch-worktrees`` — never inside the state directory.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..config import CONFIG_FILE, Config, load_config_text
from ..errors import CasError, TargetError
from ..globs import first_match
from . import git
from .lock import WorkspaceLock

STATE_DIR = "agentsearch"
WORKTREES_DIR = "agentsearch-worktrees"
STATE_SCHEMA = 1
REFERENCE_REF = (
    "refs/agentsearch/reference"  # the stock commit outputs are judged against ([verify] reference); no merge moves it
)
LAG_SEARCH = 50  # how far back along the baseline a lagging checkout is recognised


@dataclass(frozen=True)
class Proposal:
    """A proposal's place in git: its branch, worktree and the baseline it starts from."""

    episode: str
    number: int
    slug: str
    branch: str
    worktree: Path
    base: str

    @property
    def id(self) -> str:
        return f"{self.episode}/{self.number:03d}"


@dataclass(frozen=True)
class Violation:
    path: str
    pattern: str
    status: str


def slugify(text: str, limit: int = 40) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return (slug[:limit].rstrip("-")) or "proposal"


def new_episode_id() -> str:
    return time.strftime("e%Y%m%d-%H%M%S", time.gmtime()) + f"-{os.getpid() % 1000:03d}"


class Workspace:
    def __init__(self, repo_dir: Path, common: Path):
        self.repo_dir = repo_dir
        self.common = common
        self.state = common / STATE_DIR
        self.worktrees = common / WORKTREES_DIR
        self.reference_override: str | None = None  # a Ray node's cache clone: the reference the orchestrator resolved

    # ------------------------------------------------------------------ opening
    @classmethod
    def locate(cls, target: Path) -> Workspace:
        top = git.toplevel_of(target.resolve()).resolve()
        return cls(top, git.common_dir(top))

    @classmethod
    def open(cls, target: Path) -> Workspace:
        ws = cls.locate(target)
        if not (ws.state / "state.json").exists():
            raise TargetError(
                f"{ws.repo_dir}: not an agentsearch workspace; run `agentsearch init -C {ws.repo_dir}` first"
            )
        return ws

    @classmethod
    def init(cls, target: Path) -> Workspace:
        """Validate the target and create its state directory (idempotent)."""
        ws = cls.locate(target)
        if not git.is_clean(ws.repo_dir):
            raise TargetError(f"{ws.repo_dir}: the working tree has uncommitted changes; commit or stash them first")
        text = ws.read_config_text_from_head()
        config = load_config_text(text, f"{ws.repo_dir / CONFIG_FILE}")
        baseline = config.target.baseline
        if not git.branch_exists(ws.repo_dir, baseline):
            raise TargetError(
                f"{ws.repo_dir}: baseline branch {baseline!r} does not exist; create it or set [target] baseline"
            )
        ws.config()  # the baseline's own copy must be valid too
        ws.state.mkdir(parents=True, exist_ok=True)
        ws.worktrees.mkdir(parents=True, exist_ok=True)
        (ws.state / "tmp").mkdir(exist_ok=True)
        state_file = ws.state / "state.json"
        if not state_file.exists():
            _atomic_write(state_file, json.dumps({"v": STATE_SCHEMA, "created": time.time(), "repo": str(ws.repo_dir)}))
        if not ws.pinned_reference():
            # the stock commit: what the outputs are judged against besides the baseline (a later init keeps it)
            git.run_git("update-ref", REFERENCE_REF, git.resolve_commit(ws.repo_dir, baseline), "", cwd=ws.repo_dir)
        return ws

    def pinned_reference(self) -> str:
        """The commit ``init`` pinned as the reference ('' in a workspace made before agentsearch 0.3)."""
        return git.run_git(
            "rev-parse", "--verify", "--quiet", f"{REFERENCE_REF}^{{commit}}", cwd=self.repo_dir, check=False
        ).strip()

    def reference_commit(self, config: Config | None = None, base: str | None = None) -> str:
        """The commit outputs are judged against: ``[verify] reference``, else the pinned stock commit. TargetError
        (one line) when there is none or it is not an ancestor of the baseline."""
        config = config or self.config()
        want = config.verify.reference if config.verify is not None else ""
        if self.reference_override:
            commit, named = self.reference_override, "the orchestrator's reference"
        elif want:
            commit = git.resolve_commit(self.repo_dir, want)
            named = f"[verify] reference {want!r}"
        else:
            commit = self.pinned_reference()
            named = f"the pinned reference ({REFERENCE_REF})"
            if not commit:
                raise TargetError(
                    f"{self.repo_dir}: no reference is pinned (a workspace from before agentsearch 0.3): run "
                    f"`agentsearch init -C {self.repo_dir}` to pin the current baseline, or set [verify] reference"
                )
        base = base or self.baseline_commit()
        if not git.is_ancestor(self.repo_dir, commit, base):
            raise TargetError(
                f"{named} = {commit[:12]} is not an ancestor of the baseline {base[:12]}: outputs are judged against "
                "the stock code main grew from; name an ancestor of the baseline"
            )
        return commit

    def read_config_text_from_head(self) -> str:
        path = self.repo_dir / CONFIG_FILE
        head = git.run_git("rev-parse", "--verify", "--quiet", "HEAD", cwd=self.repo_dir, check=False).strip()
        text = git.show_file(self.repo_dir, head, CONFIG_FILE) if head else None
        if text is None:
            raise TargetError(
                f"{path}: no {CONFIG_FILE} committed; add one (see docs/guide/own-target.md and "
                "docs/reference/config.md)"
            )
        return text

    # ------------------------------------------------------------------ config / refs
    @property
    def baseline_branch(self) -> str:
        return self.config().target.baseline

    def config(self, commit: str | None = None) -> Config:
        """The config as committed on the baseline branch (or at ``commit``)."""
        if commit is None:
            text = self.read_config_text_from_head()
            branch = load_config_text(text, CONFIG_FILE).target.baseline
            if not git.branch_exists(self.repo_dir, branch):
                raise TargetError(f"baseline branch {branch!r} does not exist in {self.repo_dir}")
            commit = git.resolve_commit(self.repo_dir, branch)
        committed = git.show_file(self.repo_dir, commit, CONFIG_FILE)
        if committed is None:
            raise TargetError(f"{CONFIG_FILE} is missing at {commit[:12]}; the baseline must carry it")
        return load_config_text(committed, f"{CONFIG_FILE}@{commit[:12]}")

    def baseline_commit(self) -> str:
        return git.resolve_commit(self.repo_dir, self.baseline_branch)

    def resolve(self, ref: str) -> str:
        return git.resolve_commit(self.repo_dir, ref)

    def lock(self) -> WorkspaceLock:
        return WorkspaceLock(self.state / "lock")

    # ------------------------------------------------------------------ proposals
    def create_proposal(self, episode: str, number: int, title: str, base: str | None = None) -> Proposal:
        base = base or self.baseline_commit()
        slug = slugify(title)
        branch = f"agentsearch/{episode}/{number:03d}-{slug}"
        path = self.worktrees / f"{episode}-{number:03d}"
        # idempotent: a crash may have left this proposal's worktree or branch half made
        git.remove_worktree(self.repo_dir, path)
        git.add_worktree(self.repo_dir, path, base, branch=branch)
        return Proposal(episode, number, slug, branch, path, base)

    def commit_proposal(
        self, proposal: Proposal, title: str, rationale: str = "", proposer: str = "human"
    ) -> str | None:
        """The orchestrator commits the proposal's changes, with trailers. None: no change."""
        body = f"{title.strip()}\n\n{rationale.strip()}\n\n" if rationale.strip() else f"{title.strip()}\n\n"
        message = body + (
            f"Agentsearch-Proposal: {proposal.id}\n"
            f"Agentsearch-Episode: {proposal.episode}\n"
            f"Agentsearch-Baseline: {proposal.base}\n"
            f"Agentsearch-Proposer: {proposer}\n"
        )
        return git.commit_all(proposal.worktree, message)

    def protected_violations(self, base: str, commit: str, config: Config | None = None) -> list[Violation]:
        """Every changed path (both sides of renames, deletions included) under a protected glob."""
        config = config or self.config(base)
        patterns = (CONFIG_FILE, *config.target.protected)
        out = []
        for change in git.diff_changes(self.repo_dir, base, commit):
            for path in change.paths:
                hit = first_match(path, patterns)
                if hit:
                    out.append(Violation(path, hit, change.status))
        return out

    def remove_worktree(self, path: Path) -> None:
        git.remove_worktree(self.repo_dir, path)

    def add_measurement_worktree(self, commit: str, name: str) -> Path:
        """A detached worktree of ``commit`` (nothing installed: ``sides`` does that, contained)."""
        path = self.worktrees / name
        if path.exists():
            git.remove_worktree(self.repo_dir, path)
        git.add_worktree(self.repo_dir, path, commit)
        return path

    # ------------------------------------------------------------------ merge
    def merge(self, candidate: str, expected_base: str, message: str) -> str:
        """Advance the baseline to a merge of ``candidate`` — only if it still is ``expected_base``.

        The candidate must contain ``expected_base`` (it was measured as is), so the merge
        commit's tree is the candidate's tree. Raises CasError if the baseline moved.
        """
        branch = self.baseline_branch
        if not git.is_ancestor(self.repo_dir, expected_base, candidate):
            raise CasError(f"{candidate[:12]} is not based on the baseline {expected_base[:12]}; rebase it first")
        self.refuse_dirty_checkouts(branch)
        tree = git.tree_of(self.repo_dir, candidate)
        merge_commit = git.commit_tree(self.repo_dir, tree, [expected_base, candidate], message)
        if not git.update_ref_cas(
            self.repo_dir, f"refs/heads/{branch}", merge_commit, expected_base, f"agentsearch: merge {candidate[:12]}"
        ):
            now = self.baseline_commit()
            raise CasError(
                f"baseline {branch!r} moved from {expected_base[:12]} to {now[:12]} during the evaluation; not merged "
                "(re-evaluate against the new baseline)"
            )
        self._sync_checkout(branch, expected_base, merge_commit)
        return merge_commit

    def revert(self, merge: str, message: str, prepared: str | None = None) -> tuple[str, str]:
        """Revert ``merge`` on the baseline with a new commit (CAS); returns (old tip, new tip).

        ``prepared``: a revert commit made earlier (`pr --revert`'s branch, the head of its pull request). It lands
        instead of the new one when it is exactly that revert: the same tree, parent (the tip), author, committer
        and message, no other header; only the dates may differ."""
        branch = self.baseline_branch
        if not git.is_ancestor(self.repo_dir, merge, self.baseline_commit()):
            raise TargetError(f"{merge[:12]} is not on the baseline {branch!r}; nothing to revert")
        self.refuse_dirty_checkouts(branch)
        tip, new = self.revert_commit(merge, message)
        if prepared and git.same_commit_but_dates(self.repo_dir, prepared, new):
            new = prepared
        if not git.update_ref_cas(self.repo_dir, f"refs/heads/{branch}", new, tip, f"agentsearch: revert {merge[:12]}"):
            raise CasError(f"baseline {branch!r} moved during the revert; run it again")
        self._sync_checkout(branch, tip, new)
        return tip, new

    def revert_commit(self, merge: str, message: str) -> tuple[str, str]:
        """A commit on top of the baseline's tip that reverts ``merge``, on no branch; returns (tip, the commit).

        Raises TargetError when ``merge`` is not on the baseline or its revert does not apply cleanly."""
        from ..errors import GitError

        branch = self.baseline_branch
        tip = self.baseline_commit()
        if not git.is_ancestor(self.repo_dir, merge, tip):
            raise TargetError(f"{merge[:12]} is not on the baseline {branch!r}; nothing to revert")
        path = self.worktrees / f"revert-{merge[:12]}"
        git.remove_worktree(self.repo_dir, path)
        git.add_worktree(self.repo_dir, path, tip)
        try:
            try:
                new = git.revert_merge(self.repo_dir, path, merge, message)
            except GitError as exc:
                raise TargetError(
                    f"the revert of {merge[:12]} does not apply cleanly on the baseline {tip[:12]} ({exc}); revert it "
                    "by hand"
                ) from None
        finally:
            git.remove_worktree(self.repo_dir, path)
        return tip, new

    # ------------------------------------------------------------------ checkouts of the baseline
    def refuse_dirty_checkouts(self, branch: str) -> None:
        """Refuse to move ``branch`` under a checkout of it with uncommitted changes.

        Its files could not follow the branch, and a later commit there would undo the move."""
        for path in git.worktrees_on(self.repo_dir, branch):
            if git.has_local_changes(path):
                raise TargetError(
                    f"the baseline {branch!r} is checked out at {path} with uncommitted changes; the baseline was not "
                    f"moved: commit or stash them there, then run again (an episode: `agentsearch episode --resume`)"
                )

    def _sync_checkout(self, branch: str, old: str, new: str) -> None:
        """Bring every checkout of the baseline branch from ``old`` to ``new`` (safe two-tree merge)."""
        for path in git.worktrees_on(self.repo_dir, branch):
            if not git.fast_forward_checkout(path, old, new):
                _warn(_lag_warning(path, branch, old, new))

    def sync_checkouts(self) -> None:
        """Bring along every checkout of the baseline whose files lag the branch tip (a sync cut off).

        A lagging checkout: its index is the tree of an earlier commit of the branch and its
        files match its index. One that cannot be brought along gets a one-line warning."""
        branch = self.baseline_branch
        tip = self.baseline_commit()
        for path in git.worktrees_on(self.repo_dir, branch):
            tree = git.index_tree(path)
            if tree is None or tree == git.tree_of(self.repo_dir, tip):
                continue
            old = next((c for c, t in git.first_parents(self.repo_dir, tip, LAG_SEARCH)[1:] if t == tree), None)
            if old is None:
                continue  # staged work of the user's, not a lag; a merge refuses it
            if git.files_match_index(path) and git.fast_forward_checkout(path, old, tip):
                _tell(
                    f"brought the checkout at {path} from {old[:12]} to {branch!r} at {tip[:12]} (its update had been "
                    "cut off)"
                )
            else:
                _warn(_lag_warning(path, branch, old, tip))


def _lag_warning(path: Path, branch: str, old: str, new: str) -> str:
    return (
        f"warning: the checkout at {path} still has the files of {old[:12]} while {branch!r} is at {new[:12]}; a "
        f"commit there would undo the difference; bring it along with `git -C {path} read-tree -m -u {old[:12]} "
        f"{new[:12]}` (it refuses rather than overwrite your edits)"
    )


def _tell(message: str) -> None:
    """One line to stderr: the workspace reports what it repaired or could not."""
    sys.stderr.write(f"agentsearch: {message}\n")
    sys.stderr.flush()


_warn = _tell


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


atomic_write = _atomic_write

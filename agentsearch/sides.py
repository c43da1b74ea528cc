"""The two sides of a comparison, prepared and contained: one place for what evaluate, calibrate,
verify and profile all do before they measure.

``sides(ws, config, commits, tag, decision)`` refuses a side that touches a protected path (before
anything is checked out), checks out one worktree per side with the **baseline's** config (whatever
the side's own ``agentsearch.toml`` says), and lays out the scratch directory::

    <scratch>/out/<side>   that side's outputs: writable only inside that side's sandbox
    <scratch>/in           inputs the orchestrator writes (prompts): read-only for both sides
    <scratch>/logs         engine and server logs: written through file descriptors, never mounted
    <scratch>/pinned       protected files as committed on the baseline (raw blobs, no git filters)

``Sides.build()`` links overlays, makes one sandbox per side (``harness.sandbox``: only its own
worktree and output directory writable, protected files and linked compiled files bound read-only
from the pinned copies) and runs build commands inside it. From then on every child started under
the block runs in its side's sandbox. ``Sides.check()`` says whether either worktree changed since
it was built (a trial that modifies a worktree is rejected); worktrees and scratch are removed on
exit, whatever happened.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import coverage, models, sandbox
from harness.engine_session import WORKER
from harness.serve_session import SERVER
from harness.trials import BASELINE, child_env, run_child, tail
from kernels.catalog import ROOT as KERNELS_DIR

from .config import CONFIG_FILE, Config
from .containment import Decision
from .errors import AgentsearchError
from .globs import first_match
from .workspace import Workspace, git
from .workspace.install import link_overlay

BUILD_TIMEOUT_S = 3600.0
Snapshot = dict[
    str, tuple[int, int, int, int, int, int]
]  # relative path -> (mode, size, mtime_ns, ctime_ns, inode, atime_ns)
# access times are set this far ahead once a worktree is built: under relatime (or noatime) a read then never
# moves them, so an access time that moved is a write of state (red team, round 3: a one-bit cache in an atime)
ATIME_AHEAD_NS = 30 * 86400 * 10**9


class ProtectedPathError(AgentsearchError):
    """A side changes a protected path: nothing of it may run."""


class BuildError(AgentsearchError):
    def __init__(self, side: str, message: str):
        super().__init__(f"{side}: {message}")
        self.side = side


def _shared(st: os.stat_result) -> bool:
    """A file hard-linked from elsewhere (compiled files from site-packages; bound read-only in the sandbox):
    its ctime and atime move whenever anyone links, unlinks or reads it, so they say nothing here."""
    return stat.S_ISREG(st.st_mode) and st.st_nlink > 1


def walk_tree(root: Path | str) -> Iterator[tuple[str, list[str], list[str]]]:
    """``os.walk(root)`` top-down, links not followed (a link to a directory is among the files), names sorted —
    without recursion: os.walk and shutil.rmtree recurse in Python 3.11, and a tree a few thousand directories
    deep that a side made raised RecursionError out of the snapshot, the copy and the clean-up (red team, agents)."""
    stack = [os.fspath(root)]
    while stack:
        d = stack.pop()
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError:
            continue
        dirs = [e.name for e in entries if e.is_dir(follow_symlinks=False)]
        yield d, dirs, [e.name for e in entries if not e.is_dir(follow_symlinks=False)]
        stack.extend(os.path.join(d, n) for n in reversed(dirs))


def remove_tree(path: Path | str) -> None:
    """Remove a tree a side may have written, never following a link in it, however deep (coreutils ``rm -rf``
    walks without recursion); shutil.rmtree where rm is missing. Never raises."""
    p = os.fspath(path)
    if not os.path.lexists(p):
        return
    try:
        subprocess.run(["rm", "-rf", "--", p], capture_output=True, timeout=600)
    except (OSError, subprocess.SubprocessError):
        pass
    if os.path.lexists(p):
        try:
            shutil.rmtree(p, ignore_errors=True)
        except RecursionError:
            pass


def _walk(root: Path) -> Iterator[tuple[str, str]]:
    """(relative path, path) of ``root`` and of every entry under it, links not followed."""
    yield ".", str(root)
    for dirpath, dirnames, filenames in walk_tree(root):
        rel_dir = os.path.relpath(dirpath, root)
        for name in dirnames + filenames:
            yield (name if rel_dir == "." else f"{rel_dir}/{name}"), os.path.join(dirpath, name)


def snapshot(root: Path) -> Snapshot:
    """Every file, link and directory under ``root`` — its ``.git`` link included — with what identifies
    its content and metadata. The change time (ctime) moves with every write, rename, chmod, utime or
    extended attribute and cannot be set back, so an edit disguised by restoring size and mtime still
    shows. The access time is kept too: ``freeze_access_times`` set it ahead, so a read does not move it,
    and one that moved was written (a bit kept for the next trial). Bytecode is never written there
    (PYTHONDONTWRITEBYTECODE): a new ``.pyc`` is a change too."""
    out: Snapshot = {}
    for rel, path in _walk(root):
        st = os.lstat(path)
        shared = _shared(st)
        out[rel] = (
            st.st_mode,
            0 if rel == "." else st.st_size,
            st.st_mtime_ns,
            0 if shared else st.st_ctime_ns,
            st.st_ino,
            0 if shared else st.st_atime_ns,
        )
    return out


class AccessTimeError(AgentsearchError):
    """The scratch filesystem moves access times on every read: an access time cannot be kept still."""


def freeze_access_times(root: Path) -> None:
    """Set the access time of everything under ``root`` (shared compiled files aside) ``ATIME_AHEAD_NS``
    ahead of now, keeping its mtime. Under ``relatime`` a read moves an access time only when it is not
    after the modification and change times or is a day old, so from here on no read moves them and the
    snapshot can hold them still. A filesystem mounted ``strictatime`` moves them on every read: refused
    (one line), since a trial could then keep a bit in them unseen, or every honest trial would fail."""
    ahead = time.time_ns() + ATIME_AHEAD_NS
    probe = None
    for _rel, path in _walk(root):
        st = os.lstat(path)
        if _shared(st):
            continue
        os.utime(path, ns=(ahead, st.st_mtime_ns), follow_symlinks=False)
        if probe is None and stat.S_ISREG(st.st_mode) and os.access(path, os.R_OK):
            probe = path
    if probe is not None:
        with open(probe, "rb") as fh:
            fh.read(1)
        if os.lstat(probe).st_atime_ns != ahead:
            raise AccessTimeError(
                f"the filesystem under {root} updates access times on every read (strictatime); "
                "mount it relatime or noatime"
            )


def describe_change(before: Snapshot, after: Snapshot) -> str:
    """'' when equal, else the first few differences in words."""
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    both = set(before) & set(after)
    changed = sorted(p for p in both if before[p][:5] != after[p][:5])
    # only the access time moved: no read does that here (freeze_access_times), so it was set to keep state
    atime = sorted(p for p in both if before[p][:5] == after[p][:5] and before[p] != after[p])
    parts = [
        f"{what} {', '.join(map(repr, paths[:3]))}{' …' if len(paths) > 3 else ''}"
        for what, paths in (
            ("added", added),
            ("removed", removed),
            ("changed", changed),
            ("access time moved (state kept in access times) on", atime),
        )
        if paths
    ]
    return "; ".join(parts)


RESOLVER = f"{BASELINE}/resolve/"  # EnginePool key prefix of a kept baseline's resolving worker (not an engine)


def is_resolver(key: str) -> bool:
    """Whether an EnginePool key is a baseline side's resolving worker (``workloads.resolve_sides``), kept warm with
    the side between decisions."""
    return key.startswith(RESOLVER)


@dataclass
class KeptBaseline:
    """The baseline side as an evaluation built it, kept for the next one (``agentsearch.warm_baseline``)."""

    commit: str
    key: str  # what it was built under (config, environment, placement): reused only under the same
    worktree: Path
    git_link: str
    snapshot: Snapshot
    pins: list[str]  # the protected files pinned under <scratch>/pinned
    sandbox: sandbox.Sandbox | None
    engines: dict[str, Any] = field(default_factory=dict)  # EnginePool key -> warm engine (parked)
    uses: dict[str, int] = field(default_factory=dict)  # EnginePool key -> evaluations served
    evaluations: int = 0
    # what its own vLLM resolved for it (``workloads.resolve_sides``: key -> resolution): the same side, arguments
    # and environment resolve the same, so the next serving-only decision resolves the candidate alone
    resolutions: dict[str, Any] = field(default_factory=dict)


@dataclass
class Sides:
    ws: Workspace
    config: Config
    commits: Mapping[str, str]  # side -> commit
    scratch: Path
    tag: str
    decision: Decision
    read_only: Sequence[str] = ()
    worktrees: dict[str, Path] = field(default_factory=dict)
    sandboxes: dict[str, sandbox.Sandbox] = field(default_factory=dict)
    snapshots: dict[str, Snapshot] = field(default_factory=dict)
    git_links: dict[str, str] = field(default_factory=dict)  # side -> its worktree's .git file as created
    kept: KeptBaseline | None = None  # the baseline side an earlier evaluation built (reused as is)
    keep_baseline: bool = False  # close() leaves the baseline side (worktree, scratch) for the next evaluation
    pins: list[str] = field(default_factory=list)
    resolutions: dict[str, Any] = field(default_factory=dict)  # the baseline side's resolutions (KeptBaseline's)
    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    # ------------------------------------------------------------------ layout
    def out(self, side: str) -> Path:
        return self.scratch / "out" / opaque(self.ws, self.tag, "out", side)

    def label(self, side: str) -> str:
        """``side`` in a file name a child may see (its log, as its stdout): says nothing of the side."""
        return opaque(self.ws, self.tag, "label", side)[:12]

    def worktree_name(self, side: str) -> str:
        return f"m-{opaque(self.ws, self.tag, 'worktree', side)}"

    @property
    def inputs(self) -> Path:
        return self.scratch / "in"

    @property
    def logs(self) -> Path:
        return self.scratch / "logs"

    @property
    def pinned(self) -> Path:
        return self.scratch / "pinned"

    # ------------------------------------------------------------------ build
    def build(self) -> None:
        """Check out, link, contain and build every side. Raises BuildError naming the side."""
        for d in (self.inputs, self.logs, self.pinned, *(self.out(s) for s in self.commits)):
            d.mkdir(parents=True, exist_ok=True)
        target = self.config.target
        kept = self.kept
        if kept is not None:  # the baseline side as the last evaluation left it (checked unchanged by the lender)
            self.worktrees[BASELINE], self.git_links[BASELINE] = kept.worktree, kept.git_link
            self.resolutions = dict(kept.resolutions)
            for d in (self.inputs, *(self.out(s) for s in self.commits if s != BASELINE)):
                _empty(d)  # only what this evaluation writes
        for side, commit in self.commits.items():
            if kept is not None and side == BASELINE:
                continue
            try:
                self.worktrees[side] = self.ws.add_measurement_worktree(commit, self.worktree_name(side))
                self.git_links[side] = (self.worktrees[side] / ".git").read_text()
                if target.install == "overlay":
                    assert target.overlay_from
                    link_overlay(self.worktrees[side], Path(target.overlay_from))
            except (AgentsearchError, OSError, subprocess.SubprocessError) as exc:
                raise BuildError(side, str(exc)) from None
        pins = self.pins = kept.pins if kept is not None else self._pin_protected()
        linked = {side: linked_files(wt) for side, wt in self.worktrees.items()}  # the overlay's compiled files
        if self.decision.use:
            ro = (
                *self.read_only,
                str(self.inputs),
                str(WORKER),
                str(SERVER),
                str(coverage.TRACER_DIR),
                str(KERNELS_DIR),
                *model_dirs(self.config),
            )
            for side, wt in self.worktrees.items():
                if kept is not None and side == BASELINE and kept.sandbox is not None:
                    self.sandboxes[side] = kept.sandbox
                    continue
                pinned = tuple((str(self.pinned / rel), str(wt / rel)) for rel in pins)
                pinned += tuple((str(wt / rel), str(wt / rel)) for rel in linked[side])
                self.sandboxes[side] = sandbox.Sandbox(
                    worktree=str(wt.resolve()),
                    outputs=str(self.out(side)),
                    read_only=tuple(dict.fromkeys(ro)),
                    pinned=pinned,
                )
            self._stack.enter_context(
                sandbox.use(
                    sandbox.Containment({str(self.worktrees[s].resolve()): sb for s, sb in self.sandboxes.items()})
                )
            )
        if target.install == "command":
            for side, wt in self.worktrees.items():
                if kept is None or side != BASELINE:
                    self._build_command(side, wt)
                    # a file with a second name escapes the snapshot's eye (a shared file's times say nothing)
                    # and is not pinned: a build may not make one (red team, round 3)
                    stray = sorted(set(linked_files(wt)) - set(linked[side]))
                    if stray:
                        raise BuildError(
                            side,
                            f"the build left hard-linked files in the worktree ({', '.join(map(repr, stray[:3]))}"
                            f"{' …' if len(stray) > 3 else ''}): a file with two names could change unseen",
                        )
        try:
            for side, wt in self.worktrees.items():
                if kept is None or side != BASELINE:
                    freeze_access_times(wt)
        except OSError as exc:
            raise BuildError("worktree", f"could not set access times: {exc}") from None
        self.snapshots = {side: snapshot(wt) for side, wt in self.worktrees.items()}

    def baseline_side(self, key: str) -> KeptBaseline:
        """The built baseline side, to keep for the next evaluation (its engines added by the caller)."""
        k = self.kept
        return KeptBaseline(
            commit=self.commits[BASELINE],
            key=key,
            worktree=self.worktrees[BASELINE],
            git_link=self.git_links[BASELINE],
            snapshot=self.snapshots[BASELINE],
            pins=list(self.pins),
            sandbox=self.sandboxes.get(BASELINE),
            uses=dict(k.uses) if k else {},
            evaluations=k.evaluations if k else 0,
            resolutions=dict(self.resolutions),
        )

    def _build_command(self, side: str, wt: Path) -> None:
        build = self.config.target.build
        assert build
        env = child_env(dict(self.config.target.env), wt, None, self.out(side) / "build")
        rc, out, err, _wall = run_child(build, wt, env, BUILD_TIMEOUT_S, shell=True)
        if rc is None:
            raise BuildError(side, f"build timed out after {BUILD_TIMEOUT_S:g} s")
        if rc != 0:
            raise BuildError(side, f"build failed (exit {rc}): {tail(err or out, 1) or 'no output'}")

    def _pin_protected(self) -> list[str]:
        """Write the baseline's protected files (raw committed bytes) to ``pinned``; their paths."""
        return pin_protected(self.ws, self.config, self.commits.get(BASELINE) or self.ws.baseline_commit(), self.pinned)

    # ------------------------------------------------------------------ checks
    def check(self) -> str:
        """'' when no worktree changed since it was built, else what changed where."""
        for side, before in self.snapshots.items():
            what = describe_change(before, snapshot(self.worktrees[side]))
            if what:
                return f"worktree modified during a trial: {side}: {what}"
        return ""

    @contextlib.contextmanager
    def disposable_copy(self, side: str, name: str) -> Iterator[Path]:
        """A copy of ``side``'s built worktree under the scratch directory, in a sandbox of its own with the side's
        policy (the same protected files pinned read-only, the same outputs), removed on exit. What runs there —
        the functional tests — leaves nothing in the worktree the trials measure: no file, no time, no mode, not
        even the trace of an undo (red team, round 3: a directory's mtime set by the tests survived the undo and
        told every later trial that the tests had run)."""
        wt = self.worktrees[side]
        dst = self.scratch / f"c-{opaque(self.ws, self.tag, name, side)}"
        remove_tree(dst)
        try:
            _copy_tree(wt, dst)
            sb = self.sandboxes.get(side)
            if sb is None:
                yield dst
                return
            root, new = str(wt.resolve()), str(dst.resolve())

            def moved(path: str) -> str:
                return new + path[len(root) :] if path == root or path.startswith(root + "/") else path

            box = dataclasses.replace(sb, worktree=new, pinned=tuple((moved(src), moved(p)) for src, p in sb.pinned))
            with sandbox.use(sandbox.Containment({new: box})):
                yield dst
        finally:
            remove_tree(dst)  # never follows a link the run left there

    def fresh_outputs(self, side: str, keep: str = "") -> None:
        """Empty ``side``'s output directory (but its entry ``keep``) before a trial: nothing a run left
        there — a cache, a precomputed table — is there for the next one."""
        root = self.out(side)
        for entry in os.scandir(root) if root.is_dir() else ():
            if entry.name == keep:
                continue
            if entry.is_dir(follow_symlinks=False):
                remove_tree(entry.path)
            else:
                os.unlink(entry.path)

    def release(self) -> None:
        """Undo what was entered on the way in (mounts, processes), keeping the worktrees and the scratch directory."""
        self._stack.close()

    def close(self) -> None:
        """Remove the worktrees and the scratch directory (``keep_baseline``: all but the baseline's)."""
        try:
            self._stack.close()
        finally:
            for side in self.commits:
                if self.keep_baseline and side == BASELINE:
                    continue
                path = self.worktrees.get(side)
                if path is None:  # interrupted while git was still making it: no side code ever ran there
                    self.ws.remove_worktree(self.ws.worktrees / self.worktree_name(side))
                    continue
                remove_worktree(self.ws, path, self.git_links.get(side, ""))
            if self.keep_baseline:
                for side in self.commits:
                    if side != BASELINE:
                        remove_tree(self.out(side))
            else:
                remove_tree(self.scratch)


def pin_protected(ws: Workspace, config: Config, base: str, dest: Path) -> list[str]:
    """Write ``base``'s protected files (raw committed bytes) under ``dest``; their paths. A sandbox binds
    them read-only over a worktree's copies: whatever runs there reads the baseline's and cannot change them."""
    patterns = (CONFIG_FILE, *config.target.protected)
    rels = []
    for mode, rel in git.tree_files(ws.repo_dir, base):
        if mode.startswith("160") or not first_match(rel, patterns):
            continue  # submodules are not files
        dst = dest / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if mode == "120000":
            os.symlink(git.blob_bytes(ws.repo_dir, base, rel).decode("utf-8", "surrogateescape"), dst)
        else:
            dst.write_bytes(git.blob_bytes(ws.repo_dir, base, rel))
            dst.chmod(0o755 if mode == "100755" else 0o644)
        rels.append(rel)
    return rels


def remove_worktree(ws: Workspace, path: Path, link: str) -> None:
    """Remove a measurement worktree as plain files, its administrative directory too, then prune it from
    the repository: git never runs inside a worktree a side could have tampered with."""
    admin_root = (ws.common / "worktrees").resolve()
    remove_tree(path)
    admin = Path(link.split("gitdir:", 1)[1].strip()).resolve() if "gitdir:" in link else None
    if admin is not None and admin.parent == admin_root:
        remove_tree(admin)
    git.prune_worktrees(ws.repo_dir)


def _empty(root: Path) -> None:
    for entry in os.scandir(root) if root.is_dir() else ():
        if entry.is_dir(follow_symlinks=False):
            remove_tree(entry.path)
        else:
            os.unlink(entry.path)


def _copy_tree(src: Path, dst: Path) -> None:
    """``src`` copied to ``dst``: directories, links (as links), regular files with their content, mode and times;
    a file with other names (a compiled file linked from site-packages, bound read-only) is linked, not copied."""
    dst.mkdir(parents=True)
    for dirpath, dirnames, filenames in walk_tree(src):
        rel = os.path.relpath(dirpath, src)
        out = dst if rel == "." else dst / rel
        for name in dirnames + filenames:
            s, d = os.path.join(dirpath, name), out / name
            st = os.lstat(s)
            if stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(s), d)
            elif stat.S_ISDIR(st.st_mode):
                d.mkdir()
            elif stat.S_ISREG(st.st_mode):
                if st.st_nlink > 1:
                    os.link(s, d)
                else:
                    shutil.copy2(s, d, follow_symlinks=False)


def linked_files(worktree: Path) -> list[str]:
    """Files in the worktree that are hard links to files elsewhere (compiled files from site-packages)."""
    return [rel for rel, path in _walk(worktree) if rel != "." and _shared(os.lstat(path))]


def model_dirs(config: Config) -> list[str]:
    """Model directories the workloads and [verify] read (mounted read-only)."""
    names = {w.model for w in config.workloads if w.spec.engine}
    if config.verify is not None and config.verify.kind == "vllm":
        names.add(config.verify.model)
    out = []
    for name in names:
        if name in models.NAMES:
            out.append(str(models.cache_root()))
        elif name and os.path.isdir(name):
            out.append(os.path.realpath(name))
    return out


def opaque(ws: Workspace, *parts: str) -> str:
    """A path component for ``parts`` that tells a side nothing: a keyed hash (the key in the state directory,
    which no sandbox sees). Names like ``warm-stack-candidate`` told merged code which side and which check it was
    measured in, and code that knows that can fake any comparison (red team, round 4: it framed an honest merge
    as a passenger in a stack check's leave-one-out). Stable for the same parts, so a kept baseline keeps its paths."""
    import hashlib
    import secrets as _secrets

    key_file = ws.state / "paths.key"
    try:
        key = key_file.read_text().strip()
    except OSError:
        key = ""
    if len(key) < 32:
        key = _secrets.token_hex(32)
        tmp = key_file.with_name(f"paths.key.{os.getpid()}")
        tmp.write_text(key)
        os.chmod(tmp, 0o600)
        try:
            os.link(tmp, key_file)  # the first writer wins; everyone reads what it wrote
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
        key = key_file.read_text().strip()
    return hashlib.sha256(("\0".join((key, *parts))).encode()).hexdigest()[:20]


def scratch_dir(ws: Workspace, tag: str) -> Path:
    """The scratch directory of the sides built under ``tag`` (a name that says neither the tag nor the check)."""
    return ws.state / "tmp" / f"s-{opaque(ws, 'scratch', tag)}"


@contextlib.contextmanager
def sides(
    ws: Workspace,
    config: Config,
    commits: Mapping[str, str],
    tag: str,
    decision: Decision,
    *,
    keep: bool = False,
    read_only: Sequence[str] = (),
    kept: KeptBaseline | None = None,
) -> Iterator[Sides]:
    """Prepare the sides named in ``commits`` (call ``.build()`` inside the block); always cleaned up.
    ``kept``: the baseline side an earlier evaluation built under the same ``tag`` (reused, not rebuilt)."""
    base = commits.get(BASELINE) or ws.baseline_commit()
    for side, commit in commits.items():
        if side == BASELINE:
            continue
        violations = ws.protected_violations(base, commit, config)
        if violations:
            listed = ", ".join(f"{v.path} ({v.status}, matches {v.pattern!r})" for v in violations[:5])
            raise ProtectedPathError(f"touches protected paths: {listed}")
    scratch = scratch_dir(ws, tag)
    if kept is None:
        remove_tree(scratch)  # a crashed earlier attempt of the same run
    sd = Sides(ws, config, dict(commits), scratch, tag, decision, tuple(read_only), kept=kept)
    try:
        yield sd
    finally:
        if keep:
            sd.release()
        else:
            sd.close()


@contextlib.contextmanager
def built_sides(ws: Workspace, config: Config, commits: Mapping[str, str], tag: str, what: str) -> Iterator[Sides]:
    """``sides`` for the commands that are not a gate (verify, calibrate, profile): the sandbox policy
    decided, the sides built, and every refusal (a policy the machine cannot meet, a protected path,
    a failed build) an AgentsearchError naming ``what`` was being done."""
    from . import containment

    box = containment.decide(config)
    if box.status == "fail":
        raise AgentsearchError(box.detail)
    with sides(ws, config, commits, tag, box) as sd:
        try:
            sd.build()
        except BuildError as exc:
            raise AgentsearchError(f"{what}: build failed: {exc}") from None
        yield sd


__all__ = [
    "Sides",
    "KeptBaseline",
    "sides",
    "built_sides",
    "BuildError",
    "ProtectedPathError",
    "snapshot",
    "describe_change",
    "remove_worktree",
    "remove_tree",
    "walk_tree",
]

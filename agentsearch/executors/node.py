"""What runs on a worker node: one whole evaluation, from a git bundle to an ``Evaluation``.

The node keeps a cache clone of the target per slot (``<cache>/<repo key>/slot-<k>``, one
evaluation at a time per slot, taken with ``flock``), fetches the baseline and candidate commits
the orchestrator shipped as a git bundle, and judges them there with ``evaluation.evaluate``:
both sides, every pair, restarts, coverage, confirmation and distribution checks on this one
node, the candidate's code only inside its sandbox. Nothing here writes the history: the
result goes back to the orchestrator, the one writer.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import shutil
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import environment, sandbox

from ..errors import GitError, TargetError
from ..evaluation import Evaluation, evaluate
from ..workspace import Workspace, git

NODE_SCHEMA = 1
CACHE_ENV = "AGENTSEARCH_NODE_CACHE"  # where a node keeps its cache clones (default ~/.cache/agentsearch/nodes)
# state files the orchestrator ships with every job: the A/A calibration and the holdout secret
SHIPPED_STATE = ("calibration.json", "holdout.key")


@dataclass(frozen=True)
class Job:
    """One evaluation as the orchestrator hands it to a node (everything it needs but the commits)."""

    episode: str
    proposal: str
    number: int
    baseline: str  # the commit the candidate is judged against
    candidate: str
    baseline_branch: str
    seed: int  # the proposal's evaluation seed: the same on every attempt, on every node
    alpha: float
    repo_key: str  # names the target on every machine (its root commit)
    state_files: dict[str, bytes] = field(default_factory=dict)
    attempt: int = 1
    code: str = ""  # the orchestrator's code_version(): a node running other code refuses the job
    reference: str = ""  # the distribution checks' reference commit, as the orchestrator resolved it ('' : no [verify])
    schema_version: int = NODE_SCHEMA


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    hostname: str
    environment_fingerprint: str
    gpus: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "hostname": self.hostname,
            "environment_fingerprint": self.environment_fingerprint,
            "gpus": list(self.gpus),
        }


@dataclass(frozen=True)
class NodeResult:
    """What a node sends back: the evaluation, or the error that stopped it (``kind``: "run"
    for a broken set-up — the run's error —, "internal" for anything else, the proposal's REJECT)."""

    job: Job
    node: NodeInfo
    evaluation: Evaluation | None
    error: str = ""
    error_kind: str = ""
    need_full_bundle: bool = False
    wall_s: float = 0.0
    schema_version: int = NODE_SCHEMA


# the packages whose code decides a verdict: the orchestrator and every node must run the same
CODE_PACKAGES = ("agentsearch", "harness", "history", "kernels")


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """agentsearch's version and a hash of the Python code of ``CODE_PACKAGES`` as installed here."""
    from .. import __version__

    h = hashlib.sha256()
    root = Path(__file__).resolve().parents[2]
    for pkg in CODE_PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return f"{__version__}+{h.hexdigest()[:12]}"


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "agentsearch" / "nodes")


@contextmanager
def slot(repo_key: str) -> Iterator[Path]:
    """A cache clone of the target that no other evaluation on this machine is using."""
    base = cache_root() / repo_key
    base.mkdir(parents=True, exist_ok=True)
    k = 0
    while True:
        fh = open(base / f"slot-{k}.lock", "w")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            k += 1
            continue
        try:
            yield base / f"slot-{k}"
        finally:
            fh.close()
        return


def prepare(clone: Path, job: Job, bundles: list[bytes]) -> Workspace:
    """The cache clone with the job's commits fetched, its baseline branch on the judged baseline
    and the shipped state files in place; a workspace to evaluate in."""
    git.init_cache_clone(clone, job.baseline_branch)
    ws = Workspace.locate(clone)
    for d in (ws.state, ws.worktrees, ws.state / "tmp"):
        d.mkdir(parents=True, exist_ok=True)
    if not (ws.state / "state.json").exists():
        (ws.state / "state.json").write_text(
            json.dumps({"v": 1, "created": time.time(), "repo": str(clone), "node_cache": True})
        )
    for data in bundles:
        git.fetch_bundle(ws.repo_dir, data, ws.state / "tmp")
    git.point_branch(ws.repo_dir, job.baseline_branch, job.baseline)
    ws.reference_override = job.reference or None  # an ancestor of the baseline: in the bundles already
    for name in SHIPPED_STATE:
        path = ws.state / name
        if name in job.state_files:
            fd = os.open(path.with_suffix(".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(job.state_files[name])
            os.replace(path.with_suffix(".tmp"), path)
        else:
            path.unlink(missing_ok=True)  # never a calibration or secret left by an earlier target state
    return ws


def node_info(node_id: str, gpus: tuple[str, ...] = ()) -> NodeInfo:
    return NodeInfo(node_id, socket.gethostname(), environment.fingerprint(), gpus)


def run_job(
    job: Job,
    thin: bytes,
    full: Any,
    node_id: str,
    gpus: tuple[str, ...] = (),
    run_errors: tuple[type[BaseException], ...] = (),
) -> NodeResult:
    """Judge ``job`` on this machine. ``thin``: a bundle of the two commits that assumes the
    episode's first baseline; ``full``: a callable giving the bundle without that assumption
    (fetched from the object store only when this node's clone lacks the episode's baseline)."""
    t0 = time.monotonic()
    info = node_info(node_id, gpus)
    if job.code != code_version():  # verdicts from other code would not be the orchestrator's
        return NodeResult(
            job,
            info,
            None,
            f"node {info.hostname} runs agentsearch {code_version()}, the orchestrator {job.code or 'unknown'}: "
            "install the same agentsearch (the same commit) on every node of the cluster",
            "run",
            wall_s=time.monotonic() - t0,
        )
    with slot(job.repo_key) as clone:
        running = clone.parent / f"{clone.name}.running.json"
        running.write_text(
            json.dumps({"node_id": node_id, "proposal": job.proposal, "attempt": job.attempt, "pid": os.getpid()})
        )
        try:
            try:
                ws = prepare(clone, job, [thin])
            except (GitError, TargetError):  # a new clone lacks the thin bundle's prerequisites, or a killed
                shutil.rmtree(clone, ignore_errors=True)  # evaluation left it half made: it is only a cache
                ws = prepare(clone, job, [full(), thin])
            if not (git.has_commit(ws.repo_dir, job.baseline) and git.has_commit(ws.repo_dir, job.candidate)):
                return NodeResult(
                    job, info, None, "the shipped bundle lacks the judged commits", "run", wall_s=time.monotonic() - t0
                )
            unsafe = serving_unisolated(ws, job.baseline)
            if unsafe:
                return NodeResult(job, info, None, unsafe, "run", wall_s=time.monotonic() - t0)
            try:
                ev = evaluate(ws, job.candidate, seed=job.seed, alpha=job.alpha, baseline=job.baseline)
            except run_errors as exc:
                return NodeResult(job, info, None, str(exc), "run", wall_s=time.monotonic() - t0)
            except Exception as exc:  # noqa: BLE001 - the candidate's doing or a bug: the proposal's REJECT
                return NodeResult(
                    job, info, None, f"{type(exc).__name__}: {exc}", "internal", wall_s=time.monotonic() - t0
                )
            return NodeResult(job, info, ev, wall_s=time.monotonic() - t0)
        finally:
            running.unlink(missing_ok=True)


def serving_unisolated(ws: Workspace, baseline: str) -> str:
    """'' unless the target has serving workloads this node cannot give a network of their own.

    A served candidate shares the machine's network when the sandbox cannot put it in a namespace
    of its own (that needs root and nsenter); on a Ray node the cluster's control store listens on
    that network without authentication, so candidate code could submit a task outside any sandbox.
    Such a node is the run's problem (a set-up to fix), never a verdict."""
    if not any(w.spec.serving for w in ws.config(baseline).workloads):
        return ""
    if sandbox.probe()[0] and sandbox.can_join_network():
        return ""
    return (
        f"node {socket.gethostname()} cannot isolate the network of the serving workloads (needs bubblewrap, root and "
        "nsenter); on a Ray cluster candidate code could reach the cluster's control store: run the node as root or "
        "drop the vllm-serve workloads for Ray episodes"
    )

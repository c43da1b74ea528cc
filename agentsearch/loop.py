"""The episode loop, one for every executor: proposals are created, judged and committed in proposal order.

Where an evaluation runs is the executor's business: ``InProcess`` (here, one at a time, with the episode's warm
baseline side and its trials recorded as they are measured: the default) or ``executors.RayExecutor`` (in
parallel, one evaluation per node of a Ray cluster). The judging steps — create, prepare, record, verdict, merge —
are ``Episode``'s public methods (``agentsearch.episode``), the same for both.

The orchestrator (this process) is the one writer: executors return an evaluation per proposal, and only here are
records appended and the baseline moved (CAS). Evaluations run speculatively against the baseline of the moment
(at most ``lookahead`` proposals ahead; the in-process executor runs none ahead); their results are taken in
proposal order, like a reorder buffer, so the episode decides exactly what one-at-a-time judging would have
decided:

- a result measured against the current baseline is validated (commits, seed) and recorded — trials, statistics,
  distribution, verdict (with the node and its environment on a cluster) — then merged if its verdict says so;
- a result measured against a baseline that has moved since (an earlier proposal merged) is kept as a
  ``superseded`` record (its measurements, never merged on) and the proposal is re-applied on the new baseline and
  judged again;
- a task lost with its node (a ``Fault``) is recorded as ``node-fault`` and the same job (same seeds) goes to
  another node; nothing it measured was recorded, so nothing is recorded twice.

False merges: one proposal merges only on its one in-order verdict at alpha / episode budget, whatever the
parallelism (superseded verdicts never merge), so the Bonferroni bound holds unchanged. ``--resume`` after a crash
re-submits every proposal without a verdict, in order, with the same seeds.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from harness import environment, seeds
from harness.trials import BASELINE, TrialRecord
from history import records as rec
from history.proposals import Proposal

from .episode import (
    RUN_ERRORS,
    Episode,
    SessionPool,
    history_stops_the_episode,
    internal_reason,
    static_verdict,
)
from .errors import RunError
from .evaluation import Evaluation, evaluate
from .executors import Job, NodeInfo, NodeResult
from .executors.node import SHIPPED_STATE, code_version
from .executors.ray_executor import Fault
from .proposers.base import Candidate
from .verify import holdout_secret
from .workspace import git

MAX_ATTEMPTS = 4  # a proposal whose evaluation was lost this often stops the run (resumable)
LOOKAHEAD = 2  # proposals created ahead of the first unjudged one on a cluster: at most LOOKAHEAD x parallel
NO_NODE_GRACE_S = 120.0  # how long an episode waits for a node that can take an evaluation


class RecordedRunError(RunError):
    """A run error already in the history (its run-error record): it stops the episode, nothing more is recorded."""


@dataclass(frozen=True)
class Result:
    """What an executor gives back for a job: the evaluation, or the error that stopped it (``error_kind``:
    "run" for a broken set-up — the run's error —, "internal" for anything else, the proposal's REJECT).
    ``node``: where it ran (None: in this process); ``trials_recorded``: its trials are in the history already."""

    job: Job
    node: NodeInfo | None
    evaluation: Evaluation | None
    error: str = ""
    error_kind: str = ""
    error_type: str = "RunError"  # the run error's class, for its record
    wall_s: float = 0.0
    trials_recorded: bool = False

    @classmethod
    def of(cls, r: NodeResult) -> Result:
        return cls(r.job, r.node, r.evaluation, r.error, r.error_kind, wall_s=r.wall_s)


class InProcess:
    """The local executor: one evaluation at a time, in this process, when it is submitted (the call returns when
    it is measured), with the episode's warm baseline side; each trial is recorded as soon as it is measured."""

    kind = "local"
    parallel = 1
    lookahead = 1  # no proposal is created before the one in front of it is judged
    cpus = gpus = 0.0
    ships_bundles = False

    def __init__(self, episode: Episode):
        self.e = episode
        self.done: list[Result] = []
        self.flights: dict[int, Job] = {}
        self.drained: set[str] = set()

    def capacity(self) -> int:
        return 1

    def free(self) -> int:
        return 0 if self.done else 1

    def submit(self, job: Job, thin: bytes, avoid: str | None = None) -> bool:
        e = self.e
        p = e.state.proposals[job.number]
        trees: dict[str, str] = {}
        env_fp = ""

        def on_trial(t: TrialRecord) -> None:
            e.record_trial(p, job.baseline, job.candidate, t, trees, env_fp)

        def say(stage: str, detail: str) -> None:
            e.say(f"{p.id} {stage}", detail)

        t0 = time.monotonic()
        r: Result
        try:
            trees.update(
                {
                    BASELINE: git.tree_of(e.ws.repo_dir, job.baseline),
                    "candidate": git.tree_of(e.ws.repo_dir, job.candidate),
                }
            )
            env_fp = environment.fingerprint()
            ev = evaluate(
                e.ws,
                job.candidate,
                seed=job.seed,
                alpha=job.alpha,
                progress=say,
                on_trial=on_trial,
                warm=e.warm_baseline(),
                baseline=job.baseline,
            )
        except RunError as exc:  # a failed preflight or a broken baseline: the run's error
            r = Result(job, None, None, str(exc), "run", type(exc).__name__, trials_recorded=True)
        except RUN_ERRORS:
            raise
        except Exception as exc:  # noqa: BLE001 - adversarial code must not stop the episode
            reason = internal_reason(exc).removeprefix("internal error: ")
            r = Result(job, None, None, reason, "internal", trials_recorded=True)
        else:
            r = Result(job, None, ev, trials_recorded=True)
        self.done.append(dataclasses.replace(r, wall_s=time.monotonic() - t0))
        return True

    def poll(self, timeout: float) -> list[Result | Fault]:
        done, self.done = self.done, []
        return list(done)

    def close(self) -> None:
        self.e.retire_warm()  # its engines shut down, its worktree removed: also on errors and Ctrl-C


@dataclass
class _Slot:
    p: Proposal
    cand: Candidate
    job: Job | None = None  # in flight (or finished) against job.baseline
    result: Result | None = None
    attempts: int = 0
    avoid: str | None = None  # the node that lost the last attempt


class EpisodeLoop:
    """Runs an episode on an executor (``InProcess`` when none is given)."""

    def __init__(self, episode: Episode, executor: Any = None, poll_s: float = 0.5):
        self.e, self.poll_s = episode, poll_s
        self.x: Any = executor if executor is not None else InProcess(episode)
        self.local = isinstance(self.x, InProcess)
        self.ws = episode.ws
        self.rejudged = 0
        self.faults = 0
        self.lookahead = self.x.lookahead if self.local else LOOKAHEAD * self.x.parallel
        # names the target on every node (its root commit); a cluster's concern only
        self.repo_key = (
            ""
            if self.local
            else git.run_git(
                "rev-list", "--max-parents=0", "--first-parent", episode.plan.baseline, cwd=self.ws.repo_dir
            ).split()[0]
        )

    # ------------------------------------------------------------------ the loop
    def run(self) -> dict[str, Any]:
        with history_stops_the_episode():
            return self._run()

    def _run(self) -> dict[str, Any]:
        e = self.e
        from .workbench import clear_leftovers

        order: list[_Slot] = []
        stop: str | None = None
        idle_since: float | None = None
        agents = max(1, int(getattr(e.proposer, "agents", 1) or 1))
        sessions: SessionPool | None = None
        try:
            # 1. finish what a crash cut off: agent sessions' workbenches (their proposals were never made: new
            # sessions take their place), merges whose verdict is recorded, then the in-flight proposals, in order
            if clear_leftovers(self.ws):
                e.say(e.plan.episode, "removed the workbenches of agent sessions a crash cut off")
            e.complete_merges()
            if not self.local:
                holdout_secret(self.ws)  # made here, once: every node (and a later recheck) draws the same holdout
                self.x.set_full_bundle(git.bundle(self.ws.repo_dir, {"start": e.plan.baseline}))
            for p in sorted(e.state.proposals.values(), key=lambda p: p.number):
                if p.verdict is None:
                    e.say(p.id, "resuming: judging the in-flight proposal again from scratch")
                    order.append(_Slot(p, e.candidate_of(p)))
            # 2. new proposals until the queue or a budget runs out
            sessions = SessionPool(e, agents) if agents > 1 else None
            # agent sessions at once (up to --agents); on a cluster within the lookahead, in this process while
            # no proposal waits to be judged (each is created and judged before the next is taken)
            while True:
                if self._commit_head(order):
                    continue
                for s in order[1:]:  # speculative launches, in order, while nodes have room
                    if s.job is None and s.result is None and self.x.free() > 0:
                        self._launch(s)
                if sessions is not None:  # started while there is room, taken as they finish
                    if not order if self.local else len(order) + sessions.inflight < self.lookahead:
                        stop = sessions.fill()  # on every pass: a failed session's place is taken again
                    if not self.local:
                        for cand in sessions.take(0):
                            self._add(order, cand)
                    elif not order:
                        for cand in sessions.take(None, limit=1):
                            self._add(order, cand)
                while sessions is None and stop is None and self.x.free() > 0 and len(order) < self.lookahead:
                    stop = e.stop_reason()
                    if stop is not None:
                        break
                    e.say(
                        f"{e.plan.episode}/{len(e.state.proposals) + 1:03d} propose",
                        f"asking the {e.proposer.name} proposer",
                    )
                    nxt = e.proposer.next(e.state.judged_keys, e.context())
                    if nxt is None:
                        stop = "queue empty"
                        break
                    self._add(order, nxt)
                if self._commit_head(order):
                    continue
                if not order and not (sessions is not None and sessions.inflight):
                    break
                if self.x.capacity() == 0:  # no node can take an evaluation: a broken set-up, after a grace period
                    idle_since = idle_since or time.monotonic()
                    if time.monotonic() - idle_since > NO_NODE_GRACE_S:
                        raise RunError(
                            f"no node of the Ray cluster can take an evaluation ({self.x.cpus:g} CPUs, {self.x.gpus:g} "
                            "GPUs each, drained nodes excluded); the episode stopped (`agentsearch episode --resume` "
                            "continues it)"
                        )
                else:
                    idle_since = None
                results = self.x.poll(self.poll_s)
                if not results and not self.x.flights and not self.local:
                    time.sleep(self.poll_s)
                for r in results:
                    self._received(order, r)
        finally:
            try:
                if sessions is not None:
                    sessions.__exit__()
            finally:
                self.x.close()
        extra = {} if self.local else {"rejudged": self.rejudged, "node_faults": self.faults}
        return e.finish(stop or "queue empty", **extra)

    def _add(self, order: list[_Slot], cand: Candidate) -> None:
        """Create the proposal of ``cand`` and queue it; the first in line is prepared (and maybe decided) at
        once, the others launched speculatively."""
        s = _Slot(self.e.create(cand), cand)
        order.append(s)
        if len(order) == 1:
            self._commit_head(order)
        elif not self.local:
            self._launch(s)

    # ------------------------------------------------------------------ launching
    def _launch(self, s: _Slot, ready: tuple[str, str] | None = None) -> None:
        """Submit ``s`` against the current baseline (``ready``: the prepared baseline and commit).
        One that does not apply (or changes nothing) there waits for its turn, when
        ``Episode.prepare`` records why: nothing is recorded out of order."""
        e, p = self.e, s.p
        if ready is None:
            base = self.ws.baseline_commit()
            commit, _error = e.fresh_commit(p, s.cand)
            if commit is None or git.tree_of(self.ws.repo_dir, commit) == git.tree_of(self.ws.repo_dir, base):
                return
        else:
            base, commit = ready
        # in memory: a re-applied commit is the one judged
        p.created = dataclasses.replace(p.created, base=base, commit=commit)
        s.attempts += 1
        job = Job(
            e.plan.episode,
            p.id,
            p.number,
            base,
            commit,
            self.ws.baseline_branch,
            seeds.proposal_seed(e.plan.seed, p.number),
            e.plan.alpha,
            self.repo_key,
            attempt=s.attempts,
        )
        if self.local:  # evaluated here, now: nothing to ship
            s.job = job
            self.x.submit(job, b"")
            return
        state_files = {n: (self.ws.state / n).read_bytes() for n in SHIPPED_STATE if (self.ws.state / n).exists()}
        s.job = dataclasses.replace(job, state_files=state_files, code=code_version(), reference=self.reference(base))
        thin = git.bundle(self.ws.repo_dir, {"base": base, "cand": commit}, exclude=(e.plan.baseline,))
        if not self.x.submit(s.job, thin, s.avoid):
            s.job, s.attempts = None, s.attempts - 1  # no node has room: launched later

    def reference(self, base: str) -> str:
        """The distribution checks' reference, resolved here (a node's cache clone has neither the pinned ref nor the
        target's branch names); '' without a [verify] section."""
        config = self.ws.config(base)
        return self.ws.reference_commit(config, base) if config.verify is not None else ""

    def _guarded(self, s: _Slot, step: Any) -> Any:
        """Run one judging step of ``s``'s proposal; its unexpected error is the proposal's REJECT ("internal
        error: ..."), recorded like any verdict, and the queue moves on (None). A run error (a failed preflight,
        a broken baseline) is recorded and stops the episode, resumable; other errors of the run stop it too."""
        try:
            return step()
        except RecordedRunError:
            raise
        except RunError as exc:
            if s.p.verdict is None:
                self._run_error(s.p, str(exc), type(exc).__name__, self.ws.baseline_commit())
            raise
        except RUN_ERRORS:
            raise
        except Exception as exc:  # noqa: BLE001 - adversarial code and input must not stop the episode
            if s.p.verdict is not None:  # the verdict is recorded; what failed came after it (the merge)
                raise
            self.e.reject_now(s.p, rec.CheckName.JUDGING, internal_reason(exc))
            return None

    def _run_error(self, p: Proposal, error: str, kind: str, baseline: str) -> None:
        self.e.record(rec.RunError(number=p.number, proposal=p.id, error=error, kind=kind, baseline=baseline), p.id)
        raise RecordedRunError(f"{error}; the episode stopped (`agentsearch episode --resume` continues it)") from None

    def _prepared(self, s: _Slot) -> tuple[str, str, str] | None:
        """``Episode.prepare`` with the proposal's errors as its REJECT."""
        return self._guarded(s, lambda: self.e.prepare(s.p, s.cand))

    def _received(self, order: list[_Slot], r: NodeResult | Result | Fault) -> None:
        s = next(
            (s for s in order if s.job is not None and s.job.number == r.job.number and s.job.attempt == r.job.attempt),
            None,
        )
        if s is None:
            return
        if isinstance(r, Fault):
            self.faults += 1
            self.e.record(
                rec.NodeFault(
                    number=s.p.number,
                    proposal=s.p.id,
                    node=r.node_id,
                    error=r.error,
                    attempt=r.job.attempt,
                    drained=r.node_id in self.x.drained,
                ),
                s.p.id,
            )
            self.e.say(
                s.p.id, f"node {r.node_id[:12]} lost the evaluation ({r.error}); judging it again elsewhere, same seeds"
            )
            if s.attempts >= MAX_ATTEMPTS:
                raise RunError(
                    f"{s.p.id}: its evaluation was lost {s.attempts} times ({r.error}); the episode stopped "
                    "(`agentsearch episode --resume` continues it)"
                )
            s.job, s.avoid = None, r.node_id
            return
        s.result = r if isinstance(r, Result) else Result.of(r)

    # ------------------------------------------------------------------ committing, in order
    def _commit_head(self, order: list[_Slot]) -> bool:
        """Take the first proposal's result if it is there; True if anything changed."""
        if not order:
            return False
        s = order[0]
        if s.job is None and s.result is None:  # not launched: it did not apply, or no node had room
            ready = self._prepared(s)
            if ready is None:  # decided at once (recorded)
                order.pop(0)
                return True
            if self.x.free() > 0:
                self._launch(s, ready[:2])
            return False
        if s.result is None:
            return False
        r, job = s.result, s.job
        assert job is not None
        base = self.ws.baseline_commit()
        if job.baseline != base:
            self._supersede(s, base)
            s.job, s.result = None, None  # judged again on the new baseline at once (it is first in line)
            return True
        ready = self._prepared(s)  # the duplicate check, now that every earlier proposal is judged
        if ready is None:
            order.pop(0)
            return True
        self._guarded(s, lambda: self._record(s, r, ready[1], ready[2]))
        order.pop(0)
        return True

    def _record(self, s: _Slot, r: Result, commit: str, content_key: str) -> None:
        e, p, job = self.e, s.p, s.job
        if job is not None and commit != job.candidate:
            raise RunError(f"{p.id}: the judged commit {job.candidate[:12]} is not the proposal's commit {commit[:12]}")
        if job is None or r.job != job:  # the orchestrator's own job is what is recorded and merged, never an echo
            where = f"node {r.node.hostname}" if r.node else "the executor"
            raise RunError(f"{p.id}: {where} returned the result of another job")
        node = {**r.node.to_json(), "attempt": job.attempt, "wall_s": round(r.wall_s, 3)} if r.node else None
        extra = {"node": node} if node else None
        on = f" (on node {r.node.hostname} {r.node.node_id[:12]})" if r.node else ""
        if r.error_kind == "run":
            self._run_error(p, f"{r.error}{on}", r.error_type, job.baseline)
        if r.evaluation is None:
            # no content key: a one-off failure must not make the same tree "already judged" later
            e.verdict(
                p,
                static_verdict(
                    rec.CheckName.JUDGING.value, f"internal error: {r.error or 'the node returned no evaluation'}"
                ),
                job.baseline,
                job.candidate,
                None,
                None,
                extra,
            )
            return
        ev = r.evaluation
        bad = [
            f"{name} {got!r} != {want!r}"
            for name, got, want in (
                ("baseline", ev.baseline, job.baseline),
                ("candidate", ev.candidate, job.candidate),
                ("seed", ev.seed, job.seed),
            )
            if got != want
        ]
        if bad:
            where = f"node {r.node.hostname}" if r.node else "the executor"
            raise RunError(f"{p.id}: {where} returned an evaluation of something else ({'; '.join(bad)})")
        if not r.trials_recorded:
            assert r.node is not None
            trees = {
                BASELINE: git.tree_of(self.ws.repo_dir, job.baseline),
                "candidate": git.tree_of(self.ws.repo_dir, job.candidate),
            }
            for t in ev.trials:
                e.record_trial(
                    p, job.baseline, job.candidate, t, trees, r.node.environment_fingerprint, {"node": r.node.node_id}
                )
        e.record_evaluation(p, job.baseline, job.candidate, ev, content_key, extra)

    def _supersede(self, s: _Slot, new_base: str) -> None:
        """Keep the measurements made against an old baseline (never merged on)."""
        r = s.result
        assert r is not None and s.job is not None
        ev = r.evaluation
        data: dict[str, Any] = {
            "number": s.p.number,
            "proposal": s.p.id,
            "baseline": s.job.baseline,
            "new_baseline": new_base,
            "candidate": s.job.candidate,
            "seed": s.job.seed,
            "node": {**r.node.to_json(), "attempt": s.job.attempt} if r.node else {},
            "verdict": ev.verdict.verdict if ev else None,
            "reasons": list(ev.verdict.reasons) if ev else [r.error],
            "statistics": [w.to_json() for w in ev.workloads.values()] if ev else [],
            "trials": [
                {"side": t.side, "workload": t.workload, "seed": t.seed, "value": t.value, "ok": t.ok}
                for t in ev.trials
            ]
            if ev
            else [],
        }
        self.e.record(rec.Superseded.of(data), s.p.id)
        self.rejudged += 1
        self.e.say(
            s.p.id,
            f"the baseline moved ({s.job.baseline[:12]} -> {new_base[:12]}) while it was judged: judging it again",
        )

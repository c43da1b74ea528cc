"""An episode and its judging steps: propose -> apply on the current baseline -> commit -> evaluate -> gate ->
merge (CAS, evidence in the merge message and a git note) or reject -> record. The loop that drives them, on any
executor, is ``agentsearch.loop``; ``Episode``'s public methods are the steps it calls.

Everything an episode did is in the history, and ``--resume`` rebuilds its state from the
history alone: judged proposals are not re-run, an in-flight one is judged again from
scratch, a merge whose verdict was recorded but whose ref update (or note, or merge record)
was cut off is completed, nothing is recorded twice, and the budgets continue.

Record order for one proposal (each one write + fsync):
proposal-created -> trial* -> statistic* -> distribution? -> verdict -> [git merge, note] -> merge.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from harness import environment, seeds
from harness.trials import TrialRecord, tail
from history import HistoryChanged, HistoryError
from history import records as rec
from history.proposals import Proposal, agent_costs, judge_costs, proposals_of

from . import proposers
from .errors import AgentsearchError, CasError, ConfigError, LockedError, RunError, TargetError
from .evaluation import Evaluation
from .gate import MERGE, REJECT, Check, Status, judge
from .headline import headline, pct
from .proposers.base import Candidate, Proposer
from .report import reproduce_command
from .warm_baseline import WarmBaseline
from .workspace import Workspace, git
from .workspace.history_head import lost_move
from .workspace.history_head import trailers as history_trailers

EPISODE_SCHEMA = 1
Say = Callable[[str, str], None]
INTERNAL = "internal error:"


class EpisodeError(AgentsearchError):
    pass


# errors of the run itself (the history, the lock, a broken baseline or config): they stop the
# episode (resumable); any other error while judging one proposal is that proposal's REJECT
RUN_ERRORS = (HistoryError, LockedError, ConfigError, TargetError, EpisodeError, RunError)


@contextmanager
def history_stops_the_episode() -> Iterator[None]:
    """A history error while an episode runs (its file changed under it, a corrupt line) stops it with
    one line; the log refuses every later write, so nothing more is recorded."""
    try:
        yield
    except HistoryChanged as exc:
        raise EpisodeError(exc.under("the episode")) from None
    except HistoryError as exc:
        raise EpisodeError(f"{exc}; the episode stopped") from None


def internal_reason(exc: BaseException) -> str:
    return f"internal error: {type(exc).__name__}: {tail(str(exc), 1) or 'no detail'}"


@dataclass(frozen=True)
class Plan:
    """What an episode was started with; recorded in its episode-started record."""

    episode: str
    proposer: str
    manifest: Mapping[str, Any]
    budget: int  # proposals
    time_budget_s: float | None
    seed: int
    alpha: float  # false-merge level per proposal (Bonferroni over the episode)
    baseline: str  # baseline commit at the start
    config_fingerprint: str
    insights: Mapping[str, Any] | None = None  # imported with --insights (else the history's latest)
    cost_budget_usd: float | None = None  # agent proposers: stop when spent
    schema_version: int = EPISODE_SCHEMA


@dataclass
class EpisodeState:
    plan: Plan
    proposals: dict[int, Proposal] = field(default_factory=dict)
    finished: dict[str, Any] | None = None
    used_s: float = 0.0  # wall time of earlier sessions
    sessions: int = 0

    @property
    def judged_keys(self) -> set[str]:
        return {p.key for p in self.proposals.values()}


# ---------------------------------------------------------------------------- reading the history
def load_state(entries: list[Any], episode: str) -> EpisodeState:
    """Rebuild one episode's state from its records (no other source)."""
    state: EpisodeState | None = None
    seg_start = seg_last = None
    for e in entries:
        if e.episode != episode:
            continue
        if e.kind in ("episode-started", "episode-resumed"):
            if state is not None and seg_start is not None:
                state.used_s += seg_last - seg_start
            if isinstance(e.record, rec.EpisodeStarted):
                started = e.record.to_json()
                state = EpisodeState(Plan(**{k: v for k, v in started.items() if k in Plan.__dataclass_fields__}))
            seg_start = seg_last = e.ts
            if state is not None:
                state.sessions += 1
            continue
        if state is None:
            continue
        seg_last = e.ts
        r = e.record  # upgraded to the current schema (older records too)
        if isinstance(r, rec.ProposalCreated):
            state.proposals[r.number] = Proposal(r, episode)
        elif isinstance(r, rec.Verdict) and r.number in state.proposals:
            state.proposals[r.number].verdict = r
        elif isinstance(r, rec.Merge) and r.number in state.proposals:
            state.proposals[r.number].merge = r
        elif isinstance(r, rec.EpisodeFinished):
            state.finished = r.to_json()
    if state is None:
        raise EpisodeError(f"episode {episode} has no episode-started record in the history")
    if seg_start is not None:
        state.used_s += seg_last - seg_start
    return state


def latest_unfinished(entries: list[Any]) -> str | None:
    started = [e.episode for e in entries if e.kind == "episode-started"]
    finished = {e.episode for e in entries if e.kind == "episode-finished"}
    for ep in reversed(started):
        if ep not in finished:
            return ep
    return None


# ---------------------------------------------------------------------------- the loop
class Episode:
    def __init__(self, ws: Workspace, log: Any, state: EpisodeState, proposer: Proposer, say: Say | None = None):
        self.ws, self.log, self.state, self.proposer = ws, log, state, proposer
        self.say = say or (lambda stage, detail: None)
        self.t0 = time.time()
        self.plan = state.plan
        self.warm: WarmBaseline | None = None  # the baseline side kept across this run's evaluations

    # -------------------------------------------------------------- records
    def record(self, record: rec.Record, proposal: str | None) -> None:
        self.log.append(record, self.plan.episode, proposal)

    def elapsed(self) -> float:
        return self.state.used_s + (time.time() - self.t0)

    # -------------------------------------------------------------- run
    def complete_merges(self) -> None:
        """Finish the merges a crash cut off (their verdict is recorded, their merge is not)."""
        for p in sorted(self.state.proposals.values(), key=lambda p: p.number):
            if p.verdict and p.verdict.verdict == MERGE and p.merge is None:
                self.merge(p)

    def stop_reason(self, pending: int = 0) -> str | None:
        """Why no further proposal may start (a budget ran out), or None. ``pending``: sessions in flight."""
        if len(self.state.proposals) + pending >= self.plan.budget:
            return f"proposal budget reached ({self.plan.budget})"
        if self.plan.time_budget_s is not None and self.elapsed() >= self.plan.time_budget_s:
            return f"time budget reached ({self.plan.time_budget_s:g} s)"
        spent = self.cost()
        if self.plan.cost_budget_usd is not None and spent >= self.plan.cost_budget_usd:
            return f"cost budget reached (${spent:.2f} of ${self.plan.cost_budget_usd:.2f})"
        return None

    def warm_baseline(self) -> WarmBaseline | None:
        """The kept baseline side for the next evaluation (``[engine] baseline_reuse`` of the baseline's
        config; None when it is 1)."""
        reuse = self.ws.config().engine.baseline_reuse
        if self.warm is not None and self.warm.reuse != reuse:
            self.retire_warm()
        if self.warm is None and reuse > 1:
            self.warm = WarmBaseline(self.ws, self.plan.episode, reuse)
        return self.warm

    def retire_warm(self) -> None:
        warm, self.warm = self.warm, None
        if warm is not None:
            warm.retire()

    def finish(self, reason: str, **extra: Any) -> dict[str, Any]:
        """Distill the insights and record episode-finished; the summary (``extra`` added to it, not recorded)."""
        summary = self.summary(reason)
        if self.ws.config().stack.check != "off" and summary["merged"] >= 2:
            summary["stack"] = self.stack_check("the episode's end")
        from .insights import refresh

        last = list(self.log.entries())[-1:]
        if last and last[0].kind == "insight" and last[0].episode == self.plan.episode:  # a crash cut off the finish
            data, path = last[0].record.to_json(), self.ws.state / "insights.md"
        else:
            data, path = refresh(self.ws, self.log, self.plan.episode, llm=self.proposer.name == "claude")
        summary["insights"] = str(path)
        summary["lessons"] = data["lessons"]
        self.record(
            rec.EpisodeFinished.of(
                {k: v for k, v in summary.items() if k not in ("proposals", "lessons", "agents", "stack")}
            ),
            None,
        )
        summary.update(extra)
        self.state.finished = summary
        # the report's merges and reverts reconciled with git: a baseline that lacks one is the episode's error,
        # named, after everything is recorded (`history verify` also names commits nobody judged)
        problem = lost_move(self.ws.repo_dir, self.ws.baseline_branch, list(self.log.entries()))
        if problem:
            raise AgentsearchError(f"the episode's end: {problem}")
        return summary

    def cost(self) -> float:
        return sum(float(p.created.meta.get("cost_usd") or 0) for p in self.state.proposals.values())

    def context(self, number: int | None = None) -> proposers.Context:
        """What the proposer may know: baseline files, the target's history, insights. ``number``: the
        session's label when several run at once (else the proposal about to be created)."""
        base = self.ws.baseline_commit()
        entries = list(self.log.entries())
        return proposers.Context(
            read_file=lambda path: git.show_file(self.ws.repo_dir, base, path),
            history=proposals_of(entries),
            insights=self.plan.insights or latest_insights(entries),
            number=number if number is not None else len(self.state.proposals) + 1,
            seed=self.plan.seed,
            extra={
                "config": self.ws.config(),
                "episode": self.plan.episode,
                "profiles": [e.record.to_json() for e in entries if isinstance(e.record, rec.Profile)][-2:],
                # agent proposers work on a fenced workbench of the baseline (agentsearch.workbench); the
                # orchestrator takes its diff
                "workspace": self.ws,
                "base": base,
                "say": self.say,
                # an agent revising an earlier proposal of this episode starts from its change
                "proposal_patch": lambda pid: next(
                    (p.created.patch for p in list(self.state.proposals.values()) if p.id == pid), None
                ),
            },
        )

    def summary(self, reason: str) -> dict[str, Any]:
        rows = []
        for p in sorted(self.state.proposals.values(), key=lambda p: p.number):
            v = p.verdict
            obj = v.objective_summary if v else None
            rows.append(
                {
                    "proposal": p.id,
                    "title": p.created.title,
                    "branch": p.created.branch,
                    "verdict": v.verdict if v else None,
                    "speedup": v.speedup if v else None,
                    "reasons": list(v.reasons) if v else [],
                    "pairs": obj.pairs if obj else None,
                    "headline": headline(v) if v else None,
                    "merged": p.merged,
                    **({"parent": p.created.meta["parent"]} if p.created.meta.get("parent") else {}),
                }
            )
        agents = agent_costs(self.state.proposals.values())
        judge = judge_costs(self.state.proposals.values(), self.elapsed())
        return {
            "episode": self.plan.episode,
            "reason": reason,
            "proposals": rows,
            **({"agents": agents} if agents else {}),
            **({"judge": judge} if judge else {}),
            "judged": len(rows),
            "merged": sum(r["merged"] for r in rows),
            "baseline_before": self.plan.baseline,
            "baseline_after": self.ws.baseline_commit(),
            "elapsed_s": round(self.elapsed(), 1),
        }

    # -------------------------------------------------------------- one proposal
    def candidate_of(self, p: Proposal) -> Candidate:
        c = p.created
        return Candidate(
            p.key, c.title, c.rationale, c.category, c.proposer or self.proposer.name, c.patch, dict(c.meta)
        )

    def create(self, cand: Candidate) -> Proposal:
        number = len(self.state.proposals) + 1
        pid = f"{self.plan.episode}/{number:03d}"
        self.say(pid, f"applying {cand.title!r}")
        branch, base = None, None
        try:
            prop = self.ws.create_proposal(self.plan.episode, number, cand.title)
            branch, base = prop.branch, prop.base
            error = git.apply_patch(prop.worktree, cand.patch) if cand.patch.strip() else ""
            commit = None
            if not error:
                commit = self.ws.commit_proposal(prop, cand.title, cand.rationale, cand.proposer)
            files = [c.paths[-1] for c in git.diff_changes(self.ws.repo_dir, prop.base, commit)] if commit else []
        except RUN_ERRORS:
            raise
        except Exception as exc:  # noqa: BLE001 - adversarial input: this proposal is rejected, the queue goes on
            error, commit, files = internal_reason(exc), None, []
            base = base or self.ws.baseline_commit()
        meta = dict(cand.meta)
        if commit and base and files and "config" not in meta:
            meta.update(self.configuration(base, commit, files))
        created = rec.ProposalCreated(
            number=number,
            proposal=pid,
            key=cand.key,
            title=cand.title,
            rationale=cand.rationale,
            category=cand.category,
            proposer=cand.proposer,
            branch=branch,
            base=base,
            commit=commit,
            applied=not error,
            apply_error=error,
            files=tuple(files),
            diff_hash=hashlib.sha256(cand.patch.encode()).hexdigest(),
            patch=cand.patch,
            meta=meta,
        )
        self.record(created, pid)
        p = Proposal(created, self.plan.episode)
        self.state.proposals[number] = p
        return p

    def configuration(self, base: str, commit: str, files: list[str]) -> dict[str, Any]:
        """A change of the declared knobs' values alone (an agent's, the sweep's, a patch's): the configuration it
        made, for the optimizer's bookkeeping (issue #58: every measured configuration informs the model, whoever
        proposed it). {} for any other change (another file, or anything else in the knobs' files), or a target
        without knobs."""
        from .proposers import knob_model
        from .proposers.optimize import configuration_of, knob_files, knobs_only

        sweep = self.ws.config().sweep
        if not sweep.knobs or not set(files) <= knob_files(sweep):
            return {}

        def at(rev: str) -> Any:
            return lambda path: git.show_file(self.ws.repo_dir, rev, path)

        try:
            if not knobs_only(sweep, at(base), at(commit)):
                return {}
            config = configuration_of(sweep, at(commit))
        except Exception:  # noqa: BLE001 - the proposal's file, whatever it holds, is the gate's to judge, not this
            return {}
        return {"config": config, "config_from": knob_model.FROM_FILES}

    def fresh_commit(self, p: Proposal, cand: Candidate) -> tuple[str | None, str]:
        """The commit to judge: the recorded one if it is still on the current baseline, else re-applied."""
        base = self.ws.baseline_commit()
        recorded = p.created.commit
        if recorded and p.created.base == base:
            try:
                self.ws.resolve(recorded)
                return recorded, ""
            except AgentsearchError:
                pass
        if not cand.patch.strip():
            return None, ""
        if not p.created.applied and p.created.base == base:
            return None, p.created.apply_error or "the patch does not apply"
        prop = self.ws.create_proposal(self.plan.episode, p.number, cand.title, base=base)
        error = git.apply_patch(prop.worktree, cand.patch)
        if error:
            return None, error
        return self.ws.commit_proposal(prop, cand.title, cand.rationale, cand.proposer), ""

    def record_trial(
        self,
        p: Proposal,
        base: str,
        commit: str,
        t: TrialRecord,
        trees: Mapping[str, str],
        env_fp: str,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        key = hashlib.sha256(json.dumps([trees[t.side], t.workload, t.seed, env_fp]).encode()).hexdigest()[:20]
        self.record(
            rec.Trial.of_run(t, number=p.number, candidate=commit, baseline=base, measurement=key, extra=extra), p.id
        )

    def record_evaluation(
        self,
        p: Proposal,
        base: str,
        commit: str,
        ev: Evaluation,
        content_key: str,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        """The statistics, the distribution checks and the verdict of a finished evaluation (then the merge)."""
        for w in [*ev.workloads.values(), *([ev.confirmation] if ev.confirmation else [])]:
            self.record(rec.Statistic.of_summary(p.number, w), p.id)
        if ev.distribution is not None:
            self.record(rec.Distribution.of({"number": p.number, **ev.distribution.to_json()}), p.id)
        self.verdict(p, ev.verdict, base, commit, ev, content_key, extra)

    def prepare(self, p: Proposal, cand: Candidate, twins: bool = True) -> tuple[str, str, str] | None:
        """The cheap refusals (does not apply, no change, already judged: a verdict at once, None),
        else (baseline, candidate commit, content key) to measure. ``twins=False``: the duplicate
        check is left for later (a parallel episode makes it when the proposal's turn comes)."""
        base = self.ws.baseline_commit()
        config = self.ws.config()
        commit, error = self.fresh_commit(p, cand)
        if commit is None:
            reason = (
                f"does not apply to the current baseline {base[:12]}: {error}"
                if error
                else "the proposal makes no change"
            )
            failure = rec.FailureKind.PATCH_FAILED if error else rec.FailureKind.NO_CHANGE
            if error.startswith(INTERNAL):
                reason, failure = error, rec.FailureKind.INTERNAL_ERROR
            agent_error = (cand.meta or {}).get("error")
            if agent_error and not error:
                reason += f" (the agent session ended with an error: {agent_error})"
            self.verdict(p, static_verdict(rec.CheckName.PATCH_APPLIES.value, reason, failure), base, None, None)
            return None
        content_key = _content_key(self.ws, base, commit, config.fingerprint())
        if git.tree_of(self.ws.repo_dir, commit) == git.tree_of(self.ws.repo_dir, base):
            self.verdict(
                p,
                static_verdict(
                    rec.CheckName.PATCH_APPLIES.value,
                    "the patch makes no change to the baseline",
                    rec.FailureKind.NO_CHANGE,
                ),
                base,
                commit,
                None,
                content_key,
            )
            return None
        twin = self._twin(content_key, p) if twins else None
        if twin is not None:
            reason = (
                f"identical to {twin.proposal} (same code, baseline, workloads and environment), judged "
                f"{twin.verdict}; not re-measured"
            )
            self.verdict(
                p, static_verdict(rec.CheckName.NOT_A_DUPLICATE.value, reason), base, commit, None, content_key
            )
            return None
        return base, commit, content_key

    def _twin(self, content_key: str, p: Proposal) -> rec.Verdict | None:
        """The first verdict on the same content key in any episode of the history (the same
        candidate tree on the same baseline tree, config and environment), other than ``p``'s."""
        for e in self.log.entries():
            if isinstance(r := e.record, rec.Verdict) and e.proposal != p.id and r.content_key == content_key:
                return r
        return None

    def reject_now(self, p: Proposal, check: rec.CheckName, reason: str) -> None:
        """``p``'s REJECT on ``check`` for ``reason``, without a measurement (an error while judging it)."""
        self.verdict(p, static_verdict(check.value, reason), self.ws.baseline_commit(), p.created.commit, None)

    def verdict(
        self,
        p: Proposal,
        judgement: rec.Judgement,
        base: str,
        commit: str | None,
        ev: Evaluation | None,
        content_key: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        """Record ``p``'s verdict (from its evaluation ``ev`` when it was measured: ``judgement`` is then
        ``ev.verdict``), then merge a MERGE."""
        header = {"number": p.number, "proposal": p.id, "title": p.created.title, "branch": p.created.branch}
        if ev is None:
            record = rec.Verdict.static(
                judgement, **header, baseline=base, candidate=commit, content_key=content_key, **(extra or {})
            )
        else:
            objective = self.ws.config().objective.name
            record = ev.record(objective).as_verdict(**header, content_key=content_key, **(extra or {}))
        self.record(record, p.id)
        p.verdict = record
        self.say(p.id, headline(record))
        prop_path = self.ws.worktrees / f"{self.plan.episode}-{p.number:03d}"
        if prop_path.exists():
            self.ws.remove_worktree(prop_path)
        if record.verdict == MERGE:
            self.retire_warm()  # the baseline moves
            self.merge(p)

    def merge(self, p: Proposal) -> None:
        v = p.verdict
        assert v is not None
        cand, expected = v.candidate, v.baseline
        assert cand is not None  # a MERGE verdict names its candidate
        now = self.ws.baseline_commit()
        note = evidence_text(v)
        try:
            if git.is_ancestor(self.ws.repo_dir, cand, now) and now != expected:
                merged = now  # the ref moved before a crash cut the record off
                self.ws.sync_checkouts()  # ... and maybe the checkout's update too
            else:
                merged = self.ws.merge(cand, expected, merge_message(v, self.log.head))
        except CasError as exc:
            record = rec.Merge(number=p.number, ok=False, old=expected, new=now, candidate=cand, error=str(exc))
            self.record(record, p.id)
            p.merge = record
            self.say(p.id, f"not merged: {exc}")
            return
        git.add_note(self.ws.repo_dir, merged, note)
        record = rec.Merge(number=p.number, ok=True, old=expected, new=merged, candidate=cand)
        self.record(record, p.id)
        p.merge = record
        self.say(p.id, f"merged: baseline {expected[:12]} -> {merged[:12]}")
        every = self.ws.config().stack.every
        merged_now = sum(1 for q in self.state.proposals.values() if q.merged)
        if every is not None and merged_now % every == 0:
            self.stack_check(f"{merged_now} merges")

    def drop(self, journal: Any) -> None:
        """Remove a stack check's progress; a file that cannot be removed is said, never the episode's end."""
        try:
            journal.clear()
        except AgentsearchError as exc:
            self.say(f"{self.plan.episode} stack", str(exc))

    def stack_check(self, why: str) -> dict[str, Any]:
        """The stack check over this episode's merges ([stack] check), recorded in the episode's history. Its own
        failure never stops the episode: it is reported (and the check is inconclusive)."""
        from . import stack

        tip = self.ws.baseline_commit()
        done = [
            e.record
            for e in self.log.entries()
            if e.episode == self.plan.episode and isinstance(e.record, rec.StackCheck)
        ]
        # a check the crash cut off continues from its last measured part (one of another tip is dropped)
        journal = stack.Journal(self.ws.state, self.plan.episode)
        if done and done[-1].tip == tip:  # a resumed episode: this tip was checked before the crash
            self.drop(journal)
            return done[-1].summary()
        self.retire_warm()  # the baseline moved with the merges: its kept side is stale, and its memory is needed
        self.say(f"{self.plan.episode} stack", f"{why}: measuring what this episode's merges add up to")
        try:
            r = stack.check(
                self.ws,
                self.plan.episode,
                seed=self.plan.seed,
                leave_one_out=self.ws.config().stack.leave_one_out,
                progress=self.say,
                write=lambda record: self.record(record, None),
                journal=journal,
            )
        except Exception as exc:  # noqa: BLE001 - merged code runs in it: its failure is the check's, never the episode's
            why = tail(str(exc) or type(exc).__name__, 1)
            self.say(f"{self.plan.episode} stack", f"the stack check failed: {why}")
            self.drop(journal)  # a failed check is reported, not continued
            return {"verdict": "inconclusive", "error": why, "holds": False, "regressed_guards": []}
        self.say(
            f"{self.plan.episode} stack",
            f"{r.verdict}: the tip {pct(r.cumulative)} over the episode's start, the merges' "
            f"estimates multiply to {pct(r.product)}"
            + "".join(f"; guard {g} regressed over the episode" for g in r.regressed_guards),
        )
        return r.summary()


def latest_insights(entries: list[Any]) -> Mapping[str, Any] | None:
    found = [e.record.to_json() for e in entries if isinstance(e.record, rec.Insight)]
    return found[-1] if found else None


def static_verdict(check: str, reason: str, failure: rec.FailureKind | None = None) -> rec.Judgement:
    return judge([Check(check, Status.FAIL, reason, failure)])


def _content_key(ws: Workspace, base: str, commit: str, config_fp: str) -> str:
    parts = [git.tree_of(ws.repo_dir, base), git.tree_of(ws.repo_dir, commit), config_fp, environment.fingerprint()]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def merge_message(v: rec.Verdict, history: tuple[int, str] | None = None) -> str:
    """Subject, evidence and trailers; ``history``: the history head (seq, hash) the merge is made after."""
    head = f"agentsearch: merge {v.title or v.proposal}"
    if v.speedup:
        head += f" ({v.speedup - 1:+.1%} {v.objective or ''})".rstrip()
    extra = history_trailers(history) if history else ""
    return (
        f"{head}\n\n{evidence_text(v)}\nAgentsearch-Proposal: {v.proposal}\n"
        f"Agentsearch-Candidate: {v.candidate}\n{extra}"
    )


def evidence_text(v: rec.Verdict) -> str:
    """The evidence of a verdict in a few lines: for the merge message and the git note."""
    lines = [f"Verdict: {v.verdict} ({v.proposal}, branch {v.branch})", headline(v)]
    for name, w in v.workloads.items():
        if w.speedup is None:
            continue
        ci_s = f" [{w.ci[0] - 1:+.1%}, {w.ci[1] - 1:+.1%}]" if w.ci else ""
        p = f", p={w.p_value:.2g}" if w.p_value is not None else ""
        lines.append(f"- {name} ({w.role}): {w.speedup - 1:+.2%}{ci_s}{p}, {w.pairs} pairs")
    for c in v.checks:
        lines.append(f"- check {c.name}: {c.status}" + (f" ({c.detail})" if c.detail else ""))
    cmd = reproduce_command(v)  # from a checkout of the target: the same commits, seed and alpha
    lines.append(f"Reproduce: {cmd}" if cmd else "Reproduce: (decided before any measurement)")
    return "\n".join(lines) + "\n"


class SessionPool:
    """Proposer sessions running at once, in threads (an agent session mostly waits on the model and on its
    sandboxed tools), each with its own workbench. ``fill`` starts sessions while the episode's budgets allow —
    sessions in flight count against the proposal budget, so no more proposals start than it allows; ``take``
    gives the finished sessions' candidates in the order they finished. A session that fails produces nothing
    and blocks no other; one that finds nothing ends the queue (``empty``). Used by the episode loop
    (``agentsearch.loop``)."""

    def __init__(self, episode: Episode, agents: int):
        from concurrent.futures import ThreadPoolExecutor

        self.e, self.agents = episode, agents
        self.pool = ThreadPoolExecutor(agents, thread_name_prefix="agent-session")
        self.futures: dict[Any, int] = {}
        self.ready: list[Candidate] = []  # finished sessions' candidates not taken yet (they count as in flight)
        self.label = len(episode.state.proposals)  # sessions are labelled on from the proposals so far
        self.empty = False

    def __enter__(self) -> SessionPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.pool.shutdown(wait=True)

    @property
    def inflight(self) -> int:
        """Sessions running, and finished ones whose candidate is not taken yet: each may become a proposal."""
        return len(self.futures) + len(self.ready)

    def fill(self) -> str | None:
        """Start sessions up to ``agents`` in flight; why no more may start (a budget), or None."""
        e = self.e
        stop = e.stop_reason(pending=self.inflight)
        while stop is None and not self.empty and self.inflight < self.agents:
            self.label += 1
            e.say(
                f"{e.plan.episode} session {self.label}",
                f"asking the {e.proposer.name} proposer ({self.inflight + 1} in flight)",
            )
            self.futures[self.pool.submit(e.proposer.next, set(e.state.judged_keys), e.context(number=self.label))] = (
                self.label
            )
            stop = e.stop_reason(pending=self.inflight)
        return stop or ("queue empty" if self.empty else None)

    def take(self, timeout: float | None, limit: int | None = None) -> list[Candidate]:
        """The candidates of the sessions that finished, in the order they finished, at most ``limit`` (the rest
        wait for a later call). Waits up to ``timeout`` s for a session to finish (None: until one does) when
        none is waiting already."""
        from concurrent.futures import FIRST_COMPLETED, wait

        if self.futures:
            done, _ = wait(list(self.futures), timeout=0 if self.ready else timeout, return_when=FIRST_COMPLETED)
            for f in sorted(done, key=lambda f: self.futures[f]):
                n = self.futures.pop(f)
                try:
                    cand = f.result()
                except Exception as exc:  # noqa: BLE001 - one session's failure is not the episode's
                    say = self.e.say
                    say(f"{self.e.plan.episode} session {n}", f"produced no proposal: {internal_reason(exc)}")
                    continue
                if cand is None:
                    self.empty = True
                else:
                    self.ready.append(cand)
        n = len(self.ready) if limit is None else limit
        out, self.ready = self.ready[:n], self.ready[n:]
        return out


# ---------------------------------------------------------------------------- entry points
def start(
    ws: Workspace,
    log: Any,
    proposer_name: str,
    options: Mapping[str, Any],
    budget: int | None,
    time_budget_s: float | None,
    seed: int | None,
    episode: str,
    insights: Mapping[str, Any] | None = None,
    cost_budget_usd: float | None = None,
) -> Episode:
    config = ws.config()
    gpu = environment.describe().get("gpu", "none") != "none"
    proposer = proposers.build(
        proposer_name,
        {**options, "baseline": config.target.baseline, "config": config, "gpu": gpu, "episode": episode},
        ws.repo_dir,
    )
    n = budget if budget is not None else config.gate.episode_budget
    if n < 1:
        raise EpisodeError(f"--budget must be at least 1, got {n}")
    plan = Plan(
        episode=episode,
        proposer=proposer_name,
        manifest=proposer.manifest(),
        budget=n,
        time_budget_s=time_budget_s,
        seed=seed if seed is not None else seeds.new_master(),
        alpha=config.gate.alpha / max(n, config.gate.episode_budget),
        baseline=ws.baseline_commit(),
        config_fingerprint=config.fingerprint(),
        insights=insights,
        cost_budget_usd=cost_budget_usd,
    )
    with history_stops_the_episode():
        log.append(rec.EpisodeStarted.of(asdict(plan)), episode, None)
    state = EpisodeState(plan, sessions=1)
    return Episode(ws, log, state, proposer)


def resume(ws: Workspace, log: Any, episode: str, entries: list[Any]) -> Episode:
    state = load_state(entries, episode)
    proposer = proposers.rebuild(state.plan.proposer, state.plan.manifest)
    with history_stops_the_episode():
        log.append(
            rec.EpisodeResumed(
                session=state.sessions + 1,
                used_s=round(state.used_s, 3),
                judged=sum(1 for p in state.proposals.values() if p.verdict),
            ),
            episode,
            None,
        )
    state.sessions += 1
    return Episode(ws, log, state, proposer)


__all__ = [
    "Episode",
    "EpisodeError",
    "SessionPool",
    "Plan",
    "start",
    "resume",
    "latest_unfinished",
    "load_state",
    "REJECT",
]

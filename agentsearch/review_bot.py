"""The review bot on the forge: judge a pull request's head like any candidate, answer on the PR.

``Reviewer.review`` fetches the head (``refs/pull/N/head`` of the configured remote) and its base branch, runs
the same evaluation as ``agentsearch evaluate`` against the base's tip (the base's config, protected paths,
sandbox, statistics and distribution checks: a PR from a fork is candidate code like any other), records the
evaluation and a ``pr-review`` (the verdict is recorded before anything is posted), then ``post`` keeps one
comment current (found by the id recorded in ``pr-posted``, else by our marker *and* our login: a forged marker
in someone else's comment is not ours) and sets the head's commit status. ``Reviewer.once`` is one pass of
`bot`: comment commands first, then each open PR's head judged once and posted until posted. A killed bot
loses nothing: what was judged is in the history, what was not posted is posted on the next pass.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from history.records import Evaluation as EvaluationRecord
from history.records import Merge, PrCommand, PrPosted, PrReview, Verdict
from history.records import text as rtext

from .errors import AgentsearchError
from .evaluation import evaluate
from .forge import Comment, Forge, ForgeError, PullRequest
from .gate import MERGE, REVIEW
from .headline import headline
from .progress import Say
from .records import append, read_entries
from .report import gather, render_pr_review
from .workspace import Workspace, git

MARKER = "<!-- agentsearch:pr-review -->"  # the first line of the one comment we keep current on a PR
REPLY_MARKER = "<!-- agentsearch:reply to={} -->"  # our answer to comment command {id}: a restarted bot finds it
REPLIED = re.compile(r"\A<!-- agentsearch:reply to=(\d+) -->")
COMMAND = re.compile(r"^[ \t]*/agentsearch\b[ \t]*(\S*)[ \t]*(\S*)", re.M)
COMMANDS = {
    "evaluate": "judge the current head; one judged already against the base's tip only brings this comment up to date",
    "recheck": "measure the current head again on fresh seeds",
    "stack": "what the merges of the latest episode add up to on the baseline",
    "bisect": "the merge where a workload regressed; WORKLOAD after it, else the objective",
}
# the verdict's failure -> the status: regressions and failed checks fail; undecided or held ones are neutral
NEUTRAL = {
    "inconclusive": "needs more pairs: no decision within the pair budget",
    "no-effect": "no worthwhile speedup (not slower either)",
    "no-change": "changes nothing the gate measures",
    "not-confirmed": "the win did not hold on fresh seeds: needs more pairs",
}
ERROR = ("internal-error", "measurement-error")
NO_PERMISSION = "commands are taken from users with write permission on the repository only"
STALE = "stale"  # a pr-posted outcome: the status is pending, the verdict was judged against another base
AA_WINDOW = 500  # the latest verdicts looked at for this target's measured A/A false-merge rate


def outcome_of(record: EvaluationRecord) -> tuple[str, str]:
    """(outcome, status description) of an evaluation."""
    verdict, failure = record.verdict, (record.failure.value if record.failure else None)
    if verdict == MERGE:
        return "success", "merge-worthy: " + headline(record, reason_chars=60).partition(" — ")[2]
    if verdict == REVIEW:
        return "neutral", "held for review: a speedup too large to trust without a person reading the report"
    if failure in NEUTRAL:
        return "neutral", NEUTRAL[failure]
    if failure in ERROR:
        return "error", "agentsearch could not judge this head: " + str(failure)
    return "failure", headline(record, reason_chars=100)


@dataclass
class PrHistory:
    """What the history knows about one pull request."""

    reviews: list[PrReview] = field(default_factory=list)
    posted: list[PrPosted] = field(default_factory=list)
    commands: set[int] = field(default_factory=set)  # comment ids answered
    refused: set[str] = field(default_factory=set)  # authors told once that commands need write permission

    def review_of(self, head: str, base_ref: str, base: str) -> PrReview | None:
        """The latest judgment of ``head`` as a change to ``base_ref`` at its tip ``base`` (a retargeted PR is judged
        again; one whose base moved has a stale verdict: ``judged_on``)."""
        return next(
            (r for r in reversed(self.reviews) if r.head == head and r.base_ref == base_ref and r.base == base), None
        )

    def judged_on(self, head: str, base_ref: str) -> PrReview | None:
        """The latest judgment of ``head`` as a change to ``base_ref``, whatever tip the base had then."""
        return next((r for r in reversed(self.reviews) if r.head == head and r.base_ref == base_ref), None)

    def is_posted(self, review: PrReview) -> bool:
        """What the PR shows now is this review: the latest post was it (a force-push back to an older head
        brings that head's verdict back to the comment)."""
        return (
            bool(self.posted)
            and self.posted[-1].evaluation == review.evaluation
            and self.posted[-1].outcome == review.outcome
        )

    def is_posted_stale(self, review: PrReview, base: str) -> bool:
        """What the PR shows now is ``review`` marked stale against the base's tip ``base``."""
        return (
            bool(self.posted)
            and self.posted[-1].evaluation == review.evaluation
            and self.posted[-1].outcome == STALE
            and self.posted[-1].base == base
        )


class StaleVerdict(AgentsearchError):
    """--merge refused: the verdict was judged against another tip of the base than the one it has now."""

    def __init__(self, message: str, base: str) -> None:
        super().__init__(message)
        self.base = base


class Reviewer:
    def __init__(self, ws: Workspace, forge: Forge, *, say: Say | None = None, merge: bool = False) -> None:
        self.ws, self.forge, self.merge = ws, forge, merge
        self.cfg = ws.config().forge
        self.say: Say = say or (lambda stage, detail: None)

    def context(self, base_ref: str) -> str:
        """The status's context: [forge] context for a change to the baseline branch; for one to another branch, the
        context names it (a head judged against an old branch never passes a check required on the baseline)."""
        baseline = self.ws.config().target.baseline
        return (
            self.cfg.context
            if base_ref == baseline
            else f"{self.cfg.context} (base {rtext.clean(base_ref, 60, one_line=True)})"
        )

    # ------------------------------------------------------------------------------------------ state
    def history(self, number: int) -> PrHistory:
        h = PrHistory()
        for e in read_entries(self.ws):
            r = e.record
            if isinstance(r, (PrReview, PrPosted, PrCommand)) and r.forge == self.forge.identity and r.number == number:
                if isinstance(r, PrReview):
                    h.reviews.append(r)
                elif isinstance(r, PrPosted):
                    h.posted.append(r)
                else:
                    h.commands.add(r.comment_id)
                    if r.reason == NO_PERMISSION:
                        h.refused.add(r.author)
        return h

    # ------------------------------------------------------------------------------------------ judging
    def fetch(self, pr: PullRequest) -> tuple[str, str]:
        """(head, base): the PR's head and its base branch's tip, fetched into refs/agentsearch/pr/N/."""
        if pr.state != "open":
            raise AgentsearchError(
                f"pull request #{pr.number} is {pr.state or 'not open'}: only open pull requests are judged"
            )
        ok = git.run_git("check-ref-format", "--branch", pr.base_ref, cwd=self.ws.repo_dir, check=False)
        if not pr.base_ref or not ok or pr.base_ref.startswith("-"):
            raise AgentsearchError(
                f"pull request #{pr.number}: its base {rtext.clean(pr.base_ref, 80, one_line=True)!r} is not a branch "
                "name"
            )
        if not re.fullmatch(r"[0-9a-f]{40}", pr.head_sha):
            raise AgentsearchError(f"pull request #{pr.number}: the forge gave no commit for its head")
        remote = self.cfg.remote
        if git.remote_url(self.ws.repo_dir, remote) is None:
            raise AgentsearchError(
                f"the target has no git remote {remote!r} to fetch pull requests from; add it with "
                f"`git remote add {remote} URL` or set [forge] remote"
            )
        refs = f"refs/agentsearch/pr/{pr.number}"
        self.say("fetch", f"#{pr.number} head {pr.head_sha[:12]} and base {pr.base_ref}")
        try:
            git.run_git(
                "fetch",
                "--no-tags",
                "--quiet",
                remote,
                f"+refs/pull/{pr.number}/head:{refs}/head",
                f"+refs/heads/{pr.base_ref}:{refs}/base",
                cwd=self.ws.repo_dir,
            )
        except AgentsearchError as exc:
            raise AgentsearchError(
                f"could not fetch pull request #{pr.number} from {remote}: {str(exc).splitlines()[0][:200]}"
            ) from None
        head = git.resolve_commit(self.ws.repo_dir, f"{refs}/head")
        if head != pr.head_sha:
            raise AgentsearchError(
                f"pull request #{pr.number} moved while it was fetched (the forge says {pr.head_sha[:12]}, "
                f"the remote has {head[:12]}); run again"
            )
        return head, git.resolve_commit(self.ws.repo_dir, f"{refs}/base")

    def base_tip(self, number: int, base_ref: str) -> str:
        """The base branch's tip on the remote now (fetched again into refs/agentsearch/pr/N/base)."""
        ref = f"refs/agentsearch/pr/{number}/base"
        try:
            git.run_git(
                "fetch", "--no-tags", "--quiet", self.cfg.remote, f"+refs/heads/{base_ref}:{ref}", cwd=self.ws.repo_dir
            )
        except AgentsearchError as exc:
            raise AgentsearchError(
                f"could not fetch {base_ref!r} from {self.cfg.remote} for pull request #{number}: "
                f"{str(exc).splitlines()[0][:200] if str(exc) else 'git fetch failed'}"
            ) from None
        return git.resolve_commit(self.ws.repo_dir, ref)

    def review(self, pr: PullRequest, *, seed: int | None = None, trigger: str = "review-pr") -> PrReview:
        """Judge the PR's head against its base, record the verdict, then post it."""
        head, base = self.fetch(pr)
        before = [
            r for r in self.history(pr.number).reviews if (r.head, r.base_ref, r.base) != (head, pr.base_ref, base)
        ]
        measuring = f"agentsearch is measuring this head against {pr.base_ref}"
        if self.cfg.check_runs:  # first: a token that may not create them is refused before the head shows anything
            self.forge.check_run(head, self.context(pr.base_ref), None, measuring, measuring)
        self.forge.set_status(head, "pending", self.context(pr.base_ref), measuring)
        try:  # the caller holds the workspace lock (commands.forge: the whole pass)
            result = evaluate(self.ws, head, seed=seed, progress=self.say, baseline=base)
        except AgentsearchError as exc:  # the run could not judge: say so on the head, then fail as the run's error
            said = f"agentsearch could not judge this head: {exc}"
            try:
                self.forge.set_status(head, "error", self.context(pr.base_ref), said)
                if self.cfg.check_runs:  # never left in progress (a required check would wait forever)
                    self.forge.check_run(
                        head, self.context(pr.base_ref), "neutral", said[:250], rtext.md_inline(said, 2000)
                    )
            except ForgeError:
                pass
            raise
        record = result.record(
            self.ws.config(result.baseline).objective.name,
            title=f"pull request #{pr.number} at {head[:12]}",  # ours: the PR's own title is not shown
        )
        k = 1 + sum(r.head == head for r in self.history(pr.number).reviews)
        eval_id = f"pr-{pr.number}/{head[:12]}/{k}"
        append(self.ws, record, None, eval_id)
        outcome, _ = outcome_of(record)
        review = PrReview(
            forge=self.forge.identity,
            number=pr.number,
            head=head,
            base=base,
            base_ref=pr.base_ref,
            evaluation=eval_id,
            verdict=result.verdict.verdict,
            outcome=outcome,
            headline=headline(record),
            seed=result.seed,
            trigger=trigger,
            supersedes=before[-1].head if before else None,
        )
        append(self.ws, review, None, eval_id)
        self.say("verdict", f"#{pr.number} {review.headline}")
        not_merged, stale, merged = None, None, None
        if self.merge and review.verdict == MERGE:
            try:
                merged = self._merge(pr, review)
            except StaleVerdict as exc:  # posted as stale: the verdict does not hold on the base there is now
                not_merged, stale = str(exc).splitlines()[0], exc.base
            except AgentsearchError as exc:  # the verdict is posted all the same, and says why it was not merged
                not_merged = str(exc).splitlines()[0] if str(exc) else "the merge failed"
        self.post(pr, review, not_merged, stale)
        if merged:
            self._close(pr, merged)
        if not_merged:
            raise AgentsearchError(not_merged)
        return review

    def _merge(self, pr: PullRequest, review: PrReview) -> str:
        """--merge: agentsearch's own commit of the judged tree on the judged base (the pull request's commits never
        enter the baseline), the gate's compare-and-swap merge of it onto the local baseline branch, then a push of
        it; the merge commit. Refused unless the forge's head is still the judged one and the base's tip, on the
        remote and here, is still the one it was judged against."""
        baseline, n = self.ws.config().target.baseline, pr.number
        if pr.base_ref != baseline:
            raise AgentsearchError(f"--merge: pull request #{n} is for {pr.base_ref!r}, not the baseline {baseline!r}")
        try:
            now = self.forge.pull(n)
        except ForgeError as exc:
            raise AgentsearchError(
                f"--merge: could not read pull request #{n} again before merging: {str(exc).splitlines()[0][:200]}"
            ) from None
        if now.state != "open":
            raise AgentsearchError(f"--merge: pull request #{n} is {now.state or 'not open'} now; not merged")
        if now.head_sha != review.head:
            raise AgentsearchError(
                f"--merge: pull request #{n} moved since it was judged (judged {review.head[:12]}, its head is now "
                f"{rtext.clean(now.head_sha, 40, one_line=True)[:12] or 'unknown'}); not merged: judge the new head"
            )
        if now.base_ref != review.base_ref:
            raise AgentsearchError(
                f"--merge: pull request #{n} was retargeted to {rtext.clean(now.base_ref, 60, one_line=True)!r} since "
                "it was judged; not merged"
            )
        tip = self.base_tip(n, review.base_ref)
        if tip != review.base:
            raise StaleVerdict(
                f"--merge: a verdict judged against another base: #{n} was judged against {baseline} at "
                f"{review.base[:12]}, {baseline} is now at {tip[:12]}; not merged: judge it again",
                tip,
            )
        if self.ws.baseline_commit() != review.base:
            raise AgentsearchError(
                f"--merge: the local {baseline} is not the base it was measured against ({review.base[:12]}); update "
                f"it (`git fetch {self.cfg.remote} && git branch -f {baseline} {review.base[:12]}`) and run again"
            )
        repo = self.ws.repo_dir
        if not git.is_ancestor(repo, review.base, review.head):
            raise AgentsearchError(
                f"--merge: pull request #{n}'s head {review.head[:12]} does not contain its base {review.base[:12]}: "
                "its tree would undo what the base has since; not merged: rebase it and judge it again"
            )
        squash = git.commit_tree(
            repo,
            git.tree_of(repo, review.head),
            [review.base],
            f"agentsearch: pull request #{n} as judged\n\nThe tree of its head {review.head[:12]} as one commit on "
            f"{review.base[:12]}, the base it was judged against (evaluation {review.evaluation}); the pull request's "
            "own commits are not merged.\n",
        )
        new = self.ws.merge(squash, review.base, f"agentsearch: merge pull request #{n}\n\n{review.headline}\n")
        append(
            self.ws,
            Merge(number=pr.number, ok=True, old=review.base, new=new, candidate=review.head),
            None,
            review.evaluation,
        )
        err = git.push(self.ws.repo_dir, self.cfg.remote, baseline)
        if err:
            raise AgentsearchError(
                f"merged locally as {new[:12]} but `git push {self.cfg.remote} {baseline}` failed: {err}"
            )
        self.say("merge", f"#{pr.number} merged into {baseline} as {new[:12]} and pushed")
        return new

    def _close(self, pr: PullRequest, merged: str) -> None:
        """Close a pull request merged by --merge: its head is not in the baseline (its judged tree is), so the forge
        does not see it merged. A refusal is said; the merge stands (the comment says where it went)."""
        try:
            self.forge.close_pull(pr.number)
        except ForgeError as exc:
            self.say(
                "warning",
                f"#{pr.number} merged as {merged[:12]} but not closed: {str(exc).splitlines()[0][:200]}; close it",
            )

    # ------------------------------------------------------------------------------------------ posting
    def our_comment(self, number: int, h: PrHistory) -> Comment | None:
        me = self.forge.me()
        for p in reversed(h.posted):
            c = self.forge.comment(p.comment_id)
            if c is not None and c.author == me and c.body.startswith(MARKER):
                return c
        return next((c for c in self.forge.comments(number) if c.author == me and c.body.startswith(MARKER)), None)

    def post(
        self, pr: PullRequest, review: PrReview, not_merged: str | None = None, stale: str | None = None
    ) -> PrPosted:
        """The comment (edited in place), then the head's status; recorded once both reached the forge. ``stale``:
        the base's tip now, when it is not the one ``review`` was judged against (status pending: judge it again)."""
        h = self.history(pr.number)
        body = self.render(pr, review, h, not_merged, stale)
        existing = self.our_comment(pr.number, h)
        comment = self.forge.edit_comment(existing.id, body) if existing else self.forge.create_comment(pr.number, body)
        context = self.context(review.base_ref)
        if stale:
            ref = rtext.clean(review.base_ref, 40, one_line=True)
            description = (
                f"stale: judged against {ref} at {review.base[:12]}, now at {stale[:12]}; judge it again "
                "(/agentsearch evaluate)"
            )
            self.forge.set_status(review.head, "pending", context, description, comment.html_url or None)
            if self.cfg.check_runs:  # action required: a neutral conclusion would pass a required check
                self.forge.check_run(review.head, context, "error", description, body, comment.html_url or None)
        else:
            _, description = outcome_of(self._record(review))
            self.forge.set_status(review.head, review.outcome, context, description, comment.html_url or None)
            if self.cfg.check_runs:
                self.forge.check_run(review.head, context, review.outcome, description, body, comment.html_url or None)
        posted = PrPosted(
            forge=self.forge.identity,
            number=pr.number,
            head=review.head,
            evaluation=review.evaluation,
            comment_id=comment.id,
            comment_url=comment.html_url,
            outcome=STALE if stale else review.outcome,
            base=stale or review.base,
        )
        append(self.ws, posted, None, review.evaluation)
        self.say("posted", f"#{pr.number} {posted.outcome}: {comment.html_url or comment.id}")
        return posted

    def _record(self, review: PrReview) -> EvaluationRecord:
        for e in reversed(read_entries(self.ws)):
            if isinstance(e.record, EvaluationRecord) and e.proposal == review.evaluation:
                return e.record
        raise AgentsearchError(f"no evaluation recorded for {review.evaluation}")

    def aa_rate(self) -> tuple[int, int]:
        """(merged, judged) among this target's recorded A/A evaluations: measured trials of a candidate whose tree is
        its baseline's (`agentsearch evaluate BRANCH` against itself records one)."""
        seen = judged = merged = 0
        trees: dict[str, str] = {}

        def tree(c: str) -> str:
            if c not in trees:
                try:
                    trees[c] = git.tree_of(self.ws.repo_dir, c)
                except AgentsearchError:
                    trees[c] = "?" + c
            return trees[c]

        for e in reversed(read_entries(self.ws)):
            r = e.record
            if not isinstance(r, (Verdict, EvaluationRecord)) or not r.candidate or not r.baseline:
                continue
            seen += 1
            if seen > AA_WINDOW:
                break
            measured = any(w.pairs > 0 for w in r.workloads.values())
            if measured and tree(r.candidate) == tree(r.baseline):
                judged += 1
                merged += r.verdict == MERGE
        return merged, judged

    def render(
        self, pr: PullRequest, review: PrReview, h: PrHistory, not_merged: str | None = None, stale: str | None = None
    ) -> str:
        ev = gather(self.ws, review.evaluation)
        merged, judged = self.aa_rate()
        alpha = ev.alpha or self.ws.config(review.base).gate.alpha
        merge_commit = next(
            (
                e.record.new
                for e in read_entries(self.ws)
                if isinstance(e.record, Merge) and e.proposal == review.evaluation and e.record.ok
            ),
            None,
        )
        return render_pr_review(
            ev,
            marker=MARKER,
            pr_number=pr.number,
            review=review,
            alpha=alpha,
            aa_merged=merged,
            aa_judged=judged,
            commands=COMMANDS,
            merged=merge_commit,
            not_merged=not_merged,
            stale=stale,
            pr_evaluations=len(h.reviews),
            earlier=[(r.head, r.outcome) for r in h.reviews if r.evaluation != review.evaluation][-5:],
        )

    # ------------------------------------------------------------------------------------------ the bot
    def ensure(
        self, pr: PullRequest, *, seed: int | None = None, trigger: str = "bot", judge_stale: bool = False
    ) -> PrReview:
        """The PR's current head judged once against its base's tip and posted: judged now if it never was, else
        posted if it is not. A head judged against another tip of its base has a stale verdict: posted as stale
        (pending), judged again only when asked (``judge_stale``: `/agentsearch evaluate`), or not at all when
        --merge merged it (the base moved by that merge)."""
        head, base = self.fetch(pr)
        h = self.history(pr.number)
        review = h.review_of(head, pr.base_ref, base)
        if review is None:
            old = h.judged_on(head, pr.base_ref)
            if old is None or judge_stale:
                return self.review(pr, seed=seed, trigger=trigger)
            if not self._merged(old) and not h.is_posted_stale(old, base):
                self.post(pr, old, stale=base)
            return old
        if not h.is_posted(review):
            self.post(pr, review)
        return review

    def _merged(self, review: PrReview) -> bool:
        return any(
            isinstance(e.record, Merge) and e.record.ok and e.proposal == review.evaluation
            for e in read_entries(self.ws)
        )

    def reply(self, number: int, to: int, asked: str, text: str) -> Comment:
        body = (
            f"{REPLY_MARKER.format(to)}\n> `/agentsearch "
            f"{rtext.clean(asked, 60, one_line=True).replace('`', chr(39))}`\n\n{text}\n"
        )
        return self.forge.create_comment(number, body)

    def commands(self, pr: PullRequest, *, seed: int | None = None) -> int:
        """Answer the comment commands not answered yet (oldest first); the number answered. Each is recorded once it
        is answered; one answered before a kill (our reply names its comment) is recorded, not answered again."""
        h = self.history(pr.number)
        me = self.forge.me()
        comments = self.forge.comments(pr.number)
        replied = {int(m.group(1)) for c in comments if c.author == me for m in [REPLIED.match(c.body)] if m}
        done = 0
        for c in comments:
            if c.author == me or c.id in h.commands:
                continue
            m = COMMAND.search(c.body)
            if m is None:
                continue
            word, arg = m.group(1).lower(), m.group(2)
            asked = f"{word} {arg}".strip()
            action, why, answer = "run", "", True
            if not self.forge.can_write(c.author):  # first: whatever a reader asks, they are told once per PR (no spam)
                action, why = "ignored", NO_PERMISSION
                answer = c.author not in h.refused
            elif word not in COMMANDS:
                action, why = (
                    "ignored",
                    (
                        f"unknown command {rtext.md_inline(word or '(none)', 40)}; the commands are "
                        + ", ".join(f"`{k}`" for k in COMMANDS)
                    ),
                )
            if c.id in replied:
                why = why or f"{word}: answered before a restart"
            elif action == "ignored":
                if answer:
                    self.reply(pr.number, c.id, asked, f"Ignored: {why}.")
            else:
                why = self._run_command(pr, c, word, arg, h, seed)
            author = rtext.clean(c.author, 80, one_line=True)
            append(
                self.ws,
                PrCommand(
                    forge=self.forge.identity,
                    number=pr.number,
                    comment_id=c.id,
                    author=author,
                    command=rtext.clean(word, 40, one_line=True),
                    action=action,
                    reason=why,
                ),
                None,
                None,
            )
            h.commands.add(c.id)
            if why == NO_PERMISSION:
                h.refused.add(author)
            done += 1
        return done

    def _run_command(self, pr: PullRequest, c: Comment, word: str, arg: str, h: PrHistory, seed: int | None) -> str:
        trigger = f"command:{c.id}"
        if word in ("evaluate", "recheck"):
            done = next((r for r in h.reviews if r.trigger == trigger), None)  # ran before a kill: not again
            if done is None:
                done = (
                    self.ensure(pr, seed=seed, trigger=trigger, judge_stale=True)
                    if word == "evaluate"
                    else self.review(pr, seed=seed, trigger=trigger)
                )
            elif not h.is_posted(done):
                self.post(pr, done)
            return f"{word}: {done.headline}"
        from .report import stack_markdown
        from .stack import bisect, check

        try:
            record: Any = (
                check(self.ws, seed=seed, progress=self.say)
                if word == "stack"
                else bisect(self.ws, arg or None, seed=seed, progress=self.say)
            )
        except AgentsearchError as exc:
            self.reply(pr.number, c.id, f"{word} {arg}".strip(), f"Could not run it: {rtext.md_inline(str(exc), 300)}")
            return f"{word}: {str(exc)[:200]}"
        self.reply(pr.number, c.id, f"{word} {arg}".strip(), stack_markdown(record))
        return f"{word}: {getattr(record, 'verdict', None) or getattr(record, 'reason', '')}"[:300]

    def once(self, label: str | None = None, *, seed: int | None = None) -> dict[str, Any]:
        """One pass over the open pull requests (with ``label`` when given): commands, then each head judged."""
        label = self.cfg.label if label is None else label
        summary: dict[str, Any] = {"judged": [], "errors": []}
        try:
            prs, unreadable = self.forge.pulls()
        except AgentsearchError as exc:  # the forge could not list them: this pass judged nothing, the next tries again
            summary["errors"].append(
                {"number": None, "error": str(exc).splitlines()[0][:300] if str(exc) else "listing failed"}
            )
            self.say("error", summary["errors"][-1]["error"][:200])
            return summary
        for line in unreadable:
            summary["errors"].append({"number": None, "error": line[:300]})
            self.say("error", line[:200])
        for pr in prs:
            if label and label not in pr.labels:
                continue
            try:
                self.commands(pr, seed=seed)
                known = {r.evaluation for r in self.history(pr.number).reviews}
                review = self.ensure(pr, seed=seed)
                if review.evaluation not in known:
                    summary["judged"].append(
                        {
                            "number": pr.number,
                            "head": review.head,
                            "outcome": review.outcome,
                            "headline": review.headline,
                        }
                    )
            except Exception as exc:  # noqa: BLE001 - one PR's failure is not the others': said in one line, tried again next pass
                text = str(exc).splitlines()[0] if str(exc) else ""
                msg = text if isinstance(exc, (AgentsearchError, OSError)) else f"{type(exc).__name__}: {text}"
                summary["errors"].append({"number": pr.number, "error": msg[:300]})
                self.say("error", f"#{pr.number}: {msg[:200]}")
        return summary


def forge_for(ws: Workspace, **kw: Any) -> Forge:
    cfg = ws.config().forge
    return Forge.from_config(cfg, git.remote_url(ws.repo_dir, cfg.remote), **kw)


def reviewer(ws: Workspace, say: Callable[[str, str], None] | None = None, merge: bool = False) -> Reviewer:
    return Reviewer(ws, forge_for(ws), say=say, merge=merge)

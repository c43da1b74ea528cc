"""Red team: poison inputs from proposals (issue 18, "robust trial I/O").

Candidate code controls what a trial writes to ``{out}``, stdout, stderr and the warm
worker's result pipe, and a proposal controls file names and the target's numbers. Each
attack below must be a clean REJECT of that one proposal with a reason naming the problem,
never a crash, a hang or a memory blow-up, and the run must finish. Everything is real:
git repositories, child processes, the CLI.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agentsearch.workspace import Workspace
from harness.engine_session import WorkerSession
from harness.trials import MAX_METRIC_KEYS, REASON_CHARS, TAIL_CHARS, CommandSpec, read_metrics, run_child, tail
from harness.worker_protocol import MAX_MESSAGE_BYTES, WorkerError

from ..conftest import ROOT, commit, git, make_repo, run_cli, write

pytestmark = pytest.mark.timeout(120)

# the bench is protected; it runs whatever the (candidate's) engine does
BENCH = """\
import os, sys
sys.path.insert(0, os.getcwd())
seed, out = int(sys.argv[1]), sys.argv[2]
from src import engine
engine.run(seed, out)
"""

ENGINE = """\
import json, random


def run(seed, out):
    json.dump({"ops_s": 1000.0 * random.gauss(1.0, 0.02), "seed": seed}, open(out, "w"))
"""

CONFIG = """\
[target]
baseline = "main"
protected = ["bench/**", "./bench.sh"]

[[workload]]
name = "speed"
command = "{python} bench/bench.py {{seed}} {{out}}"
metric = "ops_s"
timeout_s = {timeout}

[gate]
max_pairs = 6
confirm_pairs = 2
{gate}
"""


def make_target(path: Path, timeout: float = 8, gate: str = "") -> Path:
    repo = make_repo(
        path,
        {
            "agentsearch.toml": CONFIG.format(python=sys.executable, timeout=timeout, gate=gate),
            "bench/bench.py": BENCH,
            "bench.sh": "echo bench\n",
            "src/__init__.py": "",
            "src/engine.py": ENGINE,
        },
    )
    proc = run_cli("init", "-C", str(repo))
    assert proc.returncode == 0, proc.stderr
    return repo


def poison(repo: Path, branch: str, body: str) -> None:
    """A proposal whose engine's ``run(seed, out)`` is ``body``."""
    code = "import json, os, random, subprocess, sys, time\n\n\ndef run(seed, out):\n" + textwrap.indent(
        textwrap.dedent(body), "    "
    )
    commit(repo, {"src/engine.py": code}, branch, branch=branch)


def evaluate(repo: Path, ref: str, timeout: float = 110) -> tuple[int, dict, float]:
    t0 = time.monotonic()
    proc = run_cli("evaluate", "-C", str(repo), ref, "--json", timeout=timeout)
    took = time.monotonic() - t0
    assert proc.stdout, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout), took


def assert_rejected(rc: int, out: dict, *needles: str) -> str:
    assert rc == 4 and out["verdict"] == "reject", out
    joined = " | ".join(out["reasons"])
    for needle in needles:
        assert needle in joined, (needle, out["reasons"])
    for r in out["reasons"]:
        assert len(r) < 2 * REASON_CHARS + 200 and "\x1b" not in r, r
    return joined


@pytest.fixture
def target(tmp_path: Path) -> Path:
    return make_target(tmp_path / "toy")


# ----------------------------------------------------------------------------- {out}: the metrics file
@pytest.mark.parametrize(
    "name, body, needles",
    [
        ("huge-int", "open(out, 'w').write('{\"ops_s\": 1' + '0' * 400 + '}')\n", ("out of range",)),
        ("nan", "open(out, 'w').write('{\"ops_s\": NaN}')\n", ("NaN",)),
        ("infinity", "open(out, 'w').write('{\"ops_s\": 1e999}')\n", ("out of range",)),
        ("fifo", "os.unlink(out) if os.path.exists(out) else None\nos.mkfifo(out)\n", ("not a plain file",)),
        ("dev-zero", "os.symlink('/dev/zero', out)\n", ("symbolic link",)),
        (
            "huge-file",
            "open(out, 'w').write('{\"ops_s\": 1000.0, \"pad\": \"' + 'x' * (3 << 20) + '\"}')\n",
            ("bytes",),
        ),
        ("deep", "open(out, 'w').write('[' * 200000 + ']' * 200000)\n", ("not JSON",)),
        ("directory", "os.mkdir(out)\n", ("not a plain file",)),
    ],
)
def test_poisoned_metrics_file_is_a_clean_reject(target, name, body, needles):
    poison(target, name, body)
    rc, out, took = evaluate(target, name)
    assert_rejected(rc, out, "candidate trial failed", *needles)
    assert took < 60


def test_ten_thousand_metric_keys_are_refused_and_the_history_stays_small(target):
    poison(
        target,
        "keys",
        """\
        m = {f"extra_key_{i:05d}": i for i in range(10000)}
        m["ops_s"] = 1000.0
        json.dump(m, open(out, "w"))
    """,
    )
    rc, out, _ = evaluate(target, "keys")
    assert_rejected(rc, out, "10001 keys", f"at most {MAX_METRIC_KEYS}")
    history = Workspace.open(target).state / "history.jsonl"
    assert history.stat().st_size < 200_000, history.stat().st_size


def test_metric_values_are_bounded_before_they_are_recorded(tmp_path):
    out = tmp_path / "m.json"
    out.write_text(json.dumps({"v": 2.0, "name": "\x1b[31mred\x1b[0m" + "y" * 5000, "nested": {"a": [1] * 1000}}))
    data, err = read_metrics(out, "v")
    assert err == "" and data is not None
    assert data["name"].startswith("red") and len(data["name"]) <= 200 and "\x1b" not in data["name"]
    assert "nested" not in data and "nested" in data["dropped_metrics"]
    out.write_text(json.dumps({"v": 2.0, "k" * 500: 1}))
    data, err = read_metrics(out, "v")
    assert data is None and "longer than" in err and len(err) < 200


# ----------------------------------------------------------------------------- stdout / stderr
def _spec(tmp_path: Path, code: str, timeout: float = 20) -> CommandSpec:
    script = tmp_path / "b.py"
    script.write_text(code)
    return CommandSpec(f"{sys.executable} {script} {{seed}} {{out}}", tmp_path, "v", timeout, {})


def test_fifty_megabytes_of_output_stay_out_of_the_orchestrators_memory(tmp_path):
    code = (
        "import json, os, sys\n"
        "chunk = ('\\x1b[1mspam\\xff\\x00 ' * 6554).encode('utf-8', 'surrogateescape')[:65536]\n"
        "for _ in range(800):\n"
        "    os.write(1, chunk)\n"
        "for _ in range(100):\n"
        "    os.write(2, chunk)\n"
        "json.dump({'v': 1.0}, open(sys.argv[2], 'w'))\n"
    )
    (tmp_path / "b.py").write_text(code)
    probe = f"""
import json, resource, sys, time
sys.path.insert(0, {str(ROOT)!r})
from harness.trials import CommandSpec, run_command_trial
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.monotonic()
o = run_command_trial(CommandSpec({sys.executable!r} + " " + {str(tmp_path / 'b.py')!r} + " {{seed}} {{out}}", __import__('pathlib').Path({str(tmp_path)!r}), "v", 60.0, {{}}), 1, __import__('pathlib').Path({str(tmp_path / 'o')!r}))
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"ok": o.ok, "tail": o.stderr_tail, "growth_kib": after - before, "s": time.monotonic() - t0}}))
"""
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert res["ok"]
    assert res["growth_kib"] < 30 * 1024, res["growth_kib"]  # 50 MB of output: under 30 MiB of memory
    assert len(res["tail"]) <= TAIL_CHARS and "\x1b" not in res["tail"] and "\x00" not in res["tail"]
    assert "spam" in res["tail"]


def test_stderr_in_a_reason_is_capped_and_sanitized(target):
    poison(
        target,
        "noisy",
        """\
        sys.stderr.write("\\x1b[2J\\x1b]0;owned\\x07" + "\\u0007bell " * 100000 + "\\n")
        sys.stderr.buffer.write(b"Z" * 5000 + b"\\xff\\xfe bad bytes\\n")
        sys.exit(7)
    """,
    )
    rc, out, _ = evaluate(target, "noisy")
    joined = assert_rejected(rc, out, "exited with status 7", "bad bytes")
    assert "\x07" not in joined and "owned" not in joined
    trials = out["trials"]
    assert trials and all(len(t.get("stderr_tail") or "") <= TAIL_CHARS for t in trials)
    assert any("bad bytes" in t["stderr_tail"] and "\x1b" not in t["stderr_tail"] for t in trials)
    assert tail("a\x1b[31mb\x00c\r\nd\ud800", 15) == "abc\nd"
    assert len(tail("x" * 10**6, 1)) == REASON_CHARS


def test_setsid_child_holding_stdout_neither_hangs_nor_survives_the_trial(tmp_path):
    pidfile = tmp_path / "daemon.pid"
    code = (
        "import subprocess, sys\n"
        f"p = subprocess.Popen(['setsid', {sys.executable!r}, '-c', 'import time; time.sleep(90)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
    )
    t0 = time.monotonic()
    rc, out, err, wall = run_child([sys.executable, "-c", code], tmp_path, dict(os.environ), 2.0, sandboxed=False)
    assert time.monotonic() - t0 < 10 and rc == 0
    _assert_dead(int(pidfile.read_text()))
    # the same daemon, and the parent itself hanging: the trial timeout holds
    code2 = code + "import time; time.sleep(90)\n"
    t0 = time.monotonic()
    rc, out, err, wall = run_child([sys.executable, "-c", code2], tmp_path, dict(os.environ), 2.0, sandboxed=False)
    assert rc is None and time.monotonic() - t0 < 10
    _assert_dead(int(pidfile.read_text()))


def _assert_dead(pid: int) -> None:
    for _ in range(100):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[-1].split()[0] == "Z":
                    return
        except FileNotFoundError:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    pytest.fail(f"process {pid} survived its trial")


def test_setsid_daemon_with_sandbox_off_does_not_hang_evaluate(tmp_path):
    repo = make_target(tmp_path / "toy", timeout=4, gate='sandbox = "off"')
    pidfile = tmp_path / "daemons.txt"
    poison(
        repo,
        "daemon",
        f"""\
        p = subprocess.Popen(["setsid", sys.executable, "-c", "import time; time.sleep(100)"])
        open({str(pidfile)!r}, "a").write(f"{{p.pid}}\\n")
        json.dump({{"ops_s": 1000.0 * random.gauss(1.0, 0.02)}}, open(out, "w"))
    """,
    )
    rc, out, took = evaluate(repo, "daemon")
    assert out["verdict"] == "reject" and took < 90
    pids = [int(x) for x in pidfile.read_text().split()]
    assert pids
    for pid in pids:
        _assert_dead(pid)


# ----------------------------------------------------------------------------- the warm worker's pipe
class _Pipe:
    """A WorkerSession whose result pipe the test writes to (the worker itself is a sleeper)."""

    def __init__(self, tmp_path: Path):
        self.s = WorkerSession({}, tmp_path, {}, tmp_path / "w.log", "v", timeout_s=5)
        self.s.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdin=subprocess.PIPE)
        r, self.w = os.pipe()
        self.s._rfd = r
        os.set_blocking(self.w, False)

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.w, view)
            except BlockingIOError:
                time.sleep(0.001)
                continue
            except OSError:  # the reader gave up and the pipe is closed
                return
            view = view[n:]

    def read(self) -> str:
        try:
            self.s._read(5, "measurement")
        except WorkerError as exc:
            return str(exc)
        return ""

    def close(self) -> None:
        os.close(self.w)
        self.s.proc.kill()  # a sleeper, not a worker: it would not answer "quit"
        self.s.close()


@pytest.mark.parametrize(
    "payload, needle",
    [
        (b'{"event": "result", "metrics": {"v": 1' + b"0" * 400 + b"}}\n", "out of range"),
        (b'{"event": "result", "metrics": {"v": NaN}}\n', "NaN"),
        (b"[1, 2]\n", "not a JSON object"),
        (b"\xff\xfe\n", "malformed"),
        (json.dumps({"event": "result", "metrics": {f"k{i}": i for i in range(10000)}}).encode() + b"\n", "10000 keys"),
        (
            json.dumps({"event": "error", "error": "\x1b[31m" + "E" * 100000}).encode() + b"\n",
            "engine error during measurement",
        ),
    ],
)
def test_worker_pipe_poison_is_an_error_not_a_crash(tmp_path, payload, needle):
    pipe = _Pipe(tmp_path)
    try:
        import threading

        threading.Thread(target=pipe.send, args=(payload,), daemon=True).start()
        err = pipe.read()
        assert needle in err and len(err) < 2 * REASON_CHARS + 200 and "\x1b" not in err, err
    finally:
        pipe.close()


def test_worker_oversized_message_ends_the_session(tmp_path):
    pipe = _Pipe(tmp_path)
    try:
        import threading

        threading.Thread(target=pipe.send, args=(b"x" * (MAX_MESSAGE_BYTES + (1 << 20)),), daemon=True).start()
        assert "worker sent an oversized message" in pipe.read()
        out = pipe.s.measure(1)  # the pipe can no longer be trusted: every later request fails at once
        assert not out.ok and "oversized" in out.error
    finally:
        pipe.close()


def test_a_silent_worker_is_a_timeout_and_a_dead_one_a_crash(tmp_path):
    """The failure kind the bandit and the insights count: a worker that never answers timed out, one that
    closed its pipe crashed (the English reason is for people; nothing parses it)."""
    pipe = _Pipe(tmp_path)
    try:
        pipe.s.ready, pipe.s.timeout_s = {"event": "ready"}, 1.0
        out = pipe.s.measure(1)
        assert (out.ok, out.failure) == (False, "timeout") and "timed out after 1 s" in out.error, out
    finally:
        pipe.close()
    pipe = _Pipe(tmp_path)
    try:
        pipe.s.ready = {"event": "ready"}
        pipe.s.proc.kill()  # the worker died: its pipes close
        pipe.s.proc.wait()
        os.close(pipe.w)
        pipe.w = os.open(os.devnull, os.O_WRONLY)  # close() closes it again
        out = pipe.s.measure(1)
        assert (out.ok, out.failure) == (False, "crash") and "engine process died" in out.error, out
    finally:
        pipe.close()


# ----------------------------------------------------------------------------- proposals and config
def test_non_utf8_file_name_and_binary_file_in_a_proposal_are_judged(tmp_path):
    repo = make_target(tmp_path / "toy")
    write(repo, {"src/engine.py": ENGINE.replace("# nothing", "") + "# a comment\n"})
    (repo / os.fsdecode(b"src/caf\xe9-\xff.txt")).write_text("latin-1 name\n")
    (repo / "src" / "blob.bin").write_bytes(bytes(range(256)) * 4)
    git(repo, "checkout", "-q", "-b", "try/odd")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "odd names")
    git(repo, "checkout", "-q", "main")
    commit(repo, {"src/engine.py": ENGINE + "# another comment\n"}, "plain", branch="try/plain")
    proc = run_cli("episode", "-C", str(repo), "--json", "--branches", "try/*", "--seed", "3", timeout=110)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    out = json.loads(proc.stdout)
    assert out["judged"] == 2
    for row in out["proposals"]:
        assert row["verdict"] == "reject" and row["reasons"], row
        assert not any("internal error" in r or "does not apply" in r for r in row["reasons"]), row["reasons"]
    # the history is readable, verifiable, and resume has nothing left to do
    assert run_cli("history", "verify", "-C", str(repo)).returncode == 0
    again = run_cli("episode", "-C", str(repo), "--resume")
    assert again.returncode == 2 and "no unfinished episode" in again.stderr


def test_episode_goes_on_after_a_poisoned_proposal(tmp_path):
    repo = make_target(tmp_path / "toy")
    poison(repo, "try/1-huge", "open(out, 'w').write('{\"ops_s\": 1' + '0' * 400 + '}')\n")
    commit(repo, {"src/engine.py": ENGINE + "# a comment\n"}, "plain", branch="try/2-plain")
    proc = run_cli("episode", "-C", str(repo), "--json", "--branches", "try/*", "--seed", "5", timeout=110)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    rows = {r["branch"]: r for r in out["proposals"]}
    assert out["judged"] == 2
    huge = [r for r in out["proposals"] if any("out of range" in x for x in r["reasons"])]
    assert len(huge) == 1 and huge[0]["verdict"] == "reject", rows


def test_nan_timeout_is_refused_in_one_line(tmp_path):
    for bad in ("nan", "inf", "-1.0"):
        repo = make_repo(
            tmp_path / f"cfg-{bad}",
            {
                "agentsearch.toml": CONFIG.format(python=sys.executable, timeout=bad, gate=""),
                "bench/bench.py": BENCH,
                "src/engine.py": ENGINE,
            },
        )
        proc = run_cli("init", "-C", str(repo))
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "timeout_s" in lines[0] and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "globs, ok",
    [
        (["./bench.sh"], True),
        (["bench/"], True),
        (["**"], True),
        (["/etc/passwd"], False),
        (["../outside/**"], False),
        (["a/../../b"], False),
        ([""], False),
    ],
)
def test_protected_globs_are_normalized_or_refused(globs, ok):
    from agentsearch.config import load_config_text
    from agentsearch.errors import ConfigError

    text = 'protected = ' + json.dumps(globs) + '\n[[workload]]\nname = "w"\ncommand = "true"\nmetric = "m"\n'
    text = "[target]\n" + text
    if ok:
        cfg = load_config_text(text)
        assert all(not g.startswith(("./", "/")) and not g.endswith("/") for g in cfg.target.protected)
    else:
        with pytest.raises(ConfigError) as exc:
            load_config_text(text)
        assert "protected" in str(exc.value) and "\n" not in str(exc.value)


def test_dot_slash_protected_glob_protects_the_file(target):
    commit(target, {"bench.sh": "echo cheat\n"}, "touch bench.sh", branch="cheat")
    rc, out, _ = evaluate(target, "cheat")
    assert_rejected(rc, out, "protected", "bench.sh")
    assert not any(t for t in out.get("trials", []))


def test_dollar_in_the_target_path_is_taken_literally(tmp_path):
    repo = make_target(tmp_path / "$HOME" / "toy")
    proc = run_cli("history", "-C", str(repo), "--json")
    assert proc.returncode == 0, proc.stderr


def _bench_running(target: Path) -> bool:
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/cmdline", "rb") as fh:
                cmd = fh.read()
        except OSError:
            continue
        if b"bench/bench.py" in cmd and os.fsencode(str(target)) in cmd:
            return True
    return False


def test_sigterm_cleans_up_like_ctrl_c(target):
    poison(target, "hang", "time.sleep(3600)\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentsearch.cli", "evaluate", "-C", str(target), "hang"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60  # wait until a trial of it runs (the handler is installed by then)
    while time.monotonic() < deadline and not _bench_running(target):
        time.sleep(0.2)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in err, err
    # the lock was released and no worktree is left behind
    again = run_cli("history", "-C", str(target))
    assert again.returncode == 0 and "lock" not in again.stderr

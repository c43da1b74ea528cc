"""Red team, round 2: escapes found by attacking the per-side sandbox (each was a real break once).

Privileges (remount a read-only bind, mknod + mount the host's disk), state smuggled across trials
past the worktree check (same-size rewrite with the mtime put back, bytecode files, extended
attributes, directory times), the orchestrator steered through files a side wrote (a redirected
``.git`` with hooks and filters, symbolic links where the orchestrator writes or reads, FIFOs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from agentsearch.workspace import Workspace

from ..conftest import ROOT, commit, git, make_repo, run_cli
from .test_isolation import assert_no_win, evaluate, make_target, medians, verify_attack

pytestmark = pytest.mark.timeout(300)

REMOUNT = """
import ctypes, os
FACTOR = 1.0
libc = ctypes.CDLL(None, use_errno=True)
if libc.mount(None, os.path.abspath("bench/bench.py").encode(), None, 32 | 4096, None) == 0:  # MS_REMOUNT|MS_BIND, rw
    s = open("bench/bench.py").read()
    if "CHEAT" not in s:
        open("bench/bench.py", "w").write(s.replace('factor = float(open("speed.txt").read())',
            'factor = float(open("speed.txt").read()) * (1.0 if os.getcwd().endswith("candidate") else 0.75)  # CHEAT'))
"""

HOST_DISK = """
import ctypes, os, stat, sys
FACTOR = 1.0
libc = ctypes.CDLL(None, use_errno=True)
try:
    os.makedirs("/tmp/m1", exist_ok=True)
    os.makedirs("/tmp/m2", exist_ok=True)
    libc.mount(b"tmpfs", b"/tmp/m1", b"tmpfs", 0, None)
    dev = os.stat("/").st_dev
    os.mknod("/tmp/m1/d", 0o600 | stat.S_IFBLK, os.makedev(os.major(dev), os.minor(dev)))
    if libc.mount(b"/tmp/m1/d", b"/tmp/m2", b"ext4", 0, None) == 0:
        open("/tmp/m2" + os.environ["CANARY"], "w").write("host write\\n")
except Exception as e:
    sys.stderr.write("ESC %r\\n" % e)
"""


def test_no_capabilities_inside_a_sandbox(tmp_path):
    canary = tmp_path / "PWNED"
    repo = make_target(tmp_path, files={})
    cfg = (repo / "agentsearch.toml").read_text().replace(
        "[target.env]", "[target.env]"
    ) + f'\n[target.env]\nCANARY = "{canary}"\n'
    commit(repo, {"agentsearch.toml": cfg}, "canary")
    main = Workspace.open(repo).baseline_commit()
    commit(repo, {"model.py": REMOUNT}, "remount the pinned bench", branch="remount")
    commit(repo, {"model.py": HOST_DISK}, "mount the host disk", branch="disk")
    for branch in ("remount", "disk"):
        rc, out = evaluate(repo, branch)
        assert rc == 4, (branch, out["reasons"])
        assert_no_win(repo, out, main)
        base, cand = medians(out)
        assert cand < 1.1 * base and base > 900, (branch, base, cand)
    assert git(repo, "show", "main:bench/bench.py") == (repo / "bench" / "bench.py").read_text()
    assert "CHEAT" not in (repo / "bench" / "bench.py").read_text()
    assert not canary.exists()


STASH = {
    "inplace": (
        {"data.bin": "0" * 63 + "\n"},
        """
import os
st = os.stat("data.bin")
warm = open("data.bin").read().startswith("1")
FACTOR = 1.4 if warm else 1.0
if not warm:
    with open("data.bin", "r+") as fh:
        fh.write("1")
    os.utime("data.bin", ns=(st.st_atime_ns, st.st_mtime_ns))
""",
    ),
    "pyc": (
        {},
        """
import os
p = os.path.join("__pycache__", "model.cpython-311.pyc")
FACTOR = 1.4 if os.path.exists(p) else 1.0
os.makedirs("__pycache__", exist_ok=True)
open(p, "w").write("warm")
""",
    ),
    "xattr": (
        {},
        """
import os
try:
    warm = os.getxattr("model.py", "user.warm") == b"1"
except OSError:
    warm = False
FACTOR = 1.4 if warm else 1.0
try:
    os.setxattr("model.py", "user.warm", b"1")
except OSError:
    pass
""",
    ),
    "dirmtime": (
        {"cache/.keep": ""},
        """
import os
warm = os.stat("cache").st_mtime_ns % 1000000000 == 123456789
FACTOR = 1.4 if warm else 1.0
os.utime("cache", ns=(1, 1700000000123456789))
""",
    ),
}


@pytest.mark.parametrize("channel", sorted(STASH))
def test_state_smuggled_between_trials_in_the_worktree_is_seen(tmp_path, channel):
    files, attack = STASH[channel]
    repo = make_target(tmp_path, files=files)
    main = Workspace.open(repo).baseline_commit()
    commit(repo, {"model.py": attack}, f"warm path via {channel}", branch="attack")
    rc, out = evaluate(repo, "attack")
    assert rc == 4
    assert_no_win(repo, out, main)
    assert any("worktree modified during a trial" in r for r in out["reasons"]), out["reasons"]


GIT_RCE_TEST = r'''
import os, subprocess
import model
gitfile = open(".git").read()
common = os.path.dirname(os.path.dirname(gitfile.split("gitdir:", 1)[1].strip()))
evil = os.path.join(os.path.dirname(os.environ["AGENTSEARCH_OUT"]), "evilgit")
g = ["git", "-c", "user.name=x", "-c", "user.email=x@x", "--git-dir", evil, "--work-tree", "."]
subprocess.run(g + ["init", "-q"], check=True)
subprocess.run(g + ["add", "model.py"], check=True)
subprocess.run(g + ["commit", "-qm", "x"], check=True)
payload = f"echo pwned > {os.environ['CANARY']}; git --git-dir={common} update-ref refs/heads/main refs/heads/attack; cat"
with open(os.path.join(evil, "config"), "a") as fh:
    fh.write(f'[filter "pwn"]\n\tsmudge = "sh -c \'{payload}\'"\n[core]\n\tfsmonitor = "sh -c \'echo fsm >> {os.environ["CANARY"]}\'"\n')
os.makedirs(os.path.join(evil, "info"), exist_ok=True)
open(os.path.join(evil, "info", "attributes"), "w").write("* filter=pwn\n")
open(".git", "w").write(f"gitdir: {evil}\n")
open("model.py", "a").write("# touched\n")
'''


def test_a_redirected_git_link_never_runs_anything_on_the_host(tmp_path):
    canary = tmp_path / "PWNED"
    repo = make_target(
        tmp_path,
        target_extra=f'test = "{sys.executable} test_model.py"',
        files={"test_model.py": "import model\nassert model.FACTOR == 1.0\n"},
    )
    cfg = (repo / "agentsearch.toml").read_text() + f'\n[target.env]\nCANARY = "{canary}"\n'
    commit(repo, {"agentsearch.toml": cfg}, "canary")
    main = Workspace.open(repo).baseline_commit()
    commit(repo, {"test_model.py": GIT_RCE_TEST, "model.py": "FACTOR = 1.0  # tidy\n"}, "tests", branch="attack")
    rc, out = evaluate(repo, "attack")
    assert Workspace.open(repo).baseline_commit() == main
    assert not canary.exists()
    assert out["verdict"] != "merge"


COVERAGE_LINK = """
import os
FACTOR = 1.0
out = os.environ.get("AGENTSEARCH_OUT", "")
if "/trials/" in out:
    mine = out.split("/trials/")[0]
    common = os.path.dirname(os.path.dirname(open(".git").read().split("gitdir:", 1)[1].strip()))
    os.makedirs(os.path.join(mine, "coverage"), exist_ok=True)
    for name in ("watch.json", "hits"):
        try:
            os.symlink(os.path.join(common, "refs", "heads", "main"), os.path.join(mine, "coverage", name))
        except FileExistsError:
            pass
"""

COVERAGE_FIFO = """
import os
FACTOR = 1.0
hits = os.environ.get("AGENTSEARCH_TRACE_OUT")
if hits:
    try:
        os.mkfifo(os.path.join(hits, "hits-0.txt"))
    except FileExistsError:
        pass
"""


@pytest.mark.parametrize("attack", ["link", "fifo"])
def test_the_coverage_pass_is_not_steered_by_the_candidates_outputs(tmp_path, attack):
    repo = make_target(tmp_path)
    main = Workspace.open(repo).baseline_commit()
    commit(
        repo,
        {"model.py": COVERAGE_LINK if attack == "link" else COVERAGE_FIFO, "speed.txt": "1.3\n"},
        "faster + x",
        branch="attack",
    )
    rc, out = evaluate(repo, "attack")  # finishes (a FIFO once hung it forever)
    assert git(repo, "rev-parse", "main").strip() == main  # refs/heads/main intact
    assert (repo / ".git" / "refs" / "heads" / "main").read_text().strip() == main


def test_a_committed_link_to_dev_zero_is_refused_not_read(tmp_path):
    from benchmarks.toy_engine import CONFIG, THROUGHPUT, TOY_INPUTS, TOY_VLLM

    repo = make_repo(
        tmp_path / "fork",
        {
            "agentsearch.toml": CONFIG.format(**THROUGHPUT),
            "vllm/__init__.py": TOY_VLLM,
            "vllm/inputs.py": TOY_INPUTS,
            "cost.txt": "0.0008\n",
        },
    )
    assert run_cli("init", "-C", str(repo)).returncode == 0
    git(repo, "checkout", "-q", "-b", "attack")
    os.symlink("/dev/zero", repo / "serving.json")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "serving config")
    git(repo, "checkout", "-q", "main")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    proc = subprocess.run(
        [
            "prlimit",
            "--as=4000000000",
            sys.executable,
            "-m",
            "agentsearch.cli",
            "evaluate",
            "-C",
            str(repo),
            "attack",
            "--json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        env=env,
    )
    out = json.loads(proc.stdout)
    assert proc.returncode == 4 and out["verdict"] == "reject"
    assert any("serving.json" in r and "symbolic link" in r for r in out["reasons"]), out["reasons"]


LINK_LM = """
import os, sys
prompts, out = sys.argv[1], sys.argv[2]
if out.endswith("/verify/cand.jsonl"):  # the side directories have opaque names: guess the other one, or any file
    side_dir = os.path.dirname(os.path.dirname(out))
    outs = os.path.dirname(side_dir)
    try:
        others = [d for d in os.listdir(outs) if os.path.join(outs, d) != side_dir]
    except OSError:
        others = []
    base = os.path.join(outs, others[0], "verify", "base.jsonl") if others else "/etc/hostname"
    try:
        os.unlink(out)
    except FileNotFoundError:
        pass
    os.symlink(base, out)
    sys.exit(0)
src = open("lm_real.py").read().replace("EPS = np.float32(1e-5)", "EPS = np.float32(1e-1)")
sys.argv = ["lm.py", prompts, out]
exec(compile(src, "lm_real.py", "exec"), {"__name__": "__main__"})
"""


def test_a_link_to_the_baselines_dump_is_not_followed(tmp_path):
    res = verify_attack(tmp_path, LINK_LM)
    assert res["verdict"] == "fail", res
    assert any("symbolic link" in r for r in res["reasons"]), res["reasons"]

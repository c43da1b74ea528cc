"""The preflight: set-up errors and a broken baseline are the run's error (exit 5, one line, in
seconds), never a rejection of a proposal; the environment's broken package is named.

Toy command targets (real git repositories, real sandboxed children); the vLLM workloads named in
some configs are only looked at statically, never started.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from agentsearch import preflight
from agentsearch.cli import main
from agentsearch.config import BUILT_IN_MODELS

from .conftest import TOY_BENCH, commit, git, make_repo, run_cli, toy_config

pytestmark = pytest.mark.timeout(300)

SECONDS = 30  # "within seconds" on a loaded 2-core machine (a clean run takes 2-6 s)
GEN = """
[[workload]]
name = "gen"
kind = "vllm-throughput"
metric = "output_tok_s"
model = "{model}"
"""


def toy(root: Path, extra_files: dict[str, str] | None = None, extra: str = "", cfg: str | None = None) -> Path:
    files = {
        "agentsearch.toml": cfg or toy_config(timeout=10, extra=extra),
        "bench/bench.py": TOY_BENCH,
        "speed.txt": "1.0\n",
        "src/model.py": "X = 1\n",
        **(extra_files or {}),
    }
    return make_repo(root, files)


def one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback (most recent call last)" not in stderr, stderr
    return lines[0]


def kinds(repo: Path) -> list[str]:
    path = repo / ".git" / "agentsearch" / "history.jsonl"
    return [json.loads(line)["kind"] for line in path.read_text().splitlines()] if path.exists() else []


def cli(*args: str) -> SimpleNamespace:
    """The CLI in this process (the real group, error handler and exit codes; no interpreter start-up)."""
    res = CliRunner().invoke(main, list(args))
    return SimpleNamespace(returncode=res.exit_code, stdout=res.stdout, stderr=res.stderr)


def timed(*args: str, child: bool = False) -> tuple[SimpleNamespace, float]:
    """A command run quietly (its stderr is then the error line alone) and its wall time; ``child``:
    through the real console entry point in a child process."""
    t0 = time.monotonic()
    argv = (*args[:1], *([] if args[0] == "init" else ["-q"]), *args[1:])
    proc = run_cli(*argv) if child else cli(*argv)
    return proc, time.monotonic() - t0


def queue(repo: Path, root: Path) -> Path:
    """A patch queue of one real 30% win."""
    commit(repo, {"speed.txt": "1.3\n"}, "faster", branch="scratch/fast")
    q = root / "queue"
    q.mkdir()
    (q / "01-fast.patch").write_text(git(repo, "format-patch", "--stdout", "main..scratch/fast"))
    return q


BAD_SETUPS = {
    "missing-model-dir": (GEN.format(model="/nonexistent/models/llama"), "is not a directory"),
    "hf-id": (
        GEN.format(model="meta-llama/Llama-3.2-1B"),
        "huggingface-cli download meta-llama/Llama-3.2-1B --local-dir DIR",
    ),
    "missing-overlay": ("", "overlay_from '/nonexistent/site-packages' is not a directory"),
}


def bad_config(case: str) -> str:
    extra, _ = BAD_SETUPS[case]
    cfg = toy_config(timeout=10, extra=extra)
    if case == "missing-overlay":
        cfg = cfg.replace(
            'protected = ["bench/**"]',
            'protected = ["bench/**"]\ninstall = "overlay"\noverlay_from = "/nonexistent/site-packages"',
        )
    return cfg


def test_static_model_checks_name_the_fix(tmp_path):
    assert "tiny" in BUILT_IN_MODELS
    assert preflight.check_model("w", "tiny").status == preflight.OK
    hf = preflight.check_model("workload 'gen'", "Qwen/Qwen2.5-0.5B")
    assert (
        hf.status == preflight.FAIL
        and "Hugging Face id" in hf.detail
        and "huggingface-cli download Qwen/Qwen2.5-0.5B" in hf.fix
    )
    missing = preflight.check_model("w", str(tmp_path / "nope"))
    assert missing.status == preflight.FAIL and "is not a directory" in missing.detail and '"tiny"' in missing.fix
    (tmp_path / "empty").mkdir()
    empty = preflight.check_model("w", str(tmp_path / "empty"))
    assert empty.status == preflight.FAIL and "no config.json" in empty.detail
    (tmp_path / "empty" / "config.json").write_text("{}")
    assert preflight.check_model("w", str(tmp_path / "empty")).status == preflight.OK


@pytest.mark.parametrize("case", sorted(BAD_SETUPS))
def test_init_refuses_a_bad_setup(tmp_path, case):
    repo = toy(tmp_path / "t", cfg=bad_config(case))
    proc, wall = timed("init", "-C", str(repo), child=case == "hf-id")  # once through the console entry point
    assert proc.returncode == 5, proc.stderr
    line = one_line(proc.stderr)
    assert line.startswith("agentsearch: error: preflight: ") and BAD_SETUPS[case][1] in line
    assert wall < SECONDS


def test_a_bad_setup_stops_episode_and_evaluate_before_anything_is_judged(tmp_path):
    repo = toy(tmp_path / "t")
    assert cli("init", "-C", str(repo)).returncode == 0
    q = queue(repo, tmp_path)
    for case in sorted(BAD_SETUPS):
        commit(
            repo, {"agentsearch.toml": bad_config(case)}, f"a set-up mistake: {case}"
        )  # on the baseline: what runs read
        proc, wall = timed("episode", "-C", str(repo), "--patches", str(q), "--seed", "1")
        assert proc.returncode == 5, (case, proc.stdout, proc.stderr)
        assert BAD_SETUPS[case][1] in one_line(proc.stderr) and wall < SECONDS, case
    proc, wall = timed("evaluate", "-C", str(repo), "scratch/fast", "--json")
    assert (
        proc.returncode == 5 and proc.stdout == "" and BAD_SETUPS[case][1] in one_line(proc.stderr) and wall < SECONDS
    )
    assert kinds(repo) == []  # no episode started, no proposal, no verdict, no evaluation recorded


def test_broken_baseline_stops_the_episode_as_a_run_error_and_resume_judges_after_the_fix(tmp_path):
    repo = toy(tmp_path / "t")
    assert cli("init", "-C", str(repo)).returncode == 0
    q = queue(repo, tmp_path)
    commit(repo, {"mode.txt": "crash\n"}, "break the baseline")  # its bench crashes: every proposal would be rejected
    proc, wall = timed("episode", "-C", str(repo), "--patches", str(q), "--seed", "1")
    assert proc.returncode == 5, (proc.stdout, proc.stderr)
    line = one_line(proc.stderr)
    assert (
        "is broken: speed: exited with status 1" in line
        and "ZeroDivisionError" in line
        and "alone too" in line
        and "--resume" in line
    )
    assert wall < SECONDS
    assert "verdict" not in kinds(repo) and kinds(repo).count("run-error") == 1
    err = [
        json.loads(line)
        for line in (repo / ".git" / "agentsearch" / "history.jsonl").read_text().splitlines()
        if '"run-error"' in line
    ][0]
    assert err["proposal"].endswith("/001") and err["data"]["kind"] == "BaselineBroken"
    # the baseline fixed, the same episode continues and judges the proposal it could not judge
    git(repo, "rm", "-q", "mode.txt")
    git(repo, "-c", "commit.gpgsign=false", "commit", "-qm", "fix the baseline")
    proc = cli("episode", "-C", str(repo), "-q", "--resume", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["judged"] == 1 and out["proposals"][0]["verdict"] in ("merge", "reject")
    assert kinds(repo).count("verdict") == 1


def test_broken_baseline_build_is_a_run_error_for_evaluate(tmp_path):
    cfg = toy_config(timeout=10).replace(
        'protected = ["bench/**"]', 'protected = ["bench/**"]\ninstall = "command"\nbuild = "sh build.sh"'
    )
    repo = toy(tmp_path / "t", {"build.sh": "exit 0\n"}, cfg=cfg)
    assert cli("init", "-C", str(repo)).returncode == 0
    commit(repo, {"speed.txt": "1.3\n"}, "faster", branch="fast")
    commit(repo, {"build.sh": "echo 'cc: fatal error: missing.h' >&2; exit 1\n"}, "break the baseline's build")
    git(repo, "checkout", "-q", "fast")
    git(repo, "rebase", "-q", "main")  # the candidate contains the baseline (and its broken build)
    git(repo, "checkout", "-q", "main")
    proc, wall = timed("evaluate", "-C", str(repo), "fast", "--json")
    assert proc.returncode == 5 and proc.stdout == "", proc.stderr
    line = one_line(proc.stderr)
    assert "is broken: build: baseline: build failed" in line and "missing.h" in line and wall < SECONDS
    assert "evaluation" not in kinds(repo)


FAKE_OK = {
    "torch/__init__.py": "__version__ = '9.9'\n",
    "torch-9.9.dist-info/METADATA": "Metadata-Version: 2.1\nName: torch\nVersion: 9.9\n",
    "transformers/__init__.py": "AutoTokenizer = LlamaConfig = object\n",
    "vllm/__init__.py": "LLM = SamplingParams = object\n",
}


def vllm_target(root: Path, files: dict[str, str]) -> Path:
    """A toy target with a vLLM guard (never started here) whose imports the probe checks: the
    packages in its worktree come first on the path, as the fork's vllm does."""
    repo = toy(root, files, extra=GEN.format(model="tiny"))
    assert cli("init", "-C", str(repo)).returncode == 0
    return repo


@pytest.mark.parametrize(
    "files, needle",
    [
        (
            {**FAKE_OK, "torch/__init__.py": "raise OSError('libtorch_cpu.so: cannot open shared object file')\n"},
            "`import torch` fails in the baseline's sandbox: OSError: libtorch_cpu.so",
        ),
        (
            {**FAKE_OK, "torchvision/__init__.py": "raise RuntimeError('operator torchvision::nms does not exist')\n"},
            "`import torchvision` fails in the baseline's sandbox: RuntimeError: operator torchvision::nms does not exist",
        ),
    ],
)
def test_broken_environment_is_diagnosed_by_name(tmp_path, monkeypatch, files, needle):
    monkeypatch.setenv("AGENTSEARCH_CACHE", str(tmp_path / "cache"))
    repo = vllm_target(tmp_path / "t", files)
    proc, wall = timed("preflight", "-C", str(repo), "--json")
    assert proc.returncode == 5, proc.stderr
    out = json.loads(proc.stdout)
    env = {c["name"]: c for c in out["checks"]}["environment"]
    assert out["ok"] is False and env["status"] == "fail" and needle in env["detail"], env
    assert "torch 9.9" in env["detail"] and wall < SECONDS
    assert not list((tmp_path / "cache").glob("preflight/*"))  # a failure is never cached


def test_environment_probe_passes_once_and_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTSEARCH_CACHE", str(tmp_path / "cache"))
    repo = vllm_target(tmp_path / "t", FAKE_OK)
    proc = cli("preflight", "-C", str(repo), "--json")
    assert proc.returncode == 0, proc.stderr
    env = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}["environment"]
    assert env["status"] == "ok" and "torch 9.9" in env["detail"] and "cached" not in env["detail"]
    assert len(list((tmp_path / "cache").glob("preflight/environment-*.json"))) == 1
    again = json.loads(cli("preflight", "-C", str(repo), "--json").stdout)
    assert {c["name"]: c for c in again["checks"]}["environment"]["detail"].endswith("(cached)")


def test_preflight_run_builds_the_baseline_alone_and_names_its_failure(tmp_path):
    repo = toy(tmp_path / "t")
    assert cli("init", "-C", str(repo)).returncode == 0
    proc = cli("preflight", "-C", str(repo), "--run")
    assert proc.returncode == 0 and "builds alone and runs each workload once (speed)" in proc.stdout, (
        proc.stdout + proc.stderr
    )
    commit(repo, {"mode.txt": "crash\n"}, "break the baseline")
    proc = cli("preflight", "-C", str(repo), "--run", "--json")
    out = json.loads(proc.stdout)
    base = {c["name"]: c for c in out["checks"]}["baseline"]
    assert (
        proc.returncode == 5
        and out["schema_version"] == 1
        and base["status"] == "fail"
        and "ZeroDivisionError" in base["detail"]
    )

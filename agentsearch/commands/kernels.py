"""`agentsearch kernels`: the kernel library, op-level benchmarks and kernel proposals.

- ``kernels list``: the IR ops, the library's implementations, and the providers each registers.
- ``kernels bench OP --baseline-provider X --candidate-provider Y [--baseline REF] [--candidate REF]``:
  the micro stage alone — correctness of the candidate side on every generated and hidden case, then
  interleaved timing (fresh processes, each side in its own sandbox, the gate's paired statistics).
- ``kernels propose OP --impl NAME``: a commit on a new branch of the fork that adds the library's
  provider to the fork's registry and selects it in ``serving.json`` (``ir_op_priority``).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from harness.seeds import new_master
from harness.trials import BASELINE, CANDIDATE
from kernels import catalog
from kernels import fork as kfork

from .. import micro
from ..errors import EXIT_GATE_REJECT, AgentsearchError
from ..gate import Status
from ..sides import built_sides
from ..workspace import Workspace, git
from .output import out, print_json, progress


def list_(as_json: bool) -> int:
    data = {
        "ops": {
            name: {
                "summary": o.summary,
                "signature": o.signature,
                "dtypes": list(o.dtypes),
                "tolerances": {d: o.tolerance(d) for d in o.dtypes},
            }
            for name, o in catalog.OPS.items()
        },
        "library": [
            {"name": p.name, "op": p.op, "kind": p.kind, "source": f"kernels/library/{p.module}", "summary": p.summary}
            for p in catalog.PROVIDERS
        ],
    }
    if as_json:
        print_json(data)
        return 0
    for name, o in catalog.OPS.items():
        out.print(f"[bold]{name}[/]{o.signature}  — {o.summary}")
        for p in catalog.providers(name):
            out.print(f"  {p.name:20s} {p.kind:7s} {p.summary}")
    return 0


def bench(
    target: Path,
    as_json: bool,
    op: str,
    baseline_provider: str,
    candidate_provider: str,
    baseline: str | None,
    candidate: str | None,
    pairs: int,
    seed: int | None,
) -> int:
    if op not in catalog.OPS:
        raise AgentsearchError(f"unknown op {op!r}; the fork's IR ops are: {', '.join(catalog.OPS)}")
    for p in (baseline_provider, candidate_provider):
        if not p.replace("_", "a").isalnum() or not p.islower():
            raise AgentsearchError(
                f"provider {p!r}: expected a registered provider name such as native or agentsearch_cpu"
            )
    ws = Workspace.open(target)
    base = ws.resolve(baseline) if baseline else ws.baseline_commit()
    cand = ws.resolve(candidate) if candidate else base
    config = ws.config(ws.baseline_commit())
    master = seed if seed is not None else new_master()
    t = micro.Target(op, (baseline_provider,), (candidate_provider,), "kernels bench")
    with ws.lock(), progress() as say:
        with built_sides(
            ws, config, {BASELINE: base, CANDIDATE: cand}, f"kbench-{master % 100000:05d}", "kernels bench"
        ) as sd:
            check, result = micro.run(
                config, sd, [t], master, config.gate.regression_alpha, say, pairs=(max(2, pairs // 2), pairs)
            )
    data = {
        "op": op,
        "baseline": {"ref": base, "provider": baseline_provider},
        "candidate": {"ref": cand, "provider": candidate_provider},
        "seed": master,
        "status": check.status.value,
        "detail": check.detail,
        "micro": result.to_json(),
    }
    if as_json:
        print_json(data)
    else:
        color = {"pass": "green", "fail": "red", "review": "yellow"}[check.status.value]
        out.print(
            f"[bold {color}]{check.status.value.upper()}[/] {op}: {baseline_provider} ({base[:10]}) vs "
            f"{candidate_provider} ({cand[:10]})"
        )
        r = result.ops[0]
        out.print(
            f"  correctness: {r.cases} generated + {r.hidden_cases} hidden cases"
            + (" correct" if r.correct else f", {len(r.failures)} failed")
            + (f" (dispatched: {r.providers})" if r.providers else "")
        )
        for f in r.failures[:5]:
            out.print(f"    - {f}")
        if r.speedup is not None and r.ci is not None:
            out.print(
                f"  timing: {r.baseline_us:.0f} -> {r.candidate_us:.0f} us per mix, speedup {r.speedup:.3f}x "
                f"[95% CI {r.ci[0]:.3f}, {r.ci[1]:.3f}] over {r.pairs} pairs"
            )
        out.print(f"  {check.detail}")
    return 0 if check.status == Status.PASS else EXIT_GATE_REJECT


def propose(target: Path, as_json: bool, op: str, impl: str, branch: str | None) -> int:
    try:
        p = catalog.provider(op, impl)
    except KeyError as exc:
        raise AgentsearchError(str(exc.args[0])) from None
    ws = Workspace.open(target)
    base = ws.baseline_commit()
    init_text = git.show_file(ws.repo_dir, base, kfork.KERNELS_INIT)
    if init_text is None:
        raise AgentsearchError(
            f"{kfork.KERNELS_INIT} is not in the baseline: this target is not a vLLM fork with IR ops"
        )
    name = branch or f"kernels/{p.name}-{op}"
    if git.branch_exists(ws.repo_dir, name):
        raise AgentsearchError(f"branch {name} exists already; choose another with --branch")
    files = {
        kfork.module_path(p): kfork.module_text(p),
        kfork.KERNELS_INIT: kfork.kernels_init(init_text, p),
        micro.SERVING_FILE: kfork.with_priority(git.show_file(ws.repo_dir, base, micro.SERVING_FILE), op, p.name),
    }
    title = f"kernel: {op} via {p.name} ({p.kind})"
    body = (
        f"{title}\n\n{p.summary}.\nAdds {kfork.module_path(p)} (from agentsearch's kernels/library/{p.module}), "
        f"registers it as provider {p.name!r} of vllm.ir.ops.{op} and puts it first in serving.json's "
        f"ir_op_priority.{op}.\n"
    )
    sha = commit_files_on(ws.repo_dir, base, name, files, body)
    data = {"branch": name, "commit": sha, "op": op, "provider": p.name, "files": sorted(files)}
    if as_json:
        print_json(data)
    else:
        out.print(f"[bold]{name}[/] ({sha[:12]}): {title}")
        out.print(
            f"  judge it: agentsearch evaluate {name}   (the micro stage runs first), or kernels bench {op} "
            f"--candidate {name} --candidate-provider {p.name}"
        )
    return 0


def commit_files_on(repo_dir: Path, parent: str, branch: str, files: dict[str, str], message: str) -> str:
    """A commit on new ``branch`` = ``parent``'s tree with ``files`` written (a private index; no checkout touched)."""
    with tempfile.TemporaryDirectory(prefix="agentsearch-index-") as d:
        env = {"GIT_INDEX_FILE": os.path.join(d, "index")}
        git.run_git("read-tree", parent, cwd=repo_dir, env=env)
        for path, text in files.items():
            blob = git.run_git("hash-object", "-w", "--no-filters", "--stdin", cwd=repo_dir, input=text).strip()
            git.run_git("update-index", "--add", "--cacheinfo", f"100644,{blob},{path}", cwd=repo_dir, env=env)
        tree = git.run_git("write-tree", cwd=repo_dir, env=env).strip()
    sha = git.commit_tree(repo_dir, tree, [parent], message)
    git.run_git("update-ref", "-m", "agentsearch: kernels propose", f"refs/heads/{branch}", sha, "0" * 40, cwd=repo_dir)
    return sha

"""`agentsearch profile`: where the time of a workload goes, on the baseline or any ref.

One warm vLLM worker in the ref's worktree (in-process engine, sandboxed like a measurement)
runs one warm-up round and then one round under cProfile and the PyTorch profiler (CUDA
activities too on a GPU); ``harness.profiling`` ranks the time by op, module and engine phase.
The summary is recorded in the history (kind ``profile``): proposers read the latest ones.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

from harness import seeds
from harness.engine_session import WorkerSession
from harness.profiling import summarize
from harness.safe_io import UnsafeFile, read_beneath
from harness.trials import BASELINE, CANDIDATE
from harness.worker_protocol import WorkerError

from .config import WORKLOAD_KINDS
from .errors import AgentsearchError
from .sides import built_sides
from .workloads import engine_spec
from .workspace import Workspace

PROFILABLE = tuple(k.name for k in WORKLOAD_KINDS.values() if k.profilable)
PSTATS_LIMIT = 256 << 20  # the largest profile read back from a side


def profile(
    ws: Workspace,
    ref: str | None,
    workload: str | None,
    seed: int | None = None,
    say: Callable[[str, str], None] | None = None,
) -> dict[str, Any]:
    say = say or (lambda stage, detail: None)
    commit = ws.resolve(ref) if ref else ws.baseline_commit()
    config = ws.config()
    try:
        w = config.workload(workload) if workload else config.objective
    except KeyError:
        raise AgentsearchError(
            f"no workload {workload!r}; the target has {', '.join(x.name for x in config.workloads)}"
        ) from None
    if not w.spec.profilable:
        raise AgentsearchError(
            f"workload {w.name!r} is {w.kind}; profile runs the built-in {' / '.join(PROFILABLE)} workloads (pass "
            "--workload)"
        )
    name = f"profile-{commit[:10]}-{secrets.randbelow(100000):05d}"
    env = {
        **config.target.env,
        **w.env,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }  # the engine's work in the profiled process
    s = seed if seed is not None else seeds.pair_seeds(0, w.name)(0)
    base = ws.baseline_commit()
    commits = {BASELINE: base} if commit == base else {BASELINE: base, CANDIDATE: commit}
    side = BASELINE if commit == base else CANDIDATE
    say("build", f"worktree of {commit[:12]}")
    # checked against the protected paths and built with the baseline's config, in its own sandbox
    with built_sides(ws, config, commits, name, f"profiling {commit[:12]}") as sd:
        out = sd.out(side)
        try:
            sess = WorkerSession(
                engine_spec(w),
                sd.worktrees[side],
                env,
                sd.logs / "engine.log",
                w.metric,
                w.timeout_s,
                w.startup_timeout_s,
            )
            sess.start()
            try:
                say("profile", "engine start-up and a warm-up round")
                sess.request(
                    {"cmd": "measure", "seed": s, "kind": w.kind, "params": dict(w.params)},
                    w.startup_timeout_s + w.timeout_s,
                )
                say("profile", "profiled round")
                ans = sess.request(
                    {
                        "cmd": "profile",
                        "seed": s,
                        "kind": w.kind,
                        "params": dict(w.params),
                        "out": str(out / "run.pstats"),
                    },
                    w.timeout_s * 3,
                )
            finally:
                sess.close()
            res = ans["metrics"]
            # the side wrote run.pstats: read without following a link, a regular file, capped, into a file of ours
            private = sd.scratch / "run.pstats"
            private.write_bytes(read_beneath(out, out / "run.pstats", PSTATS_LIMIT))
            summary = summarize(private, res["ops"], float(res["wall_s"]))
        except (WorkerError, UnsafeFile, KeyError, TypeError, ValueError, EOFError) as exc:
            raise AgentsearchError(f"profiling {w.name} at {commit[:12]} failed: {exc}") from None
    return {
        "ref": ref or config.target.baseline,
        "commit": commit,
        "workload": w.name,
        "kind": w.kind,
        "device": res.get("device"),
        "metric": {w.metric: (res.get("metrics") or {}).get(w.metric)},
        **summary,
    }

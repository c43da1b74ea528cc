"""Does a change of the serving config take effect? Checked before any engine starts (issue #58).

A search over knobs wastes most on the ones the engine ignores: an environment variable vLLM does not read, a
value it clamps or takes by default anyway, a flag another one overrides (``compilation_config`` under
``enforce_eager``). Measured, such a change costs an evaluation's engine starts and pairs to be rejected for no
worthwhile speedup; resolved, it costs seconds. For a candidate that changes ``serving.json`` and nothing else, each
side's own vLLM resolves the objective workload's engine configuration in the side's sandbox and environment
(``harness.engine_session.ResolveSession``: ``EngineArgs.create_engine_config`` and ``vllm.envs``, no engine) and
the two are compared. The same configuration and the same environment on both sides — while only the serving file
changed — is no effect: rejected (``takes-effect``, failure ``no-effect``), with what changed and what vLLM made of
it. Variables vLLM does not parse (``OMP_``, ``KMP_``, ...: read by the runtime) count as an effect when they differ:
they are measured. Any other change (code) is not resolvable before it runs: skipped, and measured as always.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from harness.engine_pool import EnginePool
from harness.trials import BASELINE, CANDIDATE
from harness.worker_protocol import SERVING_FILE, read_serving
from history.records import FailureKind, text

from .config import Config, WorkloadConfig
from .gate import Status
from .sides import Sides
from .workloads import resolve_sides
from .workspace import git

SHOWN = 4  # differences named in the check's detail


def differences(base: Any, cand: Any, path: str = "") -> list[str]:
    """Where two resolutions differ, as ``path: base -> candidate`` (objects walked key by key)."""
    if isinstance(base, Mapping) and isinstance(cand, Mapping):
        out: list[str] = []
        for k in sorted(set(base) | set(cand)):
            out += differences(base.get(k), cand.get(k), f"{path}.{k}" if path else str(k))
        return out
    if base == cand:
        return []
    return [f"{_short(path, 120)}: {_short(base)} -> {_short(cand)}"]


def _short(v: Any, limit: int = 60) -> str:
    """A value or name for the detail: cleaned (names and values are the proposal's text), one line, capped."""
    return text.clean(json.dumps(v) if not isinstance(v, str) else v, limit, one_line=True)


def serving_changes(base: Mapping[str, Any], cand: Mapping[str, Any]) -> list[str]:
    """What the candidate's serving.json changed: ``engine.key: old -> new`` and ``env.NAME: old -> new``."""
    out = []
    for part in ("engine", "env"):
        a, b = base.get(part), cand.get(part)
        a, b = ({} if a is None else a), ({} if b is None else b)
        if not isinstance(a, Mapping) or not isinstance(b, Mapping):
            out.append(f"{part}: rewritten")
            continue
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                old = "default" if k not in a else _short(a[k])
                out.append(f"{part}.{_short(k)}: {old} -> {'default' if k not in b else _short(b[k])}")
    return out


def named_first(diffs: list[str], changed: list[str]) -> list[str]:
    """``diffs`` with the settings the change named first (``scheduler_config.max_num_seqs: 4 -> 32`` for
    ``engine.max_num_seqs``), then what vLLM derived from them (capture sizes, ...), each group in its order."""
    named = {c.split(":", 1)[0].split(".", 1)[-1] for c in changed}
    return sorted(diffs, key=lambda d: d.split(":", 1)[0].rsplit(".", 1)[-1] not in named)


def runtime_env(serving: Mapping[str, Any]) -> dict[str, str]:
    """The serving file's variables vLLM does not parse itself (read by OpenMP, oneDNN, inductor...)."""
    env = serving.get("env") or {}
    if not isinstance(env, Mapping):
        return {}
    return {str(k): str(v) for k, v in env.items() if not str(k).startswith("VLLM_")}


def check(
    repo_dir: Any, config: Config, base: str, cand: str, sd: Sides, timeout_s: float, pool: EnginePool | None = None
) -> tuple[Status, str, FailureKind | None]:
    """(status, detail, failure) of ``takes-effect`` for the objective workload (SKIPPED: not a serving-only change,
    no engine workload, or the baseline's configuration did not resolve — then measured as always). With ``pool``,
    the baseline's resolving worker is kept there and resolves the next candidate warm (``resolve_sides``)."""
    files = {p for c in git.diff_changes(repo_dir, base, cand) for p in c.paths}
    if files != {SERVING_FILE}:
        return Status.SKIPPED, "the change is not to serving.json alone: code is judged by measuring it", None
    workload: WorkloadConfig = config.objective
    if not workload.spec.engine:
        return Status.SKIPPED, f"the objective {workload.name!r} runs no vLLM engine to resolve", None
    got = resolve_sides(config, workload, sd, timeout_s, pool)
    b, c = got.get(BASELINE), got.get(CANDIDATE)
    if not isinstance(b, dict):
        why = text.clean(b, 200, one_line=True)
        return Status.SKIPPED, f"the baseline's engine configuration did not resolve ({why}): measured instead", None
    if not isinstance(c, dict):
        why = text.clean(c, 300, one_line=True)
        return Status.FAIL, f"the candidate's engine configuration does not resolve: {why}", FailureKind.SETUP_ERROR
    try:
        sb, sc = read_serving(sd.worktrees[BASELINE]), read_serving(sd.worktrees[CANDIDATE])
    except Exception as exc:  # noqa: BLE001 - an unreadable serving file is the measurement's to report
        return Status.SKIPPED, f"serving.json could not be read ({exc}): measured instead", None
    sb, sc = (sb if isinstance(sb, dict) else {}), (sc if isinstance(sc, dict) else {})
    changed = serving_changes(sb, sc)
    # a variable neither side sets is vLLM's default, drawn per process for some (a buffer's random name): not the
    # change's; one either side sets is compared as vLLM parsed it
    names = {str(k) for k in [*(b.get("set_env") or []), *(c.get("set_env") or [])]}
    env_b = {k: v for k, v in b["env"].items() if k in names}
    env_c = {k: v for k, v in c["env"].items() if k in names}
    diffs = differences(b["config"], c["config"]) + differences(env_b, env_c, "env")
    runtime = differences(runtime_env(sb), runtime_env(sc), "env")
    kept = " (the baseline's resolution kept from the previous decision)" if b.get("kept") else ""
    if c.get("warm"):
        kept = " (the baseline's resolution kept from the previous decision; the candidate resolved by the baseline's "
        kept += "warm resolving worker: the same code, in the same environment)"
    if diffs or runtime:
        shown = (named_first(diffs, changed) + [f"{r} (read by the runtime)" for r in runtime])[:SHOWN]
        more = len(diffs) + len(runtime) - len(shown)
        detail = "the engine resolves them differently: " + "; ".join(shown) + (f" (+{more} more)" if more else "")
        return Status.PASS, detail + kept, None
    unknown = [_short(k) for k in c.get("unknown_env") or [] if isinstance(k, str)]
    why = f"; vLLM does not read {', '.join(unknown[:3])}" if unknown else ""
    what = "; ".join(changed[:SHOWN]) or "serving.json"
    return (
        Status.FAIL,
        "no effect: both sides resolve to the same engine configuration and environment, so the change "
        f"({what}) is what vLLM does anyway or ignores{why}; nothing to measure{kept}",
        FailureKind.NO_EFFECT,
    )

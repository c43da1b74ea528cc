"""The preflight: what must hold before anything is measured, and who is to blame when it does not.

Static checks, in seconds, before any measurement (``check`` / ``require``): every model a vLLM
workload or ``[verify]`` names is a built-in name (``config.BUILT_IN_MODELS``) or a model directory
(a Hugging Face id is refused with how to download it: the sandbox is offline); ``overlay_from``
exists; the sandbox policy can be met; the environment imports (torch, torchvision, transformers,
vLLM) in the baseline's sandbox, with the first broken package named — a probe cached per
environment fingerprint, so it costs its import time once per environment, not per proposal.

The dynamic part (the baseline builds, its engine starts, its workloads run) is the baseline side's
first session of every evaluation: no extra engine start. When the **baseline** side fails there,
the evaluation re-runs the baseline **alone** (``confirm_baseline``: nothing of the candidate
exists then; a fresh worktree, sandbox and engine): failing alone too, the baseline (or the
machine) is broken — ``BaselineBroken``, a run error (exit 5), nothing judged, an episode stops;
passing alone, the failure came with the candidate, which is rejected as before (fail closed). So
a candidate can never make its own failure look like the run's: its own failures are its
rejections, and what it does to the baseline cannot survive its absence (with the sandbox on,
nothing of a side outlives it). ``baseline_alone`` is also ``agentsearch preflight --run``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from harness import tiny_model
from harness.engine_pool import EnginePool
from harness.trials import BASELINE, child_env, run_child, tail

from . import containment
from . import sides as sides_mod
from .config import BUILT_IN_MODELS, Config, WorkloadConfig
from .errors import AgentsearchError, RunError
from .workloads import placement_for, session_factory
from .workspace import Workspace

PREFLIGHT_SCHEMA = 1
PROBE_VERSION = 1
PROBE_TIMEOUT_S = 600.0
OK, WARN, FAIL, SKIPPED = "ok", "warn", "fail", "skipped"
Say = Callable[[str, str], None]
HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")

# what the environment probe imports, in order (the first that fails is named); a package that is
# not installed at all is skipped when optional
PROBE_STEPS = (
    ("torch", "import torch", False),
    ("torchvision", "import torchvision", True),
    ("transformers", "from transformers import AutoTokenizer, LlamaConfig", False),
    ("vllm", "from vllm import LLM, SamplingParams", False),
)
PROBE = r"""
import importlib.util, json, sys
steps = json.loads(sys.argv[1])
res = {"versions": {}, "failed": None}
def version(pkg):
    from importlib import metadata
    for name in (pkg, pkg + "-cpu"):
        try:
            return metadata.version(name)
        except Exception:
            pass
    return None
for pkg, stmt, optional in steps:
    if optional and importlib.util.find_spec(pkg) is None:
        continue
    res["versions"][pkg] = version(pkg)
    try:
        exec(stmt, {})
    except BaseException as exc:
        root = exc
        for _ in range(20):
            nxt = root.__cause__ or root.__context__
            if nxt is None or nxt is root:
                break
            root = nxt
        res["failed"] = {"package": pkg, "statement": stmt, "error": f"{type(exc).__name__}: {exc}",
                         "cause": f"{type(root).__name__}: {root}" if root is not exc else ""}
        break
sys.stdout.write("\nAGENTSEARCH-PROBE " + json.dumps(res) + "\n")
"""


class PreflightError(RunError):
    """A static preflight check failed: nothing was measured."""


class BaselineBroken(RunError):
    """The baseline failed, and fails alone too: the run's error, not the candidate's rejection."""


@dataclass(frozen=True)
class Finding:
    name: str  # config | model | overlay | sandbox | placement | reference | environment | baseline
    status: str  # ok | warn | fail | skipped
    detail: str
    fix: str = ""

    def line(self) -> str:
        return f"preflight: {self.name}: {self.detail}" + (f"; {self.fix}" if self.fix else "")


def _say(say: Say | None) -> Say:
    return say or (lambda stage, detail: None)


def vllm_workloads(config: Config) -> list[WorkloadConfig]:
    return [w for w in config.workloads if w.spec.engine]


def models(config: Config) -> list[tuple[str, str]]:
    """(where, model) for every model the measurement will load, each model once."""
    users: dict[str, list[str]] = {}
    for w in vllm_workloads(config):
        users.setdefault(w.model, []).append(repr(w.name))
    if config.verify is not None and config.verify.kind == "vllm":
        users.setdefault(config.verify.model, []).append("[verify]")
    return [
        (("workload " if not names[0].startswith("[") else "") + ", ".join(names), model)
        for model, names in users.items()
    ]


def check_model(where: str, model: str) -> Finding:
    built = ", ".join(f'"{n}"' for n in BUILT_IN_MODELS)
    if model in BUILT_IN_MODELS:
        return Finding("model", OK, f"{where}: {model!r} ({BUILT_IN_MODELS[model]}; `agentsearch model {model}`)")
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            return Finding(
                "model",
                FAIL,
                f"{where}: model directory {model!r} has no config.json (not a Hugging Face model directory)",
                "point model at the directory that holds config.json and the weights",
            )
        return Finding("model", OK, f"{where}: directory {model!r}")
    if HF_ID.match(model) and not model.startswith(("./", "../")):
        return Finding(
            "model",
            FAIL,
            f"{where}: model {model!r} looks like a Hugging Face id, not a directory; "
            "measurements run offline (in the sandbox, without network)",
            f"download it first (`huggingface-cli download {model} --local-dir DIR`) and set model = \"DIR\"",
        )
    return Finding(
        "model",
        FAIL,
        f"{where}: model {model!r} is not a directory",
        f"give a model directory or one of {built} (built offline by `agentsearch model NAME`)",
    )


def check_paths(config: Config) -> list[Finding]:
    """What the config names on this machine: models and the overlay (also what `init` checks)."""
    found = [check_model(where, m) for where, m in models(config)]
    t = config.target
    if t.install == "overlay":
        src = Path(t.overlay_from or "")
        if not src.is_dir():
            found.append(
                Finding(
                    "overlay",
                    FAIL,
                    f"[target] overlay_from {t.overlay_from!r} is not a directory",
                    "point it at the site-packages directory holding the compiled files (or re-create the fork "
                    "with `agentsearch init --from-installed vllm DIR`)",
                )
            )
        else:
            found.append(Finding("overlay", OK, f"[target] overlay_from {t.overlay_from!r} exists"))
    return found


def check_sandbox(config: Config) -> Finding:
    box = containment.decide(config)
    if box.status == "fail":
        return Finding(
            "sandbox",
            FAIL,
            box.detail,
            "install bubblewrap and allow user namespaces, or set [gate] sandbox = \"auto\"",
        )
    if box.status == "review":
        return Finding("sandbox", WARN, box.detail)
    return Finding("sandbox", OK, "bubblewrap works: each side runs in its own sandbox")


def check_placement(config: Config) -> Finding:
    """[engine] placement on this machine's devices (split needs two GPUs): refused before anything runs."""
    if not vllm_workloads(config):
        return Finding("placement", SKIPPED, "no engine workloads")
    try:
        place = placement_for(config)
    except AgentsearchError as exc:
        return Finding("placement", FAIL, str(exc), "set [engine] placement = \"auto\"")
    return Finding("placement", OK, place.describe())


def check_reference(ws: Workspace, config: Config, base: str) -> Finding:
    """The reference the distribution checks judge against: pinned (or named) and an ancestor of the baseline."""
    if config.verify is None:
        return Finding("reference", SKIPPED, "no [verify] section")
    try:
        ref = ws.reference_commit(config, base)
    except AgentsearchError as exc:
        return Finding("reference", FAIL, str(exc))
    return Finding(
        "reference",
        OK,
        f"{ref[:12]}" + (" (the baseline itself)" if ref == base else f", {base[:12]} descends from it"),
    )


# ----------------------------------------------------------------------------- the environment probe
def site_dirs() -> list[str]:
    return sorted({p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and os.path.isdir(p)})


def environment_key(config: Config) -> str:
    """Fingerprint of what the probe depends on: the interpreter, every installed distribution (the
    site-packages listings carry their versions), the overlay and the target's environment."""
    listing = {d: sorted(os.listdir(d)) for d in site_dirs()}
    t = config.target
    blob = json.dumps(
        [
            PROBE_VERSION,
            PROBE_STEPS,
            os.path.realpath(sys.executable),
            sys.version,
            listing,
            t.install,
            t.overlay_from,
            dict(t.env),
        ],
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def _cache_file(key: str) -> Path:
    return tiny_model.default_cache() / "preflight" / f"environment-{key}.json"


def probe_in(sd: sides_mod.Sides, config: Config) -> dict:
    """Run the import probe in the baseline's sandbox (its worktree first on the path, as the engine
    sees it). {"versions": {...}, "failed": None | {"package", "statement", "error", "cause"}}."""
    wt = sd.worktrees[BASELINE]
    env = child_env(dict(config.target.env), wt, None, sd.out(BASELINE) / "probe")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(wt), config.target.env.get("PYTHONPATH", "")) if p)
    rc, out, err, _wall = run_child([sys.executable, "-c", PROBE, json.dumps(PROBE_STEPS)], wt, env, PROBE_TIMEOUT_S)
    for line in reversed(out.splitlines()):
        if line.startswith("AGENTSEARCH-PROBE "):
            try:
                return json.loads(line.split(" ", 1)[1])
            except json.JSONDecodeError:
                break
    why = "timed out" if rc is None else f"exited with status {rc}: {tail(err, 1) or 'no output'}"
    return {"versions": {}, "failed": {"package": "python", "statement": "the probe", "error": why, "cause": ""}}


def describe_probe(res: dict) -> Finding:
    versions = ", ".join(f"{k} {v}" for k, v in res.get("versions", {}).items() if v)
    bad = res.get("failed")
    if not bad:
        return Finding("environment", OK, f"imports in the baseline's sandbox ({versions or 'versions unknown'})")
    pkg = bad["package"]
    cause = f" (caused by {bad['cause']})" if bad.get("cause") and bad["cause"] not in bad["error"] else ""
    torch = res.get("versions", {}).get("torch")
    if pkg == "python":
        fix = "check the interpreter and the target's [target] env"
    elif pkg == "torch":
        fix = "the environment is broken at torch: reinstall it (`pip install --force-reinstall torch==VERSION`)"
    else:
        fix = (
            f"the environment is broken at {pkg}: reinstall a {pkg} built for torch {torch or '(the installed one)'}, "
            "or uninstall it if nothing needs it"
        )
    return Finding(
        "environment",
        FAIL,
        f"`{bad['statement']}` fails in the baseline's sandbox: {tail(bad['error'], 1)}{cause}"
        + (f" [{versions}]" if versions else ""),
        fix,
    )


def check_environment(
    ws: Workspace, config: Config, base: str, say: Say | None = None, refresh: bool = False
) -> Finding:
    """The import probe for vLLM targets, cached (successes only) per environment fingerprint."""
    if not vllm_workloads(config) and not (config.verify is not None and config.verify.kind == "vllm"):
        return Finding("environment", SKIPPED, "no vLLM workload: command workloads are checked by their first run")
    if config.target.install == "command":
        return Finding("environment", SKIPPED, "install = \"command\": checked by the baseline's build and first run")
    key = environment_key(config)
    cache = _cache_file(key)
    if cache.is_file() and not refresh:
        try:
            cached = json.loads(cache.read_text())
            return Finding(**{**cached["finding"], "detail": cached["finding"]["detail"] + " (cached)"})
        except (OSError, ValueError, KeyError, TypeError):
            pass
    _say(say)("preflight", "probing the environment's imports in the baseline's sandbox (once per environment)")
    tag = f"preflight-{base[:10]}-{secrets.token_hex(3)}"
    box = containment.decide(config)
    try:
        with sides_mod.sides(ws, config, {BASELINE: base}, tag, box) as sd:
            sd.build()
            finding = describe_probe(probe_in(sd, config))
    except sides_mod.BuildError as exc:
        return Finding("environment", FAIL, f"the baseline's worktree could not be prepared: {exc}")
    if finding.status == OK:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(
            json.dumps({"schema_version": PREFLIGHT_SCHEMA, "key": key, "at": time.time(), "finding": asdict(finding)})
        )
        os.replace(tmp, cache)
    return finding


# ----------------------------------------------------------------------------- static checks
def check(
    ws: Workspace, config: Config | None = None, base: str | None = None, say: Say | None = None, refresh: bool = False
) -> list[Finding]:
    """Every static check, in order; stops after the first failure (later ones would build on it)."""
    base = base or ws.baseline_commit()
    config = config or ws.config(base)
    found = [
        Finding("config", OK, f"{len(config.workloads)} workload(s), baseline {config.target.baseline} @ {base[:12]}")
    ]
    for f in (*check_paths(config), check_sandbox(config), check_placement(config), check_reference(ws, config, base)):
        found.append(f)
    if any(f.status == FAIL for f in found):
        return found
    found.append(check_environment(ws, config, base, say, refresh))
    return found


def first_failure(found: Iterable[Finding]) -> Finding | None:
    return next((f for f in found if f.status == FAIL), None)


def require(
    ws: Workspace, config: Config | None = None, base: str | None = None, say: Say | None = None
) -> list[Finding]:
    """``check``, raising PreflightError (exit 5, one line) at the first failure."""
    found = check(ws, config, base, say)
    bad = first_failure(found)
    if bad is not None:
        raise PreflightError(bad.line())
    return found


def require_paths(config: Config) -> None:
    """The path checks alone (for `init`): a model or overlay that is not there is refused at once."""
    bad = first_failure(check_paths(config))
    if bad is not None:
        raise PreflightError(bad.line())


# ----------------------------------------------------------------------------- the baseline alone
def baseline_alone(
    ws: Workspace, config: Config, base: str, workloads: Iterable[str] | None = None, say: Say | None = None
) -> str:
    """Build the baseline alone, start its engines and run each workload (all, or those named) once.
    '' when it all works, else what failed (with the broken package named where imports fail)."""
    say = _say(say)
    names = list(workloads) if workloads is not None else [w.name for w in config.workloads]
    box = containment.decide(config)
    if box.status == "fail":
        return box.detail
    tag = f"alone-{base[:10]}-{secrets.token_hex(3)}"
    with sides_mod.sides(ws, config, {BASELINE: base}, tag, box) as sd:
        say("baseline alone", "building")
        try:
            sd.build()
        except sides_mod.BuildError as exc:
            return f"build: {exc}"
        failure = ""
        pool = EnginePool()
        try:
            for name in names:
                w = config.workload(name)
                say("baseline alone", f"{name}: one run" + (" (engine start-up first)" if w.spec.engine else ""))
                try:
                    session = session_factory(config, w, sd, pool)(BASELINE, 0)
                except AgentsearchError as exc:
                    failure = f"{name}: {exc}"
                    break
                try:
                    session.start()
                    outcome = session.measure(1)
                finally:
                    session.close()
                if not outcome.ok:
                    failure = f"{name}: {outcome.error}"
                    if w.spec.engine:
                        probed = describe_probe(probe_in(sd, config))
                        if probed.status == FAIL:
                            failure += f"; {probed.detail}"
                    break
        finally:
            pool.close()
        return failure


def confirm_baseline(
    ws: Workspace, config: Config, base: str, workload: str | None, failure: str, say: Say | None = None
) -> None:
    """The baseline side failed during an evaluation (``workload`` None: its build). Re-run it alone:
    raise BaselineBroken when it fails alone too; return when it passes (the failure came with the candidate)."""
    _say(say)("baseline alone", "the baseline side failed; re-running it alone to see whose failure it is")
    alone = baseline_alone(ws, config, base, [] if workload is None else [workload], say)
    if alone:
        raise BaselineBroken(
            f"the baseline {base[:12]} is broken: {tail(alone, 1)} (it failed beside the candidate and fails alone "
            "too); nothing was judged: fix the baseline (or the machine) and run again"
        )


__all__ = [
    "Finding",
    "PreflightError",
    "BaselineBroken",
    "check",
    "require",
    "require_paths",
    "baseline_alone",
    "confirm_baseline",
    "check_model",
    "describe_probe",
]

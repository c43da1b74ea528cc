"""The baseline side kept warm across the proposals of an episode.

Between two proposals the baseline has not moved (a rejection changes nothing), so its worktree,
sandbox and warm engines can serve the next evaluation: only the candidate side is built and booted
afresh. The episode owns one ``WarmBaseline``; ``evaluate`` borrows it (``lend``) and gives the
baseline back (``take_back``) when the evaluation went cleanly.

What it assumes, and how the statistics stay valid:

- **Same baseline, same conditions.** Kept only while the baseline commit, the config fingerprint,
  the environment fingerprint and the placement are those it was built with, and while its worktree
  is byte-for-byte as built (a snapshot, as after every trial); anything else retires it.
- **Bounded sharing.** A baseline engine instance serves at most ``[engine] baseline_reuse``
  consecutive evaluations (default 2), then it is replaced by a fresh one. Each proposal's pairs still
  come from ``restarts`` baseline instances (the between-session variance stays in the standard error);
  what sharing adds is a correlation between the errors of neighbouring proposals (a slow baseline
  instance flatters both). The episode's false-merge bound is a union bound over its budget
  (``gate.alpha / budget`` per proposal), valid under any dependence between proposals; the
  per-proposal level is unchanged because the instance is drawn independently of the candidate.
- **Warmer baseline.** A reused instance has served another evaluation's trials (different seeds: no
  prefix shared beyond chance); each session still starts with ``[engine] warmup`` rounds on both
  sides. The engine_gate benchmark's A/A proposals measure any bias this leaves.
- **Fail closed.** A baseline failure, an error, an interrupt, a worktree change, alternate placement
  (one engine at a time) or a merge retires it: the next evaluation builds the baseline afresh.
- **Memory.** At most one instance per (workload engine, restart) is kept, parked (frozen) between
  proposals; on a GPU it is released before the distribution checks, which need the memory.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from harness.engine_pool import EnginePool
from harness.trials import BASELINE

from .sides import KeptBaseline, is_resolver, remove_worktree, scratch_dir, snapshot
from .workspace import Workspace


class WarmBaseline:
    """One episode's kept baseline. ``reuse``: evaluations one baseline engine instance may serve (1: off)."""

    def __init__(self, ws: Workspace, name: str, reuse: int):
        self.ws, self.reuse = ws, max(1, reuse)
        self.tag = f"warm-{name}"
        self.kept: KeptBaseline | None = None  # between evaluations; None while one is lent out

    @property
    def scratch(self) -> Path:
        return scratch_dir(self.ws, self.tag)

    @property
    def enabled(self) -> bool:
        return self.reuse > 1

    def lend(self, commit: str, key: str) -> KeptBaseline | None:
        """The kept baseline if it is still the one ``commit`` under ``key`` needs and untouched (it is
        the borrower's until ``take_back``), else None and whatever was kept is retired."""
        k = self.kept
        if k is None:
            return None
        if k.commit != commit or k.key != key or not k.worktree.is_dir() or snapshot(k.worktree) != k.snapshot:
            self.retire()
            return None
        self.kept = None
        for key, eng in list(k.engines.items()):  # one that died while parked is replaced by a fresh one
            if eng.proc is None or eng.proc.poll() is not None or eng.start_error:
                del k.engines[key]
                k.uses.pop(key, None)
                eng.close()
        return k

    def take_back(self, kept: KeptBaseline, pool: EnginePool) -> None:
        """After a clean evaluation: keep the baseline engines that may serve another evaluation (parked),
        close every other engine of ``pool``, and keep the side for the next evaluation."""
        uses = {key: kept.uses.get(key, 0) + 1 for key in pool.engines if is_baseline_engine(key)}
        # a resolving worker serves as many decisions as the side lasts: it measures nothing, so nothing wears
        kept.engines = pool.release(lambda key: key in uses and (uses[key] < self.reuse or is_resolver(key)))
        kept.uses = {key: uses[key] for key in kept.engines}
        kept.evaluations += 1
        self.kept = kept

    def retire(self) -> None:
        """Shut the kept engines down, remove the kept worktree and scratch."""
        k, self.kept = self.kept, None
        first: BaseException | None = None
        if k is not None:
            for eng in k.engines.values():
                try:
                    eng.close()
                except BaseException as exc:  # noqa: BLE001 - close the others too
                    first = first or exc
            remove_worktree(self.ws, k.worktree, k.git_link)
        shutil.rmtree(self.scratch, ignore_errors=True)
        if first is not None:
            raise first


def is_baseline_engine(key: str) -> bool:
    """Whether an EnginePool key (``side/restart/engine``) is one of the baseline's engines."""
    return key.startswith(f"{BASELINE}/")


__all__ = ["WarmBaseline", "is_baseline_engine"]

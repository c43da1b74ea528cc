"""The gate's sequential design from the config, in one place: ``agentsearch evaluate`` judges with it and
``agentsearch calibrate`` simulates it (``harness.power``)."""

from __future__ import annotations

import dataclasses

from harness.sequential import SequentialDesign

from .config import GateConfig, WorkloadConfig


def design_for(gate: GateConfig, alpha: float | None = None) -> SequentialDesign:
    return SequentialDesign(
        alpha=gate.proposal_alpha if alpha is None else alpha,
        min_effect=gate.min_effect,
        futility=gate.futility,
        min_pairs=gate.min_pairs,
        look_every=gate.look_every,
        max_pairs=gate.max_pairs,
        max_regression=gate.max_regression,
        regression_alpha=gate.regression_alpha,
    )


def workload_design(design: SequentialDesign, w: WorkloadConfig) -> SequentialDesign:
    """``design`` with the workload's own pair budget (``max_pairs``), when it sets one."""
    if w.max_pairs is None:
        return design
    return dataclasses.replace(design, max_pairs=w.max_pairs, min_pairs=min(design.min_pairs, w.max_pairs))

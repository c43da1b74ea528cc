"""The distribution check's result (agentsearch.verify), as measured and as recorded: ``DistributionCheck`` is what
an evaluation and a verdict keep, ``Distribution`` the record of a proposal's check; ``ReferenceCheck`` and its
``RegimeComparison`` rows are the candidate against the pinned reference, regime by regime."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .base import Part, Record

# the statistics a path's comparison keeps that say how far it moved (same_top_pct: lower is further)
STATS = ("kl_mean", "kl_p99", "kl_max", "dlogprob_max", "same_top_pct")


def worst_of_sets(sets: Mapping[str, Any]) -> dict[str, dict[str, float | None]]:
    """path -> the worst of the sets' (public, holdout) values for each of STATS (same_top_pct: the lowest)."""
    out: dict[str, dict[str, float | None]] = {}
    for stats in sets.values():
        for path, st in (stats or {}).items():
            row = out.setdefault(path, {k: None for k in STATS})
            for k in STATS:
                v = st.get(k) if isinstance(st, Mapping) else None
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    cur = row[k]
                    row[k] = float(v) if cur is None else (min(cur, v) if k == "same_top_pct" else max(cur, v))
    return out


@dataclass(frozen=True)
class RegimeComparison(Part):
    """One regime's comparison with the reference: the candidate's (``ReferenceCheck.regimes``) or main's, where the
    candidate failed (``ReferenceCheck.main``)."""

    OPEN: ClassVar[bool] = True

    label: str  # the regime for people ("the baseline's regime", "dtype=float32, max_num_seqs=1", ...)
    passed: bool  # within the drift budget of the reference
    regime: Mapping[str, Any] = field(default_factory=dict)  # the engine settings of the regime
    own: bool = False  # the check's own regime (the baseline's)
    against_main: bool | None = None  # the candidate against main in this regime (None on main's rows)
    sets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # public/holdout -> path -> statistics
    # the candidate changes only regime keys (0.8): main's runs stood for its own outside its regime, and for main's
    # in it
    shared: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict, kw_only=True)

    def worst(self) -> dict[str, dict[str, float | None]]:
        return worst_of_sets(self.sets)

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        if not self.shared:
            out.pop("shared", None)  # written only where it happened: a row of an older check reads back as written
        return out


@dataclass(frozen=True)
class ReferenceCheck(Part):
    """The candidate against the pinned reference (the stock code), per regime, and main where the candidate failed
    (verify schema 3)."""

    OPEN: ClassVar[bool] = True

    commit: str  # the reference commit
    budget: str = ""  # the drift budget in words
    mode: str = ""
    caps: Mapping[str, Any] = field(default_factory=dict)  # the budget's limits (kl_max, ...)
    passed: bool = False  # within the budget in every regime
    against_main: bool = True  # within one change's rule against main in every regime
    regimes: tuple[RegimeComparison, ...] = ()
    main: tuple[RegimeComparison, ...] = ()
    reused: int = 0  # reference runs reused from an earlier check
    collected: int = 0  # reference runs collected for this one
    wall_s: float = 0.0
    extra: Mapping[str, Any] = field(default_factory=dict, kw_only=True)

    def worst_by_regime(self) -> dict[str, dict[str, dict[str, float | None]]]:
        """regime label -> path -> the worst of each statistic over the candidate's sets."""
        return {r.label: r.worst() for r in self.regimes}


@dataclass(frozen=True)
class DistributionCheck(Part):
    """The distribution check of a candidate (agentsearch.verify.VerifyResult as recorded). Its per-path statistics
    (``public``, ``holdout``, ``languages``, ``noise_floor``, ``draws``) are the harness's comparisons, kept as
    written: set -> path -> statistic."""

    OPEN: ClassVar[bool] = True  # a check may grow fields; an older reader keeps them in ``extra``

    verdict: str  # pass | fail | skipped
    reasons: tuple[str, ...] = ()
    mode: str = ""
    public: Mapping[str, Any] | None = None
    holdout: Mapping[str, Any] | None = None
    draws: Mapping[str, Any] | None = None  # the paired draw test (verify schema 2 on)
    languages: Mapping[str, Any] = field(default_factory=dict)
    noise_floor: Mapping[str, Any] = field(default_factory=dict)
    public_size: int = 0
    holdout_size: int = 0
    corpus_size: int = 0
    baseline_reused: int = 0
    wall_s: float = 0.0
    reference: ReferenceCheck | None = None  # verify schema 3 on
    blame: str | None = None  # candidate | main: who the failure is counted against (verify schema 3 on)
    extra: Mapping[str, Any] = field(default_factory=dict, kw_only=True)

    def sets(self) -> dict[str, Mapping[str, Any]]:
        """public/holdout -> path -> statistics, for the sets the check compared."""
        return {name: s for name, s in (("public", self.public), ("holdout", self.holdout)) if s}


@dataclass(frozen=True)
class Distribution(DistributionCheck, Record):
    """``distribution``: the record of proposal ``number``'s distribution check."""

    KIND: ClassVar[str] = "distribution"

    number: int = field(kw_only=True)

"""Upgraders: the data of a record written with an older schema, in today's shape.

One function per version step, keyed by the version it reads; ``upgrade`` runs them in turn.
A history is never rewritten: lines keep the bytes (and hashes) they were written with, and
are upgraded each time they are read.

Version 1 (agentsearch before typed records) had no failure kinds: a failed check's kind is
derived from its check name and, for the statistical checks, from the recorded decision of
its workload (never from the English reasons).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .base import SCHEMA_VERSION
from .checks import CheckName, decision_failure, default_failure

Data = dict[str, Any]

_ROLE_OF = {CheckName.OBJECTIVE.value: ("objective",), CheckName.GUARD_WORKLOADS.value: ("guard",)}


def _check_failure(check: Mapping[str, Any], data: Mapping[str, Any]) -> str:
    name = check.get("name")
    summaries: list[Mapping[str, Any]] = []
    if name in _ROLE_OF:
        summaries = [
            w
            for w in (data.get("workloads") or {}).values()
            if isinstance(w, Mapping) and w.get("role") in _ROLE_OF[name]
        ]
    elif name == CheckName.CONFIRMATION.value and isinstance(data.get("confirmation"), Mapping):
        summaries = [data["confirmation"]]
    wanted = {"objective": "win", "guard": "ok", "confirmation": "ok"}
    for w in summaries:
        decision = w.get("decision")
        if decision and decision != wanted.get(str(w.get("role"))) and decision not in ("failed", "not-run"):
            return decision_failure(str(decision), w.get("ci")).value
    return default_failure(str(name)).value


def _v1_judged(data: Data) -> Data:
    """verdict, evaluation: failure kinds on the failed checks, and the first one on the record."""
    checks = []
    for c in data.get("checks") or []:
        c = dict(c)
        if c.get("status") == "fail" and "failure" not in c:
            c["failure"] = _check_failure(c, data)
        checks.append(c)
    data["checks"] = checks
    if data.get("verdict") == "reject" and "failed_check" not in data:
        failed = [c for c in checks if c.get("status") == "fail"]
        if failed:
            data["failed_check"], data["failure"] = failed[0]["name"], failed[0]["failure"]
        else:
            data["failed_check"], data["failure"] = None, "missing"
    return data


def _v1(kind: str, data: Data) -> Data:
    data = dict(data)
    if kind in ("verdict", "evaluation"):
        data = _v1_judged(data)
    if kind == "evaluation" and "objective" not in data:
        data["objective"] = None
    if kind == "insight" and "reverted" not in data:
        data["reverted"] = 0  # insights written before 0.1.0 counted reverts (2026-11-30) had none to count
    data["schema_version"] = 2  # the plan's, trial's, insight's and evaluation's own version 1 fields are this one now
    return data


UPGRADERS: dict[int, Callable[[str, Data], Data]] = {1: _v1}


def upgrade(kind: str, data: Mapping[str, Any], version: int) -> Data:
    """``data`` of a ``kind`` record written with schema ``version``, as the current schema reads it."""
    out = dict(data)
    while version < SCHEMA_VERSION:
        step = UPGRADERS.get(version)
        if step is None:
            raise ValueError(f"no upgrader from schema version {version}")
        out = step(kind, out)
        version += 1
    if version != SCHEMA_VERSION:
        raise ValueError(
            f"schema version {version} is newer than this agentsearch reads ({SCHEMA_VERSION}); upgrade agentsearch"
        )
    return out

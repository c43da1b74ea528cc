"""Fixtures shared by the red-team modules: a toy target after an episode that merged (copied per test)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .toy import copy_target, isolated_env, merged_target


@pytest.fixture(scope="module")
def merged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("merged")
    with pytest.MonkeyPatch.context() as mp:
        isolated_env(mp, root)
        return merged_target(root)


@pytest.fixture
def repo(merged: Path, tmp_path: Path) -> Path:
    """A copy of ``merged`` (modules that need another target define their own ``repo``)."""
    return copy_target(merged, tmp_path / "toy")

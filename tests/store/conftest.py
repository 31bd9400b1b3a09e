"""Every store test gets its own database in a tmp dir, never the learner's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dojo.store import ProgressStore


@pytest.fixture(autouse=True)
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "data"
    monkeypatch.setenv("DOJO_DATA_DIR", str(path))
    return path


@pytest.fixture
def store(data_dir: Path) -> Iterator[ProgressStore]:
    with ProgressStore() as opened:
        yield opened

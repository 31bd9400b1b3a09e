"""Quiz tests use the fixture lessons and a progress store in a tmp dir."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import fsrs
import pytest

from dojo.content import Catalog, load_catalog
from dojo.quiz import ReviewScheduler
from dojo.store import ProgressStore

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "content"


@pytest.fixture
def catalog() -> Catalog:
    return load_catalog(FIXTURES)


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ProgressStore]:
    monkeypatch.setenv("DOJO_DATA_DIR", str(tmp_path / "data"))
    with ProgressStore() as opened:
        yield opened


@pytest.fixture
def scheduler(store: ProgressStore) -> ReviewScheduler:
    # No fuzzing: intervals are exact, so tests can compare them.
    return ReviewScheduler(store, fsrs.Scheduler(enable_fuzzing=False))

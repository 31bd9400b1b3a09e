"""Fixtures of the container checks: an application on disk, the learner's modules."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _support import IMPORT_LOG, App, forget, new_app
from sqlalchemy import text


@pytest.fixture
def make_app(tmp_path: Path, learner: Any) -> Iterator[Any]:
    """make(hint) → an App under a fresh directory on sys.path; forgotten afterwards."""
    learner.module("markers")         # the vocabulary the applications import
    roots: list[Path] = []

    def make(hint: str = "shop") -> App:
        root = tmp_path / f"src{len(roots)}"
        root.mkdir()
        roots.append(root)
        return new_app(root, hint)

    yield make
    for root in roots:
        forget(root)


@pytest.fixture
def import_log(database: Any) -> Any:
    """The database's engine, with the import_log table that side-effect modules write to."""
    with database.engine.begin() as conn:
        conn.execute(text(IMPORT_LOG))
    return database.engine

"""A progress database SQLite cannot read is named, copied aside, and never shown as empty."""

from __future__ import annotations

from pathlib import Path

import pytest

from dojo.store.paths import database_path
from tests.quiz.cli_helpers import run_dojo


def test_a_corrupt_progress_database_is_explained_and_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    monkeypatch.setenv("DOJO_DATA_DIR", str(data))
    path = database_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    garbage = b"this is not an SQLite file at all" * 200
    path.write_bytes(garbage)
    result = run_dojo(["quiz", "--due"], data)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr, result.stderr
    assert "is corrupt" in result.stderr and "To start fresh" in result.stderr, result.stderr
    assert "Nothing is due" not in result.stdout
    backups = list(path.parent.glob(f"{path.name}.corrupt-*"))
    assert len(backups) == 1 and backups[0].read_bytes() == garbage
    assert path.read_bytes() == garbage, "the original must be left for the learner to decide"

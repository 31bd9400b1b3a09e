"""Fixtures shared by every test package."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def service_state() -> Iterator[Path]:
    """A fresh services state dir (not yet created) for a test that starts its own services.

    It lives in a temp dir of its own, not under pytest's tmp_path: as root the embedded
    PostgreSQL runs as another user that must traverse to its data dir, and every pytest
    session (another one started in parallel, say) resets /tmp/pytest-of-<user> to 0700.
    """
    base = Path(tempfile.mkdtemp(prefix="dojo-test-state-"))
    base.chmod(0o755)
    try:
        yield base / "state"
    finally:
        shutil.rmtree(base, ignore_errors=True)

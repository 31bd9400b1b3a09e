"""Service tests run their own services in a private state dir, never the shared ones."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

SERVICE_VARS = ("DOJO_DATABASE_URL", "DOJO_KAFKA_BOOTSTRAP", "DOJO_KAFKA_BACKEND",
                "DOJO_PG_PORT", "DOJO_KAFKA_PORT", "DOJO_ALLOW_EXTERNAL")


@pytest.fixture
def private_state(service_state: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A state dir of this test's own; whatever the test started is stopped afterwards."""
    state = service_state
    monkeypatch.setenv("DOJO_STATE_DIR", str(state))
    for var in SERVICE_VARS:
        monkeypatch.delenv(var, raising=False)
    yield state
    from dojo.services import manager

    try:
        manager.down()
    except Exception:
        manager.down(force=True)


def run_dojo(*args: str, env: dict[str, str] | None = None,
             timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run the real `dojo` CLI in a subprocess with the current (monkeypatched) environment."""
    return subprocess.run(
        [sys.executable, "-m", "dojo.cli", *args],
        capture_output=True, text=True, timeout=timeout,
        env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL,
    )

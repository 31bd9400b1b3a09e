"""Where dojo keeps its state, caches and data on this machine."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "interview-dojo"


def state_dir() -> Path:
    """Pids, ports, URLs, the embedded cluster and broker logs (DOJO_STATE_DIR overrides)."""
    override = os.environ.get("DOJO_STATE_DIR")
    path = Path(override) if override else platformdirs.user_state_path(APP_NAME)
    path.mkdir(parents=True, exist_ok=True)
    return path


def cache_dir() -> Path:
    """Downloaded jars and other reusable artefacts (DOJO_CACHE_DIR overrides)."""
    override = os.environ.get("DOJO_CACHE_DIR")
    path = Path(override) if override else platformdirs.user_cache_path(APP_NAME)
    path.mkdir(parents=True, exist_ok=True)
    return path

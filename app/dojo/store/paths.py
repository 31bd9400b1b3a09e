"""Where the progress database lives."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "interview-dojo"
DATABASE_FILE = "progress.sqlite3"


def data_dir() -> Path:
    """DOJO_DATA_DIR when set (tests, portable installs), else the user's data dir."""
    override = os.environ.get("DOJO_DATA_DIR")
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))


def database_path() -> Path:
    """The SQLite file that holds the learner's progress."""
    return data_dir() / DATABASE_FILE

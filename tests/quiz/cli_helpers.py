"""Run `dojo` as the learner would, on the fixture lessons and a private data dir."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "content"


def dojo_env(data_dir: Path, content: Path = FIXTURES) -> dict[str, str]:
    env = dict(os.environ, DOJO_DATA_DIR=str(data_dir), DOJO_CONTENT_ROOT=str(content))
    env.pop("NO_COLOR", None)
    return env


def run_dojo(args: list[str], data_dir: Path, stdin: str = "",
             content: Path = FIXTURES) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dojo.cli", *args], input=stdin, text=True,
                          capture_output=True, env=dojo_env(data_dir, content), timeout=60)

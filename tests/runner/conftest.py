"""Shared by the engine tests: the tally fixture lab, its misbehaving implementations, and
private copies of the content for tests that write (workspace, linter breakage, CLI)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dojo.content.labs import Lab, load_lab
from dojo.runner.execute import RunOptions, run_checks
from dojo.runner.results import CheckResult, RunSummary

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
IMPLS = FIXTURES / "impls" / "tally"
HANG_SECONDS = 2.0  # per-check limit in tests that hang on purpose


@pytest.fixture(scope="session")
def tally() -> Lab:
    return load_lab(FIXTURES / "labs" / "tally", FIXTURES)


@pytest.fixture
def content(tmp_path: Path) -> Path:
    """A private content root holding a copy of the tally lab, its solution and a correct
    alternative design."""
    root = tmp_path / "content"
    shutil.copytree(FIXTURES / "labs", root / "labs")
    shutil.copytree(FIXTURES / "solutions", root / "solutions")
    shutil.copytree(FIXTURES / "tests", root / "tests")
    return root


def run(lab: Lab, impl: Path, **options: object) -> RunSummary:
    return run_checks(lab, impl, RunOptions(**options))  # type: ignore[arg-type]


def by_check(summary: RunSummary) -> dict[str, CheckResult]:
    return {result.check: result for result in summary.results}


def kafka_has(capability: str) -> bool:
    from dojo.services.manager import resolve

    return capability in resolve(start=True).kafka_capabilities


def cli_env(root: Path) -> dict[str, str]:
    """The environment for a CLI run on the content under `root`, with a private progress
    store beside it (never the developer's own)."""
    return {**os.environ, "DOJO_CONTENT_ROOT": str(root), "DOJO_DATA_DIR": str(root / ".data")}


def run_dojo(*args: str, root: Path, stdin: str = "",
             timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The real `dojo` CLI in a subprocess, on the content under `root`."""
    return subprocess.run(
        [sys.executable, "-m", "dojo.cli", *args], input=stdin, capture_output=True, text=True,
        timeout=timeout, env=cli_env(root))

"""A service that dies under a check is the service's fault: status infra, the service named
with the command that fixes it, and an earlier pass in the learner's progress kept."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dojo.content.labs import Lab
from dojo.runner.results import CheckResult, RunSummary
from tests.runner.conftest import IMPLS, by_check, run


def _services(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "dojo.cli", "services", *args], check=True,
                   capture_output=True, timeout=180)


def test_postgres_dying_mid_check_is_infra_naming_the_fix(
        tally: Lab, service_state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOJO_STATE_DIR", str(service_state))
    monkeypatch.delenv("DOJO_DATABASE_URL", raising=False)
    _services("up")
    state = json.loads((service_state / "services.json").read_text())
    monkeypatch.setenv("TALLY_POSTGRES_PID", str(state["postgres"]["pid"]))
    try:
        summary = run(tally, IMPLS / "kills_database", stages=("persist",),
                      checks=("saving_twice_adds_up",), check_seconds=30)
    finally:
        _services("down", "--force")
    result = by_check(summary)["saving_twice_adds_up"]
    assert result.status == "infra", result
    assert "PostgreSQL" in result.message and "dojo services up" in result.message
    assert "your code raised" not in result.message
    assert not summary.passed


def test_an_infra_result_keeps_the_earlier_pass(
        tally: Lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dojo.runner.progress import record_stage_results, stage_statuses

    monkeypatch.setenv("DOJO_DATA_DIR", str(tmp_path / "data"))
    stages = ("persist",)
    passed = RunSummary(stages)
    passed.add(CheckResult("persist", "saving_twice_adds_up", "pass"))
    record_stage_results(tally, passed)
    broken = RunSummary(stages)
    broken.add(CheckResult("persist", "saving_twice_adds_up", "infra", "PostgreSQL stopped"))
    record_stage_results(tally, broken)
    assert stage_statuses(tally)["persist"] == "pass"

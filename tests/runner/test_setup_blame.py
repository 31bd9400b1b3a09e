"""Who is blamed when a check's own code raises: while the check is being prepared (a
fixture), with no learner line in the traceback, the learner is not told their code returned
the wrong shape."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from dojo.runner.failure_message import describe


def _raised_in_check_code(checks: Path) -> BaseException:
    checks.mkdir()
    module_path = checks / "check_prep.py"
    module_path.write_text("def prepare():\n    raise KeyError('ledger')\n", encoding="utf-8")
    spec = importlib.util.spec_from_file_location("check_prep", module_path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        module.prepare()
    except KeyError as exc:
        return exc
    raise AssertionError("prepare() did not raise")


def test_a_fixture_failure_in_the_checks_own_code_is_not_blamed_on_the_learner(
        tmp_path: Path) -> None:
    exc = _raised_in_check_code(tmp_path / "checks")
    diagnosis = describe(exc, tmp_path / "impl", tmp_path / "checks", "setup")
    assert diagnosis.kind == "error"
    assert "No line of your code is in the traceback" in diagnosis.message
    assert "check_prep.py line 2" in diagnosis.message
    assert "another shape" not in diagnosis.message


def test_the_same_failure_during_the_check_points_at_the_shape_of_the_learners_result(
        tmp_path: Path) -> None:
    exc = _raised_in_check_code(tmp_path / "checks")
    diagnosis = describe(exc, tmp_path / "impl", tmp_path / "checks", "call")
    assert "another shape than the lab README describes" in diagnosis.message
    assert "check_prep.py line 2" in diagnosis.message
    # a check's own bug is possible too: the learner is told how to tell, and what to do
    assert "If it matches, the check is at fault" in diagnosis.message

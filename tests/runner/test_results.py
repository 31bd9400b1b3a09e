"""The JSON-lines schema of check results and what a run summary counts as passed."""

from __future__ import annotations

import json

import pytest

from dojo.runner.results import CheckResult, RunSummary, decode_lines, encode_lines

SCHEMA_KEYS = {"stage", "check", "status", "message", "hint", "lesson", "duration", "nodeid"}


def _result(stage: str, check: str, status: str) -> CheckResult:
    return CheckResult.from_dict({"stage": stage, "check": check, "status": status})


def test_a_result_is_one_json_line_with_the_contract_keys() -> None:
    result = CheckResult("claim", "skips_locked_rows", "fail", "expected 2 rows\ngot 0",
                         "use SKIP LOCKED", "transactional-outbox#claim", 0.25, "t.py::test_x")
    line = result.to_json()
    assert "\n" not in line, "a result must stay on one line, newlines in messages escaped"
    assert set(json.loads(line)) == SCHEMA_KEYS
    assert CheckResult.from_json(line) == result


def test_lines_round_trip_and_blank_lines_are_ignored() -> None:
    results = [_result("a", "x", "pass"), _result("b", "y", "needs-backend")]
    assert decode_lines(encode_lines(results) + "\n\n") == results


@pytest.mark.parametrize("raw", [
    '{"stage": "a", "check": "x", "status": "passed"}',
    '{"stage": "a", "status": "pass"}',
    '["a", "x", "pass"]',
])
def test_a_line_that_is_not_a_result_is_refused(raw: str) -> None:
    with pytest.raises(ValueError):
        CheckResult.from_json(raw)


def test_needs_backend_never_counts_as_passed() -> None:
    summary = RunSummary(("a",), [_result("a", "x", "pass"), _result("a", "y", "needs-backend")])
    assert not summary.passed
    assert summary.stages()[0].status == "needs-backend"


def test_a_stage_that_did_not_run_keeps_the_run_from_passing() -> None:
    summary = RunSummary(("a", "b"), [_result("a", "x", "pass")])
    assert not summary.passed
    assert [stage.status for stage in summary.stages()] == ["pass", "not-run"]
    assert summary.first_unfinished_stage == "b"


def test_stage_status_is_its_worst_result() -> None:
    summary = RunSummary(("a",), [_result("a", "x", "fail"), _result("a", "y", "error")])
    assert summary.stages()[0].status == "error"


def test_check_id_drops_parameters() -> None:
    assert _result("a", "claims_in_order[3-workers]", "pass").check_id == "claims_in_order"

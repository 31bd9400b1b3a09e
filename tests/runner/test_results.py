"""The JSON-lines schema of check results and what a run summary counts as passed."""

from __future__ import annotations

import json

import pytest

from dojo.checks.failure import CheckFailure
from dojo.runner.results import (
    PROTOCOL_VERSION,
    CheckResult,
    CheckStarted,
    Collected,
    PlannedCheck,
    RunSummary,
    ServicesReady,
    ServicesStarting,
    decode_event,
    decode_lines,
    encode_event,
    encode_lines,
)

SCHEMA_KEYS = {"event", "version", "stage", "check", "status", "message", "hint", "lesson",
               "duration", "nodeid", "failure", "needs"}


def _result(stage: str, check: str, status: str) -> CheckResult:
    return CheckResult.from_dict({"stage": stage, "check": check, "status": status})


def test_a_result_is_one_json_line_with_the_contract_keys() -> None:
    result = CheckResult("claim", "skips_locked_rows", "fail", "expected 2 rows\ngot 0",
                         "use SKIP LOCKED", "transactional-outbox#claim", 0.25, "t.py::test_x")
    line = result.to_json()
    assert "\n" not in line, "a result must stay on one line, newlines in messages escaped"
    assert set(json.loads(line)) == SCHEMA_KEYS
    assert CheckResult.from_json(line) == result


def test_a_failure_travels_as_typed_fields_with_the_version() -> None:
    failure = CheckFailure("Two relays claimed one row.", expected="one claim per row",
                           actual="row 7 twice", evidence="id  relay\n7   0\n7   1",
                           lesson="transactional-outbox#claiming", fix="FOR UPDATE SKIP LOCKED")
    result = CheckResult("claim", "disjoint", "fail", str(failure), failure=failure.report)
    raw = json.loads(result.to_json())
    assert raw["version"] == PROTOCOL_VERSION and raw["event"] == "result"
    assert raw["failure"]["evidence"] == "id  relay\n7   0\n7   1"
    assert raw["failure"]["lessons"] == ["transactional-outbox#claiming"]
    assert CheckResult.from_json(result.to_json()) == result


def test_needs_backend_carries_the_missing_capabilities_as_data() -> None:
    result = CheckResult("tx", "exactly_once", "needs-backend", "needs Apache Kafka",
                         needs=("transactions",))
    assert CheckResult.from_json(result.to_json()).needs == ("transactions",)


def test_the_lesson_links_of_a_failure_and_its_stage_are_listed_once() -> None:
    failure = CheckFailure("w", "e", "a", lesson="a#x b#y")
    result = CheckResult("s", "c", "fail", str(failure), lesson="b#y", failure=failure.report)
    assert result.lessons == ("a#x", "b#y")
    assert CheckResult("s", "c", "fail", "m", lesson="b#y").lessons == ("b#y",)


@pytest.mark.parametrize("event", [
    Collected((PlannedCheck("t.py::test_a", "s", "a"),)),
    CheckStarted("s", "a", "t.py::test_a", 30.0),
    CheckStarted("s", "a", "t.py::test_a"),
    ServicesStarting(("postgres", "kafka")),
    ServicesReady(3.25, ("kafka",), "tansu"),
])
def test_every_event_round_trips_through_the_one_codec(event: object) -> None:
    line = encode_event(event)  # type: ignore[arg-type]
    assert json.loads(line)["version"] == PROTOCOL_VERSION
    assert decode_event(line) == event


def test_a_version_1_line_without_event_or_version_still_decodes() -> None:
    old = ('{"stage": "a", "check": "x", "status": "needs-backend", "message": "needs Apache '
           'Kafka (transactions)", "hint": "", "lesson": "", "duration": 0.1, "nodeid": "n"}')
    result = decode_event(old)
    assert isinstance(result, CheckResult)
    assert result.status == "needs-backend" and result.failure is None and result.needs == ()


def test_a_line_from_a_newer_protocol_is_refused_with_what_to_do() -> None:
    with pytest.raises(ValueError, match="newer"):
        decode_event(json.dumps({"event": "result", "version": PROTOCOL_VERSION + 1,
                                 "stage": "a", "check": "x", "status": "pass"}))


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


def test_the_exit_status_of_lab_check_says_whose_move_it_is() -> None:
    from dojo.cli.lab_commands import check_exit_code

    def summary(*statuses: str) -> RunSummary:
        run = RunSummary(("a", "b"))
        for number, status in enumerate(statuses):
            run.add(CheckResult("a" if number % 2 == 0 else "b", f"c{number}", status))  # type: ignore[arg-type]
        return run

    assert check_exit_code(summary("pass", "pass")) == 0
    assert check_exit_code(summary("pass", "fail")) == 1
    assert check_exit_code(summary("error", "infra")) == 1, "the learner's failure comes first"
    assert check_exit_code(summary("pass", "infra", "needs-backend")) == 3
    assert check_exit_code(summary("pass", "needs-backend")) == 4
    assert check_exit_code(summary("pass")) == 1, "a stage that never ran is not a pass"

"""How `dojo lab check` prints a run: a typed failure from its fields with every lesson link
once, and the services starting (a line when piped, a spinner with seconds on a terminal)."""

from __future__ import annotations

import io
import time

import pytest

from dojo.checks import CheckFailure
from dojo.cli.lab_render import Printer
from dojo.content.labs import Lab, load_lab
from dojo.runner.results import CheckResult, ServicesReady, ServicesStarting
from tests.runner.conftest import FIXTURES


@pytest.fixture
def lab() -> Lab:
    return load_lab(FIXTURES / "labs" / "tally", FIXTURES)


def _printed(lab: Lab, *events: object, colour: bool = False) -> str:
    out = io.StringIO()
    printer = Printer(lab, out=out, colour=colour)
    for event in events:
        printer.event(event)  # type: ignore[arg-type]
    return out.getvalue()


def test_a_typed_failure_is_printed_from_its_fields_with_each_lesson_once(lab: Lab) -> None:
    failure = CheckFailure("Two events were counted twice.", expected="3", actual="5",
                           evidence="e1  2\ne2  2", lesson="idempotent-consumer#dedupe")
    stage = lab.stage_ids[0]
    result = CheckResult(stage, "counts_once", "fail", str(failure), hint="keep the ids",
                         lesson="idempotent-consumer#dedupe", failure=failure.report)
    text = _printed(lab, result)
    assert "Two events were counted twice." in text
    assert "expected: 3" in text and "e1  2" in text
    assert text.count("read: lesson idempotent-consumer#dedupe") == 1
    assert text.index("hint: keep the ids") < text.index("read: lesson")


def test_a_failures_own_lesson_and_the_stages_are_both_shown(lab: Lab) -> None:
    failure = CheckFailure("w", expected="e", actual="a", lesson="locking#lost-update")
    stage = lab.stage_ids[0]
    result = CheckResult(stage, "c", "fail", str(failure), lesson="tally#stage",
                         failure=failure.report)
    text = _printed(lab, result)
    assert text.count("read: lesson locking#lost-update") == 1
    assert text.count("read: lesson tally#stage") == 1


def test_a_plain_message_that_names_its_lesson_is_not_repeated(lab: Lab) -> None:
    stage = lab.stage_ids[0]
    result = CheckResult(stage, "c", "fail", "broken\n  read: lesson tally#stage",
                         lesson="tally#stage")
    assert _printed(lab, result).count("read: lesson tally#stage") == 1


def test_services_starting_prints_a_line_and_then_how_long_it_took(lab: Lab) -> None:
    text = _printed(lab, ServicesStarting(("postgres", "kafka")),
                    ServicesReady(3.24, ("postgres", "kafka"), "tansu"))
    assert "starting PostgreSQL and Kafka…" in text
    assert "PostgreSQL and Kafka up in 3.2 s (Kafka: tansu)" in text


def test_services_already_up_print_nothing(lab: Lab) -> None:
    assert _printed(lab, ServicesReady(0.01, (), "tansu")) == ""


def test_on_a_terminal_a_spinner_counts_seconds_until_the_services_are_ready(lab: Lab) -> None:
    out = io.StringIO()
    printer = Printer(lab, out=out, colour=True)
    printer.event(ServicesStarting(("kafka",)))
    deadline = time.monotonic() + 5
    while "⠙" not in out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.02)
    printer.event(ServicesReady(1.0, ("kafka",), "apache"))
    text = out.getvalue()
    assert "\r⠙ starting Kafka… " in text, "the spinner turned and counted seconds"
    assert "Kafka up in 1.0 s (Kafka: apache)" in text


def test_a_later_check_of_the_stage_that_fails_the_same_way_gets_one_line(lab: Lab) -> None:
    failure = CheckFailure("tally.count() is not written yet.", expected="written",
                           actual="it raises NotImplementedError")
    stage = lab.stage_ids[0]
    first, second = (CheckResult(stage, name, "fail", str(failure), hint="split the words",
                                 failure=failure.report) for name in ("counts", "ignores_case"))
    other = CheckResult(stage, "keeps_order", "fail", "the order changed")
    text = _printed(lab, first, second, other)
    assert text.count("tally.count() is not written yet.") == 1
    assert text.count("hint: split the words") == 1
    assert "ignores_case" in text and "fails the same way as counts above" in text
    assert "the order changed" in text, "another message is printed in full"

"""The lab screen's check log while the run starts PostgreSQL and Kafka: a spinner line that
counts seconds, replaced by what started and how long it took; a typed failure's own lesson
link shown next to the stage's."""

from __future__ import annotations

import pytest
from textual.app import App, ComposeResult

from dojo.checks import CheckFailure
from dojo.content.labs import Lab, load_lab
from dojo.runner.results import CheckResult, ServicesReady, ServicesStarting
from dojo.tui.widgets import CheckLog
from tests.runner.conftest import FIXTURES
from tests.tui.conftest import wait_for

pytestmark = pytest.mark.anyio


class LogApp(App[None]):
    def __init__(self, lab: Lab) -> None:
        super().__init__()
        self.lab = lab

    def compose(self) -> ComposeResult:
        yield CheckLog(self.lab)


def _text(app: LogApp) -> str:
    return "\n".join(str(line.render()) for line in app.query_one(CheckLog).children)


async def test_a_spinner_counts_seconds_until_the_services_are_ready() -> None:
    app = LogApp(load_lab(FIXTURES / "labs" / "tally", FIXTURES))
    async with app.run_test(size=(80, 12)) as pilot:
        log = app.query_one(CheckLog)
        log.services_starting(ServicesStarting(("postgres", "kafka")))
        await wait_for(pilot, lambda: " s" in _text(app), what="the spinner to count")
        assert "starting PostgreSQL and Kafka…" in _text(app)
        log.services_ready(ServicesReady(2.5, ("postgres", "kafka"), "tansu"))
        await pilot.pause()
        assert "PostgreSQL and Kafka up in 2.5 s" in _text(app)
        assert "starting" not in _text(app)


async def test_a_failures_own_lesson_is_shown_with_the_stages() -> None:
    lab = load_lab(FIXTURES / "labs" / "tally", FIXTURES)
    app = LogApp(lab)
    failure = CheckFailure("Counted twice.", expected="1", actual="2",
                           lesson="locking#lost-update")
    stage = lab.stage_ids[0]
    result = CheckResult(stage, "counts_once", "fail", str(failure), hint="keep the ids",
                         lesson="tally#stage", failure=failure.report)
    async with app.run_test(size=(80, 24)) as pilot:
        app.query_one(CheckLog).result(result)
        await pilot.pause()
        text = _text(app)
    assert text.count("lesson locking#lost-update") == 1
    assert text.count("lesson tally#stage") == 1
    assert "expected: 1" in text

"""SVG snapshots of each screen at 80×24 and 120×40, over the fixture content with fixed
clocks, fake services and no cursor blink. Update after a deliberate change with
`pytest tests/tui/test_snapshots.py --snapshot-update`, and look at the SVGs first."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import TextArea

from dojo.runner.results import CheckResult, CheckStarted, RunSummary
from dojo.tui.app import DojoApp
from dojo.tui.screens import LabScreen, LessonScreen, MockReportScreen, MockScreen, QuizScreen
from dojo.tui.widgets import CheckLog, CheckRunner
from tests.tui.conftest import FakeServices, document_ready, home_ready, wait_for
from tests.tui.test_quiz import GOOD_ANSWER

SMALL, LARGE = (80, 24), (120, 40)
Snap = Callable[..., bool]


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Times on screen are local; the snapshots are taken in UTC."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


async def settle(pilot: Pilot[Any]) -> None:
    await pilot.pause(0.1)
    pilot.app.clear_notifications()
    await pilot.pause()


async def open_lesson(pilot: Pilot[Any]) -> None:
    await home_ready(pilot)
    await pilot.press("enter")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, LessonScreen))
    await document_ready(pilot)


async def open_lab(pilot: Pilot[Any]) -> None:
    await home_ready(pilot)
    await pilot.press("G", "enter")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, LabScreen))
    await document_ready(pilot, "#lab-doc")


async def start_drill(pilot: Pilot[Any]) -> None:
    await home_ready(pilot)
    await pilot.press("d")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, QuizScreen))
    await pilot.pause()


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["80x24", "120x40"])
def test_home(snap_compare: Snap, make_app: Callable[..., DojoApp], size: tuple[int, int]
              ) -> None:
    async def run_before(pilot: Pilot[Any]) -> None:
        await home_ready(pilot)
        await settle(pilot)

    assert snap_compare(make_app(), terminal_size=size, run_before=run_before)


def test_home_light_theme_with_services_down(snap_compare: Snap,
                                             make_app: Callable[..., DojoApp],
                                             services: FakeServices) -> None:
    services.state = "stopped"

    async def run_before(pilot: Pilot[Any]) -> None:
        await home_ready(pilot)
        await pilot.press("ctrl+t")
        await settle(pilot)

    assert snap_compare(make_app(), terminal_size=SMALL, run_before=run_before)


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["80x24", "120x40"])
def test_lesson_opening(snap_compare: Snap, make_app: Callable[..., DojoApp],
                        size: tuple[int, int]) -> None:
    """At 120 columns the table of contents is open beside the page."""
    async def run_before(pilot: Pilot[Any]) -> None:
        await open_lesson(pilot)
        await settle(pilot)

    assert snap_compare(make_app(), terminal_size=size, run_before=run_before)


def test_lesson_search_and_wide_code(snap_compare: Snap, make_app: Callable[..., DojoApp]
                                     ) -> None:
    async def run_before(pilot: Pilot[Any]) -> None:
        await open_lesson(pilot)
        await pilot.press("slash", *"producer", "enter")
        await settle(pilot)

    assert snap_compare(make_app(), terminal_size=SMALL, run_before=run_before)


def test_lesson_search_as_it_is_typed(snap_compare: Snap, make_app: Callable[..., DojoApp]
                                      ) -> None:
    """The prompt in place of the status line, the matches lit before Enter."""
    async def run_before(pilot: Pilot[Any]) -> None:
        await open_lesson(pilot)
        await pilot.press("slash", *"produc")
        await settle(pilot)

    assert snap_compare(make_app(), terminal_size=SMALL, run_before=run_before)


def test_lesson_link_selected(snap_compare: Snap, make_app: Callable[..., DojoApp]) -> None:
    """A reference to another lesson reads as its title; Tab selects it."""
    async def run_before(pilot: Pilot[Any]) -> None:
        await open_lesson(pilot)
        await pilot.press("tab")
        await settle(pilot)

    assert snap_compare(make_app(), terminal_size=SMALL, run_before=run_before)


def test_quiz_question(snap_compare: Snap, make_app: Callable[..., DojoApp]) -> None:
    async def run_before(pilot: Pilot[Any]) -> None:
        await start_drill(pilot)
        pilot.app.screen.query_one(TextArea).insert("A dead letter queue is where")
        await settle(pilot)

    assert snap_compare(make_app(), terminal_size=SMALL, run_before=run_before)


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["80x24", "120x40"])
def test_quiz_scored(snap_compare: Snap, make_app: Callable[..., DojoApp],
                     size: tuple[int, int]) -> None:
    async def run_before(pilot: Pilot[Any]) -> None:
        await start_drill(pilot)
        quiz = pilot.app.screen
        assert isinstance(quiz, QuizScreen)
        quiz.query_one(TextArea).insert(GOOD_ANSWER)
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: quiz.phase == "scored")
        await settle(pilot)

    assert snap_compare(make_app(), terminal_size=size, run_before=run_before)


def test_lab_instructions(snap_compare: Snap, make_app: Callable[..., DojoApp]) -> None:
    async def run_before(pilot: Pilot[Any]) -> None:
        await open_lab(pilot)
        await pilot.press("down")
        await document_ready(pilot, "#lab-doc")
        await settle(pilot)

    assert snap_compare(make_app(), terminal_size=SMALL, run_before=run_before)


def test_lab_results_while_running(snap_compare: Snap, make_app: Callable[..., DojoApp]
                                   ) -> None:
    """Runner events as the worker posts them (fixed durations, so the picture is stable);
    the real stream is covered by test_lab.py."""
    async def run_before(pilot: Pilot[Any]) -> None:
        await open_lab(pilot)
        lab = pilot.app.screen
        assert isinstance(lab, LabScreen)
        lab.query_one("TabbedContent").active = "lab-results"  # type: ignore[attr-defined]
        log = lab.query_one(CheckLog)
        log.clear()
        log.note("09:30:00 · workspace/wordcount · checking up to the first stage that "
                 "does not pass")
        lab.runner._busy = True
        message = "count_words('Kafka kafka KAFKA') must ignore case.\n" \
                  "  expected {'kafka': 3}\n  got      {'Kafka': 1, 'kafka': 1, 'KAFKA': 1}"
        events = [
            CheckStarted("count", "counts_each_word", "c1"),
            CheckResult("count", "counts_each_word", "pass", duration=0.05, nodeid="c1"),
            CheckStarted("count", "ignores_case", "c2"),
            CheckResult("count", "ignores_case", "fail", message,
                        hint="Split on whitespace and lower-case each word.",
                        lesson="dead-letter-queue#block-or-lose", duration=0.04, nodeid="c2"),
        ]
        for event in events:
            lab.runner.post_message(CheckRunner.Event(event))
        summary = RunSummary(("count", "dedupe"), [e for e in events
                                                   if isinstance(e, CheckResult)])
        lab.runner.post_message(CheckRunner.Done(summary, False))
        await pilot.pause(0.2)
        await settle(pilot)

    assert snap_compare(make_app(), terminal_size=SMALL, run_before=run_before)


def test_lab_watch_results_stage_first_and_folded(snap_compare: Snap,
                                                  make_app: Callable[..., DojoApp]) -> None:
    """Watch mode: the stage being worked on answers first, its identical failures fold into
    one line under the message, then the earlier stage is re-checked."""
    async def run_before(pilot: Pilot[Any]) -> None:
        await open_lab(pilot)
        lab = pilot.app.screen
        assert isinstance(lab, LabScreen)
        lab.query_one("TabbedContent").active = "lab-results"  # type: ignore[attr-defined]
        log = lab.query_one(CheckLog)
        log.clear()
        log.note("09:30:00 · workspace/wordcount · watch: stage 2 dedupe first, then 1")
        lab.runner._busy = True
        message = "wordcount.apply_events() is not written yet.\n" \
                  "  Write it as the lab README describes, then run the check again."
        events: list[CheckStarted | CheckResult] = []
        for n, check in enumerate(("redelivery_counts_once", "order_is_kept",
                                   "empty_batch")):
            events += [CheckStarted("dedupe", check, f"d{n}"),
                       CheckResult("dedupe", check, "fail", message,
                                   hint="Remember the event ids you have applied.",
                                   lesson="dead-letter-queue#replay", duration=0.03,
                                   nodeid=f"d{n}")]
        events += [CheckStarted("count", "counts_each_word", "c1"),
                   CheckResult("count", "counts_each_word", "pass", duration=0.05,
                               nodeid="c1")]
        for event in events:
            lab.runner.post_message(CheckRunner.Event(event))
        summary = RunSummary(("count", "dedupe"), [e for e in events
                                                   if isinstance(e, CheckResult)])
        lab.runner.post_message(CheckRunner.Done(summary, False))
        await pilot.pause(0.2)
        await settle(pilot)

    assert snap_compare(make_app(), terminal_size=SMALL, run_before=run_before)


def test_mock_report(snap_compare: Snap, make_app: Callable[..., DojoApp]) -> None:
    async def run_before(pilot: Pilot[Any]) -> None:
        await home_ready(pilot)
        await pilot.press("m")
        await pilot.pause(0.1)
        await pilot.press("y")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, MockScreen))
        for _ in range(4):
            await pilot.pause(0.1)
            text_area = pilot.app.screen.query_one(TextArea)
            if not text_area.text:
                text_area.insert(GOOD_ANSWER)
            await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, MockReportScreen))
        await settle(pilot)

    assert snap_compare(make_app(), terminal_size=SMALL, run_before=run_before)


def test_progress(snap_compare: Snap, make_app: Callable[..., DojoApp]) -> None:
    async def run_before(pilot: Pilot[Any]) -> None:
        await home_ready(pilot)
        await pilot.press("p")
        await wait_for(pilot, lambda: "Dead letter" in str(
            pilot.app.screen.query_one("#progress-lessons").render()))
        await settle(pilot)

    assert snap_compare(make_app(), terminal_size=SMALL, run_before=run_before)


def test_help(snap_compare: Snap, make_app: Callable[..., DojoApp]) -> None:
    async def run_before(pilot: Pilot[Any]) -> None:
        await home_ready(pilot)
        await pilot.press("question_mark")
        await settle(pilot)

    assert snap_compare(make_app(), terminal_size=SMALL, run_before=run_before)

"""A mock interview: questions and follow-ups under the clock, then a report."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from textual.widgets import OptionList, TextArea

from dojo.store import ProgressStore
from dojo.tui.app import DojoApp
from dojo.tui.screens import ConfirmScreen, LessonScreen, MockReportScreen, MockScreen
from tests.tui.conftest import home_ready, wait_for
from tests.tui.test_quiz import GOOD_ANSWER

pytestmark = pytest.mark.anyio


async def test_mock_interview_ends_in_a_report(make_app: Callable[..., DojoApp]) -> None:
    async with make_app().run_test(size=(80, 24)) as pilot:
        await home_ready(pilot)
        await pilot.press("m")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, ConfirmScreen),
                       what="the mock interview's introduction")
        await pilot.press("enter")  # Start has the focus
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, MockScreen))
        mock = pilot.app.screen
        assert isinstance(mock, MockScreen)
        # two fixture lessons, each a headline and one follow-up
        assert len(mock.turns) == 4
        assert [follow_up for _, _, follow_up in mock.turns] == [False, True, False, True]
        for number, (_, card, _) in enumerate(list(mock.turns)):
            await wait_for(pilot, lambda n=number: mock.index == n)
            meta = str(mock.query_one("#answer-meta").render())
            assert ("follow-up" in meta) == mock.turns[number][2]
            if card.id == "fx-dlq-what":
                mock.query_one(TextArea).insert(GOOD_ANSWER)
            await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, MockReportScreen),
                       what="the report")
        report = pilot.app.screen
        assert isinstance(report, MockReportScreen)
        text = str(report.query_one("#report-text").render())
        assert "Per question" in text and "Weakest lessons" in text
        assert "Dead letter queues" in text and "Idempotent consumers" in text
        assert "(60% + 0%)" in text, "the answered headline shows its coverage"
        assert "✗ " in text, "missed key points of the weakest lessons are listed"
        with ProgressStore() as store:
            answers = store.answers()
            assert len(answers) == 4 and {answer.mode for answer in answers} == {"mock"}
        actions = report.query_one(OptionList)
        assert actions.has_focus
        prompts = [str(actions.get_option_at_index(n).prompt)
                   for n in range(actions.option_count)]
        assert prompts[0].startswith("Drill the ")
        assert any(prompt.startswith("Read: ") for prompt in prompts)
        read = next(n for n, prompt in enumerate(prompts) if prompt.startswith("Read: "))
        actions.highlighted = read
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, LessonScreen),
                       what="the weakest lesson to open")

"""A drill: answer against the clock, see the score, grade it, and find it in the store."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from textual.widgets import TextArea

from dojo.store import ProgressStore
from dojo.tui.app import DojoApp
from dojo.tui.screens import HomeScreen, QuizScreen
from dojo.tui.widgets import CountdownClock, ScoreCard
from tests.tui.conftest import FakeClock, home_ready, wait_for

pytestmark = pytest.mark.anyio

GOOD_ANSWER = ("A dead letter queue is a separate topic where a consumer parks a message it "
               "cannot process, so the stream keeps flowing. Transient errors are retried "
               "with exponential backoff, and malformed messages go to the DLQ at once.")


async def start_drill(pilot) -> QuizScreen:  # type: ignore[no-untyped-def]
    await home_ready(pilot)
    await pilot.press("d")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, QuizScreen),
                   what="the drill to open")
    await pilot.pause()
    return pilot.app.screen  # type: ignore[no-any-return]


async def test_answer_is_scored_graded_and_recorded(make_app: Callable[..., DojoApp]) -> None:
    async with make_app().run_test(size=(80, 24)) as pilot:
        quiz = await start_drill(pilot)
        first = quiz.card
        assert first.id == "fx-dlq-what", "new cards come in lesson order"
        assert quiz.query_one(CountdownClock).running
        assert "60s" in str(quiz.query_one(CountdownClock).render())
        area = quiz.query_one(TextArea)
        assert area.has_focus
        area.insert(GOOD_ANSWER)
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: quiz.phase == "scored", what="the score")
        score_text = str(quiz.query_one("#score-coverage").render())
        assert "Coverage 60%" in score_text and "3 of 5 essentials" in score_text
        made = " ".join(str(row.render()) for row in quiz.query(".-made .point-text"))
        missed = " ".join(str(row.render()) for row in quiz.query(".-missed .point-text"))
        assert "It parks messages" in made and "Every DLQ needs an alert" in missed
        assert quiz.query_one(ScoreCard).query_one("#score-model").render()
        with ProgressStore() as store:
            [answer] = store.answers()
            assert answer.card_id == first.id and answer.answer == GOOD_ANSWER
            assert answer.coverage == pytest.approx(0.6) and answer.mode == "drill"
            assert store.card_state(first.id) is None, "not graded yet"
        await pilot.press("3")
        await wait_for(pilot, lambda: quiz.phase == "ready" and quiz.index == 1,
                       what="the pause before the next card")
        assert not quiz.query_one(CountdownClock).running, "the next clock waits for Enter"
        await pilot.press("enter")
        await wait_for(pilot, lambda: quiz.phase == "answering" and quiz.index == 1,
                       what="the next card")
        with ProgressStore() as store:
            [review] = store.reviews()
            assert review.card_id == first.id and int(review.rating) == 3
            assert store.card_state(first.id) is not None
            assert store.last_place() is not None
            assert store.last_place().target == quiz.card.id  # type: ignore[union-attr]
        assert quiz.query_one(TextArea).text == "", "each card starts with an empty answer"


async def test_time_out_submits_what_was_typed(make_app: Callable[..., DojoApp],
                                               clock: FakeClock) -> None:
    async with make_app().run_test(size=(80, 24)) as pilot:
        quiz = await start_drill(pilot)
        quiz.query_one(TextArea).insert("a dead letter queue parks poison messages")
        clock.advance(61)
        await wait_for(pilot, lambda: quiz.phase == "scored", what="the time-out")
        assert "time was up" in str(quiz.query_one("#score-coverage").render())
        with ProgressStore() as store:
            [answer] = store.answers()
            assert answer.answer == "a dead letter queue parks poison messages"
            assert answer.seconds_used == 60


async def test_keyword_list_is_flagged(make_app: Callable[..., DojoApp]) -> None:
    async with make_app().run_test(size=(80, 24)) as pilot:
        quiz = await start_drill(pilot)
        quiz.query_one(TextArea).insert("dlq, retry, backoff, poison, alert, owner, replay")
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: quiz.phase == "scored")
        warning = quiz.query_one("#score-warning")
        assert warning.display and "keyword list" in str(warning.render())


async def test_enter_accepts_the_suggested_grade_and_the_round_ends_with_a_summary(
        make_app: Callable[..., DojoApp]) -> None:
    async with make_app().run_test(size=(80, 24)) as pilot:
        quiz = await start_drill(pilot)
        for _ in quiz.cards:
            await pilot.press("ctrl+s")  # an empty answer: suggested grade Again
            await wait_for(pilot, lambda: quiz.phase == "scored")
            await pilot.press("enter")  # grade
            await wait_for(pilot, lambda: quiz.phase in ("ready", "done"))
            if quiz.phase == "ready":
                await pilot.press("enter")  # start the next card
                await wait_for(pilot, lambda: quiz.phase == "answering")
        await wait_for(pilot, lambda: quiz.phase == "done", what="the summary")
        summary = str(quiz.query_one("#quiz-done").render())
        assert f"{len(quiz.cards)} answered" in summary
        with ProgressStore() as store:
            assert {int(review.rating) for review in store.reviews()} == {1}
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, HomeScreen))


async def test_continue_goes_back_to_the_card_that_was_on_screen(
        make_app: Callable[..., DojoApp]) -> None:
    async with make_app().run_test(size=(80, 24)) as pilot:
        quiz = await start_drill(pilot)
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: quiz.phase == "scored")
        await pilot.press("3")
        await wait_for(pilot, lambda: quiz.index == 1)
        second = quiz.card
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, HomeScreen))
        home = pilot.app.screen
        await wait_for(pilot, lambda: home.overview is not None and home.overview.last
                       is not None and home.overview.last.kind == "quiz")
        await pilot.press("c")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, QuizScreen))
        assert pilot.app.screen.card.id == second.id  # type: ignore[attr-defined]


async def test_the_learner_ticks_and_unticks_points_and_the_suggestion_follows(
        make_app: Callable[..., DojoApp]) -> None:
    async with make_app().run_test(size=(80, 24)) as pilot:
        quiz = await start_drill(pilot)
        quiz.query_one(TextArea).insert(GOOD_ANSWER)
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: quiz.phase == "scored")
        assert quiz._suggested == 2  # 3 of 5: Hard
        await pilot.press("d", "e")  # the learner says they covered the two missed points
        await wait_for(pilot, lambda: quiz._suggested == 3, what="Good after two ticks")
        head = str(quiz.query_one("#score-coverage").render())
        assert "Coverage 100%" in head and "your checklist" in head
        await pilot.press("a", "b", "c", "d")  # untick: one of five left
        await wait_for(pilot, lambda: quiz._suggested == 1, what="Again after unticking")
        await pilot.press("enter")
        await wait_for(pilot, lambda: quiz.phase == "ready")
        assert quiz.scores[0].percent == 20


async def test_grade_buttons_show_when_the_card_comes_back(
        make_app: Callable[..., DojoApp]) -> None:
    async with make_app().run_test(size=(80, 24)) as pilot:
        quiz = await start_drill(pilot)
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: quiz.phase == "scored")
        labels = [str(quiz.query_one(f"#grade-{value}").label) for value in (1, 2, 3, 4)]
        assert all(" · " in label for label in labels), labels
        assert labels[3].endswith("d"), "Easy on a new card schedules days ahead"


async def test_aloud_nothing_is_typed_and_the_checklist_starts_empty(
        make_app: Callable[..., DojoApp]) -> None:
    async with make_app().run_test(size=(80, 24)) as pilot:
        quiz = await start_drill(pilot)
        await pilot.press("ctrl+l")
        assert quiz.aloud and quiz.query_one(TextArea).read_only
        assert quiz.query_one(CountdownClock).running, "the clock runs while they speak"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: quiz.phase == "scored")
        assert quiz._score is not None and quiz._score.matched == ()
        await pilot.press("a", "b", "c", "d")
        await wait_for(pilot, lambda: quiz._suggested == 3)
        with ProgressStore() as store:
            assert store.answers() == [], "nothing typed, nothing stored as an answer"

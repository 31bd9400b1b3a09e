"""Home, the global keys, the theme and the command palette."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from textual.widgets import Input

from dojo.store import ProgressStore
from dojo.store import data_dir as store_data_dir
from dojo.tui.app import DojoApp
from dojo.tui.screens import HelpScreen, HomeScreen, LessonScreen, ProgressScreen
from dojo.tui.screens._help import _bindings, sections
from dojo.tui.settings import settings_dir
from dojo.tui.widgets import LessonList
from tests.tui.conftest import FakeServices, home_ready, wait_for

pytestmark = pytest.mark.anyio


def prompts(lessons: LessonList) -> list[str]:
    return [str(lessons.get_option_at_index(n).prompt) for n in range(lessons.option_count)]


async def test_home_lists_tracks_lessons_and_labs_with_progress(
        make_app: Callable[..., DojoApp]) -> None:
    async with make_app().run_test(size=(80, 24)) as pilot:
        await home_ready(pilot)
        lines = prompts(pilot.app.screen.query_one(LessonList))
        assert lines[0] == "The interview" and lines[2] == "What they ask next"
        assert "01 Dead letter queues" in lines[1] and "0/2" in lines[1], \
            "lesson 01 pairs with two stages of the ready wordcount lab"
        assert "02 Idempotent consumers" in lines[3]
        labs = lines[lines.index("Labs") + 1:]
        assert [line.split()[0] for line in labs] == ["wordcount"], \
            "the labs are what labs/ holds; no planned table adds any"
        assert "0/2" in labs[0]
        today = str(pilot.app.screen.query_one("#home-today").render())
        assert "Due now     0" in today and "New         8" in today


async def test_services_show_and_start_from_home(make_app: Callable[..., DojoApp],
                                                 services: FakeServices) -> None:
    services.state = "stopped"
    async with make_app().run_test(size=(80, 24)) as pilot:
        await home_ready(pilot)
        panel = pilot.app.screen.query_one("#home-services")
        assert "PostgreSQL stopped" in " ".join(str(panel.render()).split())
        await pilot.press("u")
        await wait_for(pilot, lambda: services.started == 1 and "stopped" not in
                       str(panel.render()), what="the services to start")


async def test_progress_screen_shows_bars_and_history(make_app: Callable[..., DojoApp]
                                                      ) -> None:
    async with make_app().run_test(size=(80, 24)) as pilot:
        await home_ready(pilot)
        with ProgressStore() as store:
            store.record_stage_result("wordcount", "count", "pass")
        await pilot.press("p")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, ProgressScreen))
        screen = pilot.app.screen
        await wait_for(pilot, lambda: "Dead letter" in str(
            screen.query_one("#progress-lessons").render()))
        labs = str(screen.query_one("#progress-labs").render())
        assert "wordcount" in labs and "1/2" in labs and "✓·" in labs
        assert "No reviews yet" in str(screen.query_one("#progress-history").render())


async def test_theme_toggle_is_remembered(make_app: Callable[..., DojoApp]) -> None:
    async with make_app().run_test(size=(80, 24)) as pilot:
        await home_ready(pilot)
        assert pilot.app.current_theme.dark
        await pilot.press("ctrl+t")
        await pilot.pause()
        assert not pilot.app.current_theme.dark
    saved = json.loads((settings_dir() / "tui.json").read_text())
    assert saved == {"theme": "textual-light"}
    async with make_app().run_test(size=(80, 24)) as pilot:
        await home_ready(pilot)
        assert pilot.app.theme == "textual-light"


def test_settings_live_beside_the_progress_database(data_dir: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    assert settings_dir() == store_data_dir() == data_dir
    monkeypatch.delenv("DOJO_DATA_DIR")
    assert settings_dir() == store_data_dir(), "the same rule without the override"


def help_text(pilot) -> str:  # type: ignore[no-untyped-def]
    return "\n".join(str(static.render()) for static in pilot.app.screen.query("Static"))


def descriptions(owners: list[type]) -> set[str]:
    return {binding.description or binding.action for owner in owners
            for binding in _bindings(owner)}


async def test_help_lists_the_keys_of_the_screen_it_was_opened_on(
        make_app: Callable[..., DojoApp]) -> None:
    keys = dict(sections())
    async with make_app().run_test(size=(80, 24)) as pilot:
        await home_ready(pilot)
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, HelpScreen))
        text = help_text(pilot)
        for description in descriptions(keys["Home"]) | descriptions(keys["Everywhere"]):
            assert description in text, f"Home's help lacks {description!r}"
        assert "Search" not in text, "the lesson's keys are not Home's"
        assert "Ctrl+P" in text
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, HomeScreen))
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, LessonScreen))
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, HelpScreen))
        text = help_text(pilot)
        for description in descriptions(keys["Lesson"]):
            assert description in text, f"the lesson's help lacks {description!r}"
        assert "Mock" not in text, "Home's keys are not the lesson's"
        assert pilot.app.screen.query_one("#help-body").border_title == "Keys · Lesson"


async def test_command_palette_opens_a_lesson_by_name(make_app: Callable[..., DojoApp]) -> None:
    async with make_app().run_test(size=(80, 24)) as pilot:
        await home_ready(pilot)
        await pilot.press("ctrl+p")
        await pilot.pause(0.2)
        palette_input = pilot.app.screen.query_one(Input)
        palette_input.value = "open lesson idempotent"
        await pilot.pause(0.5)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, LessonScreen),
                       what="the palette to open the lesson")
        assert pilot.app.screen.lesson.id == "idempotent-consumer"  # type: ignore[attr-defined]


def footer_keys(pilot) -> list[tuple[str, str, int]]:  # type: ignore[no-untyped-def]
    """(key shown, action, right edge) of each key in the current screen's footer."""
    from textual.widgets._footer import FooterKey

    from dojo.tui.widgets import KeyFooter

    footer = pilot.app.screen.query_one(KeyFooter)
    return [(key.key_display, key.action, key.region.right) for key in footer.query(FooterKey)
            if not key.has_class("-command-palette")]


async def test_every_footer_keeps_help_and_the_way_out_in_view_at_80_columns(
        make_app: Callable[..., DojoApp]) -> None:
    from dojo.tui.screens import LabScreen

    async with make_app().run_test(size=(80, 24)) as pilot:
        await home_ready(pilot)
        seen = {}
        for name, keys, reached in (
                ("Home", (), lambda: isinstance(pilot.app.screen, HomeScreen)),
                ("Lesson", ("enter",), lambda: isinstance(pilot.app.screen, LessonScreen)),
                ("Lab", ("escape", "G", "enter"), lambda: isinstance(pilot.app.screen,
                                                                      LabScreen)),
                ("Progress", ("escape", "p"), lambda: isinstance(pilot.app.screen,
                                                                 ProgressScreen))):
            await pilot.press(*keys)
            await wait_for(pilot, reached, what=f"the {name} screen")
            await pilot.pause(0.2)
            shown = footer_keys(pilot)
            seen[name] = [key for key, _, _ in shown[:2]]
            assert shown[0][:2] == ("?", "help"), (name, shown)
            assert shown[1][0] == "q", (name, shown)
            assert all(right <= 80 for _, _, right in shown[:2]), (name, shown)
        assert seen["Home"] == ["?", "q"] and seen["Lab"] == ["?", "q"]


async def test_the_palette_offers_the_lab_actions_with_their_keys(
        make_app: Callable[..., DojoApp]) -> None:
    from textual.command import CommandList

    from dojo.tui.screens import LabScreen

    async with make_app().run_test(size=(100, 30)) as pilot:
        await home_ready(pilot)
        await pilot.press("G", "enter")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, LabScreen))
        lab = pilot.app.screen
        await pilot.press("ctrl+p")
        await pilot.pause(0.3)
        pilot.app.screen.query_one(Input).value = "watch"
        await pilot.pause(0.5)
        options = pilot.app.screen.query_one(CommandList)
        first = str(options.get_option_at_index(0).prompt).splitlines()
        assert first[0] == "Lab: Watch  w", first
        assert "on every save" in first[1], "the help line says what it does"
        await pilot.press("enter")
        await wait_for(pilot, lambda: pilot.app.screen is lab and lab.runner.watching,
                       what="the palette to turn watch mode on")
        await pilot.press("w")


async def test_home_is_current_after_reading_a_lesson_and_drilling_its_cards(
        make_app: Callable[..., DojoApp]) -> None:
    from textual.widgets import TextArea

    from dojo.tui.screens import QuizScreen
    from tests.tui.test_quiz import GOOD_ANSWER

    async with make_app().run_test(size=(80, 24)) as pilot:
        await home_ready(pilot)
        home = pilot.app.screen
        assert "Nothing yet" in str(home.query_one("#home-continue").render())
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, LessonScreen))
        await pilot.pause(0.3)
        await pilot.press("G")
        await pilot.pause(0.2)
        await pilot.press("d")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, QuizScreen))
        quiz = pilot.app.screen
        quiz.query_one(TextArea).insert(GOOD_ANSWER)
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: quiz.phase == "scored")  # type: ignore[attr-defined]
        await pilot.press("3", "escape")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, LessonScreen))
        await pilot.press("escape")
        await wait_for(pilot, lambda: pilot.app.screen is home)

        def fresh() -> bool:
            overview = home.overview  # type: ignore[attr-defined]
            row = overview.lessons[0] if overview else None
            return bool(row and row.read == "read" and row.mastery > 0 and overview.last)

        await wait_for(pilot, fresh, what="Home to show the lesson read and its card drilled")
        assert "Nothing yet" not in str(home.query_one("#home-continue")
                                                        .render())


async def test_a_home_load_that_lands_after_a_visit_is_replaced_by_a_fresh_one(
        make_app: Callable[..., DojoApp], monkeypatch: pytest.MonkeyPatch) -> None:
    """The first load can be slow on a busy machine; if the learner reads meanwhile, what it
    gathered is older than the visit and must not be what Home shows."""
    import threading

    from dojo.tui.navigation import OpenLesson
    from dojo.tui.screens import _home

    release = threading.Event()
    calls = []
    real_gather = _home.gather

    def slow_first(session):  # type: ignore[no-untyped-def]
        calls.append(1)
        overview = real_gather(session)
        if len(calls) == 1:
            release.wait(10)
        return overview

    monkeypatch.setattr(_home, "gather", slow_first)
    async with make_app().run_test(size=(80, 24)) as pilot:
        app = pilot.app
        home = app.screen
        await wait_for(pilot, lambda: calls, what="the first load to start")
        await wait_for(pilot, lambda: app.session.loaded)  # type: ignore[attr-defined]
        app.post_message(OpenLesson("dead-letter-queue"))
        await wait_for(pilot, lambda: isinstance(app.screen, LessonScreen))
        await pilot.pause(0.3)
        await pilot.press("G")
        await pilot.pause(0.2)
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is home)
        release.set()
        await wait_for(pilot, lambda: home.overview is not None  # type: ignore[attr-defined]
                       and home.overview.lessons[0].read == "read",  # type: ignore[attr-defined]
                       what="the fresh load, not the first one, on screen")
        await pilot.pause(0.3)
        assert home.overview.lessons[0].read == "read"  # type: ignore[attr-defined]


async def test_lesson_rows_name_the_lab_their_stage_count_belongs_to(
        make_app: Callable[..., DojoApp]) -> None:
    async with make_app().run_test(size=(80, 24)) as pilot:
        await home_ready(pilot)
        lines = prompts(pilot.app.screen.query_one(LessonList))
        assert lines[1].rstrip().endswith("wordcount 0/2"), lines[1]


async def test_home_shows_the_interview_path_and_n_takes_the_next_step(
        make_app: Callable[..., DojoApp]) -> None:
    from dojo.tui.screens import LabScreen, QuizScreen
    from dojo.tui.widgets import PathBar

    async with make_app().run_test(size=(80, 24)) as pilot:
        await home_ready(pilot)
        home = pilot.app.screen
        bar = str(home.query_one(PathBar).render())
        assert "Interview" in bar and "0%" in bar and "0 of 1 questions ready" in bar
        assert "question 1 of 1 · read “Dead letter queues”" in bar
        await pilot.press("n")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, LessonScreen))
        await pilot.pause(0.3)
        await pilot.press("G")
        await pilot.pause(0.2)
        await pilot.press("escape")
        await wait_for(pilot, lambda: pilot.app.screen is home and "drill" in str(
            home.query_one(PathBar).render()), what="the path to move on to drilling")
        assert "drill the 4 cards of “Dead letter queues”" in str(
            home.query_one(PathBar).render())
        await pilot.press("n")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, QuizScreen))
        quiz = pilot.app.screen
        assert [card.lesson_id for card in quiz.cards] == ["dead-letter-queue"] * 4  # type: ignore[attr-defined]
        await pilot.press("escape")
        await wait_for(pilot, lambda: pilot.app.screen is home)
        from dojo.quiz import SelfGrade

        for card in quiz.cards:  # type: ignore[attr-defined]
            pilot.app.session.scheduler.review(card.id, SelfGrade.GOOD)  # type: ignore[attr-defined]
        home.reload()  # type: ignore[attr-defined]
        await wait_for(pilot, lambda: "lab wordcount: pass stage count" in str(
            home.query_one(PathBar).render()), what="the path to move on to the lab")
        await pilot.press("n")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, LabScreen))
        lab = pilot.app.screen
        assert lab.query_one("StageList").stage_id == "count"  # type: ignore[attr-defined]

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


async def test_help_lists_every_key_of_every_screen(make_app: Callable[..., DojoApp]) -> None:
    async with make_app().run_test(size=(80, 24)) as pilot:
        await home_ready(pilot)
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, HelpScreen))
        text = "\n".join(str(static.render()) for static in pilot.app.screen.query("Static"))
        for _title, owners in sections():
            for owner in owners:
                for binding in _bindings(owner):
                    assert (binding.description or binding.action) in text, binding
        assert "Ctrl+P" in text
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, HomeScreen))


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

"""Reading a lesson: vim keys, search, contents, diagrams, and the place kept in the store."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dojo.store import ProgressStore
from dojo.tui.app import DojoApp
from dojo.tui.screens import HomeScreen, LessonScreen
from dojo.tui.widgets import DocumentView, TableOfContents
from tests.tui.conftest import document_ready, home_ready, wait_for

pytestmark = pytest.mark.anyio


async def open_first_lesson(pilot) -> DocumentView:  # type: ignore[no-untyped-def]
    await home_ready(pilot)
    await pilot.press("enter")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, LessonScreen),
                   what="the lesson to open")
    await document_ready(pilot)
    return pilot.app.screen.query_one(DocumentView)


async def test_vim_and_arrow_keys_move_through_the_page(make_app: Callable[..., DojoApp]
                                                        ) -> None:
    async with make_app().run_test(size=(80, 24)) as pilot:
        view = await open_first_lesson(pilot)
        assert view.top_line == 0
        await pilot.press("j", "j", "down")
        assert view.top_line == 3
        await pilot.press("k", "up")
        assert view.top_line == 1
        await pilot.press("G")
        assert view.scroll_y == view.max_scroll_y > 20
        await pilot.press("g")
        assert view.top_line == 0
        half = view.scrollable_content_region.height // 2
        await pilot.press("ctrl+d")
        assert view.top_line == half
        await pilot.press("ctrl+u")
        assert view.top_line == 0


async def test_search_highlights_matches_and_n_moves_between_them(
        make_app: Callable[..., DojoApp]) -> None:
    async with make_app().run_test(size=(80, 24)) as pilot:
        view = await open_first_lesson(pilot)
        await pilot.press("slash", *"POISON", "enter")
        assert view.search_query == "POISON"
        total = view.match_count
        assert total >= 2, "the fixture lesson says 'poison' several times, in any case"
        assert view.current_match == 1
        status = str(pilot.app.screen.query_one("#lesson-status").render())
        assert f"/POISON  1 of {total}" in status
        first = view._matches[0].line
        assert view.top_line <= first < view.top_line + view.size.height
        await pilot.press("n")
        assert view.current_match == 2
        await pilot.press("N", "N")
        assert view.current_match == total, "N before the first match wraps to the last"
        await pilot.press("slash", "enter")
        assert view.match_count == 0, "an empty search clears the highlights"


async def test_contents_jump_to_a_subsection(make_app: Callable[..., DojoApp]) -> None:
    async with make_app().run_test(size=(80, 24)) as pilot:
        view = await open_first_lesson(pilot)
        contents = pilot.app.screen.query_one(TableOfContents)
        assert not contents.display, "at 80 columns the contents start hidden"
        await pilot.press("t")
        assert contents.display and contents.has_focus
        while contents.cursor_node is not None and contents.cursor_node.data != "replay":
            await pilot.press("down")
        await pilot.press("enter")
        await pilot.pause()
        assert view.document is not None
        assert view.top_line == min(view.document.anchors["replay"], round(view.max_scroll_y))
        assert view.has_focus and not contents.display


async def test_the_60_second_answer_is_a_box_and_wide_code_is_not_wrapped(
        make_app: Callable[..., DojoApp]) -> None:
    async with make_app().run_test(size=(80, 24)) as pilot:
        view = await open_first_lesson(pilot)
        assert view.document is not None
        lines = [line.text for line in view.document.lines]
        box = next(n for n, text in enumerate(lines) if "The 60-second answer" in text)
        assert lines[box].lstrip().startswith("╭"), "the answer sits in a highlighted box"
        assert "dead letter queue is a separate queue" in " ".join(lines[box:box + 4])
        wide = next(line for line in view.document.lines if "def handle(record" in line.text)
        assert wide.scrolls and wide.text.rstrip().endswith('"permanent"):'), \
            "code keeps its width (it scrolls sideways instead of wrapping)"
        await pilot.press("right")
        assert view.scroll_x > 0


async def test_the_place_is_recorded_and_reopening_resumes_there(
        make_app: Callable[..., DojoApp]) -> None:
    async with make_app().run_test(size=(80, 24)) as pilot:
        view = await open_first_lesson(pilot)
        await pilot.press("ctrl+d", "ctrl+d", "ctrl+d")
        await pilot.pause(0.7)  # the position is written once scrolling pauses
        place = view.top_line
        with ProgressStore() as store:
            progress = store.lesson_progress()["dead-letter-queue"]
            assert progress.position == place and not progress.finished
            assert store.last_place() is not None
            assert store.last_place().target == "dead-letter-queue"  # type: ignore[union-attr]
        await pilot.press("G")
        await pilot.pause(0.1)
        with ProgressStore() as store:
            assert store.lesson_progress()["dead-letter-queue"].finished
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, HomeScreen))
        home = pilot.app.screen
        await wait_for(pilot, lambda: home.overview is not None and home.overview.last
                       is not None and home.overview.lessons[0].read == "read",
                       what="Home to show the lesson as read")
        await pilot.press("c")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, LessonScreen))
        await document_ready(pilot)
        view = pilot.app.screen.query_one(DocumentView)
        await wait_for(pilot, lambda: view.scroll_y == view.max_scroll_y > 0,
                       what="c to reopen the lesson where it was left (the end)")

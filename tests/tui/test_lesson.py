"""Reading a lesson: vim keys, search, contents, diagrams, and the place kept in the store."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dojo.store import ProgressStore
from dojo.tui.app import DojoApp
from dojo.tui.screens import HomeScreen, LessonScreen
from dojo.tui.widgets import DocumentView, SearchBar, TableOfContents
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


async def test_the_search_is_shown_as_it_is_typed_and_lights_up_matches_at_once(
        make_app: Callable[..., DojoApp]) -> None:
    async with make_app().run_test(size=(80, 24)) as pilot:
        view = await open_first_lesson(pilot)
        screen = pilot.app.screen
        bar, status = screen.query_one(SearchBar), screen.query_one("#lesson-status")
        await pilot.press("slash", *"poi")
        assert bar.display and not status.display, "the prompt takes the status line's place"
        assert bar.value == "poi" and bar.region.height == 1 and bar.region.y < 23, \
            "what is typed is on screen, above the footer"
        assert view.search_query == "poi" and view.match_count >= 2, \
            "matches light up before Enter"
        await pilot.press("s")
        assert view.search_query == "pois"
        await pilot.press("enter")
        assert not bar.display and status.display and view.has_focus
        assert view.search_query == "pois"


async def test_escape_in_the_prompt_cancels_the_search_and_goes_back_to_where_it_began(
        make_app: Callable[..., DojoApp]) -> None:
    async with make_app().run_test(size=(80, 24)) as pilot:
        view = await open_first_lesson(pilot)
        start = view.top_line
        await pilot.press("slash", *"ordering")
        await pilot.pause()
        assert view.match_count and view.top_line != start, "the page moved to the match"
        await pilot.press("escape")
        await pilot.pause()
        assert view.search_query == "" and view.match_count == 0
        assert view.top_line == start
        assert "/ordering" not in str(pilot.app.screen.query_one("#lesson-status").render())


async def test_escape_clears_a_kept_search_before_it_leaves_the_lesson(
        make_app: Callable[..., DojoApp]) -> None:
    async with make_app().run_test(size=(80, 24)) as pilot:
        view = await open_first_lesson(pilot)
        await pilot.press("slash", *"poison", "enter")
        status = pilot.app.screen.query_one("#lesson-status")
        assert "/poison" in str(status.render()) and "Esc clears" in str(status.render())
        await pilot.press("escape")
        assert isinstance(pilot.app.screen, LessonScreen), "the first Esc only clears"
        assert view.search_query == "" and "/poison" not in str(status.render())
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, HomeScreen))


async def test_t_goes_into_the_contents_and_back_at_any_width(
        make_app: Callable[..., DojoApp]) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        view = await open_first_lesson(pilot)
        contents = pilot.app.screen.query_one(TableOfContents)
        assert contents.display and view.has_focus, "wide: the contents sit beside the page"
        await pilot.press("t")
        assert contents.display and contents.has_focus, "t goes into them; it never hides them"
        await pilot.press("t")
        assert contents.display and view.has_focus, "t again: back to the page"
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        assert not contents.display, "below 100 columns the contents fold away"
        await pilot.press("t")
        assert contents.display and contents.has_focus
        await pilot.press("escape")
        assert view.has_focus and not contents.display, "Esc in the contents: back to the page"
        assert isinstance(pilot.app.screen, LessonScreen)
        await pilot.resize_terminal(120, 40)
        await pilot.pause()
        assert contents.display


async def test_g_and_G_jump_to_the_first_and_last_entry_of_the_contents(
        make_app: Callable[..., DojoApp]) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        await open_first_lesson(pilot)
        contents = pilot.app.screen.query_one(TableOfContents)
        await pilot.press("t", "G")
        assert contents.cursor_line == contents.last_line > 0
        await pilot.press("g")
        assert contents.cursor_line == 0


async def test_cut_titles_in_the_contents_end_in_an_ellipsis(
        make_app: Callable[..., DojoApp]) -> None:
    async with make_app().run_test(size=(120, 40)) as pilot:
        await open_first_lesson(pilot)
        contents = pilot.app.screen.query_one(TableOfContents)
        room = contents.scrollable_content_region.width - 2
        labels = [str(node.label) for node in contents._entries.values()]
        long = [label for label in labels if label.endswith("…")]
        assert long, "the fixture has a heading longer than the column"
        assert all(len(label) <= room for label in labels)


async def test_lesson_references_read_as_titles_and_tab_enter_follows_one(
        make_app: Callable[..., DojoApp]) -> None:
    async with make_app().run_test(size=(80, 24)) as pilot:
        view = await open_first_lesson(pilot)
        assert view.document is not None
        text = " ".join(" ".join(line.text for line in view.document.lines).split())
        assert "lesson:" not in text, "no raw reference is left on the page"
        assert "see Idempotent consumers › The processed table." in text
        assert [link.target for link in view.document.links] == [
            "lesson:idempotent-consumer#the-processed-table"]
        await pilot.press("tab")
        assert view.selected_link == "lesson:idempotent-consumer#the-processed-table"
        link_line = view.document.links[0].line
        assert view.top_line <= link_line < view.top_line + view.size.height
        status = str(pilot.app.screen.query_one("#lesson-status").render())
        assert "→ Idempotent consumers › The processed table" in status
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, LessonScreen)
                       and pilot.app.screen.lesson.id == "idempotent-consumer",
                       what="the linked lesson to open")
        await document_ready(pilot)
        other = pilot.app.screen.query_one(DocumentView)
        assert other.document is not None
        await wait_for(pilot, lambda: other.top_line == min(
            other.document.anchors["the-processed-table"], round(other.max_scroll_y)),  # type: ignore[union-attr]
            what="the linked section at the top")
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, LessonScreen)
                       and pilot.app.screen.lesson.id == "dead-letter-queue",
                       what="Esc to come back to the lesson the link was in")


async def test_a_click_on_a_reference_opens_that_lesson(make_app: Callable[..., DojoApp]
                                                         ) -> None:
    async with make_app().run_test(size=(80, 24)) as pilot:
        view = await open_first_lesson(pilot)
        assert view.document is not None
        link = view.document.links[0]
        view.go_to(line=link.line)
        await pilot.pause()
        line, start, _end = link.spans[0]
        region = view.scrollable_content_region
        await pilot.click(view, offset=(start + 1 + region.x - view.region.x,
                                        line - view.top_line + region.y - view.region.y))
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, LessonScreen)
                       and pilot.app.screen.lesson.id == "idempotent-consumer",
                       what="the click to open the linked lesson")

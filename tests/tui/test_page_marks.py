"""The page's marks as plain functions: search matches in cells, and which link Tab picks."""

from __future__ import annotations

from textual.strip import Strip

from dojo.tui.document import DocLine, Link
from dojo.tui.widgets._page_marks import Match, find_matches, pick_link

LINKS = [Link("lesson:a", ((2, 0, 4),)), Link("lesson:b", ((30, 5, 9),)),
         Link("lesson:c", ((31, 0, 3), (32, 0, 2)))]


def test_matches_ignore_case_and_count_wide_characters_as_two_cells() -> None:
    lines = [DocLine(Strip([]), "Poison — poison"), DocLine(Strip([]), "日本 poison")]
    assert find_matches(lines, "POISON") == [Match(0, 0, 6), Match(0, 9, 15),
                                             Match(1, 5, 11)]
    assert find_matches(lines, "") == []


def test_tab_starts_at_the_first_link_in_view_and_then_moves_on_and_wraps() -> None:
    assert pick_link(LINKS, -1, top=20, height=20, step=1) == 1
    assert pick_link(LINKS, 1, top=20, height=20, step=1) == 2
    assert pick_link(LINKS, 2, top=20, height=20, step=1) == 0, "after the last: the first"
    assert pick_link(LINKS, -1, top=20, height=20, step=-1) == 2, "Shift+Tab: the last in view"


def test_a_selected_link_scrolled_out_of_view_does_not_hold_tab_back() -> None:
    assert pick_link(LINKS, 0, top=25, height=10, step=1) == 1, \
        "the selected link is off screen: Tab starts from what is in view"
    assert pick_link(LINKS, -1, top=40, height=10, step=1) == 0, "nothing below: the first"

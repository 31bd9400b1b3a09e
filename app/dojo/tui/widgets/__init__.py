"""The app's widgets, one per private module, loaded on first use (as `textual.widgets`
does), so Home does not pay for the quiz's text area or the lab's log."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dojo.tui.widgets._answer_panel import AnswerPanel
    from dojo.tui.widgets._check_log import CheckLog
    from dojo.tui.widgets._check_runner import CheckRunner
    from dojo.tui.widgets._countdown_clock import CountdownClock
    from dojo.tui.widgets._document_view import DocumentView
    from dojo.tui.widgets._grade_bar import GradeBar
    from dojo.tui.widgets._key_footer import KeyFooter
    from dojo.tui.widgets._lesson_list import LessonList
    from dojo.tui.widgets._path_bar import PathBar
    from dojo.tui.widgets._score_card import ScoreCard
    from dojo.tui.widgets._search_bar import SearchBar
    from dojo.tui.widgets._services_panel import ServicesPanel
    from dojo.tui.widgets._stage_list import StageList
    from dojo.tui.widgets._table_of_contents import TableOfContents

_MODULES = {
    "AnswerPanel": "_answer_panel",
    "CheckLog": "_check_log",
    "CheckRunner": "_check_runner",
    "CountdownClock": "_countdown_clock",
    "DocumentView": "_document_view",
    "GradeBar": "_grade_bar",
    "KeyFooter": "_key_footer",
    "LessonList": "_lesson_list",
    "PathBar": "_path_bar",
    "ScoreCard": "_score_card",
    "SearchBar": "_search_bar",
    "ServicesPanel": "_services_panel",
    "StageList": "_stage_list",
    "TableOfContents": "_table_of_contents",
}

__all__ = [
    "AnswerPanel",
    "CheckLog",
    "CheckRunner",
    "CountdownClock",
    "DocumentView",
    "GradeBar",
    "KeyFooter",
    "LessonList",
    "PathBar",
    "ScoreCard",
    "SearchBar",
    "ServicesPanel",
    "StageList",
    "TableOfContents",
]


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)

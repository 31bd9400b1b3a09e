"""The app's screens, one per private module, loaded on first use (as `textual.widgets`
does), so start-up imports only Home."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dojo.tui.screens._confirm import ConfirmScreen
    from dojo.tui.screens._help import HelpScreen
    from dojo.tui.screens._home import HomeScreen
    from dojo.tui.screens._lab import LabScreen
    from dojo.tui.screens._lesson import LessonScreen
    from dojo.tui.screens._mock import MockScreen
    from dojo.tui.screens._mock_report import MockReportScreen
    from dojo.tui.screens._pick import PickScreen
    from dojo.tui.screens._progress import ProgressScreen
    from dojo.tui.screens._quiz import QuizScreen
    from dojo.tui.screens._viewer import ViewerScreen

_MODULES = {
    "ConfirmScreen": "_confirm",
    "HelpScreen": "_help",
    "HomeScreen": "_home",
    "LabScreen": "_lab",
    "LessonScreen": "_lesson",
    "MockReportScreen": "_mock_report",
    "MockScreen": "_mock",
    "PickScreen": "_pick",
    "ProgressScreen": "_progress",
    "QuizScreen": "_quiz",
    "ViewerScreen": "_viewer",
}

__all__ = [
    "ConfirmScreen",
    "HelpScreen",
    "HomeScreen",
    "LabScreen",
    "LessonScreen",
    "MockReportScreen",
    "MockScreen",
    "PickScreen",
    "ProgressScreen",
    "QuizScreen",
    "ViewerScreen",
]


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)

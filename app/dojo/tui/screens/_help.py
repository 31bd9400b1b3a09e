"""`?`: the keys of the screen it was opened on, then those that work everywhere, read from
the bindings themselves so it cannot drift."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.content import Content
from textual.dom import DOMNode
from textual.screen import ModalScreen
from textual.widgets import Static

KEY_WIDTH = 13
COLUMN_WIDTH = 35


def _bindings(owner: type[DOMNode]) -> list[Binding]:
    found: list[Binding] = []
    for item in owner.__dict__.get("BINDINGS", []):
        if isinstance(item, Binding):
            found.append(item)
        else:
            key, action, *rest = item
            found.append(Binding(key, action, rest[0] if rest else ""))
    return found


def sections() -> list[tuple[str, list[type[DOMNode]]]]:
    """Each screen with the widgets whose keys work on it."""
    from dojo.tui.app import DojoApp
    from dojo.tui.screens._home import HomeScreen
    from dojo.tui.screens._lab import LabScreen
    from dojo.tui.screens._lesson import LessonScreen
    from dojo.tui.screens._mock import MockScreen
    from dojo.tui.screens._mock_report import MockReportScreen
    from dojo.tui.screens._progress import ProgressScreen
    from dojo.tui.screens._quiz import QuizScreen
    from dojo.tui.widgets import (
        AnswerPanel,
        CheckLog,
        DocumentView,
        LessonList,
        SearchBar,
        StageList,
    )

    return [
        ("Everywhere", [DojoApp]),
        ("Home", [HomeScreen, LessonList]),
        ("Lesson", [LessonScreen, DocumentView, SearchBar]),
        ("Lab", [LabScreen, StageList, CheckLog]),
        ("Drill", [QuizScreen, AnswerPanel]),
        ("Mock interview", [MockScreen]),
        ("Mock interview report", [MockReportScreen]),
        ("Progress", [ProgressScreen]),
    ]


def section_for(screen: type[DOMNode] | None) -> tuple[str, list[type[DOMNode]]] | None:
    """The section of `screen` (a screen class), None for a screen without one."""
    for title, owners in sections():
        if screen is not None and owners and owners[0] is screen:
            return title, owners
    return None


class HelpScreen(ModalScreen[None]):
    """The keys of `screen` (the screen `?` was pressed on) and the global ones; Esc, q or
    ? closes it. Without a screen it lists every screen's keys."""

    DEFAULT_CSS = """
    HelpScreen {
        align: center middle;
        & > VerticalScroll {
            width: 76; max-width: 100%; height: 90%;
            border: thick $primary; border-title-color: $text-primary;
            background: $surface; padding: 0 1;
        }
        & Static { height: auto; }
        & .help-title { color: $text-primary; text-style: bold; margin-top: 1; }
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,question_mark", "close", "Close"),
        Binding("j,down", "scroll(1)", "Down", show=False),
        Binding("k,up", "scroll(-1)", "Up", show=False),
    ]

    def __init__(self, screen: type[DOMNode] | None = None) -> None:
        super().__init__()
        self.for_screen = screen

    def compose(self) -> ComposeResult:
        everywhere = sections()[0]
        own = section_for(self.for_screen)
        shown = [own, everywhere] if own else sections()
        with VerticalScroll(id="help-body"):
            yield Static(Content.assemble(
                ("Ctrl+P", "bold $text-accent"),
                (" finds any action of this screen, lesson or lab by name, with its key.",
                 "$text-muted")))
            for title, owners in shown:
                yield Static(title, classes="help-title")
                yield Static(self._keys(owners))

    def _keys(self, owners: list[type[DOMNode]]) -> Content:
        """The keys in two columns (one when the screen is narrow)."""
        entries: list[Content] = []
        seen: set[tuple[str, str]] = set()
        for owner in owners:
            for binding in _bindings(owner):
                keys = " ".join(self.app.get_key_display(Binding(key.strip(), ""))
                                for key in binding.key.split(","))
                if binding.key_display:
                    keys = binding.key_display
                label = binding.description or binding.action
                if (keys, label) in seen:
                    continue
                seen.add((keys, label))
                label = label if len(label) <= COLUMN_WIDTH - KEY_WIDTH else \
                    label[:COLUMN_WIDTH - KEY_WIDTH - 1] + "…"
                entries.append(Content.assemble(
                    (f"{keys:<{KEY_WIDTH - 1}} ", "bold $text-accent"),
                    f"{label:<{COLUMN_WIDTH - KEY_WIDTH}}"))
        columns = 2 if self.app.size.width >= 2 * COLUMN_WIDTH + 6 else 1
        rows = -(-len(entries) // columns)
        lines = [Content("").join(entries[row + rows * column]
                                  for column in range(columns)
                                  if row + rows * column < len(entries)).rstrip()
                 for row in range(rows)]
        return Content("\n").join(lines)

    def on_mount(self) -> None:
        own = section_for(self.for_screen)
        self.query_one("#help-body").border_title = f"Keys · {own[0]}" if own else "Keys"

    def action_scroll(self, step: int) -> None:
        body = self.query_one("#help-body")
        body.scroll_to(y=body.scroll_y + 2 * step, animate=False)

    def action_close(self) -> None:
        self.dismiss()

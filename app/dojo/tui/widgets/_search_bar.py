"""`SearchBar`: the `/` prompt at the bottom of a page, as in vim and less."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import Input


class SearchBar(Input):
    """Enter posts `SearchBar.Search`; Escape posts `SearchBar.Cancelled`. Hidden until
    `open()`; the screen hides it again when either message arrives."""

    DEFAULT_CSS = """
    SearchBar {
        dock: bottom;
        display: none;
        height: 1;
        border: none;
        padding: 0 1;
        background: $panel;
        &.-open { display: block; }
        &:focus { border: none; background-tint: transparent; }
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel search"),
    ]

    @dataclass
    class Search(Message):
        bar: SearchBar
        query: str

        @property
        def control(self) -> SearchBar:
            return self.bar

    @dataclass
    class Cancelled(Message):
        bar: SearchBar

        @property
        def control(self) -> SearchBar:
            return self.bar

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(placeholder="/ search this page · Enter finds · empty Enter clears · "
                                     "Esc cancels", id=id)

    def on_mount(self) -> None:
        self.cursor_blink = getattr(self.app, "cursor_blink", True)

    def open(self, text: str = "") -> None:
        self.value = text
        self.add_class("-open")
        self.focus()

    def close(self) -> None:
        self.remove_class("-open")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.post_message(self.Search(self, event.value))

    def action_cancel(self) -> None:
        self.post_message(self.Cancelled(self))

"""`SearchBar`: the `/` prompt at the bottom of a page, as in vim and less: it takes the place
of the page's status line while open, and every keystroke searches (incremental)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import Input


class SearchBar(Input):
    """Each change posts `SearchBar.Typed`, Enter `SearchBar.Search`, Escape
    `SearchBar.Cancelled`. Hidden until `open()`; the screen hides it again when Search or
    Cancelled arrives."""

    DEFAULT_CSS = """
    SearchBar {
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
    class Typed(Message):
        """The query changed (every keystroke)."""

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
        super().__init__(placeholder="search this page: matches light up as you type · Enter "
                                     "keeps them · Esc cancels", id=id)

    def on_mount(self) -> None:
        self.cursor_blink = getattr(self.app, "cursor_blink", True)

    def open(self, text: str = "") -> None:
        self.value = text
        self.add_class("-open")
        # focus now, not after the queue (focus() would): the keys typed right after `/`
        # are already on their way and must land here, not on the page's own bindings
        self.screen.set_focus(self)

    def close(self) -> None:
        self.remove_class("-open")

    @property
    def is_open(self) -> bool:
        return self.has_class("-open")

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        if self.is_open:
            self.post_message(self.Typed(self, event.value))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.post_message(self.Search(self, event.value))

    def action_cancel(self) -> None:
        self.post_message(self.Cancelled(self))

"""`ViewerScreen`: a full-screen document (the reference solution), closed with Esc."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import Header

from dojo.tui.document import Block
from dojo.tui.widgets import DocumentView, KeyFooter


class ViewerScreen(Screen[None]):
    """Reads like a lesson: j/k, g/G, Ctrl+D/U, ←/→ for wide code."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q,escape", "close", "Close"),
    ]

    def __init__(self, title: str, blocks: list[Block]) -> None:
        super().__init__()
        self.view_title = title
        self.blocks = blocks

    def compose(self) -> ComposeResult:
        yield Header()
        yield DocumentView(self.blocks, id="viewer-doc")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.title = self.view_title
        self.query_one(DocumentView).focus()

    def action_close(self) -> None:
        self.dismiss()

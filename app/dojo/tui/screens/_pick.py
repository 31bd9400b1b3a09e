"""`PickScreen`: choose one of a few names (a file to edit, a lab to open)."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option


class PickScreen(ModalScreen[str | None]):
    """Dismisses with the chosen name, or None for Esc."""

    DEFAULT_CSS = """
    PickScreen {
        align: center middle;
        & > Vertical {
            width: 50; max-width: 95%; height: auto; max-height: 90%;
            border: thick $primary; background: $surface; padding: 0 1;
        }
        & Static { margin: 0 0 1 0; text-style: bold; }
        & OptionList { height: auto; max-height: 16; border: none; }
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q", "cancel", "Cancel"),
        Binding("j", "down", show=False),
        Binding("k", "up", show=False),
    ]

    def __init__(self, title: str, names: tuple[str, ...]) -> None:
        super().__init__()
        self.prompt = title
        self.names = names

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Content(self.prompt))
            yield OptionList(*(Option(name, id=name) for name in self.names))

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def action_down(self) -> None:
        self.query_one(OptionList).action_cursor_down()

    def action_up(self) -> None:
        self.query_one(OptionList).action_cursor_up()

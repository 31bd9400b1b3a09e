"""`ConfirmScreen`: a yes/no question before something that cannot be undone."""

from __future__ import annotations

from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class ConfirmScreen(ModalScreen[bool]):
    """Dismisses with True for y / the confirm button, False for n / Esc."""

    DEFAULT_CSS = """
    ConfirmScreen {
        align: center middle;
        & > Vertical {
            width: 64; max-width: 95%; height: auto;
            border: thick $primary; background: $surface; padding: 1 2;
            &.-danger { border: thick $error; }
        }
        & #confirm-title { text-style: bold; color: $text-primary; }
        & .-danger #confirm-title { color: $text-error; }
        & #confirm-body { margin: 1 0; }
        & Horizontal { height: auto; align-horizontal: right; }
        & Button { margin-left: 2; }
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n,escape", "answer(False)", "No"),
    ]

    def __init__(self, title: str, body: str, *, confirm: str = "Yes",
                 danger: bool = True) -> None:
        super().__init__()
        self.question = title
        self.body = body
        self.confirm_label = confirm
        self.danger = danger

    def compose(self) -> ComposeResult:
        with Vertical(classes="-danger" if self.danger else ""):
            yield Static(Content(self.question), id="confirm-title")
            yield Static(Content(self.body), id="confirm-body")
            with Horizontal():
                yield Button("n Cancel", id="confirm-no", compact=True)
                yield Button(f"y {self.confirm_label}", id="confirm-yes",
                             variant="error" if self.danger else "primary", compact=True)

    def on_mount(self) -> None:
        # the safe answer has the focus when saying yes destroys something
        self.query_one("#confirm-no" if self.danger else "#confirm-yes", Button).focus()

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "confirm-yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)

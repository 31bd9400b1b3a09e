"""`GradeBar`: the four self-grades, with the one the score suggests marked."""

from __future__ import annotations

from dataclasses import dataclass

from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.message import Message
from textual.widgets import Button, Static

GRADES = ((1, "Again"), (2, "Hard"), (3, "Good"), (4, "Easy"))


class GradeBar(Horizontal):
    """Buttons 1 Again · 2 Hard · 3 Good · 4 Easy; posts `GradeBar.Graded(value)` (1–4).
    The screen binds the number keys; Enter on the focused button grades too."""

    DEFAULT_CSS = """
    GradeBar {
        height: 1;
        padding: 0 1;
        & > Static { width: auto; color: $text-muted; padding: 0 1 0 0; }
        & > Button { margin: 0 1 0 0; min-width: 11; }
        & > Button.-suggested { text-style: bold underline; }
    }
    """

    @dataclass
    class Graded(Message):
        bar: GradeBar
        value: int

        @property
        def control(self) -> GradeBar:
            return self.bar

    def compose(self) -> ComposeResult:
        yield Static("How did it go?")
        for value, label in GRADES:
            yield Button(f"{value} {label}", id=f"grade-{value}", compact=True,
                         variant="error" if value == 1 else "default")

    def intervals(self, labels: dict[int, str]) -> None:
        """Show when the card comes back after each grade, as Anki does: `3 Good · 3d`."""
        for value, label in GRADES:
            after = labels.get(value)
            self.query_one(f"#grade-{value}", Button).label = \
                f"{value} {label} · {after}" if after else f"{value} {label}"

    def suggest(self, value: int) -> None:
        """Mark and focus the suggested grade (Enter accepts it)."""
        for button in self.query(Button):
            button.set_class(button.id == f"grade-{value}", "-suggested")
        self.query_one(f"#grade-{value}", Button).focus()

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id and event.button.id.startswith("grade-"):
            self.post_message(self.Graded(self, int(event.button.id.removeprefix("grade-"))))


def short_interval(seconds: float) -> str:
    """`10m`, `5h`, `3d`, `2mo`: the gap until the next review, in a button's width."""
    minutes = max(1, round(seconds / 60))
    if minutes < 60:
        return f"{minutes}m"
    hours = round(seconds / 3600)
    if hours < 24:
        return f"{hours}h"
    days = round(seconds / 86400)
    return f"{days}d" if days < 60 else f"{round(days / 30)}mo"

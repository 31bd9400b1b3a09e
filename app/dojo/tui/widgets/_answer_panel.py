"""`AnswerPanel`: one question, the clock, and a text area for the answer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.message import Message
from textual.widgets import Button, Static, TextArea

from dojo.tui.widgets._countdown_clock import CountdownClock

if TYPE_CHECKING:
    from dojo.content import Card
    from dojo.quiz.timer import Countdown


class AnswerPanel(Vertical):
    """`ask()` shows a card and starts its countdown; Ctrl+S, the Submit button or the end
    of the countdown post `AnswerPanel.Answered` with what was typed."""

    DEFAULT_CSS = """
    AnswerPanel {
        height: 1fr;
        & > #answer-head { height: 1; background: $panel; }
        & > #answer-head > #answer-meta { width: 1fr; padding: 0 1; color: $text-muted; }
        & > #answer-question {
            height: auto; max-height: 9; padding: 0 1;
            border: round $primary; border-title-color: $text-primary;
            text-style: bold;
        }
        & > TextArea {
            height: 1fr; min-height: 3;
            border: round $foreground 30%; border-title-color: $text-muted;
            &:focus { border: round $accent; }
        }
        & > #answer-actions { height: 1; }
        & > #answer-actions > Button { margin: 0 1; }
        & > #answer-actions > #answer-hint { width: 1fr; color: $text-muted; }
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("ctrl+s", "submit", "Submit", priority=True),
    ]

    @dataclass
    class Answered(Message):
        panel: AnswerPanel
        card: Card
        text: str
        seconds_used: float
        timed_out: bool

        @property
        def control(self) -> AnswerPanel:
            return self.panel

    def __init__(self, *, cursor_blink: bool = True, id: str | None = None) -> None:
        super().__init__(id=id)
        self.cursor_blink = cursor_blink
        self.card: Card | None = None
        self.countdown: Countdown | None = None

    def compose(self) -> ComposeResult:
        with Horizontal(id="answer-head"):
            yield Static("", id="answer-meta")
            yield CountdownClock(id="answer-clock")
        yield Static("", id="answer-question")
        area = TextArea(id="answer-text", soft_wrap=True, tab_behavior="focus")
        area.cursor_blink = self.cursor_blink
        area.border_title = "Your answer — say it as you would out loud"
        yield area
        with Horizontal(id="answer-actions"):
            yield Button("Submit", id="answer-submit", variant="primary", compact=True)
            yield Static("ctrl+s submits · when time runs out, what you typed is scored",
                         id="answer-hint")

    def ask(self, card: Card, meta: Content | str, countdown: Countdown) -> None:
        """Show `card`'s question under `meta`, clear the answer, start the clock."""
        self.card, self.countdown = card, countdown
        self.query_one("#answer-meta", Static).update(meta)
        question = self.query_one("#answer-question", Static)
        question.update(Content(card.question))
        question.border_title = "Question"
        area = self.query_one(TextArea)
        area.text = ""
        area.read_only = False
        area.focus()
        self.query_one(CountdownClock).start(countdown)

    def set_aloud(self, aloud: bool) -> None:
        """Aloud: nothing is typed; the clock runs while the learner speaks, and Ctrl+S (or
        the end of the clock) brings the checklist."""
        area = self.query_one(TextArea)
        area.read_only = aloud
        area.border_title = ("Say it out loud now — ctrl+s when you are done" if aloud
                             else "Your answer — say it as you would out loud")
        if aloud:
            area.text = ""

    def stop(self) -> None:
        """Stop the clock without answering (the round ends early)."""
        self.query_one(CountdownClock).stop()

    @property
    def text(self) -> str:
        return self.query_one(TextArea).text

    def action_submit(self) -> None:
        self._answer(timed_out=False)

    @on(Button.Pressed, "#answer-submit")
    def _pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self._answer(timed_out=False)

    @on(CountdownClock.Expired)
    def _expired(self, event: CountdownClock.Expired) -> None:
        event.stop()
        self._answer(timed_out=True)

    def _answer(self, timed_out: bool) -> None:
        clock = self.query_one(CountdownClock)
        if self.card is None or self.countdown is None or (not clock.running and not timed_out):
            return
        clock.stop()
        self.query_one(TextArea).read_only = True
        used = min(self.countdown.elapsed(), self.countdown.seconds)
        self.post_message(self.Answered(self, self.card, self.text, used, timed_out))

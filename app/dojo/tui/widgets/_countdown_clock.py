"""`CountdownClock`: the 60-second clock of a quiz answer, ticking on screen."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from textual.content import Content
from textual.message import Message
from textual.widgets import Static

from dojo.tui.widgets._meter import meter

if TYPE_CHECKING:
    from dojo.quiz.timer import Countdown

TICK_SECONDS = 0.2
HURRY_SECONDS = 15


class CountdownClock(Static):
    """Shows `42s ██████░░░░` for the countdown it is given; posts `Expired` once when the
    time is up. `stop()` freezes it (the answer was submitted)."""

    DEFAULT_CSS = """
    CountdownClock {
        width: auto;
        height: 1;
        padding: 0 1;
        color: $text-success;
        &.-hurry { color: $text-warning; text-style: bold; }
        &.-expired { color: $text-error; text-style: bold; }
    }
    """

    @dataclass
    class Expired(Message):
        clock: CountdownClock

        @property
        def control(self) -> CountdownClock:
            return self.clock

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.countdown: Countdown | None = None
        self._ticking = False
        self._expired_posted = False

    def on_mount(self) -> None:
        self.set_interval(TICK_SECONDS, self._tick)

    def start(self, countdown: Countdown) -> None:
        self.countdown = countdown
        self._ticking = True
        self._expired_posted = False
        self._tick()

    def stop(self) -> None:
        self._ticking = False

    @property
    def running(self) -> bool:
        return self._ticking

    def _tick(self) -> None:
        countdown = self.countdown
        if countdown is None or not self._ticking:
            return
        remaining = countdown.remaining()
        self.set_class(remaining <= HURRY_SECONDS and remaining > 0, "-hurry")
        self.set_class(countdown.expired, "-expired")
        bar = meter(remaining / countdown.seconds if countdown.seconds else 0, 10,
                    style="$text-warning" if remaining <= HURRY_SECONDS else "$text-success")
        # whole seconds, rounded up like the engine's label, without its ⏱ (some terminals
        # draw that glyph two cells wide and shift the line)
        self.update(Content.assemble(f"{math.ceil(remaining):>2}s ", bar))
        if countdown.expired and not self._expired_posted:
            self._expired_posted = True
            self._ticking = False
            self.post_message(self.Expired(self))

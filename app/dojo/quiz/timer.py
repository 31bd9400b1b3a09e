"""The 60-second clock of a quiz round, as plain code the CLI and the TUI both drive."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Countdown:
    """A countdown that starts when created. `clock` is injectable so tests need no sleeps."""

    seconds: float = 60.0
    clock: Callable[[], float] = time.monotonic
    started_at: float = field(init=False)

    def __post_init__(self) -> None:
        self.started_at = self.clock()

    @property
    def deadline(self) -> float:
        """The clock reading at which time is up."""
        return self.started_at + self.seconds

    def elapsed(self) -> float:
        return self.clock() - self.started_at

    def remaining(self) -> float:
        """Seconds left, never below zero."""
        return max(0.0, self.deadline - self.clock())

    @property
    def expired(self) -> bool:
        return self.remaining() <= 0.0

    def label(self) -> str:
        """`⏱ 42s`: whole seconds left, rounded up so 0s only shows when time is up."""
        return f"⏱ {math.ceil(self.remaining())}s"

"""A clock the check controls: real time, plus every second slept or skipped.

Learner code that takes its time from a clock argument (a backoff, a TTL, an open circuit)
can then be checked without waiting: `sleep(4)` returns at once and the clock reads 4 s
later; `advance(60)` jumps past a timeout. Durations between two readings stay real, so a
check still sees the time the code itself spent.

    clock = InstantClock()
    clock()            # an aware UTC datetime (money lab: `clock()` is "now")
    clock.now()        # seconds since the epoch (DLQ lab: `clock.now()`)
    clock.monotonic()  # for durations and deadlines
    clock.sleep(4.0)   # instant, recorded in clock.sleeps
    clock.advance(31)  # the check moves time on
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

YIELD_SECONDS = 0.0005  # a real sleep lets other threads run; so does an instant one


class InstantClock:
    """Real time plus a skip that grows with every `sleep()` and `advance()`.

    Attributes:
        sleeps: (monotonic reading when the sleep started, seconds asked) for every sleep().
    """

    def __init__(self) -> None:
        self._skipped = 0.0
        self._lock = threading.Lock()
        self.sleeps: list[tuple[float, float]] = []

    def __call__(self) -> datetime:
        """Now, as an aware UTC datetime."""
        return datetime.now(UTC) + timedelta(seconds=self._skipped)

    def now(self) -> float:
        """Now, in seconds since the epoch."""
        return time.time() + self._skipped

    def monotonic(self) -> float:
        """A reading for durations: never goes back, jumps with every sleep and advance."""
        return time.monotonic() + self._skipped

    def sleep(self, seconds: float) -> None:
        """Return at once, with the clock `seconds` later (negative counts as 0)."""
        seconds = max(0.0, float(seconds))
        with self._lock:
            self.sleeps.append((self.monotonic(), seconds))
            self._skipped += seconds
        time.sleep(YIELD_SECONDS)

    def advance(self, seconds: float) -> None:
        """Move the clock `seconds` on, as if that much time passed (not recorded as a
        sleep)."""
        with self._lock:
            self._skipped += float(seconds)

    @property
    def skipped(self) -> float:
        """Seconds added so far by sleeps and advances."""
        return self._skipped


@contextmanager
def machine_time_zone(tz: str) -> Iterator[None]:
    """Run the block with this process's local time zone set to `tz` (a POSIX TZ string such
    as "<+0545>-05:45"): code that turns a time into "local" time (datetime.astimezone()
    without a zone, time.localtime) gets that zone, far from UTC, not the machine's."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = tz
    time.tzset()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = before
        time.tzset()

"""A circuit breaker for the exchange-rate provider: CLOSED, OPEN, HALF_OPEN.

CLOSED counts the outcome of the last `window_size` calls; once at least `minimum_calls`
are in the window and the failure rate or the slow-call rate reaches its threshold, it
OPENs. OPEN refuses every call at once with CircuitOpen (nothing is sent) until
`open_seconds` have passed on the clock; then HALF_OPEN lets `half_open_calls` probes
through (and refuses the rest): all succeed, it CLOSEs with an empty window; one fails or
is slow, it OPENs again.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

T = TypeVar("T")

CLOSED, OPEN, HALF_OPEN = "CLOSED", "OPEN", "HALF_OPEN"


class CircuitOpen(Exception):
    """The breaker is open: the call was not made (so it certainly did not execute)."""


@dataclass(frozen=True)
class BreakerConfig:
    """The thresholds. Percentages are 0-100.

    slow_call_seconds is set from the provider client's timeout (2 s), not left at
    Resilience4j's 60 s default: a call that took 1.5 s is already a sign of trouble, and
    one that would take 60 s has long been cut by the timeout (and counted as a failure).
    """

    window_size: int = 20
    minimum_calls: int = 10
    failure_rate_threshold: float = 50.0
    slow_call_seconds: float = 1.5
    slow_call_rate_threshold: float = 50.0
    open_seconds: float = 30.0
    half_open_calls: int = 3


class CircuitBreaker:
    """Thread-safe: one breaker guards every call to one provider."""

    def __init__(self, config: BreakerConfig, clock: Callable[[], datetime]) -> None:
        self.config = config
        self.clock = clock
        self._lock = threading.Lock()
        self._state = CLOSED
        self._window: deque[tuple[bool, bool]] = deque(maxlen=config.window_size)
        self._opened_at: datetime | None = None
        self._probes_started = 0
        self._probes_ok = 0
        self._half_opened = 0  # which half-open period a probe was admitted in

    @property
    def state(self) -> str:
        """CLOSED, OPEN or HALF_OPEN (an OPEN breaker whose wait is over reads HALF_OPEN)."""
        with self._lock:
            self._maybe_half_open()
            return self._state

    def _maybe_half_open(self) -> None:
        if self._state == OPEN and self._opened_at is not None and (
                (self.clock() - self._opened_at).total_seconds() >= self.config.open_seconds):
            self._state = HALF_OPEN
            self._probes_started = self._probes_ok = 0
            self._half_opened += 1

    def _open(self) -> None:
        self._state = OPEN
        self._opened_at = self.clock()
        self._window.clear()

    def _admit(self) -> tuple[str, int]:
        with self._lock:
            self._maybe_half_open()
            if self._state == OPEN:
                raise CircuitOpen("the provider's circuit is open: not calling it "
                                  f"(retry after {self.config.open_seconds:g} s)")
            if self._state == HALF_OPEN:
                if self._probes_started >= self.config.half_open_calls:
                    raise CircuitOpen("the provider's circuit is half-open and its probes "
                                      "are taken: not calling it")
                self._probes_started += 1
            return self._state, self._half_opened

    def _record(self, admitted: tuple[str, int], failed: bool, slow: bool) -> None:
        admitted_as, period = admitted
        with self._lock:
            if admitted_as == HALF_OPEN:
                if self._state != HALF_OPEN or period != self._half_opened:
                    return  # another probe already decided (this period or an earlier one)
                if failed or slow:
                    self._open()
                    return
                self._probes_ok += 1
                if self._probes_ok >= self.config.half_open_calls:
                    self._state = CLOSED
                    self._window.clear()
                return
            if self._state != CLOSED:
                return
            self._window.append((failed, slow))
            calls = len(self._window)
            if calls < self.config.minimum_calls:
                return
            failures = sum(1 for f, _ in self._window if f)
            slows = sum(1 for _, s in self._window if s)
            if (failures * 100 >= self.config.failure_rate_threshold * calls
                    or slows * 100 >= self.config.slow_call_rate_threshold * calls):
                self._open()

    def call(self, fn: Callable[[], T]) -> T:
        """Run `fn()` through the breaker; an exception from it counts as a failure and is
        raised again. Raises CircuitOpen, without calling `fn`, when the circuit is open."""
        admitted = self._admit()
        started = time.monotonic()
        try:
            result = fn()
        except BaseException:
            self._record(admitted, failed=True,
                         slow=time.monotonic() - started >= self.config.slow_call_seconds)
            raise
        self._record(admitted, failed=False,
                     slow=time.monotonic() - started >= self.config.slow_call_seconds)
        return result

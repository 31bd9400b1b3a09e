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
from fractions import Fraction
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
    """Thread-safe. The state is derived lazily from (phase, opened_at); half-open probes are
    tickets of one generation, and only results of the current generation count."""

    def __init__(self, config: BreakerConfig, clock: Callable[[], datetime]) -> None:
        self.config = config
        self.clock = clock
        self._mutex = threading.Condition()
        self._phase = CLOSED
        self._results: list[tuple[bool, bool]] = []
        self._opened_at: datetime | None = None
        self._generation = 0
        self._tickets = 0
        self._passed = 0

    def _refresh(self) -> None:
        if self._phase == OPEN:
            waited = (self.clock() - self._opened_at).total_seconds()
            if waited >= self.config.open_seconds:
                self._phase = HALF_OPEN
                self._generation += 1
                self._tickets = self.config.half_open_calls
                self._passed = 0

    @property
    def state(self) -> str:
        with self._mutex:
            self._refresh()
            return self._phase

    def _trip(self) -> None:
        self._phase = OPEN
        self._opened_at = self.clock()
        self._results = []

    def _enter(self) -> int | None:
        """None for a closed-state call, else the generation of the half-open ticket."""
        with self._mutex:
            self._refresh()
            if self._phase == CLOSED:
                return None
            if self._phase == HALF_OPEN and self._tickets > 0:
                self._tickets -= 1
                return self._generation
            raise CircuitOpen(f"circuit {self._phase.lower()}: the provider is not called")

    def _leave(self, ticket: int | None, bad: bool, failed: bool, slow: bool) -> None:
        with self._mutex:
            if ticket is not None:
                if self._phase != HALF_OPEN or ticket != self._generation:
                    return
                if bad:
                    self._trip()
                else:
                    self._passed += 1
                    if self._passed == self.config.half_open_calls:
                        self._phase = CLOSED
                        self._results = []
                return
            if self._phase != CLOSED:
                return
            self._results.append((failed, slow))
            del self._results[:-self.config.window_size]
            n = len(self._results)
            if n < self.config.minimum_calls:
                return
            fail_pct = Fraction(sum(f for f, _ in self._results) * 100, n)
            slow_pct = Fraction(sum(s for _, s in self._results) * 100, n)
            if (fail_pct >= Fraction(str(self.config.failure_rate_threshold))
                    or slow_pct >= Fraction(str(self.config.slow_call_rate_threshold))):
                self._trip()

    def call(self, fn: Callable[[], T]) -> T:
        ticket = self._enter()
        t0 = time.perf_counter()
        failed = True
        try:
            result = fn()
            failed = False
            return result
        finally:
            slow = time.perf_counter() - t0 >= self.config.slow_call_seconds
            self._leave(ticket, failed or slow, failed, slow)

"""A circuit breaker for the exchange-rate provider: CLOSED, OPEN, HALF_OPEN.

CLOSED counts the outcome of the last `window_size` calls; once at least `minimum_calls`
are in the window and the failure rate or the slow-call rate reaches (>=) its threshold, it
OPENs. OPEN refuses every call at once with CircuitOpen (nothing is sent) until
`open_seconds` have passed on the clock; then HALF_OPEN lets `half_open_calls` probes
through (and refuses the rest): all succeed, it CLOSEs with an empty window; one fails or
is slow, it OPENs again.

Calls come from many threads at once: guard the state with a threading.Lock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

T = TypeVar("T")


class CircuitOpen(Exception):
    """The breaker is open: the call was not made (so it certainly did not execute)."""


@dataclass(frozen=True)
class BreakerConfig:
    """The thresholds. Percentages are 0-100; a call is slow when it takes at least
    slow_call_seconds."""

    window_size: int = 20
    minimum_calls: int = 10
    failure_rate_threshold: float = 50.0
    # Resilience4j's default is 60 s. Set it deliberately for this provider: see the README,
    # stage circuit-breaker.
    slow_call_seconds: float = 60.0
    slow_call_rate_threshold: float = 50.0
    open_seconds: float = 30.0
    half_open_calls: int = 3


class CircuitBreaker:
    """One breaker guards every call to one provider; `clock()` returns the time now (an
    aware datetime), and is what open_seconds is measured on."""

    def __init__(self, config: BreakerConfig, clock: Callable[[], datetime]) -> None:
        self.config = config
        self.clock = clock

    @property
    def state(self) -> str:
        """CLOSED, OPEN or HALF_OPEN."""
        raise NotImplementedError("return the current state as one of the three strings")

    def call(self, fn: Callable[[], T]) -> T:
        """Run `fn()` through the breaker; an exception from it counts as a failure and is
        raised again. Raises CircuitOpen, without calling `fn`, when the circuit is open."""
        raise NotImplementedError(
            "admit the call (or raise CircuitOpen), time fn() with time.monotonic(), record "
            "(failed, slow) in a deque(maxlen=window_size), and open, half-open or close")

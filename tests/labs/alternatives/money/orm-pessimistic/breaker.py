"""Circuit breaker: CLOSED / OPEN / HALF_OPEN.

The closed state judges the outcomes of the last `window_size` calls (a bounded deque) once
there are at least `minimum_calls`; the half-open state hands out its `half_open_calls`
probes through a non-blocking semaphore created when the wait is over. Times: the injected
clock for the open period, time.monotonic() for a call's duration."""

from __future__ import annotations

import threading
import time
from collections import deque
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
    slow_call_seconds (set under the FX client's 2 s timeout: a slow call must be seen as
    slow before the timeout turns it into a failure)."""

    window_size: int = 20
    minimum_calls: int = 10
    failure_rate_threshold: float = 50.0
    slow_call_seconds: float = 1.2
    slow_call_rate_threshold: float = 50.0
    open_seconds: float = 30.0
    half_open_calls: int = 3


class CircuitBreaker:
    """One breaker guards every call to one provider; `clock()` returns the time now (an
    aware datetime), and is what open_seconds is measured on."""

    def __init__(self, config: BreakerConfig, clock: Callable[[], datetime]) -> None:
        self.config = config
        self.clock = clock
        self._guard = threading.RLock()
        self._state = "CLOSED"
        self._outcomes: deque[str] = deque(maxlen=config.window_size)  # 'ok' 'fail' 'slow' 'slowfail'
        self._opened_at: datetime | None = None
        self._probes: threading.Semaphore | None = None
        self._probe_successes = 0
        self._epoch = 0

    @property
    def state(self) -> str:
        """CLOSED, OPEN or HALF_OPEN."""
        with self._guard:
            if self._state == "OPEN" and self._opened_at is not None and \
                    (self.clock() - self._opened_at).total_seconds() >= self.config.open_seconds:
                self._state = "HALF_OPEN"
                self._probes = threading.Semaphore(self.config.half_open_calls)
                self._probe_successes = 0
                self._epoch += 1
            return self._state

    def _trip(self) -> None:
        self._state = "OPEN"
        self._opened_at = self.clock()
        self._outcomes.clear()
        self._probes = None
        self._epoch += 1

    def call(self, fn: Callable[[], T]) -> T:
        """Run `fn()` through the breaker; an exception from it counts as a failure and is
        raised again. Raises CircuitOpen, without calling `fn`, when the circuit is open."""
        with self._guard:
            state = self.state
            if state == "OPEN":
                raise CircuitOpen("the circuit is open")
            if state == "HALF_OPEN":
                assert self._probes is not None
                if not self._probes.acquire(blocking=False):
                    raise CircuitOpen("the circuit is half-open and all probes are out")
            epoch = self._epoch
        t0 = time.monotonic()
        try:
            value = fn()
        except BaseException:
            self._judge(epoch, state, failed=True, elapsed=time.monotonic() - t0)
            raise
        self._judge(epoch, state, failed=False, elapsed=time.monotonic() - t0)
        return value

    def _judge(self, epoch: int, admitted: str, *, failed: bool, elapsed: float) -> None:
        slow = elapsed >= self.config.slow_call_seconds
        with self._guard:
            if epoch != self._epoch:
                return  # admitted under a state that is gone
            if admitted == "HALF_OPEN":
                if failed or slow:
                    self._trip()
                    return
                self._probe_successes += 1
                if self._probe_successes >= self.config.half_open_calls:
                    self._state = "CLOSED"
                    self._outcomes.clear()
                    self._epoch += 1
                return
            self._outcomes.append(("fail" if failed else "ok") + ("+slow" if slow else ""))
            n = len(self._outcomes)
            if n < self.config.minimum_calls:
                return
            fails = sum(o.startswith("fail") for o in self._outcomes)
            slows = sum(o.endswith("+slow") for o in self._outcomes)
            if fails / n * 100 >= self.config.failure_rate_threshold or \
                    slows / n * 100 >= self.config.slow_call_rate_threshold:
                self._trip()

"""A count-based circuit breaker in the style of Resilience4j's fixed-size sliding window:
a ring buffer of the last `window_size` outcomes with running totals, so recording a call
is O(1). CLOSED -> OPEN when, with at least `minimum_calls` recorded, the failure rate or the
slow-call rate reaches its threshold; OPEN refuses everything until `open_seconds` have
passed on the injected clock; HALF_OPEN hands out `half_open_calls` permits, closes when all
of them succeeded (fast), and reopens at the first failed or slow probe."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeVar

T = TypeVar("T")


class CircuitOpen(Exception):
    """The breaker is open: the call was not made (so it certainly did not execute)."""


@dataclass(frozen=True)
class BreakerConfig:
    """Percentages are 0-100; a call is slow when it takes at least slow_call_seconds. The
    slow threshold sits well under the client's 2 s timeout: a call that needs 1 s from a
    provider that usually answers in milliseconds is a symptom."""

    window_size: int = 20
    minimum_calls: int = 10
    failure_rate_threshold: float = 50.0
    slow_call_seconds: float = 1.0
    slow_call_rate_threshold: float = 50.0
    open_seconds: float = 30.0
    half_open_calls: int = 3


class _Ring:
    def __init__(self, size: int) -> None:
        self.slots: list[tuple[bool, bool] | None] = [None] * size
        self.next = 0
        self.calls = self.failures = self.slow = 0

    def add(self, failed: bool, slow: bool) -> None:
        old = self.slots[self.next]
        if old is not None:
            self.calls -= 1
            self.failures -= old[0]
            self.slow -= old[1]
        self.slots[self.next] = (failed, slow)
        self.next = (self.next + 1) % len(self.slots)
        self.calls += 1
        self.failures += failed
        self.slow += slow


class CircuitBreaker:
    """One breaker guards every call to one provider; `clock()` returns the time now (an
    aware datetime), and is what open_seconds is measured on."""

    def __init__(self, config: BreakerConfig, clock: Callable[[], datetime]) -> None:
        self.config = config
        self.clock = clock
        self._mutex = threading.Lock()
        self._name = "CLOSED"
        self._ring = _Ring(config.window_size)
        self._open_until: datetime | None = None
        self._permits = 0
        self._successes = 0
        self._generation = 0  # bumps on every transition: stale results are ignored

    def _transition(self, name: str) -> None:
        self._name = name
        self._generation += 1
        if name == "OPEN":
            self._open_until = self.clock() + timedelta(seconds=self.config.open_seconds)
        elif name == "HALF_OPEN":
            self._permits = self.config.half_open_calls
            self._successes = 0
        else:
            self._ring = _Ring(self.config.window_size)

    def _refresh(self) -> None:
        if self._name == "OPEN" and self._open_until is not None and self.clock() >= self._open_until:
            self._transition("HALF_OPEN")

    @property
    def state(self) -> str:
        """CLOSED, OPEN or HALF_OPEN."""
        with self._mutex:
            self._refresh()
            return self._name

    def call(self, fn: Callable[[], T]) -> T:
        """Run `fn()` through the breaker; an exception from it counts as a failure and is
        raised again. Raises CircuitOpen, without calling `fn`, when the circuit is open."""
        with self._mutex:
            self._refresh()
            if self._name == "OPEN":
                raise CircuitOpen("circuit open: the provider is not called")
            if self._name == "HALF_OPEN":
                if self._permits == 0:
                    raise CircuitOpen("circuit half-open: every probe permit is in use")
                self._permits -= 1
            generation, admitted = self._generation, self._name
        began = time.perf_counter()
        failed = True
        try:
            result = fn()
            failed = False
            return result
        finally:
            slow = time.perf_counter() - began >= self.config.slow_call_seconds
            self._on_result(generation, admitted, failed, slow)

    def _on_result(self, generation: int, admitted: str, failed: bool, slow: bool) -> None:
        with self._mutex:
            if generation != self._generation:
                return  # the state changed while this call ran
            if admitted == "HALF_OPEN":
                if failed or slow:
                    self._transition("OPEN")
                else:
                    self._successes += 1
                    if self._successes == self.config.half_open_calls:
                        self._transition("CLOSED")
                return
            ring = self._ring
            ring.add(failed, slow)
            if ring.calls >= self.config.minimum_calls and (
                    100 * ring.failures >= self.config.failure_rate_threshold * ring.calls
                    or 100 * ring.slow >= self.config.slow_call_rate_threshold * ring.calls):
                self._transition("OPEN")

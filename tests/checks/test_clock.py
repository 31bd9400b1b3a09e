"""InstantClock: sleeps cost no real time but move the clock; advances jump it; real time
still passes underneath."""

from __future__ import annotations

import time
from datetime import UTC, timedelta

from dojo.checks import InstantClock


def test_a_sleep_returns_at_once_and_moves_every_reading_on() -> None:
    clock = InstantClock()
    wall, mono, now = clock.now(), clock.monotonic(), clock()
    started = time.monotonic()
    clock.sleep(4.0)
    assert time.monotonic() - started < 0.5
    assert clock.now() - wall >= 4.0
    assert clock.monotonic() - mono >= 4.0
    assert clock() - now >= timedelta(seconds=4)
    assert clock.skipped == 4.0


def test_sleeps_are_recorded_and_a_negative_one_counts_as_zero() -> None:
    clock = InstantClock()
    clock.sleep(1.5)
    clock.sleep(-2)
    assert [seconds for _, seconds in clock.sleeps] == [1.5, 0.0]
    assert clock.skipped == 1.5


def test_advance_jumps_without_recording_a_sleep() -> None:
    clock = InstantClock()
    clock.advance(60)
    assert clock.sleeps == [] and clock.skipped == 60
    assert clock().tzinfo is UTC


def test_real_time_still_passes() -> None:
    clock = InstantClock()
    before = clock.monotonic()
    time.sleep(0.05)
    assert clock.monotonic() - before >= 0.05

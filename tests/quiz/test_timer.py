"""Countdown: the 60 seconds of a round, on an injectable clock."""

from __future__ import annotations

from dojo.quiz import Countdown


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_fresh_countdown_has_all_its_seconds_left() -> None:
    clock = FakeClock()
    countdown = Countdown(60, clock)
    assert countdown.remaining() == 60 and countdown.deadline == 1060
    assert countdown.label() == "⏱ 60s"


def test_the_label_rounds_up_so_zero_means_time_is_up() -> None:
    clock = FakeClock()
    countdown = Countdown(60, clock)
    clock.now += 59.2
    assert countdown.label() == "⏱ 1s" and not countdown.expired
    clock.now += 0.8
    assert countdown.label() == "⏱ 0s" and countdown.expired


def test_remaining_never_goes_below_zero() -> None:
    clock = FakeClock()
    countdown = Countdown(60, clock)
    clock.now += 75
    assert countdown.remaining() == 0.0 and countdown.elapsed() == 75

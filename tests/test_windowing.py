"""The renewal window: additive increase, multiplicative decrease on 429s, a floor where the
server's Retry-After is honoured instead."""

from __future__ import annotations

import pytest

from operators.engine.windowing import DECREASE, FLOOR, Window


def test_it_starts_at_its_ceiling_and_a_burst_of_429s_cuts_it_once() -> None:
    window = Window(384)
    assert window.allowed(0.0) == 384
    sent = window.epoch
    for _ in range(100):  # everything sent into the old window answered 429 together
        window.throttled(sent, now=1.0, retry_after=1.0)
    assert window.limit == int(384 * DECREASE)
    assert window.throttled_total == 100
    window.throttled(window.epoch, now=1.5, retry_after=1.0)  # sent into the new one
    assert window.limit == int(384 * DECREASE * DECREASE)


def test_at_the_floor_it_waits_out_retry_after_instead() -> None:
    window = Window(384)
    while window.size > window.floor:
        window.throttled(window.epoch, now=0.0, retry_after=1.0)
    assert window.limit == FLOOR
    assert window.allowed(0.0) == FLOOR
    window.throttled(window.epoch, now=10.0, retry_after=2.0)
    assert window.limit == FLOOR
    assert window.allowed(11.9) == 0
    assert window.allowed(12.0) == FLOOR


def test_it_grows_by_one_a_round_trip_while_in_use_and_not_past_its_ceiling() -> None:
    window = Window(64)
    window.throttled(window.epoch, now=0.0, retry_after=1.0)
    size = window.limit
    for _ in range(size):  # a window's worth of successes: one round trip
        window.succeeded(in_flight=size)
    assert window.limit == size + 1
    for _ in range(10_000):
        window.succeeded(in_flight=64)
    assert window.limit == 64


def test_an_idle_window_does_not_grow() -> None:
    window = Window(64)
    window.throttled(window.epoch, now=0.0, retry_after=1.0)
    size = window.limit
    for _ in range(1000):
        window.succeeded(in_flight=size // 2 - 1)
    assert window.limit == size


def test_a_ceiling_below_the_floor_is_both() -> None:
    window = Window(4)
    window.throttled(window.epoch, now=0.0, retry_after=1.0)
    assert window.limit == 4
    assert window.allowed(0.5) == 0
    with pytest.raises(ValueError, match="ceiling must be 1 or more, not 0"):
        Window(0)

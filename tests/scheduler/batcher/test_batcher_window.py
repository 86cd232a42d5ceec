"""The batcher's wait window (scheduler/batcher/window.py): pure policy, no processes."""

from __future__ import annotations

import math

import pytest

from scheduler.batcher.window import ArrivalRate, window_ms

DEFAULTS = {"base_ms": 50.0, "min_ms": 5.0, "max_ms": 100.0}


def test_low_traffic_waits_the_minimum() -> None:
    """Fewer than one more task expected in the default window: no one to wait for."""
    assert window_ms(0.0, 63, **DEFAULTS) == 5.0
    assert window_ms(19.0, 63, **DEFAULTS) == 5.0  # 19/s · 50 ms < 1


def test_under_load_the_window_is_the_time_to_fill_the_batch() -> None:
    assert window_ms(1000.0, 63, **DEFAULTS) == pytest.approx(63.0)
    assert window_ms(2000.0, 63, **DEFAULTS) == pytest.approx(31.5)


def test_the_fill_time_is_bounded_below_by_the_minimum() -> None:
    assert window_ms(100_000.0, 10, **DEFAULTS) == 5.0
    assert window_ms(math.inf, 10, **DEFAULTS) == 5.0


def test_a_batch_that_cannot_fill_within_the_maximum_waits_the_default() -> None:
    """200/s fills 63 slots in 315 ms, past the 100 ms bound: the default window instead."""
    assert window_ms(200.0, 63, **DEFAULTS) == 50.0


def test_the_window_never_exceeds_the_maximum() -> None:
    for rate in (0.0, 1.0, 20.0, 50.0, 640.0, 650.0, 5000.0):
        for free in (1, 10, 63):
            assert 0.0 <= window_ms(rate, free, **DEFAULTS) <= 100.0


def test_a_full_batch_has_no_window() -> None:
    assert window_ms(1000.0, 0, **DEFAULTS) == 0.0


def test_the_rate_is_the_inverse_of_the_average_gap() -> None:
    rate = ArrivalRate(alpha=0.5)
    assert rate.per_second() == 0.0
    for at in range(0, 100, 10):  # one task every 10 ms
        rate.arrived(float(at))
    assert rate.per_second() == pytest.approx(100.0)


def test_the_rate_follows_a_change_in_traffic() -> None:
    rate = ArrivalRate(alpha=0.2)
    at = 0.0
    for _ in range(50):
        at += 100.0  # 10/s
        rate.arrived(at)
    assert rate.per_second() == pytest.approx(10.0)
    for _ in range(50):
        at += 1.0  # 1000/s
        rate.arrived(at)
    assert rate.per_second() > 900.0


def test_silence_decays_the_rate() -> None:
    rate = ArrivalRate(alpha=0.2)
    for at in range(0, 100, 1):
        rate.arrived(float(at))
    busy = rate.per_second(now_ms=99.0)
    assert rate.per_second(now_ms=10_099.0) < busy / 10


def test_simultaneous_and_out_of_order_arrivals_count_as_a_burst() -> None:
    rate = ArrivalRate(alpha=0.5)
    for at in (100.0, 100.0, 90.0, 100.0):
        rate.arrived(at)
    assert rate.per_second() == math.inf


def test_alpha_must_be_a_weight() -> None:
    with pytest.raises(ValueError, match="alpha"):
        ArrivalRate(alpha=0.0)

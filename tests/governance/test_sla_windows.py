"""Processing windows become UTC intervals, across midnight, weekends and daylight saving."""

from __future__ import annotations

from datetime import UTC, datetime
from itertools import islice

import pytest

from governance.sla_windows import (
    WindowError,
    open_intervals,
    open_seconds_between,
    parse_windows,
    zone,
)

NIGHTS_AND_WEEKENDS = parse_windows(
    [
        {"days": ["mon", "tue", "wed", "thu", "fri"], "start": "20:00", "end": "06:00"},
        {"days": ["sat", "sun"], "start": "00:00", "end": "00:00"},
    ]
)


def utc(year: int, month: int, day: int, hour: int = 0) -> datetime:
    return datetime(year, month, day, hour, tzinfo=UTC)


def test_friday_night_runs_into_the_weekend_as_one_span() -> None:
    spans = list(
        islice(open_intervals(NIGHTS_AND_WEEKENDS, zone("Europe/Zurich"), utc(2026, 11, 27, 12)), 2)
    )
    # Zurich is UTC+1 in winter: Friday 20:00 → Monday 00:00 local, then Monday night.
    assert spans == [
        (utc(2026, 11, 27, 19), utc(2026, 11, 29, 23)),
        (utc(2026, 11, 30, 19), utc(2026, 12, 1, 5)),
    ]


def test_a_span_already_open_is_clipped_to_now() -> None:
    first = next(open_intervals(NIGHTS_AND_WEEKENDS, zone("UTC"), utc(2026, 11, 24, 3)))
    assert first == (utc(2026, 11, 24, 3), utc(2026, 11, 24, 6))


def test_daylight_saving_shortens_the_night_it_falls_in() -> None:
    nightly = parse_windows([{"days": ["sat"], "start": "22:00", "end": "06:00"}])
    # Europe/Zurich springs forward at 02:00 on 2026-03-29 (a Sunday): 7 hours, not 8.
    hours = (
        open_seconds_between(nightly, zone("Europe/Zurich"), utc(2026, 3, 28), utc(2026, 3, 30))
        / 3600
    )
    assert hours == 7


def test_no_windows_means_any_time() -> None:
    begin, end = next(open_intervals((), zone("UTC"), utc(2026, 1, 1)))
    assert begin == utc(2026, 1, 1)
    assert end.year == 9999


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"days": ["mon"]}, "must be a list"),
        ([{"days": [], "start": "20:00", "end": "06:00"}], "non-empty list"),
        ([{"days": ["monday"], "start": "20:00", "end": "06:00"}], "unknown day"),
        ([{"days": ["mon"], "start": "8pm", "end": "06:00"}], "not a time"),
        (
            [{"days": ["mon"], "start": "20:00", "end": "06:00", "tz": "UTC"}],
            "days, start and end only",
        ),
    ],
)
def test_malformed_windows_are_refused_with_a_reason(raw: object, message: str) -> None:
    with pytest.raises(WindowError, match=message):
        parse_windows(raw)


def test_an_unknown_time_zone_is_refused() -> None:
    with pytest.raises(WindowError, match="not a time zone"):
        zone("Mars/Olympus_Mons")

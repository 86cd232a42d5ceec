"""Processing windows: when an SLA class's batch work may run (docs/files.md).

A window is a weekly recurring span in a time zone — ``{"days": ["mon", "tue"], "start":
"20:00", "end": "06:00"}`` runs from 20:00 on each named day to 06:00 the next morning (an
``end`` at or before ``start`` crosses midnight; ``"00:00"``–``"00:00"`` is the whole day).
An SLA class with no windows may run at any time. Windows are parsed once (``parse_windows``,
with messages fit for an officer's form) and turned into concrete UTC intervals
(``open_intervals``), daylight-saving changes included, by the feasibility model and the job
scheduler alike.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_HORIZON_DAYS = 400  # how far ahead intervals are looked for before giving up


class WindowError(ValueError):
    """A window that cannot be understood; the message says which and why."""


@dataclass(frozen=True)
class Window:
    days: frozenset[int]  # 0 = Monday
    start: time
    end: time

    @property
    def crosses_midnight(self) -> bool:
        return self.end <= self.start


def _clock(value: object, where: str) -> time:
    if not isinstance(value, str):
        raise WindowError(f'{where} must be a time like "20:00"')
    try:
        parsed = time.fromisoformat(value)
    except ValueError:
        raise WindowError(f'{where} {value!r} is not a time like "20:00"') from None
    if parsed.second or parsed.microsecond or parsed.tzinfo is not None:
        raise WindowError(f"{where} {value!r}: hours and minutes only, no zone")
    return parsed


def parse_windows(raw: object) -> tuple[Window, ...]:
    """The JSON an officer gave (a list of objects), checked."""
    if raw in (None, ""):
        return ()
    if not isinstance(raw, list):
        raise WindowError("windows must be a list of {days, start, end} objects")
    windows = []
    for index, item in enumerate(raw, start=1):
        where = f"window {index}"
        if not isinstance(item, dict) or set(item) - {"days", "start", "end"}:
            raise WindowError(f"{where} must be an object with days, start and end only")
        days = item.get("days")
        if not isinstance(days, list) or not days:
            raise WindowError(f'{where}: days must be a non-empty list such as ["mon", "fri"]')
        unknown = [d for d in days if d not in DAYS]
        if unknown:
            raise WindowError(f"{where}: unknown day(s) {unknown}; use {', '.join(DAYS)}")
        windows.append(
            Window(
                days=frozenset(DAYS.index(d) for d in days),
                start=_clock(item.get("start"), f"{where} start"),
                end=_clock(item.get("end"), f"{where} end"),
            )
        )
    return tuple(windows)


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise WindowError(f"{name!r} is not a time zone (e.g. Europe/Zurich, UTC)") from None


def open_intervals(
    windows: Sequence[Window], tz: ZoneInfo, after: datetime
) -> Iterator[tuple[datetime, datetime]]:
    """The windows' spans (UTC, merged where they touch or overlap) that end after ``after``,
    in order, the first clipped to start no earlier than ``after``. No windows: one span
    from ``after`` on, unbounded (``datetime.max`` in UTC)."""
    after = after.astimezone(UTC)
    if not windows:
        yield after, datetime.max.replace(tzinfo=UTC)
        return
    current: tuple[datetime, datetime] | None = None
    first_day = after.astimezone(tz).date() - timedelta(days=1)  # a span begun yesterday
    for offset in range(_HORIZON_DAYS):
        day = first_day + timedelta(days=offset)
        for begin, end in sorted(_spans_on(windows, tz, day)):
            if end <= after:
                continue
            begin = max(begin, after)
            if current is not None and begin <= current[1]:
                current = (current[0], max(current[1], end))
                continue
            if current is not None:
                yield current
            current = (begin, end)
    if current is not None:
        yield current


def _spans_on(
    windows: Sequence[Window], tz: ZoneInfo, day: date
) -> Iterator[tuple[datetime, datetime]]:
    for window in windows:
        if day.weekday() not in window.days:
            continue
        begin = datetime.combine(day, window.start, tzinfo=tz)
        end_day = day + timedelta(days=1) if window.crosses_midnight else day
        end = datetime.combine(end_day, window.end, tzinfo=tz)
        yield begin.astimezone(UTC), end.astimezone(UTC)


def open_seconds_between(
    windows: Sequence[Window], tz: ZoneInfo, start: datetime, end: datetime
) -> float:
    """Seconds of window time between ``start`` and ``end``."""
    total = 0.0
    for begin, close in open_intervals(windows, tz, start):
        if begin >= end:
            break
        total += (min(close, end) - begin).total_seconds()
    return total

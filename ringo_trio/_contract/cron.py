"""Cron expressions and fixed intervals: when a schedule's ticks fall (sans-IO).

Shared by the SDK (early validation) and the daemon (the authority, which
computes every ``next_fire_at``); docs/schedules.md is the user's account.

Theory of operation
-------------------
`parse_cron` turns an expression into one frozen set of allowed values per
field (seconds, minutes, hours, day of month, month, day of week), or
`CronError` naming the field and the 1-based character position where the
expression goes wrong. Five fields mean seconds ``{0}``; six put seconds
first. Day of week 0 and 7 are both Sunday. When both day of month and day of
week are restricted (neither field starts with ``*``), a day matches if
*either* does (the classic cron rule); otherwise only the restricted one
counts.

`Cron.next_fire(after)` is the first tick strictly after the aware instant
``after``. The expression speaks of *wall times* in the schedule's zone, so
the search walks naive wall times upwards, field by field (a month that
cannot match is skipped whole, then a day, an hour, a minute), and maps each
matching wall time to an instant:

* a wall time that exists once is that instant;
* **spring forward**: a wall time inside the gap (Europe/Berlin's 02:30 on
  the last Sunday of March) does not exist; it fires at the first instant
  after the gap (03:00 CEST). Several skipped wall times (``*/15`` in the
  skipped hour) all land on that one instant, which fires once;
* **fall back**: a wall time that exists twice (01:30 on the first Sunday
  of November in America/New_York) fires once, at its first occurrence
  (EDT). During the repeated hour nothing fires again, so an every-minute
  expression pauses for that hour: each wall time fires exactly once.

This mapping never goes backwards as the wall time grows, so the first
matching wall time whose instant is after ``after`` is the answer; the walk
starts at the wall time of ``after`` itself (an earlier wall time maps to an
earlier or equal instant).

`Every.next_fire(after)` is ``anchor + k * interval`` for the least k that
makes it later than ``after``: intervals count real elapsed time from the
schedule's creation, whatever the zone and its transitions.

A restricted expression that can never match (``0 0 30 2 *``) is refused at
parse time, so `next_fire` always finds a tick within `_SEARCH_YEARS`.
"""

from __future__ import annotations

import calendar
import zoneinfo
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Final, Protocol

__all__ = [
    "CronError",
    "Cron",
    "Every",
    "Timing",
    "MAX_EVERY",
    "MIN_EVERY",
    "parse_cron",
    "zone",
]

MIN_EVERY: Final = timedelta(seconds=1)
"""The shortest ``every`` interval (a schedule's resolution is a second)."""
MAX_EVERY: Final = timedelta(days=366)
"""The longest ``every`` interval."""

# Ticks a restricted expression has within this many years of any instant
# (Feb 29 on a given weekday recurs within 28); bounds the search.
_SEARCH_YEARS = 30

_MONTHS = {
    name: i
    for i, name in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"),
        start=1,
    )
}
_DAYS = {name: i for i, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

# (name, low, high, names) of each field in six-field order.
_FIELDS: Final = (
    ("second", 0, 59, None),
    ("minute", 0, 59, None),
    ("hour", 0, 23, None),
    ("day of month", 1, 31, None),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 7, _DAYS),
)


class CronError(ValueError):
    """A cron expression that is not valid: names the field and the position."""

    def __init__(self, message: str, *, field: str | None = None, position: int | None = None):
        self.field = field
        self.position = position
        where = ""
        if field is not None:
            where = f"{field} field"
            if position is not None:
                where += f" (position {position})"
            where += ": "
        super().__init__(where + message)


class Timing(Protocol):
    """When a schedule's ticks fall."""

    def next_fire(self, after: datetime) -> datetime:
        """The first tick strictly after the aware instant `after` (aware, UTC)."""
        ...


def zone(name: str) -> tzinfo:
    """The IANA zone `name` ("" is UTC); `ValueError` for an unknown name."""
    if name in ("", "UTC"):
        return UTC
    # Only names; never a path (zoneinfo refuses absolute and ".." ones too).
    if name.startswith("/") or ".." in name or len(name) > 64:
        raise ValueError(f"unknown time zone {name!r}")
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(f"unknown time zone {name!r}") from None


@dataclass(frozen=True, slots=True)
class Every:
    """A tick every `interval`, counted from `anchor` (aware)."""

    interval: timedelta
    anchor: datetime

    def __post_init__(self) -> None:
        if not MIN_EVERY <= self.interval <= MAX_EVERY:
            raise ValueError(f"every must be within {MIN_EVERY}..{MAX_EVERY}")
        if self.anchor.tzinfo is None:
            raise ValueError("the anchor must be an aware datetime")

    def next_fire(self, after: datetime) -> datetime:
        _aware(after)
        if after < self.anchor:
            return self.anchor.astimezone(UTC)
        # Integer microseconds: no float rounding over a long life.
        step = _us(self.interval)
        k = _us(after - self.anchor) // step + 1
        return (self.anchor + timedelta(microseconds=k * step)).astimezone(UTC)


@dataclass(frozen=True, slots=True)
class Cron:
    """A parsed cron expression read in zone `tz`."""

    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday .. 6; 7 folded into 0
    days_restricted: bool
    weekdays_restricted: bool
    tz: tzinfo = UTC

    def in_zone(self, tz: tzinfo) -> Cron:
        return Cron(
            self.seconds,
            self.minutes,
            self.hours,
            self.days,
            self.months,
            self.weekdays,
            self.days_restricted,
            self.weekdays_restricted,
            tz,
        )

    def matches_day(self, year: int, month: int, day: int) -> bool:
        # Python: Monday 0; cron: Sunday 0.
        weekday = (calendar.weekday(year, month, day) + 1) % 7
        by_day = day in self.days
        by_weekday = weekday in self.weekdays
        if self.days_restricted and self.weekdays_restricted:
            return by_day or by_weekday
        return by_day and by_weekday

    def next_fire(self, after: datetime) -> datetime:
        _aware(after)
        after = after.astimezone(UTC)
        wall = after.astimezone(self.tz).replace(tzinfo=None, microsecond=0)
        limit = wall.year + _SEARCH_YEARS
        while True:
            found = self._next_wall(wall, limit)
            if found is None:
                raise ValueError("the expression has no tick within the search horizon")
            instant = self._instant(found)
            if instant > after:
                return instant
            wall = found + timedelta(seconds=1)

    def _next_wall(self, start: datetime, limit: int) -> datetime | None:
        """The first matching naive wall time at or after `start`."""
        t = start
        while t.year <= limit:
            if t.month not in self.months:
                t = _first_of_next_month(t)
                continue
            if not self.matches_day(t.year, t.month, t.day):
                t = datetime(t.year, t.month, t.day) + timedelta(days=1)
                continue
            if t.hour not in self.hours:
                t = t.replace(minute=0, second=0) + timedelta(hours=1)
                continue
            if t.minute not in self.minutes:
                t = t.replace(second=0) + timedelta(minutes=1)
                continue
            if t.second not in self.seconds:
                t = t + timedelta(seconds=1)
                continue
            return t
        return None

    def _instant(self, wall: datetime) -> datetime:
        """The instant a matching wall time fires at (the DST rule above)."""
        early = wall.replace(tzinfo=self.tz, fold=0)
        utc = early.astimezone(UTC)
        if utc.astimezone(self.tz).replace(tzinfo=None) == wall:
            # Exists: once, or twice (fold 0 is the first occurrence).
            return utc
        # In a gap: fold=1 reads it with the offset after the gap, fold=0
        # with the one before, and the transition lies between those two.
        lo = int(wall.replace(tzinfo=self.tz, fold=1).timestamp())
        hi = int(early.timestamp())
        if lo > hi:
            lo, hi = hi, lo
        before = datetime.fromtimestamp(lo, UTC).astimezone(self.tz).utcoffset()
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if datetime.fromtimestamp(mid, UTC).astimezone(self.tz).utcoffset() == before:
                lo = mid
            else:
                hi = mid
        return datetime.fromtimestamp(hi, UTC)


def _first_of_next_month(t: datetime) -> datetime:
    if t.month == 12:
        return datetime(t.year + 1, 1, 1)
    return datetime(t.year, t.month + 1, 1)


def _aware(moment: datetime) -> None:
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError("next_fire needs an aware datetime")


def _us(delta: timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def parse_cron(expression: str, tz: tzinfo = UTC) -> Cron:
    """`Cron` for `expression` read in zone `tz`; `CronError` if invalid."""
    text = expression.strip()
    if not text:
        raise CronError("the expression is empty")
    lowered = text.lower()
    if lowered.startswith("@"):
        if lowered not in _MACROS:
            raise CronError(f"unknown macro {text!r} (known: {', '.join(sorted(_MACROS))})")
        text = _MACROS[lowered]
    # Fields with their 1-based starting positions in the original text.
    fields: list[tuple[str, int]] = []
    i = 0
    while i < len(text):
        if text[i].isspace():
            i += 1
            continue
        j = i
        while j < len(text) and not text[j].isspace():
            j += 1
        fields.append((text[i:j], i + 1))
        i = j
    if len(fields) == 5:
        fields.insert(0, ("0", 0))
    elif len(fields) != 6:
        raise CronError(
            f"expected 5 fields (minute hour day-of-month month day-of-week) or 6"
            f" (seconds first), got {len(fields)}"
        )
    values = [_parse_field(f, pos, spec) for (f, pos), spec in zip(fields, _FIELDS, strict=True)]
    weekdays = frozenset(d % 7 for d in values[5])
    cron = Cron(
        seconds=values[0],
        minutes=values[1],
        hours=values[2],
        days=values[3],
        months=values[4],
        weekdays=weekdays,
        days_restricted=not fields[3][0].startswith("*"),
        weekdays_restricted=not fields[5][0].startswith("*"),
        tz=tz,
    )
    if not (cron.days_restricted and cron.weekdays_restricted) and not any(
        day <= _longest(month) for month in cron.months for day in cron.days
    ):
        raise CronError(
            "no month of the expression has any of its days",
            field="day of month",
            position=fields[3][1],
        )
    return cron


def _longest(month: int) -> int:
    return 29 if month == 2 else calendar.monthrange(2001, month)[1]


def _parse_field(
    text: str, position: int, spec: tuple[str, int, int, dict[str, int] | None]
) -> frozenset[int]:
    name, low, high, names = spec
    out: set[int] = set()
    offset = 0
    for part in text.split(","):
        where = position + offset
        offset += len(part) + 1
        if not part:
            raise CronError("empty list element", field=name, position=where)
        rng, _, step_text = part.partition("/")
        step = 1
        if "/" in part:
            if not step_text.isdigit() or int(step_text) < 1:
                raise CronError(
                    f"step {step_text!r} must be a positive integer",
                    field=name,
                    position=where + len(rng) + 1,
                )
            step = int(step_text)
        if rng == "*":
            first, last = low, high
            if name == "day of week":
                last = 6  # 7 is Sunday again: */2 must not add it twice
        else:
            first_text, dash, last_text = rng.partition("-")
            first = _value(first_text, name, low, high, names, where)
            if dash:
                last = _value(last_text, name, low, high, names, where + len(first_text) + 1)
                if last < first:
                    raise CronError(f"range {rng!r} goes backwards", field=name, position=where)
            else:
                # "5/15" means 5, 20, 35, 50.
                last = high if "/" in part else first
        out.update(range(first, last + 1, step))
    return frozenset(out)


def _value(
    text: str, name: str, low: int, high: int, names: dict[str, int] | None, position: int
) -> int:
    if names is not None and text.lower() in names:
        return names[text.lower()]
    if not text.isdigit():
        raise CronError(f"{text!r} is not a number or a known name", field=name, position=position)
    value = int(text)
    if not low <= value <= high:
        raise CronError(f"{value} is outside {low}-{high}", field=name, position=position)
    return value

"""The cron module (ringo_trio/_contract/cron.py) against croniter and a
minute-by-minute oracle of the documented DST rule."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from hypothesis import given, settings
from hypothesis import strategies as st

from ringo_trio._contract.cron import MAX_EVERY, MIN_EVERY, CronError, Every, parse_cron, zone

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def _field(low: int, high: int, *, star_ok: bool = True) -> st.SearchStrategy[str]:
    number = st.integers(low, high)
    # A range of one value ("1-1") is left out: croniter mistakes it in day of week.
    ranges = st.tuples(number, number).filter(lambda ab: ab[0] != ab[1])
    ranges = ranges.map(lambda ab: f"{min(ab)}-{max(ab)}")
    stepped_range = st.tuples(number, number, st.integers(1, high - low + 1))
    stepped_range = stepped_range.filter(lambda abs_: abs_[0] != abs_[1]).map(
        lambda abs_: f"{min(abs_[:2])}-{max(abs_[:2])}/{abs_[2]}"
    )
    element = st.one_of(number.map(str), ranges, stepped_range)
    listed = st.lists(element, min_size=1, max_size=3).map(",".join)
    options = [listed]
    if star_ok:
        options += [st.just("*"), st.integers(1, high - low + 1).map(lambda n: f"*/{n}")]
    return st.one_of(*options)


# Day of month and day of week: croniter counts a field as restricted unless
# it is exactly "*" (ours: unless it starts with "*"), so "*/n" is left out.
_DOM = st.one_of(st.just("*"), _field(1, 28, star_ok=False))
_DOW = st.one_of(st.just("*"), _field(0, 6, star_ok=False))
EXPRESSIONS = st.tuples(_field(0, 59), _field(0, 23), _DOM, _field(1, 12), _DOW).map(" ".join)
WITH_SECONDS = st.tuples(_field(0, 59), EXPRESSIONS).map(" ".join)
INSTANTS = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2040, 1, 1), timezones=st.just(UTC)
)


def _reference(expression: str, after: datetime, tz: tzinfo) -> datetime:
    it = croniter(
        expression,
        after.astimezone(tz),
        second_at_beginning=len(expression.split()) == 6,
    )
    return it.get_next(datetime).astimezone(UTC)  # type: ignore[no-any-return]


@settings(max_examples=400, deadline=None)
@given(EXPRESSIONS, INSTANTS)
def test_next_fire_matches_croniter_in_utc(expression: str, after: datetime) -> None:
    """Property: in UTC, next_fire is croniter's next tick, for any expression
    of lists, ranges and steps and any instant."""
    assert parse_cron(expression).next_fire(after) == _reference(expression, after, UTC)


@settings(max_examples=200, deadline=None)
@given(WITH_SECONDS, INSTANTS)
def test_six_fields_match_croniter_seconds_first(expression: str, after: datetime) -> None:
    """Property: six fields put seconds first, as croniter's second_at_beginning."""
    assert parse_cron(expression).next_fire(after) == _reference(expression, after, UTC)


@settings(max_examples=300, deadline=None)
@given(EXPRESSIONS, INSTANTS, st.sampled_from([BERLIN, NEW_YORK]))
def test_matches_croniter_away_from_transitions(
    expression: str, after: datetime, tz: ZoneInfo
) -> None:
    """Property: in a zone with DST, next_fire is croniter's wherever no
    transition lies between the instant and the tick (there the DST rule,
    tested below, decides)."""
    ours = parse_cron(expression, tz).next_fire(after)
    theirs = _reference(expression, after, tz)
    span = max(ours, theirs) - after
    offsets = {(after + span * i / 40).astimezone(tz).utcoffset() for i in range(41)}
    if len(offsets) == 1 and span < timedelta(days=40):
        assert ours == theirs


_TRANSITIONS = [
    # (zone, an instant in the hour before a spring-forward or a fall-back)
    (BERLIN, datetime(2024, 3, 31, 0, 0, tzinfo=UTC)),
    (BERLIN, datetime(2024, 10, 27, 0, 0, tzinfo=UTC)),
    (NEW_YORK, datetime(2024, 3, 10, 6, 0, tzinfo=UTC)),
    (NEW_YORK, datetime(2024, 11, 3, 4, 0, tzinfo=UTC)),
]


def _oracle(
    minutes: frozenset[int], hours: frozenset[int], after: datetime, tz: tzinfo
) -> datetime:
    """The documented rule, minute by minute in real time: a wall time fires
    at its first occurrence; wall times a spring-forward skipped fire at the
    first instant after the gap."""
    t = after.replace(second=0, microsecond=0) + timedelta(minutes=1)
    previous_wall = (t - timedelta(minutes=1)).astimezone(tz).replace(tzinfo=None)
    while True:
        local = t.astimezone(tz)
        wall = local.replace(tzinfo=None)
        skipped = []
        w = previous_wall + timedelta(minutes=1)
        while w < wall:
            skipped.append(w)
            w += timedelta(minutes=1)
        candidates = skipped + ([wall] if local.fold == 0 else [])
        if any(c.minute in minutes and c.hour in hours for c in candidates):
            return t
        previous_wall = max(previous_wall, wall)
        t += timedelta(minutes=1)


@settings(max_examples=300, deadline=None)
@given(
    _field(0, 59),
    _field(0, 23),
    st.sampled_from(_TRANSITIONS),
    st.integers(-120, 240),
)
def test_dst_rule_against_minute_oracle(
    minute: str, hour: str, transition: tuple[ZoneInfo, datetime], shift: int
) -> None:
    """Property: across spring-forward and fall-back in Europe/Berlin and
    America/New_York, every tick is the documented rule's (a skipped wall
    time fires once at the end of the gap, a repeated one once at its first
    occurrence)."""
    tz, near = transition
    cron = parse_cron(f"{minute} {hour} * * *", tz)
    after = near + timedelta(minutes=shift)
    for _ in range(3):
        expected = _oracle(cron.minutes, cron.hours, after, tz)
        assert cron.next_fire(after) == expected
        after = expected


def test_spring_forward_fires_once_after_the_gap() -> None:
    """Property: 02:30 on Berlin's spring-forward day fires at 03:00 CEST, once."""
    cron = parse_cron("*/15 2 * * *", BERLIN)
    first = cron.next_fire(datetime(2024, 3, 30, 12, tzinfo=UTC))
    assert first.astimezone(BERLIN) == datetime(2024, 3, 31, 3, 0, tzinfo=BERLIN)
    second = cron.next_fire(first)
    assert second.astimezone(BERLIN) == datetime(2024, 4, 1, 2, 0, tzinfo=BERLIN)


def test_fall_back_fires_the_first_occurrence_once() -> None:
    """Property: 01:30 on New York's fall-back day fires once, in EDT."""
    cron = parse_cron("30 1 * * *", NEW_YORK)
    first = cron.next_fire(datetime(2024, 11, 3, 0, tzinfo=UTC))
    assert first == datetime(2024, 11, 3, 5, 30, tzinfo=UTC)  # 01:30 EDT
    assert cron.next_fire(first) == datetime(2024, 11, 4, 6, 30, tzinfo=UTC)  # next day, EST


@pytest.mark.parametrize(
    ("expression", "equivalent"),
    [
        ("0 0 * * sun", "0 0 * * 0"),
        ("0 0 * * 7", "0 0 * * 0"),
        ("0 0 * jan-mar mon-fri", "0 0 * 1-3 1-5"),
        ("@hourly", "0 * * * *"),
        ("@daily", "0 0 * * *"),
        ("@weekly", "0 0 * * 0"),
        ("@monthly", "0 0 1 * *"),
        ("@yearly", "0 0 1 1 *"),
        ("5/15 * * * *", "5,20,35,50 * * * *"),
        # A range of one value is that value (croniter's day-of-week slip aside).
        ("0 5-5 * * *", "0 5 * * *"),
        ("0 0 * * fri-fri", "0 0 * * 5"),
    ],
)
def test_names_sundays_and_macros(expression: str, equivalent: str) -> None:
    """Property: names, Sunday as 7 and the macros mean their numeric forms."""
    after = datetime(2024, 5, 17, 13, 7, tzinfo=UTC)
    a, b = parse_cron(expression), parse_cron(equivalent)
    for _ in range(5):
        assert a.next_fire(after) == b.next_fire(after)
        after = a.next_fire(after)


def test_day_of_month_or_day_of_week() -> None:
    """Property: both restricted, a day matches if either does (the 13th or a Friday)."""
    cron = parse_cron("0 0 13 * 5")
    after = datetime(2024, 9, 1, tzinfo=UTC)
    days = []
    for _ in range(4):
        after = cron.next_fire(after)
        days.append(after.day)
    assert days == [6, 13, 20, 27]


@pytest.mark.parametrize(
    ("expression", "field", "position"),
    [
        ("61 * * * *", "minute", 1),
        ("* 24 * * *", "hour", 3),
        ("0 0 * * 8", "day of week", 9),
        ("0 0 1 13 *", "month", 7),
        ("*/0 * * * *", "minute", 3),
        ("0 0 30 2 *", "day of month", 5),
        ("0 0 1,,2 * *", "day of month", 7),
        ("0 0 * * mon-xyz", "day of week", 13),
        ("70 0 0 * * *", "second", 1),
        # One past each field's bound (one short of it for the lows).
        ("60 * * * *", "minute", 1),
        ("60 0 0 * * *", "second", 1),
        ("0 0 32 * *", "day of month", 5),
        ("0 0 0 * *", "day of month", 5),
        ("0 0 1 0 *", "month", 7),
    ],
)
def test_errors_name_field_and_position(expression: str, field: str, position: int) -> None:
    """Property: a syntax error names the field and the 1-based position."""
    with pytest.raises(CronError) as info:
        parse_cron(expression)
    assert info.value.field == field
    assert info.value.position == position
    assert f"{field} field (position {position})" in str(info.value)


@pytest.mark.parametrize("expression", ["", "* * *", "* * * * * * *", "@never"])
def test_shape_errors(expression: str) -> None:
    with pytest.raises(CronError):
        parse_cron(expression)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, int(MAX_EVERY.total_seconds())).map(lambda s: timedelta(seconds=s)),
    INSTANTS,
    st.integers(-(10**6), 10**9).map(lambda s: timedelta(seconds=s)),
)
def test_every_is_anchored(interval: timedelta, anchor: datetime, offset: timedelta) -> None:
    """Property: every= ticks are anchor + k*interval, the first strictly
    after the instant (the anchor itself when the instant is before it)."""
    after = anchor + offset
    tick = Every(interval, anchor).next_fire(after)
    assert tick > after
    assert (tick - anchor) % interval == timedelta(0)
    assert tick - interval <= after or tick == anchor


def test_every_is_bounded_to_the_microsecond() -> None:
    """`MIN_EVERY` and `MAX_EVERY` themselves are accepted, a µs past
    either is refused; they are the documented 1 s and 366 days
    (docs/schedules.md: a yearly tick in a leap year)."""
    assert (timedelta(seconds=1), timedelta(days=366)) == (MIN_EVERY, MAX_EVERY)
    anchor = datetime(2030, 1, 1, tzinfo=UTC)
    one_us = timedelta(microseconds=1)
    for interval in (MIN_EVERY, MAX_EVERY):
        assert Every(interval, anchor).next_fire(anchor) == anchor + interval
    for interval in (MIN_EVERY - one_us, MAX_EVERY + one_us):
        with pytest.raises(ValueError, match="every must be within"):
            Every(interval, anchor)


@pytest.mark.parametrize(
    ("interval", "since_anchor", "tick"),
    [
        (timedelta(seconds=1.5), timedelta(seconds=3), timedelta(seconds=4.5)),
        (timedelta(hours=1), timedelta(days=3, minutes=30), timedelta(days=3, hours=1)),
        (timedelta(days=2), timedelta(days=9, seconds=1), timedelta(days=10)),
        (timedelta(days=1, hours=1), timedelta(days=400), timedelta(days=1, hours=1) * 385),
    ],
)
def test_every_counts_whole_days_of_a_long_life(
    interval: timedelta, since_anchor: timedelta, tick: timedelta
) -> None:
    """Property: a schedule's next tick is right days, months and a year
    after its anchor, and for intervals with a fraction of a second (the
    microsecond count carries whole days and the microseconds, not only
    the seconds) -- examples the random anchors above reach
    too rarely to be sure of."""
    anchor = datetime(2030, 1, 1, tzinfo=UTC)
    assert Every(interval, anchor).next_fire(anchor + since_anchor) == anchor + tick


def test_february_29th_is_a_day_of_february_and_30th_is_not() -> None:
    """Property: "29 2" is a valid day (it fires on the next leap day) and
    "30 2" is not; the other months keep their 30th and 31st."""
    after = datetime(2030, 1, 1, tzinfo=UTC)
    assert parse_cron("0 0 29 2 *").next_fire(after) == datetime(2032, 2, 29, tzinfo=UTC)
    with pytest.raises(CronError, match="no month of the expression has any of its days"):
        parse_cron("0 0 30 2 *")
    assert parse_cron("0 0 30 4 *").next_fire(after) == datetime(2030, 4, 30, tzinfo=UTC)
    assert parse_cron("0 0 31 1,3 *").next_fire(after) == datetime(2030, 1, 31, tzinfo=UTC)


def test_zone_names() -> None:
    assert zone("") is UTC
    assert zone("Europe/Berlin") == BERLIN
    for bad in ("Mars/Olympus", "../etc/passwd", "/etc/localtime"):
        with pytest.raises(ValueError, match="unknown time zone"):
            zone(bad)

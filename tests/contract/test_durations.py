"""Durations and retentions as operators type them (`ringo --older-than`, `ringod --retain-*`)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ringo_trio._contract.durations import (
    FOREVER,
    MAX_RETENTION,
    NEVER,
    format_duration,
    format_retention,
    parse_duration,
    parse_retention,
)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("90", timedelta(seconds=90)),
        ("90s", timedelta(seconds=90)),
        ("5m", timedelta(minutes=5)),
        ("12h", timedelta(hours=12)),
        ("7d", timedelta(days=7)),
        ("2w", timedelta(weeks=2)),
        (" 1.5H ", timedelta(minutes=90)),
    ],
)
def test_durations_read_as_written(text: str, value: timedelta) -> None:
    """Every unit, a bare number of seconds, fractions, case and surrounding spaces."""
    assert parse_duration(text) == value


@pytest.mark.parametrize("text", ["", "-1d", "7 days", "d", "1y", "1e3s", "inf"])
def test_what_is_not_a_duration_is_refused_with_the_forms(text: str) -> None:
    with pytest.raises(ValueError, match="7d"):
        parse_duration(text)


@given(st.integers(min_value=0, max_value=10**9))
def test_a_formatted_duration_reads_back_the_same(seconds: int) -> None:
    value = timedelta(seconds=seconds)
    assert parse_duration(format_duration(value)) == value


@pytest.mark.parametrize("text", ["forever", "FOREVER", " Forever "])
def test_forever_is_the_retention_that_keeps_tasks(text: str) -> None:
    assert parse_retention(text) is None
    assert format_retention(None) == FOREVER


def test_a_retention_is_a_positive_duration_up_to_the_limit() -> None:
    """`0` is refused (it reads as both "keep nothing" and "no limit"), and so is a
    retention beyond MAX_RETENTION, whose cutoff could not be a date; each message
    points at `forever`."""
    assert parse_retention("30d") == timedelta(days=30)
    assert parse_retention(format_duration(MAX_RETENTION)) == MAX_RETENTION
    for text in ("0", "0s", "0d", format_duration(MAX_RETENTION + timedelta(days=1))):
        with pytest.raises(ValueError, match=FOREVER):
            parse_retention(text)
    with pytest.raises(ValueError, match="only succeeded tasks"):
        parse_retention("never")


@pytest.mark.parametrize("text", ["never", "NEVER", " Never "])
def test_never_is_the_zero_retention_only_where_asked_for(text: str) -> None:
    """`never` (succeeded tasks: the ack deletes them) reads as a zero
    retention only where the caller allows it, and reads back the same;
    the plain `0` stays refused."""
    assert parse_retention(text, never=True) == timedelta(0)
    assert format_retention(timedelta(0)) == NEVER
    with pytest.raises(ValueError, match="only succeeded tasks"):
        parse_retention(text)
    with pytest.raises(ValueError, match=FOREVER):
        parse_retention("0", never=True)


@given(st.integers(min_value=1, max_value=int(MAX_RETENTION.total_seconds())))
def test_a_formatted_retention_reads_back_the_same(seconds: int) -> None:
    value = timedelta(seconds=seconds)
    assert parse_retention(format_retention(value)) == value


@pytest.mark.parametrize("text", ["86400000000000", "99999999999999w", "9" * 400])
def test_a_duration_beyond_what_timedelta_holds_is_refused_as_bad_input(text: str) -> None:
    """A `ValueError` (which argparse turns into a usage error), never the
    `OverflowError` timedelta raises: at 86,400,000,000,000 seconds, the float
    of `timedelta.max` itself, the bound's edge."""
    with pytest.raises(ValueError, match="too long a duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (timedelta(weeks=1), "1w"),
        (timedelta(days=7), "1w"),
        (timedelta(days=8), "8d"),
        (timedelta(days=1), "1d"),
        (timedelta(hours=1), "1h"),
        (timedelta(minutes=2), "2m"),
        (timedelta(seconds=60), "1m"),
        (timedelta(seconds=90), "90s"),
        (timedelta(seconds=59), "59s"),
        (timedelta(seconds=1_000_000), "1000000s"),
        (timedelta(seconds=0.5), "0.5s"),
        (timedelta(0), "0s"),
    ],
)
def test_a_duration_is_formatted_in_the_largest_exact_unit(value: timedelta, text: str) -> None:
    """What `ringod --help` and the retention log lines show: a week as `1w`,
    not `7d` nor `604800s`; a unit is used only when it divides the value."""
    assert format_duration(value) == text


def test_the_longest_retention_is_a_hundred_years() -> None:
    """docs/operations.md names `36500d`: a day more is refused and points at `forever`."""
    assert parse_retention("36500d") == timedelta(days=36500) == MAX_RETENTION
    with pytest.raises(ValueError, match=FOREVER):
        parse_retention("36501d")

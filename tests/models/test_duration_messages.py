"""Durations in messages read as people say them: "delay must be at most 365
days (got 400 days)", not Python's "365 days, 0:00:00" (which reads as two
values) nor the daemon's old "31536001s" (which had to be divided out)."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta

import pytest

from ringo_trio import InvalidArgumentError, RetryBackoff, RetryTaskError, Ringo, TaskSpec
from ringo_trio._contract.durations import describe_duration
from ringo_trio._queue.schedules import _schedule_wire


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (timedelta(days=365), "365 days"),
        (timedelta(days=1), "1 day"),
        (timedelta(days=365, seconds=1), "365 days 1 second"),
        (timedelta(days=1, hours=2, minutes=3), "1 day 2 hours 3 minutes"),
        (timedelta(seconds=90.5), "1 minute 30.5 seconds"),
        (timedelta(microseconds=1), "0.000001 seconds"),
        (timedelta(0), "0 seconds"),
        (timedelta(days=999_999_000), "999999000 days"),
        (timedelta(seconds=-5), "minus 5 seconds"),
        (-timedelta(days=1, microseconds=500_000), "minus 1 day 0.5 seconds"),
    ],
)
def test_describe_duration_is_exact_and_in_words(value: timedelta, words: str) -> None:
    """Property: every unit that is not zero is named (so a value just past a
    limit never reads as equal to it), singular for one, no "0:00:00"."""
    assert describe_duration(value) == words


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: TaskSpec("t", delay=timedelta(days=400)),
            "delay must be at most 365 days (got 400 days)",
        ),
        (
            lambda: RetryBackoff(maximum=timedelta(days=366)),
            "retry_backoff.maximum must be at most 365 days (got 366 days)",
        ),
        (
            lambda: RetryTaskError("x", delay=timedelta(days=365, seconds=1)),
            "RetryTaskError delay must be at most 365 days (got 365 days 1 second)",
        ),
        (
            lambda: RetryTaskError("x", delay=400 * 86400.0),
            "RetryTaskError delay must be a finite number of seconds, at most 365 days"
            " (got 34560000.0 seconds)",
        ),
        (
            lambda: _schedule_wire(
                "q",
                "s",
                "t",
                cron=None,
                every=timedelta(milliseconds=500),
                payload=b"",
                timezone="UTC",
                misfire="skip",
                catch_up=0,
                paused=False,
                priority=0,
                max_attempts=None,
            ),
            "every must be from 1 second to 366 days (got 0.5 seconds)",
        ),
        (
            lambda: (
                Ringo.connect("127.0.0.1:1")
                .queue("q")
                .worker(lambda task, ctx: None, lease_duration=timedelta(days=2))
            ),
            "lease_duration must be at most 1 day (got 2 days)",
        ),
    ],
)
def test_sdk_limits_name_the_limit_and_the_value_in_words(
    build: Callable[[], object], message: str
) -> None:
    """Property: a duration past its limit is refused with the limit and the
    value given, both in words, as one sentence."""
    with pytest.raises(InvalidArgumentError, match=f"^{re.escape(message)}$"):
        build()

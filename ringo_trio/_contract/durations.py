"""Durations as operators type them: ``90s``, ``5m``, ``12h``, ``7d``, ``2w``,
or a bare number of seconds. Shared by `ringo` and `ringod` flags; a
retention (``ringod --retain-*``) is such a duration or ``forever``, and
the succeeded tasks' may be ``never``."""

from __future__ import annotations

import math
import re
from datetime import timedelta

__all__ = [
    "FOREVER",
    "MAX_RETENTION",
    "NEVER",
    "describe_duration",
    "format_duration",
    "format_retention",
    "parse_duration",
    "parse_retention",
]

FOREVER = "forever"
"""The retention that keeps tasks (the one way to turn a retention off)."""
NEVER = "never"
"""The retention that keeps no task: its ack deletes it (``ringod
--retain-succeeded never``). Read as a zero retention, which the plain
spelling ``0`` is not (it reads as "no limit" to some)."""
MAX_RETENTION = timedelta(days=100 * 365)
"""Longer retentions are refused (say `FOREVER`): the cutoff, now minus the
retention, must stay a valid date."""

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_FORM = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", re.IGNORECASE)


def parse_duration(text: str) -> timedelta:
    """`ValueError` naming the accepted forms for anything else (negative,
    empty, unknown unit, or beyond what `timedelta` holds)."""
    match = _FORM.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration; use e.g. 90s, 5m, 12h, 7d or 2w")
    seconds = float(match.group(1)) * _UNITS[(match.group(2) or "s").lower()]
    # `>=`: timedelta.max in seconds rounds up to a float that timedelta
    # itself refuses with an OverflowError, which argparse would not catch.
    if not math.isfinite(seconds) or seconds >= timedelta.max.total_seconds():
        raise ValueError(f"{text!r} is too long a duration")
    return timedelta(seconds=seconds)


def format_duration(value: timedelta) -> str:
    """The largest whole unit that states `value` exactly (``7d``, ``90s``)."""
    seconds = value.total_seconds()
    for unit in ("w", "d", "h", "m"):
        size = _UNITS[unit]
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    # Fixed-point: `:g` would write 1000000 seconds as "1e+06s", which
    # parse_duration (rightly) refuses.
    return f"{seconds:.6f}".rstrip("0").rstrip(".") + "s"


def describe_duration(value: timedelta) -> str:
    """`value` in words, exactly, for messages: ``365 days``, ``1 day 2 hours``,
    ``1 minute 30.5 seconds``. Python's own ``str(timedelta)`` reads
    ``365 days, 0:00:00``, which in "must be at most 365 days, 0:00:00"
    looks like two things."""
    if value < timedelta(0):
        return "minus " + describe_duration(-value)
    micros = value // timedelta(microseconds=1)
    parts = []
    for name, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        count, micros = divmod(micros, size * 1_000_000)
        if count:
            parts.append(f"{count} {name}" + ("" if count == 1 else "s"))
    if micros or not parts:
        seconds = f"{micros / 1_000_000:.6f}".rstrip("0").rstrip(".")
        parts.append(f"{seconds} second" + ("" if seconds == "1" else "s"))
    return " ".join(parts)


def parse_retention(text: str, *, never: bool = False) -> timedelta | None:
    """A retention: a positive duration up to `MAX_RETENTION`, or ``forever``
    (None: never delete), or, where `never` allows it, ``never`` (zero: keep
    none). ``0`` is refused rather than guessed at, since it reads as "keep
    nothing" to some and as "no limit" to others."""
    word = text.strip().lower()
    if word == FOREVER:
        return None
    if word == NEVER:
        if not never:
            raise ValueError(
                f"{text!r}: only succeeded tasks can be kept {NEVER!r} (deleted by their ack)"
            )
        return timedelta(0)
    value = parse_duration(text)
    if value <= timedelta(0):
        raise ValueError(
            f"{text!r}: a retention must be positive; say {FOREVER!r} to keep tasks forever"
        )
    if value > MAX_RETENTION:
        raise ValueError(
            f"{text!r} is longer than {format_duration(MAX_RETENTION)}; say {FOREVER!r}"
        )
    return value


def format_retention(value: timedelta | None) -> str:
    """What `parse_retention` reads back as `value`."""
    if value is None:
        return FOREVER
    return NEVER if not value else format_duration(value)

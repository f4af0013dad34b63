"""Durations as operators type them: ``90s``, ``5m``, ``12h``, ``7d``, ``2w``,
or a bare number of seconds. Shared by `ringo` and `ringod` flags."""

from __future__ import annotations

import math
import re
from datetime import timedelta

__all__ = ["format_duration", "parse_duration"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_FORM = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", re.IGNORECASE)


def parse_duration(text: str) -> timedelta:
    """`ValueError` naming the accepted forms for anything else (negative,
    empty, unknown unit, or beyond what `timedelta` holds)."""
    match = _FORM.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration; use e.g. 90s, 5m, 12h, 7d or 2w")
    seconds = float(match.group(1)) * _UNITS[(match.group(2) or "s").lower()]
    if not math.isfinite(seconds) or seconds > timedelta.max.total_seconds():
        raise ValueError(f"{text!r} is too long a duration")
    return timedelta(seconds=seconds)


def format_duration(value: timedelta) -> str:
    """The largest whole unit that states `value` exactly (``7d``, ``90s``)."""
    seconds = value.total_seconds()
    for unit in ("w", "d", "h", "m"):
        size = _UNITS[unit]
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"

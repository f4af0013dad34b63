"""The daemon's ready line: how ``ringod`` tells whoever started it that it serves.

Once its port is bound and health says SERVING, ``ringod`` writes exactly one
line to stdout — the only thing it ever writes there — a JSON object that
names at least its ``endpoint`` (``"127.0.0.1:PORT"``); the other keys
(``pid``, ``generation``, ``storage``, ...) are listed by
``ringo_trio.server.main.ready_info``.

Three readers wait for that line: the private local daemon
(`ringo_trio._local.process`), the shared one (`ringo_trio._local.shared`)
and the testing kit's `DaemonProcess` (`ringo_trio.testing._process`). They
wait differently (anyio streams, a selector) and check different things
afterwards (a parseable endpoint, a loopback one, the generation they asked
for), but the line is written by `format_line` and read by `parse_line`
only, so what counts as a ready line is decided here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["LINE_LIMIT", "ReadyLineError", "format_line", "parse_line"]

#: A reader stops waiting for the newline once this much arrived: whatever
#: the child prints, it is not a ready line.
LINE_LIMIT = 64 * 1024


class ReadyLineError(ValueError):
    """The first line a daemon printed is not a ready line."""


def format_line(info: Mapping[str, Any]) -> str:
    """The ready line announcing ``info``, newline included."""
    return json.dumps(info) + "\n"


def parse_line(line: bytes) -> dict[str, Any]:
    """What a ready line (without its newline) announces.

    Raises `ReadyLineError` unless ``line`` is a JSON object whose
    ``endpoint`` is a string.
    """
    try:
        info = json.loads(line)
    except (ValueError, RecursionError):
        # RecursionError: a deeply nested array, well within LINE_LIMIT.
        raise ReadyLineError("not JSON") from None
    if not isinstance(info, dict):
        raise ReadyLineError("not a JSON object")
    if not isinstance(info.get("endpoint"), str):
        raise ReadyLineError("no endpoint string")
    return info

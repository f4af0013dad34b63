"""The ready line (`ringo_trio._contract.readiness`): what the daemon writes, every reader reads."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ringo_trio._contract import readiness

_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=10,
)

_INFOS = st.builds(
    lambda endpoint, rest: {**rest, "endpoint": endpoint},
    st.text(),
    st.dictionaries(st.text(), _JSON, max_size=5),
)


def _line(info: dict[str, Any]) -> bytes:
    text = readiness.format_line(info)
    assert text.endswith("\n")
    return text.encode()[:-1]


@given(_INFOS)
def test_a_formatted_line_reads_back_as_announced(info: dict[str, Any]) -> None:
    """Whatever the daemon announces (an ``endpoint`` string and any other
    JSON values) is one ASCII line a reader parses back to the same dict."""
    line = _line(info)
    assert b"\n" not in line
    assert line.isascii()
    assert readiness.parse_line(line) == info


def test_the_daemons_own_announcement_reads_back() -> None:
    """The shape ``ringod`` writes (server/_main.py ``ready_info``)."""
    info = {
        "endpoint": "127.0.0.1:50051",
        "host": "127.0.0.1",
        "port": 50051,
        "pid": 4242,
        "protocol_major": 1,
        "protocol_minor": 11,
        "auth": True,
        "storage": "sqlite",
        "data_dir": "/tmp/ringo",
        "generation": "0" * 32,
    }
    assert readiness.parse_line(_line(info)) == info


@given(st.binary(max_size=200))
def test_garbage_is_refused_never_misread(line: bytes) -> None:
    """Any bytes either parse as a JSON object naming an endpoint string, or
    are refused with `ReadyLineError`; no other exception escapes."""
    try:
        info = readiness.parse_line(line)
    except readiness.ReadyLineError:
        return
    assert isinstance(info, dict)
    assert isinstance(info["endpoint"], str)


@given(_JSON.filter(lambda value: not isinstance(value, dict) or "endpoint" not in value))
def test_json_that_announces_no_endpoint_is_refused(value: object) -> None:
    """Valid JSON is not enough: a list, a number, or an object without an
    ``endpoint`` is not a ready line."""
    with pytest.raises(readiness.ReadyLineError):
        readiness.parse_line(json.dumps(value).encode())


@given(_JSON.filter(lambda value: not isinstance(value, str)))
def test_an_endpoint_that_is_not_a_string_is_refused(endpoint: object) -> None:
    with pytest.raises(readiness.ReadyLineError):
        readiness.parse_line(json.dumps({"endpoint": endpoint}).encode())


@pytest.mark.parametrize("line", [b"", b"ringod starting...", b"[" * 100_000, b"{" * 10, b"\xff"])
def test_lines_a_broken_daemon_might_print_are_refused(line: bytes) -> None:
    with pytest.raises(readiness.ReadyLineError):
        readiness.parse_line(line)

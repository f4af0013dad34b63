"""The dashboard's sans-IO parts, property-tested: the sparkline rings, the
signed session cookie, the payload preview."""

from __future__ import annotations

import json
from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from ringo_trio.server.http.ui import Activity
from ringo_trio.server.http.ui.activity import MINUTES
from ringo_trio.server.http.ui.auth import Sessions
from ringo_trio.server.http.ui.views import HEX_BYTES, PREVIEW_BYTES, preview

T0 = 29_000_000 * 60.0

events = st.lists(
    st.tuples(st.floats(min_value=0, max_value=4 * 3600), st.booleans()), max_size=60
).map(sorted)


@given(events=events, look=st.floats(min_value=0, max_value=3600))
def test_activity_series_equal_a_model_of_the_last_hour(
    events: list[tuple[float, bool]], look: float
) -> None:
    """Property: for events recorded in time order, series(now) holds, per
    minute of the last 60 ending with now's, exactly the events of that
    minute; older ones are gone."""
    activity = Activity()
    for offset, ok in events:
        activity.record("q", succeeded=ok, now=T0 + offset)
    now = T0 + (events[-1][0] if events else 0.0) + look
    minute = int(now // 60)
    model: Counter[tuple[int, bool]] = Counter(
        (int((T0 + offset) // 60), ok) for offset, ok in events
    )
    ok, failed = activity.series("q", now=now)
    first = minute - MINUTES + 1
    assert ok == [model[(m, True)] for m in range(first, minute + 1)]
    assert failed == [model[(m, False)] for m in range(first, minute + 1)]


@given(flip=st.integers(min_value=0), char=st.sampled_from("AZaz09-_."))
def test_a_tampered_session_cookie_is_refused(flip: int, char: str) -> None:
    """Property: a session cookie with any one character changed names no
    session; the unchanged one does, until it expires."""
    sessions = Sessions("token")
    sid, cookie = sessions.new(now=1000.0)
    assert sessions.session(cookie, now=1000.0) == sid
    i = flip % len(cookie)
    tampered = cookie[:i] + char + cookie[i + 1 :]
    if tampered != cookie:
        assert sessions.session(tampered, now=1000.0) is None
    assert sessions.session(cookie, now=10**9) is None
    assert Sessions("token").session(cookie, now=1000.0) is None


# Sizes drawn evenly up to past the cut (st.binary keeps to small ones).
payloads = st.one_of(
    st.binary(max_size=64),
    st.builds(
        lambda n, head: head + bytes(n),
        st.integers(min_value=0, max_value=PREVIEW_BYTES + 100),
        st.binary(max_size=8),
    ),
)


@given(data=payloads, view=st.sampled_from(["text", "json", "hex"]))
def test_previews_are_bounded(data: bytes, view: str) -> None:
    """Property: a preview shows at most PREVIEW_BYTES (hex: HEX_BYTES) of
    the payload, and says so when it cut."""
    text, note = preview(data, view)
    limit = HEX_BYTES if view == "hex" else PREVIEW_BYTES
    if view == "hex":
        assert len(text.splitlines()) <= HEX_BYTES // 16
    elif len(data) <= PREVIEW_BYTES and view == "json":
        pass  # pretty JSON may be longer than its source
    else:
        # A decoded character takes at least one byte (U+FFFD for a bad one).
        assert len(text) <= limit
    if len(data) > limit:
        assert note


json_with_surrogates = st.lists(
    st.one_of(
        st.integers(min_value=0xD800, max_value=0xDFFF).map(lambda c: f"\\u{c:04x}"),
        st.text(max_size=4).map(lambda t: json.dumps(t)[1:-1]),
    ),
    max_size=6,
).map(lambda parts: ('{"a": "' + "".join(parts) + '"}').encode())


@given(
    data=st.one_of(payloads, json_with_surrogates), view=st.sampled_from(["text", "json", "hex"])
)
def test_every_preview_fits_a_utf8_page(data: bytes, view: str) -> None:
    """Property: whatever a payload holds (invalid UTF-8, JSON whose strings
    hold lone surrogates), its preview in every view encodes to UTF-8, so the
    page showing it renders; a lone surrogate in JSON is shown as its
    escape."""
    text, _ = preview(data, view)
    text.encode("utf-8")
    assert preview(b'["\\udcff"]', "json") == ('[\n  "\\udcff"\n]', "")

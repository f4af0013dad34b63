"""The worker's hot frames, unrolled: `ringo_trio._work._frames` (decoding) and
`ringo_trio._wire.work` (the commands).

The references are the generic paths of tests/_kit/generic_frames.py:
`decode_work_response` (the shared codec plus the SDK's conversion,
`as_frames`) for the decoder, the codec over each command's message for the
encoders. On any frame, valid or corrupted, the fast
decoder gives the same value or the same error; the encoders give the same
bytes.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ringo_trio._proto.ringo.v1 import (
    ErrorCode,
    ErrorDetail,
    Lease,
    LeasedTask,
    RetryBackoff,
    Task,
    TaskState,
    WorkResponse,
    WorkResponseBatch,
    WorkResult,
)
from ringo_trio._wire import work
from ringo_trio._wire.codec import encode
from ringo_trio._wire.primitives import tag_len, varint
from ringo_trio._work import _frames as _work_wire
from ringo_trio._work._frames import PushedTask, WorkResultFrame
from tests._kit import generic_frames as generic
from tests._kit.generic_frames import decode_work_response as generic_decode
from tests._kit.wire_strategies import (
    BETTERPROTO_DURATIONS,
    DURATIONS,
    edits,
    hot_task,
    messages,
    outcome,
)

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Any frame: every body, every field of every level, unknown fields included
# (most of these leave the fast path somewhere; the generic decoder decides).
ANY_FRAME = messages(WorkResponse, BETTERPROTO_DURATIONS, nan=False)


def _plain(lease: Lease) -> Lease:
    lease._unknown_fields = b""
    return lease


PUSH = st.builds(
    lambda task, lease: WorkResponse(task=LeasedTask(task=hot_task(task), lease=_plain(lease))),
    messages(Task, BETTERPROTO_DURATIONS, nan=False),
    messages(Lease).map(_plain),
)
OK_RESULT = st.builds(
    lambda request_id, lease: WorkResponse(result=WorkResult(request_id=request_id, lease=lease)),
    st.integers(0, 2**64 - 1),
    st.none() | messages(Lease).map(_plain),
)
HOT_ELEMENT = st.one_of(PUSH, OK_RESULT)
# What a worker reads per task: a push, an OK result, or a batch of them.
HOT_FRAME = st.one_of(
    HOT_ELEMENT,
    st.lists(HOT_ELEMENT, max_size=4).map(
        lambda elements: WorkResponse(batch=WorkResponseBatch(responses=elements))
    ),
)


@PROPERTY
@given(ANY_FRAME)
def test_any_frame_decodes_as_the_generic_decoder_does(frame: WorkResponse) -> None:
    """Property (same answer): on any frame the result is the generic decoder's."""
    data = encode(frame)
    assert outcome(_work_wire.decode_work_response, data) == outcome(generic_decode, data)


@PROPERTY
@given(HOT_FRAME)
def test_pushes_and_results_take_the_fast_path(frame: WorkResponse) -> None:
    """Property (fast path taken, same answer): pushes, results without an
    error, and batches of them are read without the generic decoder, into
    the very values it would build."""
    data = encode(frame)
    assert _work_wire._decode(data) == generic_decode(data)


@PROPERTY
@given(st.one_of(ANY_FRAME, HOT_FRAME), st.data())
def test_corrupted_frames_fail_or_decode_as_the_generic_decoder(
    frame: WorkResponse, data: st.DataObject
) -> None:
    """Property (same error): corrupted bytes or a cut frame give the
    generic decoder's result or exactly its error."""
    encoded = bytearray(encode(frame))
    if not encoded:
        return
    for _ in range(data.draw(st.integers(1, 3))):
        index = data.draw(st.integers(0, len(encoded) - 1))
        encoded[index] = data.draw(st.integers(0, 255))
    cut = bytes(encoded[: data.draw(st.integers(0, len(encoded)))])
    for attempt in (bytes(encoded), cut):
        assert outcome(_work_wire.decode_work_response, attempt) == outcome(generic_decode, attempt)


@PROPERTY
@given(st.one_of(ANY_FRAME, HOT_FRAME), st.one_of(ANY_FRAME, HOT_FRAME))
def test_concatenated_frames_decode_as_the_generic_decoder(
    first: WorkResponse, second: WorkResponse
) -> None:
    """Property (same answer): two frames' bytes back to back (protobuf's
    merge: two members of the oneof, which the generic decoder refuses, or
    one member twice, where the last wins) give the generic decoder's result
    or error."""
    data = encode(first) + encode(second)
    assert outcome(_work_wire.decode_work_response, data) == outcome(generic_decode, data)


def _field(number: int, body: bytes) -> bytes:
    return tag_len(number) + varint(len(body)) + body


def _push(task: bytes, lease: bytes) -> bytes:
    """A push frame of a task's and a lease's encoded bodies, written by hand."""
    return _field(2, _field(1, task) + _field(2, lease))


@PROPERTY
@given(PUSH, PUSH, st.sampled_from(["leased task", "task", "lease"]))
def test_merged_pushes_decode_as_the_generic_decoder(
    first: WorkResponse, second: WorkResponse, level: str
) -> None:
    """Property (same answer): a push whose leased task, task or lease is two
    encodings back to back (every field twice: the last one wins) gives the
    generic decoder's result."""
    a, b = first.task, second.task
    assert a is not None
    assert b is not None
    assert a.task is not None
    assert b.task is not None
    assert a.lease is not None
    assert b.lease is not None
    if level == "leased task":
        body = encode(a) + encode(b)
    elif level == "task":
        body = _field(1, encode(a.task) + encode(b.task)) + _field(2, encode(a.lease))
    else:
        body = _field(1, encode(a.task)) + _field(2, encode(a.lease) + encode(b.lease))
    data = _field(2, body)
    assert outcome(_work_wire.decode_work_response, data) == outcome(generic_decode, data)


# Any Duration a ttl's bytes can hold: whole microseconds (what a daemon
# sends) or not, near the ends of timedelta's range and past them, int64
# and int32 extremes, nanos of the opposite sign.
TTL_SECONDS = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-(10**6), 10**6),
    st.sampled_from(
        [0, 59, 86_399_999_913_600, 86_399_999_999_999, 86_400_000_000_000, -86_399_999_913_600]
    ).flatmap(lambda s: st.sampled_from([s - 86_400, s - 1, s, s + 1, -s])),
    # Where the decoder stops counting microseconds itself (2**53 of them:
    # the compiled build divides floats there).
    st.integers(-2, 2)
    .map(lambda d: _work_wire._SECONDS_SPAN + d)
    .flatmap(lambda s: st.sampled_from([s, -s])),
)
TTL_NANOS = st.one_of(
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-999_999, 999_999).map(lambda us: us * 1000),
    st.sampled_from([0, 1, 500, 501, 999, 999_999_999, -1000, -999, 999_999_500]),
)


@PROPERTY
@given(PUSH, TTL_SECONDS, TTL_NANOS, st.booleans())
def test_a_pushed_lease_s_ttl_reads_as_the_generic_decoder_reads_it(
    frame: WorkResponse, seconds: int, nanos: int, last: bool
) -> None:
    """Property (same answer): a push whose lease carries any ttl — any
    seconds and nanos, whole microseconds or not, inside timedelta's range
    or past it — gives the generic decoder's value (the ttl as
    ``total_seconds()``) or its error; the ttl as the lease's last field
    (how encoders write it) takes the fast path whenever the generic
    decoder accepts it."""
    leased = frame.task
    assert leased is not None
    assert leased.lease is not None
    leased.lease.ttl = None
    ttl = _field(6, b"\x08" + varint(seconds) + b"\x10" + varint(nanos))
    lease = encode(leased.lease) + ttl if last else ttl + encode(leased.lease)
    data = _push(encode(leased.task), lease)
    generic_outcome = outcome(generic_decode, data)
    assert outcome(_work_wire.decode_work_response, data) == generic_outcome
    if last and not isinstance(generic_outcome, tuple):
        assert _work_wire._decode(data) == generic_outcome


def test_a_daemon_s_ttl_is_read_to_the_microsecond() -> None:
    """Example: the ttl a daemon sends (whole microseconds) is its seconds,
    exactly, whatever was read before it (the last ttl is remembered), and
    absent without one."""
    for seconds in (59.999874, 12.5, 59.999874, 59.999874, 0.0):
        lease = Lease(task_id="t", attempt=1, lease_token="k", ttl=timedelta(seconds=seconds))
        data = encode(WorkResponse(task=LeasedTask(task=Task(id="t"), lease=lease)))
        pushed = _work_wire._decode(data)
        assert isinstance(pushed, PushedTask)
        assert pushed.ttl == seconds
    lease.ttl = None
    data = encode(WorkResponse(task=LeasedTask(task=Task(id="t"), lease=lease)))
    pushed = _work_wire._decode(data)
    assert isinstance(pushed, PushedTask)
    assert pushed.ttl is None


# A push with every field a push carries, a lease with every field, results
# with and without a lease and with an error, and a batch of them.
_AT = datetime(2026, 12, 7, 4, 5, 6, 789_012, tzinfo=UTC)
_LEASE = Lease(
    task_id="01JEXAMPLE",
    attempt=3,
    lease_token="token-1",
    worker_id="worker-1",
    until=_AT + timedelta(seconds=30),
    ttl=timedelta(seconds=29, microseconds=999_874),
)
_PUSH = WorkResponse(
    task=LeasedTask(
        task=Task(
            id="01JEXAMPLE",
            queue="emails",
            task_type="send",
            payload=b"\x00\x80payload",
            unique_key="unique",
            state=TaskState.LEASED,
            attempt=3,
            max_attempts=5,
            priority=-2,
            retry_backoff=RetryBackoff(
                initial=timedelta(seconds=1), maximum=timedelta(minutes=5), multiplier=2.0
            ),
            created_at=_AT,
            updated_at=_AT + timedelta(seconds=1),
            available_at=_AT,
            finished_at=_AT + timedelta(seconds=2),
            last_error="boom",
            worker_id="worker-1",
            lease_until=_AT + timedelta(seconds=30),
            limit_key="tenant-7",
        ),
        lease=_LEASE,
    )
)
_RESULT = WorkResponse(result=WorkResult(request_id=300, lease=_LEASE))
_HOT_EXAMPLES = {
    "push": _PUSH,
    "result": _RESULT,
    "result without a lease": WorkResponse(result=WorkResult(request_id=1)),
    "error": WorkResponse(
        result=WorkResult(
            request_id=2,
            error=ErrorDetail(
                code=ErrorCode.LEASE_LOST, message="gone", metadata={"reason": "cancelled"}
            ),
        )
    ),
    "batch": WorkResponse(batch=WorkResponseBatch(responses=[_PUSH, _RESULT, _PUSH])),
}


def test_every_byte_of_a_hot_frame_edited_decodes_as_the_generic_decoder() -> None:
    """Property (same answer, at every point of the frame): a push with every
    field, results with and without a lease or with an error, and a batch of
    them, each cut at every byte, with every byte dropped, and with every
    byte replaced by or preceded by each byte that matters to the wire
    format, decode to the generic decoder's value or fail with its error —
    a fault at each point of the frame, not the few a random draw finds."""
    for name, frame in _HOT_EXAMPLES.items():
        data = encode(frame)
        if name != "error":  # a result with an error is the generic path's
            assert _work_wire._decode(data) == generic_decode(data), name
        for edited in edits(data):
            assert outcome(_work_wire.decode_work_response, edited) == outcome(
                generic_decode, edited
            ), (name, edited.hex())


def test_oversized_varints_are_cut_to_their_field_s_width() -> None:
    """Example (same answer): a varint wider than its field — a request id
    past 64 bits, an attempt, max_attempts, priority or state past 32 — is
    cut to the field's width, as protobuf says and the generic decoder does,
    on the fast path."""
    wide = b"\xff" * 9 + b"\x7f"  # 2**70 - 1: ten bytes, the most a varint has
    result = _field(3, b"\x08" + wide)
    task_fields = b"".join(bytes((number << 3,)) + wide for number in (6, 7, 8, 9))
    push = _push(_field(1, b"t") + task_fields, encode(_plain(_LEASE)))
    for data in (result, push):
        decoded = _work_wire._decode(data)
        assert decoded == generic_decode(data)
    assert _work_wire._decode(result).request_id == 2**64 - 1  # type: ignore[union-attr]


def test_a_push_without_its_task_or_its_lease_is_no_push() -> None:
    """Example: a push missing its lease or its task is not read as a task
    (there is nothing to run, or no lease to settle it with): the frame
    comes back as the decoded `WorkResponse`, for the worker to refuse, and
    inside a batch it is a `ValueError` naming the element."""
    task = Task(id="t", queue="q", task_type="x")
    for leased in (LeasedTask(task=task), LeasedTask(lease=_plain(_LEASE)), LeasedTask()):
        frame = WorkResponse(task=leased)
        assert _work_wire.decode_work_response(encode(frame)) == frame
        batch = WorkResponse(batch=WorkResponseBatch(responses=[_RESULT, frame]))
        with pytest.raises(ValueError, match=r"batch\.responses\[1\]"):
            _work_wire.decode_work_response(encode(batch))


def test_a_ttl_finer_than_a_microsecond_reads_as_the_generic_decoder_reads_it() -> None:
    """Example (same answer): nanoseconds that are no whole microsecond,
    below one microsecond and above, either sign, give the generic
    decoder's ttl (timedelta rounds half to even) on the fast path."""
    for seconds in (0, 29, -29):
        for nanos in (1, 499, 500, 501, 999, 1_500, 2_500, 999_999_999):
            nanos = -nanos if seconds < 0 else nanos
            ttl = _field(6, b"\x08" + varint(seconds) + b"\x10" + varint(nanos))
            lease = encode(_plain(Lease(task_id="t", attempt=1, lease_token="k"))) + ttl
            data = _push(encode(Task(id="t")), lease)
            assert _work_wire._decode(data) == generic_decode(data), (seconds, nanos)


def test_a_priority_reads_as_its_int32_at_every_sign_bit() -> None:
    """Example (same answer): an int32 priority at each bit that could be
    taken for its sign (bits 30 and 31, both ends of the range) is read on
    the fast path as the generic decoder reads it."""
    for priority in (-(2**31), -(2**30), -1, 0, 1, 2**30, 2**30 + 5, 2**31 - 1):
        frame = WorkResponse(
            task=LeasedTask(task=Task(id="t", priority=priority), lease=_plain(_LEASE))
        )
        data = encode(frame)
        pushed = _work_wire._decode(data)
        assert pushed == generic_decode(data)
        assert isinstance(pushed, PushedTask)
        assert pushed.task.priority == priority


def test_a_result_s_error_is_read_with_its_code_message_and_reason() -> None:
    """Example: a command result carrying an error is read as that error —
    its code's name and number, its message, the ``reason`` of its metadata,
    the lease's until — never as a success; an error detail whose code is
    unset (0), or none, is a success."""
    failed = WorkResponse(
        result=WorkResult(
            request_id=7,
            error=ErrorDetail(
                code=ErrorCode.LEASE_LOST, message="gone", metadata={"reason": "cancelled"}
            ),
            lease=_plain(_LEASE),
        )
    )
    assert _work_wire.decode_work_response(encode(failed)) == WorkResultFrame(
        7, "LEASE_LOST", "gone", "cancelled", _LEASE.until, int(ErrorCode.LEASE_LOST)
    )
    for detail in (ErrorDetail(message="no code"), None):
        ok = WorkResponse(result=WorkResult(request_id=8, error=detail))
        assert _work_wire.decode_work_response(encode(ok)) == WorkResultFrame(8, "", "", "", None)


def test_fields_of_128_bytes_and_more_take_the_fast_path() -> None:
    """Example (fast path taken, same answer): a push whose every string and
    bytes field, the task's and the lease's, has a two-byte length (128
    bytes and more) is read without the generic decoder, into the value it
    would build; so is a result whose lease has them."""
    long = "x" * 127 + "é" * 100  # 327 bytes of UTF-8
    lease = Lease(task_id=long, attempt=1, lease_token=long + "t", worker_id=long + "w", until=_AT)
    task = Task(
        id=long,
        queue=long + "q",
        task_type=long + "y",
        payload=long.encode() * 2,
        unique_key=long + "u",
        attempt=1,
        last_error=long + "e",
        worker_id=long + "w",
        limit_key=long + "k",
    )
    for frame in (
        WorkResponse(task=LeasedTask(task=task, lease=lease)),
        WorkResponse(result=WorkResult(request_id=2**40, lease=lease)),
    ):
        data = encode(frame)
        assert _work_wire._decode(data) == generic_decode(data)


# -- the commands ----------------------------------------------------------------------

REQUEST_IDS = st.integers(0, 2**64 - 1)
LEASES = st.tuples(
    st.text(max_size=30), st.integers(0, 2**32 - 1), st.text(max_size=40)
)  # task id, attempt, token
TEXTS = st.text(max_size=300)  # past 127 bytes: two-byte lengths


@PROPERTY
@given(REQUEST_IDS, LEASES, st.none() | st.binary(max_size=300))
def test_ack_encodes_byte_equal_to_the_generic_encoder(
    request_id: int, lease: tuple[str, int, str], result: bytes | None
) -> None:
    """Property (same bytes): ack."""
    assert work.encode_ack(request_id, *lease, result) == generic.encode_ack(
        request_id, *lease, result
    )


@PROPERTY
@given(REQUEST_IDS, LEASES, TEXTS, st.none() | DURATIONS)
def test_nack_encodes_byte_equal_to_the_generic_encoder(
    request_id: int, lease: tuple[str, int, str], error: str, delay: timedelta | None
) -> None:
    """Property (same bytes): nack, with and without a retry delay."""
    assert work.encode_nack(request_id, *lease, error, delay) == generic.encode_nack(
        request_id, *lease, error, delay
    )


@PROPERTY
@given(REQUEST_IDS, LEASES, TEXTS)
def test_reject_encodes_byte_equal_to_the_generic_encoder(
    request_id: int, lease: tuple[str, int, str], error: str
) -> None:
    """Property (same bytes): reject."""
    assert work.encode_reject(request_id, *lease, error) == generic.encode_reject(
        request_id, *lease, error
    )


@PROPERTY
@given(REQUEST_IDS, LEASES, DURATIONS)
def test_extend_encodes_byte_equal_to_the_generic_encoder(
    request_id: int, lease: tuple[str, int, str], extension: timedelta
) -> None:
    """Property (same bytes): extend."""
    assert work.encode_extend(request_id, *lease, extension) == generic.encode_extend(
        request_id, *lease, extension
    )


COUNTS = st.integers(0, 2**32 - 1)


@PROPERTY
@given(REQUEST_IDS, COUNTS, st.none() | COUNTS, st.none() | COUNTS)
def test_credit_encodes_byte_equal_to_the_generic_encoder(
    request_id: int, available: int, target: int | None, grant: int | None
) -> None:
    """Property (same bytes): credit, absolute or a grant, with and without a
    target (a zero target or grant is still sent: both fields are optional)."""
    assert work.encode_credit(request_id, available, target, grant) == generic.encode_credit(
        request_id, available, target, grant
    )

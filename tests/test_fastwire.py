"""`ringo_trio._fastwire` against betterproto2, the reference it replaces.

Encoders must be byte-identical to ``bytes(message)``; decoders must give
exactly what the SDK builds from ``Message.parse`` plus the ``_models``
conversions, and must turn every malformed input into `ValueError`.
Comparisons of decoded values go through ``repr`` so that NaN, ``-0.0`` and
the timezone of a datetime count.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, TypeVar, cast

import betterproto2
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ringo_trio import _fastwire as fw
from ringo_trio import _models as models
from ringo_trio._errors import InvalidArgumentError
from ringo_trio._limits import MAX_DELAY, MAX_NOT_BEFORE
from ringo_trio._proto.google.protobuf import Duration, Timestamp
from ringo_trio._proto.ringo.v1 import (
    AckRequest,
    CreditUpdate,
    EnqueueManyRequest,
    EnqueueManyResponse,
    EnqueueResult,
    ErrorCode,
    ErrorDetail,
    ExtendLeaseRequest,
    Heartbeat,
    Lease,
    LeasedTask,
    LeaseRef,
    NackRequest,
    Progress,
    RejectRequest,
    RequestContext,
    RetryBackoff,
    Task,
    TaskSpec,
    TaskState,
    WorkerRegistered,
    WorkRequest,
    WorkResponse,
    WorkResult,
)

M = TypeVar("M", bound=betterproto2.Message)

# Generous deadlines: betterproto2 itself takes ~0.1-0.2 ms per message.
PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- strategies --------------------------------------------------------------------

U32 = st.integers(0, 2**32 - 1)
U64 = st.integers(0, 2**64 - 1)
I32 = st.integers(-(2**31), 2**31 - 1)
TEXT = st.text(st.characters(codec="utf-8"), max_size=40)
BLOB = st.binary(max_size=200)
DOUBLES = st.floats()  # NaN, infinities, -0.0 included
UTC_DATETIMES = st.datetimes(timezones=st.just(UTC))  # year 1 to 9999, microseconds
OFFSET_DATETIMES = st.datetimes(
    min_value=datetime(1, 1, 2),
    max_value=datetime(9999, 12, 30),
    timezones=st.integers(-(24 * 60 - 1), 24 * 60 - 1).map(
        lambda minutes: timezone(timedelta(minutes=minutes))
    ),
)
DATETIMES = st.one_of(
    UTC_DATETIMES,
    OFFSET_DATETIMES,
    st.sampled_from(
        [
            datetime(1970, 1, 1, tzinfo=UTC),
            datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
            datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
            datetime(1, 1, 1, tzinfo=UTC),
            datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        ]
    ),
)
DURATION_EDGES = [
    timedelta(0),
    timedelta(microseconds=1),
    timedelta(microseconds=-1),
    timedelta(seconds=-1, microseconds=1),
    timedelta(days=36_499, seconds=86_399, microseconds=999_999),
    timedelta(days=36_500),
    timedelta(days=-1),
    timedelta.max,
    timedelta.min,
]
DURATIONS = st.one_of(st.timedeltas(), st.sampled_from(DURATION_EDGES))
NON_NEGATIVE_DURATIONS = st.timedeltas(min_value=timedelta(0))
# What the SDK's validation accepts (`_limits.MAX_DELAY`, `MAX_NOT_BEFORE`).
SPEC_DURATIONS = st.timedeltas(min_value=timedelta(0), max_value=MAX_DELAY)
SPEC_DATETIMES = DATETIMES.filter(lambda moment: moment <= MAX_NOT_BEFORE)
# betterproto2's float arithmetic is lossless below 2**53 µs (~285 years).
LOSSLESS_DURATIONS = st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=100_000))
TASK_STATES = st.one_of(st.sampled_from(list(TaskState)), I32.map(TaskState))
ERROR_CODES = st.one_of(st.sampled_from(list(ErrorCode)), I32.map(ErrorCode))


@st.composite
def unknown_fields(draw: st.DrawFn) -> bytes:
    """Well-formed fields of numbers no message here uses."""
    out = b""
    for _ in range(draw(st.integers(1, 3))):
        number = draw(st.integers(100, 2**29 - 1))
        wire_type = draw(st.sampled_from([0, 1, 2, 5]))
        out += betterproto2.encode_varint(number << 3 | wire_type)
        if wire_type == 0:
            out += betterproto2.encode_varint(draw(U64))
        elif wire_type == 1:
            out += draw(st.binary(min_size=8, max_size=8))
        elif wire_type == 5:
            out += draw(st.binary(min_size=4, max_size=4))
        else:
            data = draw(st.binary(max_size=20))
            out += betterproto2.encode_varint(len(data)) + data
    return out


UNKNOWN = st.one_of(st.just(b""), st.just(b""), unknown_fields())


def _set_unknown(pair: tuple[M, bytes]) -> M:
    message, raw = pair
    message._unknown_fields = raw
    return message


def with_unknown(strategy: st.SearchStrategy[M]) -> st.SearchStrategy[M]:
    return st.tuples(strategy, UNKNOWN).map(_set_unknown)


def opt(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), strategy)


def backoffs(durations: st.SearchStrategy[timedelta] = DURATIONS) -> st.SearchStrategy[Any]:
    return with_unknown(
        st.builds(
            RetryBackoff,
            initial=opt(durations),
            maximum=opt(durations),
            multiplier=st.one_of(st.just(0.0), DOUBLES),
        )
    )


PROGRESSES = with_unknown(
    st.builds(Progress, current=DOUBLES, total=DOUBLES, message=TEXT, updated_at=opt(DATETIMES))
)


def tasks(
    durations: st.SearchStrategy[timedelta] = DURATIONS,
    progresses: st.SearchStrategy[Any] = PROGRESSES,
) -> st.SearchStrategy[Task]:
    return with_unknown(
        st.builds(
            Task,
            id=TEXT,
            queue=TEXT,
            task_type=TEXT,
            payload=BLOB,
            unique_key=TEXT,
            state=TASK_STATES,
            attempt=U32,
            max_attempts=U32,
            priority=I32,
            retry_backoff=opt(backoffs(durations)),
            created_at=opt(DATETIMES),
            updated_at=opt(DATETIMES),
            available_at=opt(DATETIMES),
            finished_at=opt(DATETIMES),
            last_error=TEXT,
            progress=opt(progresses),
            worker_id=TEXT,
            lease_until=opt(DATETIMES),
        )
    )


TASKS = tasks()
LEASES = with_unknown(
    st.builds(
        Lease, task_id=TEXT, attempt=U32, lease_token=TEXT, worker_id=TEXT, until=opt(DATETIMES)
    )
)
LEASED = with_unknown(st.builds(LeasedTask, task=opt(TASKS), lease=opt(LEASES)))
FULL_LEASED = with_unknown(st.builds(LeasedTask, task=TASKS, lease=LEASES))
METADATA = st.dictionaries(st.one_of(st.sampled_from(["reason", "field"]), TEXT), TEXT, max_size=4)
ERRORS = with_unknown(st.builds(ErrorDetail, code=ERROR_CODES, message=TEXT, metadata=METADATA))
CONTEXTS = with_unknown(
    st.builds(RequestContext, protocol_major=U32, protocol_minor=U32, session_token=TEXT)
)
SPECS = with_unknown(
    st.builds(
        TaskSpec,
        task_type=TEXT,
        payload=BLOB,
        unique_key=TEXT,
        max_attempts=U32,
        retry_backoff=opt(backoffs()),
        delay=opt(DURATIONS),
        not_before=opt(DATETIMES),
        priority=I32,
    )
)
RESULTS = st.lists(st.tuples(TASKS, st.booleans()), max_size=4)


@st.composite
def model_specs(
    draw: st.DrawFn, durations: st.SearchStrategy[timedelta] = SPEC_DURATIONS
) -> models.TaskSpec:
    """Any spec the SDK's validation accepts."""
    name = st.text(st.characters(codec="utf-8"), min_size=1, max_size=30)
    backoff = None
    if draw(st.booleans()):
        low, high = sorted(draw(st.lists(durations, min_size=2, max_size=2)))
        multiplier = draw(st.one_of(st.integers(1, 1000), st.floats(1.0, 1000.0, allow_nan=False)))
        backoff = models.RetryBackoff(initial=low, maximum=high, multiplier=multiplier)
    when = draw(st.sampled_from(["none", "delay", "not_before"]))
    return models.TaskSpec(
        task_type=draw(name),
        payload=draw(BLOB),
        unique_key=draw(opt(name)),
        max_attempts=draw(opt(st.integers(1, 10_000))),
        retry_backoff=backoff,
        delay=draw(durations) if when == "delay" else None,
        not_before=draw(SPEC_DATETIMES) if when == "not_before" else None,
        priority=draw(I32),
    )


# -- the reference paths -----------------------------------------------------------


def sdk_work_view(data: bytes) -> object:
    """What the SDK's Work reader (`_worker._Worker._read`) takes from a frame today."""
    response = WorkResponse.parse(data)
    result = response.result
    if result is not None:
        detail = result.error
        error = None
        if detail is not None and detail.code:
            error = (detail.code.name, detail.message, detail.metadata.get("reason", ""))
        until = result.lease.until if result.lease is not None else None
        return ("result", result.request_id, error, until)
    leased = response.task
    if leased is not None and leased.task is not None and leased.lease is not None:
        lease = leased.lease
        task = models.Task.from_wire(leased.task)
        return (
            "task",
            task,
            lease.task_id,
            lease.attempt,
            lease.lease_token,
            lease.worker_id,
            lease.until,
        )
    return None


def fast_work_view(data: bytes) -> object:
    frame = fw.decode_work_response(data)
    if isinstance(frame, fw.WorkResultFrame):
        error = (frame.error_code, frame.error_message, frame.reason) if frame.error_value else None
        return ("result", frame.request_id, error, frame.lease_until)
    if isinstance(frame, fw.PushedTask):
        return (
            "task",
            frame.task,
            frame.task_id,
            frame.attempt,
            frame.lease_token,
            frame.worker_id,
            frame.until,
        )
    assert frame is None
    return None


def sdk_batch(data: bytes) -> models.BatchResult:
    """What `TaskQueue.enqueue_many` builds from one reply today."""
    reply = EnqueueManyResponse.parse(data)
    return models.BatchResult(
        results=tuple(models.EnqueueResult.from_wire(r) for r in reply.results),
        created_count=reply.created_count,
        duplicate_count=reply.duplicate_count,
    )


def assert_same(fast: object, reference: object) -> None:
    assert repr(fast) == repr(reference)


def assert_equivalent(
    fast: Callable[[bytes], object], reference: Callable[[bytes], object], data: bytes
) -> None:
    """fast(data) is reference(data); or ValueError where the reference overflows (a
    Timestamp/Duration outside datetime's range: betterproto2 encodes ``timedelta.max``
    as a Duration it cannot decode)."""
    try:
        expected = reference(data)
    except OverflowError:
        with pytest.raises(ValueError, match="range"):
            fast(data)
    else:
        assert_same(fast(data), expected)


def assert_work_equivalent(data: bytes) -> None:
    """As assert_equivalent for Work frames, where None means "the caller falls back to
    WorkResponse.parse": where that parse overflows, fastwire raises or falls back."""
    try:
        expected = sdk_work_view(data)
    except OverflowError:
        outcome: object
        try:
            outcome = fw.decode_work_response(data)
        except ValueError as exc:
            outcome = str(exc)
        assert outcome is None or "range" in str(outcome)
    else:
        assert_same(fast_work_view(data), expected)


def ld(tag: bytes, body: bytes) -> bytes:
    return tag + betterproto2.encode_varint(len(body)) + body


def split_fields(data: bytes) -> list[bytes]:
    """The raw top-level fields of a well-formed message (test-local parser)."""
    return [field.raw for field in betterproto2.parse_fields(data)]


# -- encoders: byte-identical -------------------------------------------------------


@PROPERTY
@given(TASKS)
def test_encode_task_is_bytes_of_task(task: Task) -> None:
    """Property: encode_task(t) == bytes(t) for every Task."""
    assert fw.encode_task(task) == bytes(task)


@PROPERTY
@given(LEASED)
def test_encode_work_push_is_bytes_of_work_response(leased: LeasedTask) -> None:
    """Property: encode_work_push(lt) == bytes(WorkResponse(task=lt)), task/lease None or set."""
    assert fw.encode_work_push(leased) == bytes(WorkResponse(task=leased))


@PROPERTY
@given(U64, opt(ERRORS), opt(LEASES))
def test_encode_work_result_is_bytes_of_work_response(
    request_id: int, error: ErrorDetail | None, lease: Lease | None
) -> None:
    """Property: encode_work_result(...) == bytes(WorkResponse(result=WorkResult(...)))."""
    expected = bytes(
        WorkResponse(result=WorkResult(request_id=request_id, error=error, lease=lease))
    )
    assert fw.encode_work_result(request_id, error, lease) == expected


@PROPERTY
@given(RESULTS, U32, U32)
def test_encode_enqueue_many_response_is_bytes_of_message(
    results: list[tuple[Task, bool]], created: int, duplicates: int
) -> None:
    """Property: encode_enqueue_many_response == bytes(EnqueueManyResponse(...))."""
    expected = bytes(
        EnqueueManyResponse(
            results=[EnqueueResult(task=t, created=c) for t, c in results],
            created_count=created,
            duplicate_count=duplicates,
        )
    )
    assert fw.encode_enqueue_many_response(results, created, duplicates) == expected


@PROPERTY
@given(U64, U32, opt(U32))
def test_encode_credit_is_bytes_of_work_request(
    request_id: int, available: int, target: int | None
) -> None:
    """Property: encode_credit == bytes(WorkRequest(credit=CreditUpdate(...))), optional target."""
    expected = bytes(
        WorkRequest(
            request_id=request_id,
            credit=CreditUpdate(available=available, target_concurrency=target),
        )
    )
    assert fw.encode_credit(request_id, available, target) == expected


@PROPERTY
@given(U64, TEXT, U32, TEXT, TEXT, opt(DURATIONS), DURATIONS)
def test_encode_settle_and_extend_are_bytes_of_work_requests(
    request_id: int,
    task_id: str,
    attempt: int,
    token: str,
    error: str,
    retry_delay: timedelta | None,
    extension: timedelta,
) -> None:
    """Property: encode_ack/nack/reject/extend == bytes(WorkRequest(...)) of the same command."""
    ref = LeaseRef(task_id=task_id, attempt=attempt, lease_token=token)
    ack = WorkRequest(request_id=request_id, ack=AckRequest(lease=ref))
    nack = WorkRequest(
        request_id=request_id,
        nack=NackRequest(lease=ref, error=error, retry_delay_override=retry_delay),
    )
    reject = WorkRequest(request_id=request_id, reject=RejectRequest(lease=ref, error=error))
    extend = WorkRequest(
        request_id=request_id,
        extend_lease=ExtendLeaseRequest(lease=ref, extension=extension),
    )
    assert fw.encode_ack(request_id, task_id, attempt, token) == bytes(ack)
    assert fw.encode_nack(request_id, task_id, attempt, token, error, retry_delay) == bytes(nack)
    assert fw.encode_reject(request_id, task_id, attempt, token, error) == bytes(reject)
    assert fw.encode_extend(request_id, task_id, attempt, token, extension) == bytes(extend)


@PROPERTY
@given(opt(CONTEXTS), TEXT, st.lists(SPECS, max_size=4))
def test_encode_enqueue_many_request_is_bytes_of_message(
    context: RequestContext | None, queue: str, specs: list[TaskSpec]
) -> None:
    """Property: encode_enqueue_many_request == bytes(EnqueueManyRequest(...))."""
    expected = bytes(EnqueueManyRequest(context=context, queue=queue, tasks=specs))
    assert fw.encode_enqueue_many_request(context, queue, specs) == expected


@PROPERTY
@given(opt(CONTEXTS), TEXT, st.lists(model_specs(), max_size=4))
def test_encode_from_model_specs_is_bytes_of_to_wire_request(
    context: RequestContext | None, queue: str, specs: list[models.TaskSpec]
) -> None:
    """Property: encoding SDK specs directly == bytes of the request built with to_wire()."""
    expected = bytes(
        EnqueueManyRequest(context=context, queue=queue, tasks=[s.to_wire() for s in specs])
    )
    assert fw.encode_enqueue_many_request_from_specs(context, queue, specs) == expected


@FUZZ
@given(DATETIMES)
def test_timestamp_is_betterproto_timestamp(moment: datetime) -> None:
    """Property: the Timestamp of any aware datetime is Timestamp.from_datetime's, byte for byte."""
    body = bytes(Timestamp.from_datetime(moment))
    assert fw._timestamp(moment) == bytes([len(body)]) + body


@FUZZ
@given(DURATIONS)
@example(timedelta(days=36_499, seconds=86_399, microseconds=999_999))
@example(timedelta(days=36_500, microseconds=-1))
def test_duration_is_betterproto_duration(delta: timedelta) -> None:
    """Property: the Duration of any timedelta is Duration.from_timedelta's (float arithmetic
    included), on both sides of the integer fast path's bound."""
    body = bytes(Duration.from_timedelta(delta))
    assert fw._duration(delta) == bytes([len(body)]) + body


@FUZZ
@given(st.integers(-(2**63), 2**70))
def test_varint_is_betterproto_varint(value: int) -> None:
    """Property: _varint(v) == betterproto2.encode_varint(v) (negatives: 10-byte complement)."""
    assert fw._varint(value) == betterproto2.encode_varint(value)


def test_varint_below_int64_is_refused_like_betterproto() -> None:
    """Example: a value below -2**63 fits no varint; both refuse it with ValueError."""
    with pytest.raises(ValueError, match="64-bit"):
        betterproto2.encode_varint(-(2**63) - 1)
    with pytest.raises(ValueError, match="64-bit"):
        fw._varint(-(2**63) - 1)


def test_naive_datetime_is_refused() -> None:
    """Example: a naive datetime has no Timestamp (betterproto2 refuses it too)."""
    with pytest.raises(ValueError, match="timezone aware"):
        bytes(Task(created_at=datetime(2025, 1, 1)))
    with pytest.raises(ValueError, match="timezone aware"):
        fw.encode_task(Task(created_at=datetime(2025, 1, 1)))


@pytest.mark.parametrize(
    ("message", "encoded"),
    [
        # proto3 implicit presence: -0.0 == 0.0 is skipped, NaN != 0.0 is written.
        (Progress(current=-0.0), b""),
        (Progress(current=float("nan")), b"\x09" + b"\x00\x00\x00\x00\x00\x00\xf8\x7f"),
        # A set sub-message is written even when empty.
        (Task(progress=Progress()), b"\x82\x01\x00"),
        (Task(created_at=datetime(1970, 1, 1, tzinfo=UTC)), b"\x5a\x00"),
        # int32 -1 is a 10-byte varint.
        (Task(priority=-1), b"\x48" + b"\xff" * 9 + b"\x01"),
        # A negative duration goes through float modulo: -1 µs becomes +0.999999 s.
        (RetryBackoff(initial=timedelta(microseconds=-1)), b"\x0a\x06\x10\x98\x8c\xeb\xdc\x03"),
        (RetryBackoff(multiplier=-0.0), b""),
        (RetryBackoff(multiplier=float("nan")), b"\x19" + b"\x00\x00\x00\x00\x00\x00\xf8\x7f"),
        # Map entries always carry key and value, in dict order (not sorted).
        (ErrorDetail(metadata={"": ""}), b"\x1a\x04\x0a\x00\x12\x00"),
        (
            ErrorDetail(metadata={"z": "", "a": ""}),
            b"\x1a\x05\x0a\x01z\x12\x00\x1a\x05\x0a\x01a\x12\x00",
        ),
    ],
)
def test_betterproto_quirks_are_reproduced(message: betterproto2.Message, encoded: bytes) -> None:
    """Examples: the betterproto2 encoding quirks the codec reproduces, pinned."""
    assert bytes(message) == encoded
    if isinstance(message, Task):
        assert fw.encode_task(message) == encoded
    elif isinstance(message, Progress):
        assert bytes(fw._progress_body(message, {})) == encoded
    elif isinstance(message, RetryBackoff):
        assert bytes(fw._backoff_body(message)) == encoded
    else:
        assert isinstance(message, ErrorDetail)
        assert bytes(fw._error_body(message)) == encoded


def test_credit_target_zero_is_present() -> None:
    """Example: optional target_concurrency=0 is written (explicit presence), None is not."""
    assert fw.encode_credit(1, 2, 0) == b"\x08\x01\x1a\x04\x08\x02\x10\x00"
    assert fw.encode_credit(1, 2, None) == b"\x08\x01\x1a\x02\x08\x02"


# -- decoders: equal to the betterproto2 path -----------------------------------------

WORK_RESPONSES = st.one_of(
    FULL_LEASED.map(lambda leased: WorkResponse(task=leased)),
    LEASED.map(lambda leased: WorkResponse(task=leased)),
    st.builds(
        lambda request_id, error, lease: WorkResponse(
            result=WorkResult(request_id=request_id, error=error, lease=lease)
        ),
        U64,
        opt(ERRORS),
        opt(LEASES),
    ),
    st.builds(
        lambda duration, concurrency, ordered, worker_id: WorkResponse(
            registered=WorkerRegistered(
                lease_duration=duration,
                max_concurrency=concurrency,
                ordered_request_ids=ordered,
                worker_id=worker_id,
            )
        ),
        opt(DURATIONS),
        U32,
        st.booleans(),
        TEXT,
    ),
    opt(DATETIMES).map(lambda now: WorkResponse(heartbeat=Heartbeat(server_time=now))),
    st.just(WorkResponse()),
)


@PROPERTY
@given(with_unknown(WORK_RESPONSES))
def test_decode_work_response_matches_sdk_path(response: WorkResponse) -> None:
    """Property: for every WorkResponse, decode_work_response gives what the SDK takes from
    WorkResponse.parse + Task.from_wire (and None for registered/heartbeat/empty frames)."""
    data = bytes(response)
    assert_work_equivalent(data)


@PROPERTY
@given(FULL_LEASED)
def test_full_push_never_falls_back(leased: LeasedTask) -> None:
    """Property: a task frame with task and lease decodes to a PushedTask (never None)."""
    data = fw.encode_work_push(leased)
    assert_work_equivalent(data)
    # ValueError only for a Duration betterproto2 cannot decode either (checked above).
    with contextlib.suppress(ValueError):
        assert isinstance(fw.decode_work_response(data), fw.PushedTask)


@PROPERTY
@given(st.lists(WORK_RESPONSES, min_size=2, max_size=3))
@example(
    [
        WorkResponse(registered=WorkerRegistered(lease_duration=timedelta.max)),
        WorkResponse(task=LeasedTask(task=Task(), lease=Lease())),
    ]
)
def test_decode_concatenated_frames_like_betterproto(responses: list[WorkResponse]) -> None:
    """Property: concatenated encodings (repeated singular fields, several oneof members)
    decode as betterproto2 parses them: the last occurrence wins, result before task."""
    data = b"".join(bytes(r) for r in responses)
    assert_work_equivalent(data)


@PROPERTY
@given(TASKS, LEASES, st.randoms(use_true_random=False), st.booleans())
def test_decode_fields_in_any_order(task: Task, lease: Lease, rnd: Any, lease_first: bool) -> None:
    """Property: fields in any order (here: a shuffled Task body, lease before task) decode
    as betterproto2 parses them."""
    fields = split_fields(bytes(task))
    rnd.shuffle(fields)
    parts = [ld(b"\x0a", b"".join(fields)), ld(b"\x12", bytes(lease))]
    if lease_first:
        parts.reverse()
    data = ld(b"\x12", b"".join(parts))
    assert_work_equivalent(data)


@PROPERTY
@given(TASKS, TASKS, LEASES)
def test_decode_merged_task_bodies_like_betterproto(
    first: Task, second: Task, lease: Lease
) -> None:
    """Property: a Task body made of two encodings (protobuf's merge) decodes like
    betterproto2: a scalar the second one sets wins, a sub-message is replaced whole."""
    body = ld(b"\x0a", bytes(first) + bytes(second)) + ld(b"\x12", bytes(lease))
    assert_work_equivalent(ld(b"\x12", body))


_UNDECODABLE = LeasedTask(
    task=Task(retry_backoff=RetryBackoff(maximum=timedelta.max)), lease=Lease(until=None)
)


@PROPERTY
@given(FULL_LEASED, FULL_LEASED)
@example(_UNDECODABLE, LeasedTask(task=Task(), lease=Lease()))
def test_decode_replaced_occurrences_like_betterproto(
    first: LeasedTask, second: LeasedTask
) -> None:
    """Property: a LeasedTask body carrying task and lease twice decodes like betterproto2:
    the last occurrence wins, yet an undecodable earlier one fails the frame (betterproto2
    decodes every occurrence)."""
    assert_work_equivalent(ld(b"\x12", bytes(first) + bytes(second)))


@PROPERTY
@given(st.integers(0, 2**34), st.integers(0, 34), st.sampled_from([0, 0, 1, 999_999]))
def test_timestamps_one_bit_apart_decode_apart(seconds: int, bit: int, micros: int) -> None:
    """Property: timestamps whose encodings differ in one bit of any varint byte (the last
    included) decode to their own values: the per-frame Timestamp memo keys exactly."""
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    first = epoch + timedelta(seconds=seconds, microseconds=micros)
    second = epoch + timedelta(seconds=seconds ^ (1 << bit), microseconds=micros)
    task = Task(created_at=first, updated_at=second, available_at=first, lease_until=second)
    leased = LeasedTask(task=task, lease=Lease(until=second))
    data = fw.encode_work_push(leased)
    assert data == bytes(WorkResponse(task=leased))
    assert_work_equivalent(data)


@PROPERTY
@given(DOUBLES, st.integers(0, 63), opt(DURATIONS))
def test_backoffs_one_bit_apart_decode_apart(
    multiplier: float, bit: int, initial: timedelta | None
) -> None:
    """Property: two backoffs whose multipliers differ in one bit (the last byte of the body
    included) decode to their own values: the shared RetryBackoff memo keys exactly."""
    (raw,) = struct.unpack("<Q", struct.pack("<d", multiplier))
    (other,) = struct.unpack("<d", struct.pack("<Q", raw ^ (1 << bit)))
    results = [
        (Task(id=str(i), retry_backoff=RetryBackoff(initial, initial, m)), True)
        for i, m in enumerate((multiplier, other))
    ]
    data = fw.encode_enqueue_many_response(results, 2, 0)
    assert_equivalent(fw.decode_enqueue_many_response, sdk_batch, data)


WIDE = st.integers(0, 2**70 - 1)


@PROPERTY
@given(WIDE, WIDE, WIDE, WIDE, WIDE, WIDE, WIDE, WIDE, WIDE)
# Bits beyond 64 whose low 64 bits are a known value (TaskState 2, ErrorCode 3, ...).
@example(2**64 + 2, 2**64 + 1, 2**40, 2**63, 2**32 + 5, 2**64 - 1, 2**35, 2**64 + 3, 2**64 + 3)
def test_decode_wide_varints_like_betterproto(
    state: int,
    attempt: int,
    max_attempts: int,
    priority: int,
    lease_attempt: int,
    seconds: int,
    nanos: int,
    request_id: int,
    code: int,
) -> None:
    """Property: varints of up to 10 bytes (bits beyond the field's width, negative int32 and
    enum values) are truncated and sign-converted exactly as betterproto2 does."""
    varint = betterproto2.encode_varint
    task_body = (
        b"\x30" + varint(state)
        + b"\x38" + varint(attempt)
        + b"\x40" + varint(max_attempts)
        + b"\x48" + varint(priority)
    )  # fmt: skip
    lease_body = b"\x10" + varint(lease_attempt)
    push = ld(b"\x12", ld(b"\x0a", task_body) + ld(b"\x12", lease_body))
    assert_work_equivalent(push)
    result = ld(b"\x1a", b"\x08" + varint(request_id) + ld(b"\x12", b"\x08" + varint(code)))
    assert_work_equivalent(result)
    entry = ld(b"\x0a", ld(b"\x0a", task_body) + b"\x10" + varint(state))
    batch = entry + b"\x10" + varint(attempt) + b"\x18" + varint(max_attempts)
    assert_equivalent(fw.decode_enqueue_many_response, sdk_batch, batch)
    # A Timestamp of arbitrary int64 seconds / int32 nanos.
    ts = ld(b"\x5a", b"\x08" + varint(seconds) + b"\x10" + varint(nanos))
    stamped = ld(b"\x12", ld(b"\x0a", ts) + ld(b"\x12", b""))
    assert_work_equivalent(stamped)


@FUZZ
@given(st.integers(-(2**63), 2**63 - 1), st.integers(-(2**31), 2**31 - 1))
@example(0, 1500)
@example(0, 2500)
@example(-1, -1)
@example(86_400 * 999_999_999, 0)
def test_decode_durations_like_betterproto(seconds: int, nanos: int) -> None:
    """Property: any Duration decodes to Duration.to_timedelta's value (float microseconds
    rounded half-even), or ValueError where betterproto2 overflows."""
    body = bytes(Duration(seconds=seconds, nanos=nanos))
    data = ld(b"\x0a", body)
    try:
        expected = Duration.parse(body).to_timedelta()
    except OverflowError:
        with pytest.raises(ValueError, match="range"):
            fw._read_duration(data, 1, len(data))
    else:
        assert fw._read_duration(data, 1, len(data)) == (expected, len(data))


@PROPERTY
@given(st.lists(st.tuples(TASKS, st.booleans()), max_size=4), U32, U32, UNKNOWN)
def test_decode_enqueue_many_response_matches_sdk_path(
    results: list[tuple[Task, bool]], created: int, duplicates: int, unknown: bytes
) -> None:
    """Property: decode_enqueue_many_response(data) == the BatchResult the SDK builds from
    EnqueueManyResponse.parse(data)."""
    message = EnqueueManyResponse(
        results=[EnqueueResult(task=t, created=c) for t, c in results],
        created_count=created,
        duplicate_count=duplicates,
    )
    message._unknown_fields = unknown
    data = bytes(message)
    assert_equivalent(fw.decode_enqueue_many_response, sdk_batch, data)


@PROPERTY
@given(
    st.lists(st.lists(st.tuples(TASKS, st.booleans()), max_size=2), min_size=2, max_size=3),
    st.lists(U32, min_size=3, max_size=3),
)
def test_decode_concatenated_enqueue_many_like_betterproto(
    parts: list[list[tuple[Task, bool]]], counts: list[int]
) -> None:
    """Property: concatenated replies decode like betterproto2: results accumulate, the last
    non-zero count wins."""
    data = b"".join(
        fw.encode_enqueue_many_response(results, count, count // 2)
        for results, count in zip(parts, counts, strict=False)
    )
    assert_equivalent(fw.decode_enqueue_many_response, sdk_batch, data)


@pytest.mark.parametrize("size", [0, 127, 128, 16_383, 16_384, 2**21])
def test_multi_byte_lengths(size: int) -> None:
    """Examples: payloads and strings whose lengths take 1 to 4 varint bytes encode and
    decode like betterproto2."""
    task = Task(id="é" * (size // 64), payload=b"\x00" * size, last_error="x" * (size // 2))
    assert fw.encode_task(task) == bytes(task)
    leased = LeasedTask(task=task, lease=Lease(lease_token="t" * size))
    data = fw.encode_work_push(leased)
    assert data == bytes(WorkResponse(task=leased))
    assert_work_equivalent(data)


@pytest.mark.parametrize(
    "entries",
    [
        [b"\x0a\x06reason\x12\x01a", b"\x0a\x06reason\x12\x01b"],  # last one wins
        [b"\x0a\x06reason"],  # no value: ""
        [b"\x12\x01v\x0a\x06reason"],  # value before key
        [b"\x0a\x06reason\x12\x01a", b"\x12\x01z"],  # no key: the "" key
        [b"\x0a\x06reason\x12\x01a\xa0\x06\x05"],  # unknown field in the entry
    ],
)
def test_error_metadata_entries_like_betterproto(entries: list[bytes]) -> None:
    """Examples: unusual map entries give the same metadata["reason"] as betterproto2."""
    detail = b"\x08\x03" + b"".join(ld(b"\x1a", entry) for entry in entries)
    data = ld(b"\x1a", b"\x08\x01" + ld(b"\x12", detail))
    assert_work_equivalent(data)


def test_enqueue_result_without_task_is_the_sdk_error() -> None:
    """Example: a result without its task raises the SDK's InvalidArgumentError, as today."""
    data = bytes(EnqueueManyResponse(results=[EnqueueResult(created=True)]))
    with pytest.raises(InvalidArgumentError, match="no task"):
        sdk_batch(data)
    with pytest.raises(InvalidArgumentError, match="no task"):
        fw.decode_enqueue_many_response(data)


def test_decoders_accept_buffers() -> None:
    """Example: bytearray and memoryview inputs decode like bytes."""
    data = fw.encode_work_result(5, None, None)
    assert fw.decode_work_response(bytearray(data)) == fw.decode_work_response(data)
    batch = fw.encode_enqueue_many_response([(Task(id="a"), True)], 1, 0)
    assert fw.decode_enqueue_many_response(memoryview(batch)) == (
        fw.decode_enqueue_many_response(batch)
    )


def test_result_error_codes() -> None:
    """Examples: error_code is the ErrorCode name, "" when unset, UNSPECIFIED or unknown;
    error_value tells them apart."""

    def frame(detail: ErrorDetail | None) -> fw.WorkResultFrame:
        decoded = fw.decode_work_response(fw.encode_work_result(9, detail, None))
        assert isinstance(decoded, fw.WorkResultFrame)
        return decoded

    lost = frame(ErrorDetail(code=ErrorCode.LEASE_LOST, metadata={"reason": "expired"}))
    assert (lost.error_code, lost.error_value, lost.reason) == ("LEASE_LOST", 3, "expired")
    assert (frame(None).error_code, frame(None).error_value) == ("", 0)
    unspecified = frame(ErrorDetail(message="x"))
    assert (unspecified.error_code, unspecified.error_value) == ("", 0)
    unknown = frame(ErrorDetail(code=ErrorCode(-7)))
    assert (unknown.error_code, unknown.error_value) == ("", -7)
    assert ErrorCode(-7).name == ""


# -- round trips -----------------------------------------------------------------------

ROUND_TRIP_TASKS = tasks(
    durations=LOSSLESS_DURATIONS,
    progresses=with_unknown(
        st.builds(
            Progress,
            current=st.floats(allow_nan=False),
            total=st.floats(allow_nan=False),
            message=TEXT,
            updated_at=opt(DATETIMES),
        )
    ),
).filter(
    lambda t: t.retry_backoff is None or t.retry_backoff.multiplier == t.retry_backoff.multiplier
)


@PROPERTY
@given(ROUND_TRIP_TASKS, LEASES)
def test_push_round_trip(task: Task, lease: Lease) -> None:
    """Property: decode(encode_work_push(lt)) == Task.from_wire(lt.task) and lt.lease, for
    durations betterproto2 can round-trip (non-negative, below 2**53 µs)."""
    frame = fw.decode_work_response(fw.encode_work_push(LeasedTask(task=task, lease=lease)))
    assert isinstance(frame, fw.PushedTask)
    assert frame.task == models.Task.from_wire(task)
    assert (frame.task_id, frame.attempt, frame.lease_token, frame.worker_id, frame.until) == (
        lease.task_id,
        lease.attempt,
        lease.lease_token,
        lease.worker_id,
        lease.until,
    )


@PROPERTY
@given(U64, opt(ERRORS), opt(LEASES))
def test_result_round_trip(request_id: int, error: ErrorDetail | None, lease: Lease | None) -> None:
    """Property: decode(encode_work_result(id, error, lease)) carries id, code, message, reason
    and lease.until."""
    frame = fw.decode_work_response(fw.encode_work_result(request_id, error, lease))
    assert isinstance(frame, fw.WorkResultFrame)
    assert frame.request_id == request_id
    assert frame.lease_until == (lease.until if lease is not None else None)
    if error is None:
        assert (frame.error_value, frame.error_message, frame.reason) == (0, "", "")
    else:
        assert frame.error_value == int(error.code)
        assert frame.error_code == (error.code.name if error.code else "")
        assert frame.error_message == error.message
        assert frame.reason == error.metadata.get("reason", "")


@PROPERTY
@given(st.lists(st.tuples(ROUND_TRIP_TASKS, st.booleans()), max_size=4), U32, U32)
def test_enqueue_many_response_round_trip(
    results: list[tuple[Task, bool]], created: int, duplicates: int
) -> None:
    """Property: decode(encode_enqueue_many_response(r, c, d)) == BatchResult of r, c, d."""
    batch = fw.decode_enqueue_many_response(
        fw.encode_enqueue_many_response(results, created, duplicates)
    )
    assert batch == models.BatchResult(
        results=tuple(models.EnqueueResult(models.Task.from_wire(t), c) for t, c in results),
        created_count=created,
        duplicate_count=duplicates,
    )


@PROPERTY
# SPEC_DURATIONS (at most MAX_DELAY) are far inside betterproto2's lossless range.
@given(opt(CONTEXTS), TEXT, st.lists(model_specs(), max_size=4))
def test_enqueue_many_request_round_trip(
    context: RequestContext | None, queue: str, specs: list[models.TaskSpec]
) -> None:
    """Property: EnqueueManyRequest.parse(encode(...)) == the request the SDK builds."""
    parsed = EnqueueManyRequest.parse(
        fw.encode_enqueue_many_request_from_specs(context, queue, specs)
    )
    assert parsed == EnqueueManyRequest(
        context=context, queue=queue, tasks=[s.to_wire() for s in specs]
    )


# -- malformed input: ValueError, never garbage, never another exception ---------------

DECODERS: list[Callable[[bytes], object]] = [
    fw.decode_work_response,
    fw.decode_enqueue_many_response,
]


def value_or_value_error(decode: Callable[[bytes], object], data: bytes) -> None:
    with contextlib.suppress(ValueError):
        decode(data)


@FUZZ
@given(with_unknown(WORK_RESPONSES), st.data())
def test_any_prefix_decodes_or_raises_value_error(response: WorkResponse, data: Any) -> None:
    """Property: every prefix of a valid frame decodes or raises ValueError, nothing else."""
    encoded = bytes(response)
    cut = data.draw(st.integers(0, len(encoded)))
    for decode in DECODERS:
        value_or_value_error(decode, encoded[:cut])


@FUZZ
@given(st.lists(st.tuples(TASKS, st.booleans()), max_size=2), st.data())
def test_corrupted_bytes_decode_or_raise_value_error(
    results: list[tuple[Task, bool]], data: Any
) -> None:
    """Property: a valid encoding with any byte replaced, inserted or dropped decodes or
    raises ValueError, nothing else."""
    encoded = bytearray(fw.encode_enqueue_many_response(results, 1, 2))
    index = data.draw(st.integers(0, len(encoded)))
    action = data.draw(st.sampled_from(["replace", "insert", "drop"]))
    byte = data.draw(st.integers(0, 255))
    if action == "insert" or index == len(encoded):
        encoded.insert(index, byte)
    elif action == "replace":
        encoded[index] = byte
    else:
        del encoded[index]
    for decode in DECODERS:
        value_or_value_error(decode, bytes(encoded))


@FUZZ
@given(st.binary(max_size=200))
def test_random_bytes_decode_or_raise_value_error(data: bytes) -> None:
    """Property: arbitrary bytes decode or raise ValueError, nothing else (and terminate)."""
    for decode in DECODERS:
        value_or_value_error(decode, data)


_PUSH_OK = ld(b"\x12", ld(b"\x0a", b"\x0a\x01a") + ld(b"\x12", b""))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param(b"\x12\x05\x0a\x01", "truncated", id="length-past-end"),
        pytest.param(b"\x12\x02\x0a\x05", "truncated", id="nested-length-past-end"),
        pytest.param(b"\x1a\x02\x08\x80", "truncated varint", id="truncated-varint"),
        pytest.param(b"\x1a\x0b\x08" + b"\x80" * 10, "longer than 10", id="11-byte-varint"),
        pytest.param(b"\x12\x04\x0a\x02\x08\x05", "wrong wire type", id="string-as-varint"),
        pytest.param(b"\x1a\x01\x0a", "wrong wire type", id="uint64-as-length"),
        pytest.param(b"\x02\x00", "field number 0", id="field-zero"),
        pytest.param(b"\x0b\x0c", "wire type 3", id="start-group"),
        pytest.param(b"\x0e", "wire type 6", id="reserved-wire-type"),
        pytest.param(b"\xa1\x06\x00\x00", "truncated", id="truncated-fixed64"),
        pytest.param(b"\x09" + b"\x00" * 8, "wrong wire type 1", id="message-as-fixed64"),
        pytest.param(b"\x12\x05\x0a\x03\x0a\x01\xff", "utf-8", id="invalid-utf8"),
        pytest.param(
            b"\x12\x0e\x0a\x0c\x5a\x0a\x08" + b"\xff" * 8 + b"\x7f", "range", id="timestamp-range"
        ),
        pytest.param(b"\x12" + betterproto2.encode_varint(2**64), "truncated", id="huge-length"),
    ],
)
def test_malformed_work_frames_raise_value_error(data: bytes, message: str) -> None:
    """Examples: each kind of malformed frame raises ValueError naming the problem."""
    assert fw.decode_work_response(_PUSH_OK) is not None
    with pytest.raises(ValueError, match=message):
        fw.decode_work_response(data)


def test_malformed_batch_raises_value_error() -> None:
    """Example: a truncated batch reply raises ValueError (betterproto2 silently truncates)."""
    data = fw.encode_enqueue_many_response([(Task(id="abc"), True)], 1, 0)
    with pytest.raises(ValueError, match="truncated"):
        fw.decode_enqueue_many_response(data[:-3])


def test_betterproto_is_lenient_where_fastwire_is_strict() -> None:
    """Examples: what betterproto2 does with malformed input, which fastwire refuses."""
    assert Task.parse(b"\x0a\x05ab").id == "ab"  # length past the end: silently cut
    assert Task.parse(b"\x08\x05").id == 5  # type: ignore[comparison-overlap]  # wrong wire type
    with pytest.raises(EOFError):
        Task.parse(b"\x38")  # truncated varint: not even a ValueError
    for data in (b"\x0a\x05ab", b"\x08\x05", b"\x38"):
        frame = ld(b"\x12", ld(b"\x0a", data) + ld(b"\x12", b""))
        with pytest.raises(ValueError, match=r"truncated|wire type"):
            fw.decode_work_response(frame)


def test_non_canonical_encodings_decode() -> None:
    """Examples: over-long tags, lengths and values (valid protobuf) decode like betterproto2."""
    task = b"\x8a\x00\x01a" + b"\x38\x81\x80\x00" + b"\x9a\x80\x00\x00"  # id, attempt, unique_key
    frame = ld(b"\x12", ld(b"\x0a", task) + b"\x12\x80\x00")
    assert_work_equivalent(frame)
    pushed = fw.decode_work_response(frame)
    assert isinstance(pushed, fw.PushedTask)
    assert (pushed.task.id, pushed.task.attempt) == ("a", 1)


def test_all_decoders_listed() -> None:
    """Meta: every public decode_* function is fuzzed above."""
    public = {name for name in fw.__all__ if name.startswith("decode_")}
    assert public == {decode.__name__ for decode in DECODERS}


# Field name -> (number, proto type) of every message fastwire reads or writes.
_SCHEMAS: dict[type[betterproto2.Message], dict[str, tuple[int, str]]] = {
    Task: {
        "id": (1, "string"),
        "queue": (2, "string"),
        "task_type": (3, "string"),
        "payload": (4, "bytes"),
        "unique_key": (5, "string"),
        "state": (6, "enum"),
        "attempt": (7, "uint32"),
        "max_attempts": (8, "uint32"),
        "priority": (9, "int32"),
        "retry_backoff": (10, "message"),
        "created_at": (11, "message"),
        "updated_at": (12, "message"),
        "available_at": (13, "message"),
        "finished_at": (14, "message"),
        "last_error": (15, "string"),
        "progress": (16, "message"),
        "worker_id": (17, "string"),
        "lease_until": (18, "message"),
        # Minor 9; only a SUCCEEDED task has one, and a push never carries it.
        "result": (19, "bytes"),
    },
    RetryBackoff: {
        "initial": (1, "message"),
        "maximum": (2, "message"),
        "multiplier": (3, "double"),
    },
    Progress: {
        "current": (1, "double"),
        "total": (2, "double"),
        "message": (3, "string"),
        "updated_at": (4, "message"),
    },
    Lease: {
        "task_id": (1, "string"),
        "attempt": (2, "uint32"),
        "lease_token": (3, "string"),
        "worker_id": (4, "string"),
        "until": (5, "message"),
    },
    LeasedTask: {"task": (1, "message"), "lease": (2, "message")},
    LeaseRef: {"task_id": (1, "string"), "attempt": (2, "uint32"), "lease_token": (3, "string")},
    ErrorDetail: {"code": (1, "enum"), "message": (2, "string"), "metadata": (3, "map")},
    WorkResult: {"request_id": (1, "uint64"), "error": (2, "message"), "lease": (3, "message")},
    WorkResponse: {
        "registered": (1, "message"),
        "task": (2, "message"),
        "result": (3, "message"),
        "heartbeat": (4, "message"),
    },
    WorkerRegistered: {
        "lease_duration": (1, "message"),
        "max_concurrency": (2, "uint32"),
        "ordered_request_ids": (3, "bool"),
        "worker_id": (4, "string"),
    },
    Heartbeat: {"server_time": (1, "message")},
    EnqueueResult: {"task": (1, "message"), "created": (2, "bool")},
    EnqueueManyResponse: {
        "results": (1, "message"),
        "created_count": (2, "uint32"),
        "duplicate_count": (3, "uint32"),
    },
    EnqueueManyRequest: {
        "context": (1, "message"),
        "queue": (2, "string"),
        "tasks": (3, "message"),
    },
    RequestContext: {
        "protocol_major": (1, "uint32"),
        "protocol_minor": (2, "uint32"),
        "session_token": (3, "string"),
    },
    TaskSpec: {
        "task_type": (1, "string"),
        "payload": (2, "bytes"),
        "unique_key": (3, "string"),
        "max_attempts": (4, "uint32"),
        "retry_backoff": (5, "message"),
        "delay": (6, "message"),
        "not_before": (7, "message"),
        "priority": (8, "int32"),
    },
    CreditUpdate: {"available": (1, "uint32"), "target_concurrency": (2, "uint32")},
    # result: minor 9; an ack that carries one is encoded by betterproto2.
    AckRequest: {"context": (1, "message"), "lease": (2, "message"), "result": (3, "bytes")},
    NackRequest: {
        "context": (1, "message"),
        "lease": (2, "message"),
        "error": (3, "string"),
        "retry_delay_override": (4, "message"),
    },
    RejectRequest: {"context": (1, "message"), "lease": (2, "message"), "error": (3, "string")},
    ExtendLeaseRequest: {
        "context": (1, "message"),
        "lease": (2, "message"),
        "extension": (3, "message"),
    },
}


@pytest.mark.parametrize("message", list(_SCHEMAS), ids=lambda cls: cls.__name__)
def test_schemas_are_the_ones_fastwire_was_written_for(message: type[betterproto2.Message]) -> None:
    """Pin: the fields of every message fastwire handles. A proto change (a new field
    the strategies above would never generate) fails here first; update the codec, the
    strategies, then this table."""
    meta: Any = cast(Any, message)._betterproto.meta_by_field_name
    actual = {name: (m.number, m.proto_type) for name, m in meta.items()}
    assert actual == _SCHEMAS[message]
    assert cast(Any, WorkRequest)._betterproto.field_name_by_number == {
        1: "request_id",
        2: "register",
        3: "credit",
        4: "ack",
        5: "nack",
        6: "reject",
        7: "extend_lease",
        8: "progress",
        9: "drain",
        # Minor 7; rare (a stopping worker), so encoded by betterproto2, not fastwire.
        10: "release",
    }

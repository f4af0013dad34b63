"""`ringo_trio._queue._batch`: EnqueueMany replies decoded straight into models.

The reference is the generic decoder (tests/_kit/generic_frames.py's
`decode_enqueue_many_response`: the shared codec plus `batch_result`): on any reply, valid or
corrupted, the fast decoder gives the same `BatchResult` or the same error.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ringo_trio._errors import InvalidArgumentError
from ringo_trio._models import TaskSpec as ModelTaskSpec
from ringo_trio._proto.ringo.v1 import (
    EnqueueManyResponse,
    EnqueueResult,
    RequestContext,
    RetryBackoff,
    Task,
)
from ringo_trio._queue import _batch as _batch_wire
from ringo_trio._queue._batch import encode_enqueue_many_request
from ringo_trio._wire.codec import encode
from ringo_trio._wire.primitives import WireError, varint
from ringo_trio.testing.strategies import names, retry_backoffs
from tests._kit.generic_frames import (
    decode_enqueue_many_response,
    encode_enqueue_many_request_from_specs,
)
from tests._kit.wire_strategies import BETTERPROTO_DURATIONS, hot_task, messages, outcome

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Any reply: every field of every level, unknown fields included (most of
# these leave the fast path somewhere; the generic decoder decides).
ANY_REPLY = messages(EnqueueManyResponse, BETTERPROTO_DURATIONS, nan=False)

# What the daemon sends for fresh and most duplicate tasks: fields 1-15 only.


def _fresh(task: Task) -> Task:
    """What an EnqueueMany reply carries: a pushed task's fields, never leased."""
    task = hot_task(task)
    task.worker_id = ""
    task.lease_until = None
    return task


FRESH_REPLY = st.builds(
    lambda results, created, duplicates: EnqueueManyResponse(
        results=[EnqueueResult(task=_fresh(task), created=was) for task, was in results],
        created_count=created,
        duplicate_count=duplicates,
    ),
    st.lists(
        st.tuples(messages(Task, BETTERPROTO_DURATIONS, nan=False), st.booleans()), max_size=5
    ),
    st.integers(0, 2**32 - 1),
    st.integers(0, 2**32 - 1),
)


@PROPERTY
@given(ANY_REPLY)
def test_any_reply_decodes_as_the_generic_decoder_does(reply: EnqueueManyResponse) -> None:
    """Property (same answer): on any reply the result is the generic decoder's."""
    data = encode(reply)
    assert outcome(_batch_wire.decode_enqueue_many_reply, data) == outcome(
        decode_enqueue_many_response, data
    )


@PROPERTY
@given(FRESH_REPLY)
def test_replies_of_fresh_tasks_take_the_fast_path(reply: EnqueueManyResponse) -> None:
    """Property (fast path taken, same answer): replies whose tasks carry fields
    1-15 only — what an enqueue creates — are read without the generic
    decoder, into the very models it would build."""
    data = encode(reply)
    assert _batch_wire._decode(data) == decode_enqueue_many_response(data)


@PROPERTY
@given(st.one_of(ANY_REPLY, FRESH_REPLY), st.data())
def test_corrupted_replies_fail_or_decode_as_the_generic_decoder(
    reply: EnqueueManyResponse, data: st.DataObject
) -> None:
    """Property (same error): a corrupted byte gives the generic decoder's
    result or exactly its error."""
    encoded = bytearray(encode(reply))
    if not encoded:
        return
    for _ in range(data.draw(st.integers(1, 3))):
        index = data.draw(st.integers(0, len(encoded) - 1))
        encoded[index] = data.draw(st.integers(0, 255))
    cut = bytes(encoded[: data.draw(st.integers(0, len(encoded)))])
    for attempt in (bytes(encoded), cut):
        assert outcome(_batch_wire.decode_enqueue_many_reply, attempt) == outcome(
            decode_enqueue_many_response, attempt
        )


# A task's message fields after fields 1-5: one value for each, to send twice.
_MESSAGE_FIELDS = {
    "retry_backoff": RetryBackoff(initial=timedelta(seconds=1), maximum=timedelta(seconds=9)),
    "created_at": datetime(2030, 1, 1, tzinfo=UTC),
    "updated_at": datetime(2030, 1, 2, tzinfo=UTC),
    "available_at": datetime(2030, 1, 3, tzinfo=UTC),
    "finished_at": datetime(2030, 1, 4, tzinfo=UTC),
}


@PROPERTY
@given(messages(Task, BETTERPROTO_DURATIONS, nan=False), st.sampled_from(sorted(_MESSAGE_FIELDS)))
def test_a_message_field_sent_twice_is_refused_as_the_generic_decoder_does(
    task: Task, field: str
) -> None:
    """Property (same error): a task whose backoff or timestamp comes twice is
    refused naming the field, as the generic decoder refuses it; neither copy
    is taken for the task's value (protobuf would merge them, betterproto2
    keep the last)."""
    again = encode(Task(**{field: _MESSAGE_FIELDS[field]}))
    body = encode(_fresh(task)) + again
    result = b"\x0a" + varint(len(body)) + body
    reply = b"\x0a" + varint(len(result)) + result
    refused = outcome(decode_enqueue_many_response, reply)
    if getattr(_fresh(task), field) is not None:
        assert refused == (WireError, f"results[0].task.{field}: message field sent twice")
    assert outcome(_batch_wire.decode_enqueue_many_reply, reply) == refused


def test_a_result_without_its_task_is_refused_as_before() -> None:
    """Example: a result missing its task is the generic decoder's error."""
    data = encode(EnqueueManyResponse(results=[EnqueueResult(created=True)]))
    with pytest.raises(InvalidArgumentError, match="no task"):
        _batch_wire.decode_enqueue_many_reply(data)


def test_repeated_backoffs_are_shared_values() -> None:
    """Example: a 1,000-task reply with one retry policy builds it once (the
    models are frozen, so sharing never changes a result)."""
    task = Task(id="a", queue="q", task_type="t", state=1, max_attempts=3)
    task.retry_backoff = RetryBackoff(
        initial=timedelta(seconds=1), maximum=timedelta(seconds=300), multiplier=2.0
    )
    data = encode(EnqueueManyResponse(results=[EnqueueResult(task=task, created=True)] * 3))
    batch = _batch_wire._decode(data)
    backoffs = {id(result.task.retry_backoff) for result in batch.results}
    assert len(backoffs) == 1
    assert batch == decode_enqueue_many_response(data)


@pytest.mark.parametrize("size", [127, 128, 129, 16_384])
def test_fields_whose_length_takes_a_second_byte_read_as_the_generic_decoder_does(
    size: int,
) -> None:
    """Example (same answer, fast path): a task's id, queue, type, payload and
    unique key of 127 bytes (a one-byte length) and of 128 and more (the
    length's varint continues into a second byte, which is not content)."""
    text = "x" * (size - 1) + "y"
    task = Task(
        id=text, queue=text, task_type=text, payload=text.encode(), unique_key=text, state=1
    )
    data = encode(EnqueueManyResponse(results=[EnqueueResult(task=task, created=False)]))
    assert _batch_wire._decode(data) == decode_enqueue_many_response(data)


@pytest.mark.parametrize("wrap", [bytearray, memoryview])
def test_a_reply_in_a_buffer_decodes_as_its_bytes_do(wrap: Any) -> None:
    """Example (same answer): a reply handed over as a bytearray or a
    memoryview gives the models its bytes give, payloads as `bytes`."""
    task = Task(id="a", queue="q", task_type="t", payload=b"p", state=1)
    data = encode(EnqueueManyResponse(results=[EnqueueResult(task=task, created=False)]))
    batch = _batch_wire.decode_enqueue_many_reply(wrap(data))
    assert batch == decode_enqueue_many_response(data)
    assert type(batch.results[0].task.payload) is bytes


def test_a_backoff_right_after_the_first_fields_is_read_on_the_fast_path() -> None:
    """Example (fast path taken): a task whose state, attempts and priority
    are all zero (left out on the wire) has its backoff straight after its
    unique key; the fast path reads it rather than handing the reply on."""
    task = Task(id="a", queue="q", task_type="t", unique_key="k")
    task.retry_backoff = RetryBackoff(initial=timedelta(seconds=1), maximum=timedelta(seconds=3))
    data = encode(EnqueueManyResponse(results=[EnqueueResult(task=task, created=True)]))
    assert _batch_wire._decode(data) == decode_enqueue_many_response(data)


def test_off_the_fast_path_a_created_task_gets_only_a_missing_payload() -> None:
    """Example (a created task is what was sent, on the generic path too): a
    reply the fast path hands on (its tasks carry a worker id) gives the
    created task it sent without a payload the payload sent for it, and
    leaves a payload the reply carries as the reply says."""
    bare = Task(id="a", queue="q", task_type="t", state=1, worker_id="w")
    echoed = Task(id="b", queue="q", task_type="t", state=1, worker_id="w", payload=b"echo")
    data = encode(
        EnqueueManyResponse(
            results=[
                EnqueueResult(task=bare, created=True),
                EnqueueResult(task=echoed, created=True),
            ]
        )
    )
    with pytest.raises(_batch_wire._Generic):
        _batch_wire._decode(data)
    batch = _batch_wire.decode_enqueue_many_reply(data, [b"sent a", b"sent b"])
    assert [result.task.payload for result in batch.results] == [b"sent a", b"echo"]
    assert [result.created for result in batch.results] == [True, True]


# -- payloads of created tasks ----------------------------------------------------------


def _sent_payloads(reply: EnqueueManyResponse, data: st.DataObject) -> list[bytes]:
    """What a client may have sent for `reply`'s results: one payload per
    result (sometimes fewer or more)."""
    count = len(reply.results) + data.draw(st.integers(-1, 1))
    return data.draw(
        st.lists(st.binary(max_size=20), min_size=max(count, 0), max_size=max(count, 0))
    )


def _reference(data: bytes, payloads: list[bytes]) -> Any:
    """The generic decoder's result, each created task without a payload
    given the one sent for it."""
    try:
        batch = decode_enqueue_many_response(data)
    except Exception as exc:
        return (type(exc), str(exc))
    results = list(batch.results)
    for index, result in enumerate(results):
        if index < len(payloads) and result.created and not result.task.payload:
            results[index] = dataclasses.replace(
                result, task=dataclasses.replace(result.task, payload=payloads[index])
            )
    return dataclasses.replace(batch, results=tuple(results))


def _compact(reply: EnqueueManyResponse) -> EnqueueManyResponse:
    """`reply` as the daemon sends it from minor 11: no payloads."""
    for result in reply.results:
        if result.task is not None:
            result.task.payload = b""
    return reply


@PROPERTY
@given(st.one_of(ANY_REPLY, FRESH_REPLY, FRESH_REPLY.map(_compact)), st.data())
def test_created_tasks_without_a_payload_get_the_one_sent(
    reply: EnqueueManyResponse, data: st.DataObject
) -> None:
    """Property (a created task is what was sent): decoded with the payloads
    sent, a created task the reply carries without a payload has the one
    sent for it; every other task is exactly the generic decoder's (a
    duplicate keeps what the reply says), on the fast path or not."""
    encoded = encode(reply)
    payloads = _sent_payloads(reply, data)
    assert outcome(
        lambda d: _batch_wire.decode_enqueue_many_reply(d, payloads), encoded
    ) == _reference(encoded, payloads)


@PROPERTY
@given(FRESH_REPLY.map(_compact), st.data())
def test_compact_replies_of_fresh_tasks_take_the_fast_path(
    reply: EnqueueManyResponse, data: st.DataObject
) -> None:
    """Property (fast path taken): a compact reply of fresh tasks is read
    without the generic decoder, the payloads sent filled in."""
    encoded = encode(reply)
    payloads = _sent_payloads(reply, data)
    assert _batch_wire._decode(encoded, payloads) == _reference(encoded, payloads)


# -- the request ----------------------------------------------------------------------

_SPECS = st.builds(
    ModelTaskSpec,
    task_type=names(),
    payload=st.binary(max_size=200),
    unique_key=st.none()
    | st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8).filter(bool),
    max_attempts=st.none() | st.integers(1, 100),
    retry_backoff=st.none() | retry_backoffs(),
    priority=st.integers(-(2**31), 2**31 - 1),
    limit_key=st.none() | names(),
).flatmap(
    lambda spec: st.one_of(
        st.just(spec),
        st.timedeltas(timedelta(0), timedelta(days=3)).map(
            lambda delay: dataclasses.replace(spec, delay=delay)
        ),
        st.datetimes(max_value=datetime(8999, 1, 1), timezones=st.just(UTC)).map(
            lambda moment: dataclasses.replace(spec, not_before=moment)
        ),
    )
)


@PROPERTY
@given(st.lists(_SPECS, max_size=8), st.none() | messages(RequestContext), names())
def test_requests_encode_byte_equal_to_the_generic_encoder(
    specs: list[ModelTaskSpec], context: RequestContext | None, queue: str
) -> None:
    """Property (same bytes): any specs — shared and distinct attempts,
    policies, schedules, priorities — encode as the generic encoder does."""
    specs = specs + specs[:3]  # repeats hit the request's memo
    assert encode_enqueue_many_request(
        context, queue, specs
    ) == encode_enqueue_many_request_from_specs(context, queue, specs)

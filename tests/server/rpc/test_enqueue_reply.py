"""`ringo_trio.server.rpc.enqueue_reply`: EnqueueMany replies encoded from the tasks.

The reference is the generic encoder (`tests/_kit/generic_frames.py`'s
`encode_enqueue_many_response`): every reply is byte-equal to its encoding.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ringo_trio._proto.ringo.v1 import RetryBackoff, Task, TaskState
from ringo_trio.server.rpc.enqueue_reply import encode_enqueue_many_reply
from tests._kit.generic_frames import encode_enqueue_many_response
from tests._kit.wire_strategies import BETTERPROTO_DURATIONS, messages

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

COUNTS = st.integers(0, 2**32 - 1)


@PROPERTY
@given(st.lists(st.tuples(messages(Task, BETTERPROTO_DURATIONS), st.booleans()), max_size=6))
def test_any_tasks_encode_byte_equal_to_the_generic_encoder(
    results: list[tuple[Task, bool]],
) -> None:
    """Property (same bytes): any tasks — every field, unknown fields, repeats."""
    results = results + results[:2]  # repeated tasks hit the reply's memo
    for created, duplicates in ((len(results), 0), (0, 2**32 - 1)):
        assert encode_enqueue_many_reply(
            results, created, duplicates
        ) == encode_enqueue_many_response(results, created, duplicates)


@PROPERTY
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["q", "other", "ü"]),
            st.sampled_from(["t", "u"]),
            st.integers(-(2**31), 2**31 - 1),
            st.sampled_from([None, timedelta(seconds=1), timedelta(0)]),
            st.booleans(),
        ),
        max_size=8,
    )
)
def test_batches_sharing_fields_encode_byte_equal(
    rows: list[tuple[str, str, int, timedelta | None, bool]],
) -> None:
    """Property (same bytes, memo keyed by value): tasks like one batch's —
    repeated queues, types, timestamps and equal but distinct backoffs; tasks
    equal but for one timestamp do not share an encoding."""
    now = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
    results = [
        (
            Task(
                id=f"{index:032x}",
                queue=queue,
                task_type=task_type,
                payload=b"x" * index,
                unique_key=f"k{index}" if index % 2 else "",
                state=TaskState.PENDING,
                max_attempts=3,
                priority=priority,
                retry_backoff=None
                if initial is None
                else RetryBackoff(initial=initial, maximum=timedelta(seconds=300), multiplier=2.0),
                created_at=now - timedelta(seconds=index % 2),
                updated_at=now,
                available_at=now + timedelta(seconds=index % 3),
                limit_key=f"tenant-{index % 2}" if index % 3 else "",
            ),
            created,
        )
        for index, (queue, task_type, priority, initial, created) in enumerate(rows)
    ]
    assert encode_enqueue_many_reply(results, len(rows), 0) == encode_enqueue_many_response(
        results, len(rows), 0
    )


def test_every_length_around_a_one_byte_size_encodes_byte_equal() -> None:
    """Same bytes at every length a size's first byte can take: a field or
    a task of 127 bytes has a one-byte size, of 128 a two-byte one (the
    shortcut table covers sizes below 128 only). Payloads of 0-300 bytes
    move the payload field and the whole task across that edge."""
    now = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
    for length in range(301):
        task = Task(
            id="t",
            queue="q",
            task_type="t",
            payload=b"x" * length,
            created_at=now,
            limit_key="k" * (length % 140),
        )
        results = [(task, length % 2 == 0)]
        assert encode_enqueue_many_reply(results, 1, 0) == encode_enqueue_many_response(
            results, 1, 0
        ), length


def test_a_task_holding_only_a_result_is_encoded_whole() -> None:
    """Same bytes for a duplicate whose existing task is SUCCEEDED with a
    result and nothing else beyond a new task's fields: the result is among
    what sends a task to the generic encoder."""
    results = [(Task(id="t", queue="q", task_type="t", result=b"done"), False)]
    assert encode_enqueue_many_reply(results, 0, 1) == encode_enqueue_many_response(results, 0, 1)

"""`ringo_trio.server.rpc.reply_bounds`: the size bounds, the Claim helper, and
each bounded reply built by the daemon's own code (no sockets; the grpcio
client's view is tests/server/rpc/test_reply_bounds.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import pathlib
import tempfile
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ringo_trio._contract import limits, versions
from ringo_trio._proto.ringo.v1 import (
    ClaimRequest,
    ClaimResponse,
    EnqueueManyRequest,
    EnqueueManyResponse,
    GetQueueStatsRequest,
    GetTaskResponse,
    Lease,
    LeasedTask,
    LeaseRef,
    ListQueuesResponse,
    ListTasksRequest,
    Progress,
    QueueStats,
    RequestContext,
    RetryBackoff,
    Task,
    TaskAttempt,
    TaskSpec,
    TaskState,
    TaskTypeStats,
)
from ringo_trio._wire.codec import decode, encode
from ringo_trio._wire.primitives import varint
from ringo_trio.server.clock import ManualClock
from ringo_trio.server.rpc import reply_bounds as rb
from ringo_trio.server.rpc import validate as v
from ringo_trio.server.rpc.enqueue_reply import encode_enqueue_many_reply
from ringo_trio.server.rpc.service import QueueService
from ringo_trio.server.rpc.sessions import SessionTable
from ringo_trio.server.rpc.wakeups import LeaseReaper, QueueWakeups
from ringo_trio.server.storage.base import Storage
from ringo_trio.server.storage.sqlite import SQLiteEngine
from tests._kit.generic_frames import encode_enqueue_many_response
from tests._kit.grpc_client import deadline
from tests._kit.wire_strategies import BETTERPROTO_DURATIONS, messages


@pytest.fixture(autouse=True)
def _deadline() -> Iterator[None]:
    """No test here runs longer than a minute (asyncio.run never hangs the run)."""
    with deadline(60):
        yield


PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NOW = datetime(2030, 1, 1, tzinfo=UTC)
MiB = 1024 * 1024

# -- the bounds ------------------------------------------------------------------

# Texts of every width: ASCII, 2-, 3- and 4-byte UTF-8.
_TEXT = st.text(st.sampled_from("a\u00e9\u20ac\U0001f600"), max_size=300)


def _texts(task: Task, data: st.DataObject) -> Task:
    """`task` with long texts and bytes drawn in."""
    task.queue = data.draw(_TEXT)
    task.unique_key = data.draw(_TEXT)
    task.last_error = data.draw(_TEXT)
    task.worker_id = data.draw(_TEXT)
    task.payload = data.draw(st.binary(max_size=300))
    if task.progress is not None:
        task.progress.message = data.draw(_TEXT)
    return task


@PROPERTY
@given(messages(Task), st.data())
def test_task_bound_is_at_least_the_encoding(task: Task, data: st.DataObject) -> None:
    """Property: `task_bound` never undercounts a task's encoding: any field
    values (negative numbers, extreme times, unknown enum values and
    fields), texts of any UTF-8 width."""
    assert len(encode(task)) <= rb.task_bound(task)
    assert len(encode(_texts(task, data))) <= rb.task_bound(task)


@PROPERTY
@given(messages(LeasedTask))
def test_leased_bound_is_at_least_the_encoding(item: LeasedTask) -> None:
    """Property: `leased_bound` never undercounts a LeasedTask's encoding."""
    assert len(encode(item)) <= rb.leased_bound(item)


@PROPERTY
@given(st.lists(st.integers(0, 2 * MiB), max_size=40), st.integers(0, 8 * MiB))
@example([10, 10], 2 * (10 + rb.ELEMENT_BYTES) - 1)  # the framing decides
@example([10, 10], 2 * (10 + rb.ELEMENT_BYTES))  # exactly the budget fits
@example([10, 10], 20)
def test_fitting_keeps_the_longest_prefix_within_the_budget(bounds: list[int], budget: int) -> None:
    """Property: `fitting` keeps the longest prefix whose elements, framed,
    fit the budget — but always the first element."""
    keep = rb.fitting(bounds, budget)
    framed = [b + rb.ELEMENT_BYTES for b in bounds]
    if not bounds:
        assert keep == 0
        return
    assert 1 <= keep <= len(bounds)
    assert keep == 1 or sum(framed[:keep]) <= budget
    assert keep == len(bounds) or sum(framed[: keep + 1]) > budget


@functools.cache
def _worst_text(size: int, char: str = "\U0001f600") -> str:
    """`size` bytes of 4-byte characters (and ASCII to fill up); one object
    per size, so a thousand worst tasks share their texts."""
    return char * (size // 4) + "x" * (size % 4)


_PAYLOAD = b"p" * limits.MAX_PAYLOAD_BYTES
_RESULT = b"r" * limits.MAX_RESULT_BYTES
_CANCELLED = "cancelled: " + _worst_text(limits.MAX_ERROR_BYTES)


def _worst_task(index: int = 0, **fields: object) -> Task:
    """A task with every field at its limit (`fields` overrides)."""
    task = Task(
        id=f"{index:032x}",
        queue=_worst_text(limits.MAX_NAME_BYTES),
        task_type=_worst_text(limits.MAX_NAME_BYTES),
        payload=_PAYLOAD,
        unique_key=_worst_text(limits.MAX_UNIQUE_KEY_BYTES),
        state=TaskState.LEASED,
        attempt=2**32 - 1,
        max_attempts=2**32 - 1,
        priority=-(2**31),
        retry_backoff=RetryBackoff(
            initial=timedelta(days=365), maximum=timedelta(days=365), multiplier=1e300
        ),
        created_at=NOW,
        updated_at=NOW,
        available_at=NOW,
        finished_at=NOW,
        last_error=_CANCELLED,
        progress=Progress(
            current=1e300,
            total=1e300,
            message=_worst_text(limits.MAX_PROGRESS_MESSAGE_BYTES),
            updated_at=NOW,
        ),
        worker_id=_worst_text(limits.MAX_NAME_BYTES),
        lease_until=NOW,
        result=_RESULT,
    )
    return dataclasses.replace(task, **fields)


def test_a_reply_of_one_task_fits_whatever_it_holds() -> None:
    """Property: one task with every field at its limit — what GetTask,
    RetryTask, CancelTask and Enqueue answer — is within MAX_REPLY_BYTES,
    and within ONE_TASK_BYTES."""
    task = _worst_task()
    assert rb.task_bound(task) <= rb.ONE_TASK_BYTES
    assert len(encode(GetTaskResponse(task=task))) <= limits.MAX_REPLY_BYTES


def _unknown(size: int) -> bytes:
    """A length-delimited field no message of ours has (number 1000)."""
    return b"\xc2\x3e" + varint(size) + b"u" * size


def _every_field_large(size: int) -> LeasedTask:
    """A leased task whose every text, bytes and unknown field -- its own,
    its history's, its progress', its backoff's and its lease's -- is
    `size` bytes: far beyond the slack of the bounds' fixed parts, so a
    field a bound leaves out (or takes away) shows."""
    text = "x" * size
    attempts = [
        TaskAttempt(attempt=i, worker_id=text, started_at=NOW, ended_at=NOW, error=text)
        for i in range(limits.MAX_TASK_HISTORY)
    ]
    for attempt in attempts:
        attempt._unknown_fields = _unknown(size)
    progress = Progress(current=1.0, total=2.0, message=text, updated_at=NOW)
    progress._unknown_fields = _unknown(size)
    backoff = RetryBackoff(initial=timedelta(seconds=1), maximum=timedelta(seconds=2))
    backoff._unknown_fields = _unknown(size)
    task = _worst_task(
        id=text,
        queue=text,
        task_type=text,
        payload=b"p" * size,
        unique_key=text,
        last_error=text,
        worker_id=text,
        limit_key=text,
        result=b"r" * size,
        progress=progress,
        retry_backoff=backoff,
        history=attempts,
    )
    task._unknown_fields = _unknown(size)
    lease = Lease(task_id=text, attempt=1, lease_token=text, worker_id=text, until=NOW)
    lease._unknown_fields = _unknown(size)
    leased = LeasedTask(task=task, lease=lease)
    leased._unknown_fields = _unknown(size)
    return leased


def test_an_echo_that_exactly_fills_the_budget_fits() -> None:
    """Property: EnqueueMany echoes tasks whole while their bounds, with
    each result's framing, are within the budget -- exactly the budget
    included -- and compacts them one byte past it."""
    tasks = [_worst_task(i, payload=b"", result=None, history=[]) for i in range(3)]
    exact = sum(rb.task_bound(t) + 2 * rb.ELEMENT_BYTES + 2 for t in tasks)
    assert rb.enqueue_results_fit(tasks, exact)
    assert not rb.enqueue_results_fit(tasks, exact - 1)


def test_the_bounds_count_every_field() -> None:
    """Property (replies within a default client's 4 MiB): `task_bound` and
    `leased_bound` are at least the encoding of a task whose every field is
    large -- each text, bytes and unknown field of the task, its history,
    progress, backoff and lease counts -- and within the fixed parts' slack
    of it (the Hypothesis property above draws mostly small fields, which
    the slack alone covers)."""
    leased = _every_field_large(4096)
    assert leased.task is not None
    task_size = len(encode(leased.task))
    assert task_size <= rb.task_bound(leased.task) <= task_size + 4096
    leased_size = len(encode(leased))
    assert leased_size <= rb.leased_bound(leased) <= leased_size + 4096


def test_a_compact_reply_of_a_full_batch_of_worst_tasks_fits() -> None:
    """Property: an EnqueueMany reply of 1000 compact duplicates, each with
    every field at its limit, is within MAX_REPLY_BYTES; so is a full
    echo of 1000 created tasks of 200-byte names and 512-byte keys."""
    worst = [(_worst_task(i), False) for i in range(limits.MAX_BATCH)]
    data = encode_enqueue_many_reply(worst, 0, limits.MAX_BATCH, compact=True)
    assert len(data) <= limits.MAX_REPLY_BYTES
    assert all(rb.task_bound(rb.compact(t)) <= rb.COMPACT_TASK_BYTES for t, _ in worst[:3])
    created = [
        (_worst_task(i, payload=b"", result=None, progress=None, last_error="", worker_id=""), True)
        for i in range(limits.MAX_BATCH)
    ]
    assert rb.enqueue_results_fit([t for t, _ in created])
    assert len(encode_enqueue_many_reply(created, limits.MAX_BATCH, 0)) <= limits.MAX_REPLY_BYTES


def test_queue_pages_and_stats_fit_at_their_limits() -> None:
    """Property: a ListQueues page of 1000 queues with 200-byte names and
    maximal counts, and GetQueueStats with MAX_STATS_TASK_TYPES types of
    200 bytes, are within MAX_REPLY_BYTES."""
    big = 2**64 - 1
    counts = {"pending": big, "leased": big, "succeeded": big, "dead": big, "cancelled": big}
    stats = QueueStats(
        queue=_worst_text(limits.MAX_NAME_BYTES), oldest_pending_at=NOW, as_of=NOW, **counts
    )
    page = ListQueuesResponse(queues=[stats] * limits.MAX_LIST_PAGE, next_page_token="t" * 406)
    assert len(encode(page)) <= limits.MAX_REPLY_BYTES
    stats.by_type = [
        TaskTypeStats(task_type=_worst_text(limits.MAX_NAME_BYTES), **counts)
    ] * limits.MAX_STATS_TASK_TYPES
    assert len(encode(stats)) <= limits.MAX_REPLY_BYTES


def test_compact_tasks_leave_out_payload_and_result_and_cut_long_texts() -> None:
    """Example: `compact` empties payload and result and cuts last_error and
    the progress message to MAX_LIST_ERROR_BYTES (UTF-8 safe); the rest stays."""
    task = _worst_task()
    small = rb.compact(task)
    assert (small.payload, small.result) == (b"", None)
    assert small.last_error == task.last_error.encode()[: limits.MAX_LIST_ERROR_BYTES].decode(
        errors="ignore"
    )
    assert small.progress is not None
    assert task.progress is not None
    assert len(small.progress.message.encode()) <= limits.MAX_LIST_ERROR_BYTES
    assert task.progress.message.startswith(small.progress.message)
    assert (small.id, small.unique_key, small.worker_id) == (
        task.id,
        task.unique_key,
        task.worker_id,
    )
    assert task.payload, "compact must not change its argument"


# -- claim_within against a model of storage -----------------------------------------


@dataclasses.dataclass
class _Row:
    task: Task
    state: TaskState = TaskState.PENDING
    attempt: int = 0
    token: str = ""


class _Queue:
    """Tasks in claim order: `claim` leases the first PENDING ones (a fresh
    token, attempt + 1), `release` hands leases back (PENDING, attempt - 1)."""

    def __init__(self, tasks: Sequence[Task]) -> None:
        self.rows = [_Row(task) for task in tasks]
        self.rounds: list[int] = []
        self.released = 0
        self._tokens = 0

    async def claim(self, limit: int) -> list[LeasedTask]:
        assert limit > 0, "a storage round that asks for nothing is a wasted round trip"
        self.rounds.append(limit)
        out = []
        for row in self.rows:
            if len(out) == limit:
                break
            if row.state is TaskState.PENDING:
                self._tokens += 1
                row.state, row.attempt, row.token = (
                    TaskState.LEASED,
                    row.attempt + 1,
                    str(self._tokens),
                )
                task = dataclasses.replace(row.task, state=row.state, attempt=row.attempt)
                lease = Lease(task_id=task.id, attempt=row.attempt, lease_token=row.token)
                out.append(LeasedTask(task=task, lease=lease))
        return out

    async def release(self, unsent: list[LeasedTask]) -> None:
        self.released += len(unsent)
        for item in unsent:
            assert item.lease is not None
            [row] = [r for r in self.rows if r.task.id == item.lease.task_id]
            assert (row.state, row.token) == (TaskState.LEASED, item.lease.lease_token)
            row.state, row.attempt, row.token = TaskState.PENDING, row.attempt - 1, ""


_SIZES = st.sampled_from([0, 1, 100, 4096, 256 * 1024, 1024 * 1024 - 1, limits.MAX_PAYLOAD_BYTES])


@st.composite
def _tasks(draw: st.DrawFn) -> list[Task]:
    tasks = []
    for index in range(draw(st.integers(0, 12))):
        payload = draw(st.one_of(_SIZES, st.integers(0, limits.MAX_PAYLOAD_BYTES)))
        error = draw(st.sampled_from([0, 1024, limits.MAX_ERROR_BYTES]))
        message = draw(st.sampled_from([0, limits.MAX_PROGRESS_MESSAGE_BYTES]))
        tasks.append(
            Task(
                id=f"{index:032x}",
                queue="q",
                task_type="t",
                payload=b"x" * payload,
                unique_key=draw(st.sampled_from(["", "k" * limits.MAX_UNIQUE_KEY_BYTES])),
                last_error="e" * error,
                progress=Progress(message="m" * message) if message else None,
            )
        )
    # Many small tasks after big ones and the other way round.
    if draw(st.booleans()):
        tasks += [Task(id=f"s{i:031x}", queue="q", task_type="t") for i in range(200)]
    return tasks


@PROPERTY
@given(_tasks(), st.integers(1, limits.MAX_BATCH))
@example([Task(id=str(i), payload=b"x" * limits.MAX_PAYLOAD_BYTES) for i in range(8)], 1000)
@example([Task(id=str(i), payload=b"x" * limits.MAX_PAYLOAD_BYTES) for i in range(6)], 6)
def test_claim_answers_within_the_reply_limit_and_hands_back_the_rest(
    tasks: list[Task], limit: int
) -> None:
    """Property: whatever the tasks hold, `claim_within` answers a
    ClaimResponse within MAX_REPLY_BYTES, of at most `limit` tasks, at
    least one when any is claimable, the first ones in claim order; every
    task it leased but did not answer is PENDING again with its attempt
    unspent, so the only LEASED tasks are the answered ones. No storage
    round asks for more than CLAIM_ROUND tasks."""
    queue = _Queue(tasks)
    answered = asyncio.run(rb.claim_within(queue.claim, queue.release, limit))
    assert len(encode(ClaimResponse(tasks=answered))) <= limits.MAX_REPLY_BYTES
    assert len(answered) <= limit
    assert bool(answered) == bool(tasks)
    ids = [item.task.id for item in answered if item.task]
    assert ids == [t.id for t in tasks[: len(ids)]]
    for row in queue.rows:
        if row.task.id in ids:
            assert (row.state, row.attempt) == (TaskState.LEASED, 1)
        else:
            assert (row.state, row.attempt) == (TaskState.PENDING, 0)
    assert max(queue.rounds, default=0) <= rb.CLAIM_ROUND


def test_claim_answers_one_task_even_beyond_the_budget() -> None:
    """Example: a claim always answers its first task (one task always fits
    a real reply: ONE_TASK_BYTES), and hands back the rest."""
    queue = _Queue([Task(id=str(i), payload=b"x" * 100) for i in range(3)])
    answered = asyncio.run(rb.claim_within(queue.claim, queue.release, 3, budget=10))
    assert [item.task.id for item in answered if item.task] == ["0"]
    assert [row.state for row in queue.rows] == [TaskState.LEASED] + [TaskState.PENDING] * 2


def _budget_of_the_first(tasks: Sequence[Task], count: int) -> int:
    """The bytes the first `count` of `tasks`, claimed from a fresh queue,
    take in a reply by the bounds (their lease tokens included)."""
    queue = _Queue(tasks)
    claimed = asyncio.run(rb.claim_within(queue.claim, queue.release, count))
    assert len(claimed) == count
    return sum(rb.leased_bound(item) + rb.ELEMENT_BYTES for item in claimed)


def test_after_the_first_round_a_claim_asks_only_for_what_the_room_holds() -> None:
    """No churn: once a round has shown how big the tasks are, the next asks
    for no more than the reply's remaining room holds, so no lease is taken
    only to be handed back (a release is a write per task) and no round asks
    for nothing. 100 tasks of 60 KiB: the first round (50) leaves room for
    17 more; the claim answers those 67 in two rounds and releases none."""
    queue = _Queue([Task(id=f"{i:03}", payload=b"x" * 60 * 1024) for i in range(100)])
    answered = asyncio.run(rb.claim_within(queue.claim, queue.release, limits.MAX_BATCH))
    assert queue.rounds == [rb.CLAIM_ROUND, len(answered) - rb.CLAIM_ROUND]
    assert len(answered) == 67
    assert queue.released == 0
    # Room for exactly one more after the first round: a round of one.
    small = [Task(id=f"{i:03}") for i in range(60)]
    budget = _budget_of_the_first(small, 51)
    queue = _Queue(small)
    answered = asyncio.run(rb.claim_within(queue.claim, queue.release, 60, budget=budget))
    assert (queue.rounds, len(answered), queue.released) == ([rb.CLAIM_ROUND, 1], 51, 0)


def test_a_claim_fills_its_budget_exactly_and_not_one_byte_more() -> None:
    """The budget's edges: tasks whose bounds add up to exactly the budget
    are all answered; one byte less and the last goes back."""
    tasks = [Task(id=str(i), payload=b"x" * 100 * (i + 1)) for i in range(4)]
    budget = _budget_of_the_first(tasks, 3)
    for room, answers in ((budget, 3), (budget - 1, 2)):
        queue = _Queue(tasks)
        answered = asyncio.run(rb.claim_within(queue.claim, queue.release, 4, budget=room))
        assert [item.task.id for item in answered if item.task] == [str(i) for i in range(answers)]
        assert queue.released == 4 - answers


# -- the daemon's replies, built by the service over a real SQLite engine ----------------


async def _opened(path: pathlib.Path) -> tuple[QueueService, Storage]:
    storage = SQLiteEngine(path)
    await storage.open()
    clock = ManualClock(NOW)
    wakeups = QueueWakeups()
    service = QueueService(
        storage,
        clock=clock,
        sessions=SessionTable(timedelta(hours=1)),
        served_minor=versions.MINOR,
        wakeups=wakeups,
        reaper=LeaseReaper(storage, clock, wakeups),
    )
    return service, storage


def _context(service: QueueService, minor: int) -> RequestContext:
    token = service._sessions.open(minor, NOW)
    return RequestContext(versions.MAJOR, minor, token)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.one_of(_SIZES, st.integers(0, limits.MAX_PAYLOAD_BYTES)), min_size=1, max_size=10),
    st.integers(1, limits.MAX_BATCH),
)
@example([limits.MAX_PAYLOAD_BYTES] * 8, 1000)
def test_claim_over_sqlite_leaves_every_unanswered_task_pending_and_unspent(
    sizes: list[int], limit: int
) -> None:
    """Property: a Claim served over SQLite answers within MAX_REPLY_BYTES,
    and every task it did not answer is PENDING with attempt 0 (its lease
    was released before the reply, the attempt not spent)."""

    async def run(path: pathlib.Path) -> None:
        service, storage = await _opened(path)
        try:
            specs = [TaskSpec(task_type="t", payload=b"x" * size) for size in sizes]
            outcomes = await storage.enqueue("q", [v.task_spec(s, "t", NOW) for s in specs], NOW)
            args = v.claim_args(ClaimRequest(queue="q", worker_id="w", limit=limit))
            answered = await service.claims.claim_now(args, NOW)
            assert answered
            assert len(encode(ClaimResponse(tasks=answered))) <= limits.MAX_REPLY_BYTES
            ids = {item.task.id for item in answered if item.task}
            for outcome in outcomes:
                task = await storage.get("q", task_id=outcome.task.id)
                if task.id in ids:
                    assert (task.state, task.attempt) == (TaskState.LEASED, 1)
                else:
                    assert (task.state, task.attempt) == (TaskState.PENDING, 0)
        finally:
            await storage.close()

    with tempfile.TemporaryDirectory() as scratch:
        asyncio.run(run(pathlib.Path(scratch) / "ringo.db"))


@pytest.mark.parametrize("minor", [versions.MINOR, 10])
def test_enqueue_many_commits_and_answers_a_batch_of_any_echo(
    tmp_path: pathlib.Path, minor: int
) -> None:
    """Property: EnqueueMany of 64 tasks of 1 MiB (an echo of 64 MiB) is
    stored whole and answered within MAX_REPLY_BYTES, compact — at the newest minor
    as always, at minor 10 because the echo would not fit — and a small
    batch at minor 10 still gets its full echo."""

    async def run() -> None:
        service, storage = await _opened(tmp_path / "ringo.db")
        try:
            context = _context(service, minor)
            payload = b"x" * limits.MAX_PAYLOAD_BYTES
            count = limits.MAX_MESSAGE_BYTES // limits.MAX_PAYLOAD_BYTES - 1
            reply = await service.enqueue_many(
                EnqueueManyRequest(
                    context=context,
                    queue="q",
                    tasks=[TaskSpec(task_type="t", payload=payload)] * count,
                )
            )
            data = bytes(reply)
            assert len(data) <= limits.MAX_REPLY_BYTES
            results = decode(data, EnqueueManyResponse).results
            assert len(results) == count
            assert all(r.created and r.task and r.task.payload == b"" for r in results)
            first = results[0].task
            assert first is not None
            assert (await storage.get("q", task_id=first.id)).payload == payload
            small = decode(
                bytes(
                    await service.enqueue_many(
                        EnqueueManyRequest(
                            context=context,
                            queue="q",
                            tasks=[TaskSpec(task_type="t", payload=b"s")],
                        )
                    )
                ),
                EnqueueManyResponse,
            ).results[0]
            assert small.task is not None
            assert small.task.payload == (b"" if minor >= 11 else b"s")
        finally:
            await storage.close()

    asyncio.run(run())


@PROPERTY
@given(st.lists(st.tuples(messages(Task), st.booleans()), max_size=6))
def test_compact_replies_encode_as_the_generic_encoder_of_compact_tasks(
    results: list[tuple[Task, bool]],
) -> None:
    """Property (same bytes): a compact reply is the generic encoding of
    each task made `compact`, whatever the tasks hold."""
    expected = encode_enqueue_many_response([(rb.compact(t), c) for t, c in results], 3, 4)
    assert encode_enqueue_many_reply(results, 3, 4, compact=True) == expected


def _pending_duplicate(task: Task, error: str) -> Task:
    """`task` as a PENDING duplicate after a nack: fields 1-15 only (the
    encoder's fast path), a long last_error."""
    task.progress = None
    task.worker_id = ""
    task.lease_until = None
    task.result = None
    task._unknown_fields = b""
    if task.retry_backoff is not None:
        task.retry_backoff._unknown_fields = b""
    task.last_error = error
    return task


@PROPERTY
@given(
    st.lists(
        st.tuples(
            st.builds(
                _pending_duplicate,
                messages(Task, BETTERPROTO_DURATIONS),
                st.text(st.sampled_from("e\u00e9\u20ac\U0001f600"), min_size=200, max_size=3000),
            ),
            st.booleans(),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_compact_replies_cut_the_errors_of_tasks_on_the_fast_path(
    results: list[tuple[Task, bool]],
) -> None:
    """Property: the encoder's own path (tasks of fields 1-15, as a nacked
    duplicate is) cuts last_error to MAX_LIST_ERROR_BYTES in a compact
    reply, byte-equal to the generic encoding of the compact task."""
    data = encode_enqueue_many_reply(results, 0, len(results), compact=True)
    expected = encode_enqueue_many_response(
        [(rb.compact(t), c) for t, c in results], 0, len(results)
    )
    assert data == expected
    for result in decode(data, EnqueueManyResponse).results:
        assert result.task is not None
        assert len(result.task.last_error.encode()) <= limits.MAX_LIST_ERROR_BYTES


def test_list_tasks_pages_fit_and_cover_every_task_once(tmp_path: pathlib.Path) -> None:
    """Property: ListTasks at page_size 1000 over tasks with 4 KiB progress
    messages and maximal keys and names answers pages within
    MAX_REPLY_BYTES; a page cut short carries a token, and the pages list
    every matching task once, in order, oldest or newest first, with or
    without a unique-key prefix (a walked filter)."""

    async def run() -> None:
        service, storage = await _opened(tmp_path / "ringo.db")
        try:
            context = _context(service, versions.MINOR)
            queue = "q" * limits.MAX_NAME_BYTES
            specs = [
                v.task_spec(
                    TaskSpec(
                        task_type="t" * limits.MAX_NAME_BYTES,
                        unique_key=f"{'ab'[i % 2]}{i:05d}".ljust(limits.MAX_UNIQUE_KEY_BYTES, "k"),
                    ),
                    "t",
                    NOW,
                )
                for i in range(limits.MAX_LIST_PAGE)
            ]
            await storage.enqueue(queue, specs, NOW)
            for item in await storage.claim(
                queue,
                [],
                limits.MAX_LIST_PAGE,
                "w" * limits.MAX_NAME_BYTES,
                timedelta(hours=1),
                NOW,
            ):
                assert item.lease is not None
                ref = LeaseRef(item.lease.task_id, item.lease.attempt, item.lease.lease_token)
                await storage.report_progress(
                    ref, 1, 2, "m" * limits.MAX_PROGRESS_MESSAGE_BYTES, NOW
                )
            everything = [s.unique_key for s in specs]
            for prefix in ("", "a"):
                for order in (1, 2):
                    keys: list[str] = []
                    token = ""
                    pages = 0
                    while True:
                        reply = await service.list_tasks(
                            ListTasksRequest(
                                context=context,
                                queue=queue,
                                page_size=limits.MAX_LIST_PAGE,
                                unique_key_prefix=prefix,
                                order=order,
                                page_token=token,
                            )
                        )
                        assert len(encode(reply)) <= limits.MAX_REPLY_BYTES
                        keys += [t.unique_key for t in reply.tasks]
                        pages += 1
                        token = reply.next_page_token
                        if not token:
                            break
                    want = [k for k in everything if k.startswith(prefix)]
                    assert keys == (want if order == 1 else want[::-1])
                    assert pages >= 2 or prefix
        finally:
            await storage.close()

    asyncio.run(run())


def test_queue_stats_count_every_type_but_list_at_most_the_limit(tmp_path: pathlib.Path) -> None:
    """Example: GetQueueStats of a queue of more task types than
    MAX_STATS_TASK_TYPES lists the first of them by name and counts every task."""

    async def run() -> None:
        service, storage = await _opened(tmp_path / "ringo.db")
        try:
            count = limits.MAX_STATS_TASK_TYPES + 5
            for start in range(0, count, limits.MAX_BATCH):
                stop = min(start + limits.MAX_BATCH, count)
                specs = [TaskSpec(task_type=f"t{i:06d}") for i in range(start, stop)]
                await storage.enqueue("q", [v.task_spec(s, "t", NOW) for s in specs], NOW)
            reply = await service.get_queue_stats(
                GetQueueStatsRequest(context=_context(service, versions.MINOR), queue="q")
            )
            stats = reply.stats
            assert stats is not None
            assert stats.pending == count
            assert [t.task_type for t in stats.by_type] == [
                f"t{i:06d}" for i in range(limits.MAX_STATS_TASK_TYPES)
            ]
        finally:
            await storage.close()

    asyncio.run(run())

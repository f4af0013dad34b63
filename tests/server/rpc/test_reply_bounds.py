"""Bounded replies, seen by a grpcio client with DEFAULT settings.

grpcio refuses a received message over 4 MiB (``RESOURCE_EXHAUSTED``), and
so do most gRPC clients: the daemon must never send a bigger reply, above
all after it committed something (an enqueue the client then retries, a
lease nobody receives). Every documented RPC is called here at the
documented limits, at the newest protocol minor and at minor 10, against a real
``ringod``; after each call the daemon holds no lease the client did not
receive.

The client speaks through grpcio's generic ``unary_unary`` /
``stream_stream`` with betterproto2's own encoder and parser (not the
daemon's codec), and records the size of every message it receives.
"""

from __future__ import annotations

import contextlib
import queue as queue_module
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

import grpc
import pytest

from ringo_trio._contract import limits, versions
from ringo_trio._proto.ringo.v1 import (
    AckRequest,
    AckResponse,
    CancelTaskRequest,
    CancelTaskResponse,
    ClaimRequest,
    ClaimResponse,
    CreditUpdate,
    DeleteTasksRequest,
    DeleteTasksResponse,
    EnqueueManyRequest,
    EnqueueManyResponse,
    EnqueueRequest,
    EnqueueResponse,
    GetQueueStatsRequest,
    GetQueueStatsResponse,
    GetTaskRequest,
    GetTaskResponse,
    LeasedTask,
    LeaseRef,
    ListQueuesRequest,
    ListQueuesResponse,
    ListSchedulesRequest,
    ListSchedulesResponse,
    ListTasksRequest,
    ListTasksResponse,
    NackRequest,
    NackResponse,
    NegotiateRequest,
    NegotiateResponse,
    PutScheduleRequest,
    PutScheduleResponse,
    ReportProgressRequest,
    ReportProgressResponse,
    RequestContext,
    RetryTaskRequest,
    RetryTaskResponse,
    RetryTasksRequest,
    RetryTasksResponse,
    Schedule,
    Task,
    TaskSpec,
    TaskState,
    WorkerRegistration,
    WorkRequest,
    WorkRequestBatch,
    WorkResponse,
)
from ringo_trio.testing import DaemonProcess, spawn_daemon
from tests._kit.grpc_client import deadline

_M = TypeVar("_M")

MiB = 1024 * 1024
# grpcio's default receive limit, which MAX_REPLY_BYTES promises to honour.
GRPC_DEFAULT_RECEIVE = 4 * MiB
CALL_TIMEOUT = 60.0
# The whole test, daemon calls included; a hang fails instead of stalling the run.
TEST_TIMEOUT = 240

SERVICE = "/ringo.v1.QueueService/"
MINORS = [versions.MINOR, 10]


@pytest.fixture(autouse=True)
def _deadline() -> Iterator[None]:
    """Fail a test that runs longer than TEST_TIMEOUT (grpcio calls carry
    their own deadlines; this catches everything else)."""
    with deadline(TEST_TIMEOUT):
        yield


@pytest.fixture(scope="module")
def ringod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with spawn_daemon(tmp_path_factory.mktemp("replies") / "data") as process:
        yield process
    assert process.process.returncode == 0, process.stderr_text()


def name(prefix: str, size: int = limits.MAX_NAME_BYTES) -> str:
    """A fresh name of exactly `size` bytes."""
    head = f"{prefix}-{uuid.uuid4().hex}-"
    return head + "n" * (size - len(head))


def key(index: int, tag: str) -> str:
    head = f"{tag}-{index:06d}-"
    return head + "k" * (limits.MAX_UNIQUE_KEY_BYTES - len(head))


@dataclass
class Grpcio:
    """One session of a default grpcio client."""

    channel: grpc.Channel
    context: RequestContext
    received: dict[str, list[int]] = field(default_factory=dict)
    """Every message size received, by method."""
    leases: dict[str, set[str]] = field(default_factory=dict)
    """Task ids of every lease received, by queue."""
    attempts: set[tuple[str, int]] = field(default_factory=set)

    def call(self, method: str, request: Any, response_type: type[_M]) -> _M:
        if hasattr(request, "context"):
            request.context = self.context
        sizes = self.received.setdefault(method, [])

        def parse(data: bytes) -> _M:
            sizes.append(len(data))
            return response_type.parse(data)  # type: ignore[attr-defined, no-any-return]

        stub = self.channel.unary_unary(
            SERVICE + method, request_serializer=bytes, response_deserializer=parse
        )
        reply: _M = stub(request, timeout=CALL_TIMEOUT)
        return reply

    def claim(self, queue: str, limit: int, worker_id: str = "w") -> list[LeasedTask]:
        reply = self.call(
            "Claim",
            ClaimRequest(queue=queue, worker_id=worker_id, limit=limit),
            ClaimResponse,
        )
        self._note(queue, reply.tasks)
        return reply.tasks

    def _note(self, queue: str, tasks: list[LeasedTask]) -> None:
        got = self.leases.setdefault(queue, set())
        for item in tasks:
            assert item.lease is not None
            attempt = (item.lease.task_id, item.lease.attempt)
            assert attempt not in self.attempts, "an attempt handed out twice"
            self.attempts.add(attempt)
            got.add(item.lease.task_id)

    def enqueue_many(self, queue: str, specs: list[TaskSpec]) -> EnqueueManyResponse:
        return self.call(
            "EnqueueMany", EnqueueManyRequest(queue=queue, tasks=specs), EnqueueManyResponse
        )

    def enqueue_each(self, queue: str, specs: list[TaskSpec]) -> list[str]:
        """Task ids of `specs`, enqueued one call each (a setup that does
        not lean on EnqueueMany's bound)."""
        ids = []
        for spec in specs:
            result = self.call(
                "Enqueue", EnqueueRequest(queue=queue, task=spec), EnqueueResponse
            ).result
            assert result is not None
            assert result.task is not None
            ids.append(result.task.id)
        return ids

    def get(self, queue: str, task_id: str) -> Task:
        task = self.call(
            "GetTask", GetTaskRequest(queue=queue, task_id=task_id), GetTaskResponse
        ).task
        assert task is not None
        return task

    def list_all(self, queue: str, **filters: Any) -> list[Task]:
        """Every page of ListTasks at page_size 1000."""
        tasks: list[Task] = []
        token = ""
        while True:
            page = self.call(
                "ListTasks",
                ListTasksRequest(queue=queue, page_size=1000, page_token=token, **filters),
                ListTasksResponse,
            )
            tasks += page.tasks
            token = page.next_page_token
            if not token:
                return tasks

    def assert_nothing_unseen_leased(self, queue: str) -> None:
        """The daemon holds a lease of `queue` only where this client received it."""
        leased = {t.id for t in self.list_all(queue, states=[TaskState.LEASED])}
        assert leased <= self.leases.get(queue, set()), "leased but never received"

    def assert_bounded(self) -> None:
        for method, sizes in self.received.items():
            assert max(sizes, default=0) <= limits.MAX_REPLY_BYTES, method


@pytest.fixture(params=MINORS, ids=lambda minor: f"minor{minor}")
def client(ringod: DaemonProcess, request: pytest.FixtureRequest) -> Iterator[Grpcio]:
    with _session(ringod, request.param) as session:
        yield session


@contextlib.contextmanager
def _session(ringod: DaemonProcess, minor: int) -> Iterator[Grpcio]:
    """A negotiated session of a default grpcio client; on the way out, no
    message it received was over the bound."""
    # Default options: a 4 MiB receive limit.
    channel = grpc.insecure_channel(ringod.endpoint)
    try:
        hello = channel.unary_unary(
            SERVICE + "Negotiate",
            request_serializer=bytes,
            response_deserializer=NegotiateResponse.parse,
        )(
            NegotiateRequest(
                sdk_name="grpcio", sdk_version="0", protocol_major=1, protocol_minor=minor
            ),
            timeout=CALL_TIMEOUT,
        )
        assert hello.protocol_minor == minor
        session = Grpcio(channel, RequestContext(hello.protocol_major, minor, hello.session_token))
        yield session
        session.assert_bounded()
    finally:
        channel.close()


def test_the_bound_is_grpcs_default_receive_limit() -> None:
    """Example: MAX_REPLY_BYTES is what a default gRPC client accepts."""
    assert limits.MAX_REPLY_BYTES == GRPC_DEFAULT_RECEIVE


def _unseen_pending(client: Grpcio, queue: str, ids: list[str]) -> None:
    """Every task of `ids` this client did not receive is PENDING with no
    attempt spent."""
    for task_id in ids:
        if task_id not in client.leases.get(queue, set()):
            task = client.get(queue, task_id)
            assert (task.state, task.attempt) == (TaskState.PENDING, 0), task_id


# -- EnqueueMany ---------------------------------------------------------------


def test_enqueue_many_of_large_payloads_is_answered(client: Grpcio) -> None:
    """Property: EnqueueMany of 60 x 100 KB (an echo of 6 MB) is answered
    within 4 MiB; every task is created once. From minor 11 no payload comes
    back; at minor 10 the reply is the compact one beyond the budget."""
    queue = name("big")
    specs = [
        TaskSpec(task_type="t", payload=bytes([i]) * 100_000, unique_key=f"k{i}") for i in range(60)
    ]
    reply = client.enqueue_many(queue, specs)
    assert (reply.created_count, reply.duplicate_count, len(reply.results)) == (60, 0, 60)
    assert all(r.created and r.task is not None for r in reply.results)
    assert all(r.task.payload == b"" for r in reply.results if r.task is not None)
    # Stored whole, whatever the reply said.
    assert client.get(queue, reply.results[7].task.id).payload == specs[7].payload  # type: ignore[union-attr]
    # A retry of the batch creates nothing.
    again = client.enqueue_many(queue, specs)
    assert (again.created_count, again.duplicate_count) == (0, 60)
    client.assert_nothing_unseen_leased(queue)


def test_enqueue_many_of_maximal_names_and_keys_is_answered(client: Grpcio) -> None:
    """Property: 1000 tasks with 200-byte queue and type names and 512-byte
    unique keys are answered within 4 MiB; below minor 11 the reply is the
    full echo (it fits), from minor 11 the compact one."""
    queue = name("keys")
    specs = [
        TaskSpec(task_type=name("type"), payload=b"p" * 100, unique_key=key(i, "m"))
        for i in range(limits.MAX_BATCH)
    ]
    reply = client.enqueue_many(queue, specs)
    assert reply.created_count == limits.MAX_BATCH
    echoed = [r.task.payload for r in reply.results if r.task is not None]
    compact = client.context.protocol_minor >= 11
    assert echoed == [b"" if compact else b"p" * 100] * limits.MAX_BATCH
    assert [r.task.unique_key for r in reply.results if r.task] == [s.unique_key for s in specs]


# -- a queue at its limits: 1000 LEASED tasks with every text at its maximum ---------


@dataclass
class Heavy:
    queue: str
    specs: list[TaskSpec]
    ids: list[str]
    leases: set[str]


HEAVY_TASKS = limits.MAX_BATCH
# Tasks whose last attempt left a maximal error (more would only slow the test).
HEAVY_ERRORS = 20


@pytest.fixture(scope="module")
def heavy(ringod: DaemonProcess) -> Iterator[Heavy]:
    """1000 LEASED tasks of a 200-byte queue name, each with a 200-byte task
    type, a 512-byte unique key, a 200-byte worker id and a 4 KiB progress
    message; 20 of them also carry a 256 KiB error of an earlier attempt."""
    with _session(ringod, versions.MINOR) as session:
        queue = name("heavy")
        specs = [
            TaskSpec(task_type=name("type"), payload=b"p" * 1000, unique_key=key(i, "h"))
            for i in range(HEAVY_TASKS)
        ]
        created = session.enqueue_many(queue, specs)
        ids = [r.task.id for r in created.results if r.task is not None]
        worker = name("worker")
        # Small claims: the setup must work on a daemon without the bound too.
        first = session.claim(queue, HEAVY_ERRORS, worker)
        for item in first:
            session.call(
                "Nack",
                NackRequest(
                    lease=_ref(item),
                    error="e" * limits.MAX_ERROR_BYTES,
                    retry_delay_override=timedelta(0),
                ),
                NackResponse,
            )
        session.leases.clear()
        while len(session.leases.get(queue, ())) < HEAVY_TASKS:
            for item in session.claim(queue, 10, worker):
                session.call(
                    "ReportProgress",
                    ReportProgressRequest(
                        lease=_ref(item),
                        current=1,
                        total=2,
                        message="m" * limits.MAX_PROGRESS_MESSAGE_BYTES,
                    ),
                    ReportProgressResponse,
                )
        yield Heavy(queue, specs, ids, session.leases[queue])


def _ref(item: LeasedTask) -> LeaseRef:
    assert item.lease is not None
    return LeaseRef(item.lease.task_id, item.lease.attempt, item.lease.lease_token)


def test_enqueue_many_of_heavy_duplicates_is_answered(client: Grpcio, heavy: Heavy) -> None:
    """Property: EnqueueMany whose 1000 tasks are all duplicates of tasks
    carrying 4 KiB progress messages, 200-byte worker ids and (some) 256 KiB
    errors is answered within 4 MiB at either minor; nothing changes."""
    reply = client.enqueue_many(heavy.queue, heavy.specs)
    assert (reply.created_count, reply.duplicate_count) == (0, HEAVY_TASKS)
    tasks = [r.task for r in reply.results if r.task is not None]
    assert [t.id for t in tasks] == heavy.ids
    assert {t.state for t in tasks} == {TaskState.LEASED}
    for task in tasks:
        assert task.payload == b""
        assert len(task.last_error.encode()) <= limits.MAX_LIST_ERROR_BYTES
    leased = client.list_all(heavy.queue, states=[TaskState.LEASED])
    assert {t.id for t in leased} == heavy.leases
    assert max(client.received["EnqueueMany"]) > 3 * MiB // 4, "not the worst case"


def test_list_tasks_of_heavy_tasks_pages_within_the_bound(client: Grpcio, heavy: Heavy) -> None:
    """Property: ListTasks at page_size 1000 over tasks with 4 KiB progress
    messages comes back in pages within 4 MiB (a short page carries a
    next_page_token), and the pages together list every task once."""
    listed = client.list_all(heavy.queue)
    assert [t.id for t in listed] == heavy.ids
    assert all(t.progress is not None and len(t.progress.message) == 4096 for t in listed)
    assert len(client.received["ListTasks"]) >= 2, "a full page would not have fit"


def test_stats_and_queue_listing_of_a_heavy_queue(client: Grpcio, heavy: Heavy) -> None:
    """Property: GetQueueStats and ListQueues (page_size 1000) answer within 4 MiB."""
    stats = client.call(
        "GetQueueStats", GetQueueStatsRequest(queue=heavy.queue), GetQueueStatsResponse
    ).stats
    assert stats is not None
    assert stats.leased == HEAVY_TASKS
    assert len(stats.by_type) == HEAVY_TASKS
    client.call("ListQueues", ListQueuesRequest(page_size=1000), ListQueuesResponse)


# -- Claim -----------------------------------------------------------------------


@pytest.mark.parametrize(("tasks", "limit"), [(6, 6), (8, limits.MAX_BATCH)])
def test_claim_of_big_payloads_answers_fewer_and_leases_nothing_unseen(
    client: Grpcio, tasks: int, limit: int
) -> None:
    """Property: a Claim of 1 MiB payloads answers within 4 MiB (at least one
    task); a task it did not answer is PENDING with its attempt unspent.
    Claiming on drains the queue, each task handed out exactly once."""
    queue = name("claim")
    specs = [
        TaskSpec(task_type="t", payload=bytes([i]) * limits.MAX_PAYLOAD_BYTES) for i in range(tasks)
    ]
    ids = client.enqueue_each(queue, specs)
    rounds = 0
    while len(client.leases.get(queue, ())) < tasks:
        got = client.claim(queue, limit)
        assert got, "a claim of a non-empty queue answered nothing"
        assert all(item.task and len(item.task.payload) == limits.MAX_PAYLOAD_BYTES for item in got)
        client.assert_nothing_unseen_leased(queue)
        _unseen_pending(client, queue, ids)
        rounds += 1
    assert rounds >= 2
    for task_id in ids:
        task = client.get(queue, task_id)
        assert (task.state, task.attempt) == (TaskState.LEASED, 1)


def test_claim_of_a_thousand_small_tasks_gets_them_all(client: Grpcio) -> None:
    """Property: the bound does not cap a claim of small tasks: limit 1000
    leases all 1000 at once."""
    queue = name("small")
    client.enqueue_many(queue, [TaskSpec(task_type="t", payload=b"x" * 100)] * 1000)
    assert len(client.claim(queue, 1000)) == 1000
    client.assert_nothing_unseen_leased(queue)


# -- one task at its limits -----------------------------------------------------------


def _maximal_task(client: Grpcio, queue: str) -> str:
    """A SUCCEEDED task holding a 1 MiB payload, a 1 MiB result, a 256 KiB
    error, a 4 KiB progress message, a 512-byte key and 200-byte names."""
    spec = TaskSpec(
        task_type=name("type"),
        payload=b"P" * limits.MAX_PAYLOAD_BYTES,
        unique_key=key(0, "max"),
    )
    [task_id] = client.enqueue_each(queue, [spec])
    [first] = client.claim(queue, 1, name("worker"))
    client.call(
        "Nack",
        NackRequest(
            lease=_ref(first), error="E" * limits.MAX_ERROR_BYTES, retry_delay_override=timedelta(0)
        ),
        NackResponse,
    )
    [second] = client.claim(queue, 1, name("worker"))
    client.call(
        "ReportProgress",
        ReportProgressRequest(
            lease=_ref(second), current=1, total=1, message="M" * limits.MAX_PROGRESS_MESSAGE_BYTES
        ),
        ReportProgressResponse,
    )
    client.call(
        "Ack",
        AckRequest(lease=_ref(second), result=b"R" * limits.MAX_RESULT_BYTES),
        AckResponse,
    )
    return task_id


def test_rpcs_of_one_maximal_task_are_answered(client: Grpcio) -> None:
    """Property: GetTask, Enqueue and EnqueueMany (a duplicate), RetryTask
    and CancelTask of a task with every field at its limit answer within
    4 MiB; RetryTasks and DeleteTasks answer counts."""
    queue = name("maximal")
    task_id = _maximal_task(client, queue)
    task = client.get(queue, task_id)
    assert (len(task.payload), len(task.result or b""), len(task.last_error)) == (
        limits.MAX_PAYLOAD_BYTES,
        limits.MAX_RESULT_BYTES,
        limits.MAX_ERROR_BYTES,
    )
    spec = TaskSpec(task_type=task.task_type, payload=b"x", unique_key=task.unique_key)
    duplicate = client.call(
        "Enqueue", EnqueueRequest(queue=queue, task=spec), EnqueueResponse
    ).result
    assert duplicate is not None
    assert duplicate.task is not None
    assert duplicate.task.result == task.result  # one task: the full echo fits
    many = client.enqueue_many(queue, [spec] * limits.MAX_BATCH)
    assert many.duplicate_count == limits.MAX_BATCH
    retried = client.call(
        "RetryTask", RetryTaskRequest(queue=queue, task_id=task_id), RetryTaskResponse
    ).task
    assert retried is not None
    assert retried.state == TaskState.PENDING
    cancelled = client.call(
        "CancelTask",
        CancelTaskRequest(queue=queue, task_id=task_id, reason="C" * limits.MAX_ERROR_BYTES),
        CancelTaskResponse,
    ).task
    assert cancelled is not None
    assert cancelled.payload == task.payload
    client.call(
        "RetryTasks",
        RetryTasksRequest(queue=queue, limit=limits.MAX_DELETE_BATCH),
        RetryTasksResponse,
    )
    client.call(
        "DeleteTasks",
        DeleteTasksRequest(queue=queue, limit=limits.MAX_DELETE_BATCH),
        DeleteTasksResponse,
    )
    client.assert_nothing_unseen_leased(queue)


# -- GetQueueStats of a queue of many task types ----------------------------------------


@pytest.mark.slow  # ~17 s: 25,000 task types (in-process: test_reply_budget.py)
def test_queue_stats_of_many_task_types_is_answered(ringod: DaemonProcess) -> None:
    """Property: GetQueueStats of a queue holding 25,000 task types of 200
    bytes (5 MB of per-type counts) answers within 4 MiB; its totals count
    every task."""
    with _session(ringod, versions.MINOR) as client:
        queue = name("types")
        count = 25_000
        for start in range(0, count, limits.MAX_BATCH):
            client.enqueue_many(
                queue,
                [
                    TaskSpec(task_type=name(f"t{i:05d}"))
                    for i in range(start, start + limits.MAX_BATCH)
                ],
            )
        stats = client.call(
            "GetQueueStats", GetQueueStatsRequest(queue=queue), GetQueueStatsResponse
        ).stats
        assert stats is not None
        assert stats.pending == count
        assert 0 < len(stats.by_type) <= limits.MAX_STATS_TASK_TYPES


# -- the Work stream ------------------------------------------------------------------


class _Work:
    """A grpcio Work call fed from a queue of requests."""

    def __init__(self, client: Grpcio) -> None:
        self._requests: queue_module.Queue[WorkRequest | None] = queue_module.Queue()
        self.sizes: list[int] = []

        def parse(data: bytes) -> WorkResponse:
            self.sizes.append(len(data))
            return WorkResponse.parse(data)

        stub = client.channel.stream_stream(
            SERVICE + "Work", request_serializer=bytes, response_deserializer=parse
        )
        self.call = stub(iter(self._requests.get, None), timeout=CALL_TIMEOUT)

    def send(self, request: WorkRequest) -> None:
        self._requests.put(request)

    def frames(self) -> Iterator[WorkResponse]:
        """Every response, batch frames flattened."""
        for response in self.call:
            if response.batch is not None:
                yield from response.batch.responses
            else:
                yield response

    def close(self) -> None:
        self._requests.put(None)
        self.call.cancel()


def test_work_stream_frames_stay_within_the_bound(client: Grpcio) -> None:
    """Property: on the Work stream, a batch of 1000 commands on stale
    leases with 512-byte task ids (each answered with an error naming the
    id) and pushes of 1 MiB payloads arrive in messages within 4 MiB; the
    pushed tasks are leased, nothing else is."""
    queue = name("work")
    ids = client.enqueue_each(
        queue, [TaskSpec(task_type="t", payload=b"w" * limits.MAX_PAYLOAD_BYTES)] * 8
    )
    work = _Work(client)
    try:
        work.send(
            WorkRequest(
                register=WorkerRegistration(
                    context=client.context, queue=queue, worker_id="w", max_concurrency=8
                )
            )
        )
        frames = work.frames()
        assert next(frames).registered is not None
        weird = "\x01" * limits.MAX_UNIQUE_KEY_BYTES
        stale = [
            WorkRequest(
                request_id=i + 1,
                nack=NackRequest(lease=LeaseRef(weird, 1, weird), error="e"),
            )
            for i in range(limits.MAX_WORK_BATCH)
        ]
        work.send(WorkRequest(batch=WorkRequestBatch(requests=stale)))
        work.send(
            WorkRequest(request_id=limits.MAX_WORK_BATCH + 1, credit=CreditUpdate(available=8))
        )
        results = pushes = 0
        for frame in frames:
            if frame.result is not None:
                results += 1
            elif frame.task is not None:
                assert frame.task.lease is not None
                client.leases.setdefault(queue, set()).add(frame.task.lease.task_id)
                pushes += 1
            if results == limits.MAX_WORK_BATCH + 1 and pushes == 8:
                break
        assert max(work.sizes) <= limits.MAX_REPLY_BYTES
        assert max(work.sizes) > 2 * MiB, "not the worst case"
    finally:
        work.close()
    client.assert_nothing_unseen_leased(queue)
    assert client.leases[queue] == set(ids)


def test_schedules_with_large_payloads_are_listed_within_the_bound(ringod: DaemonProcess) -> None:
    """Property: ListSchedules of schedules whose payloads are at their limit
    (1 MiB each: six are over 4 MiB) is answered by a default grpcio client,
    with the longest prefix that fits, in name order; one queue's listing
    asks for the rest."""
    queue = name("sched")
    with _session(ringod, versions.MINOR) as client:
        for index in range(6):
            client.call(
                "PutSchedule",
                PutScheduleRequest(
                    schedule=Schedule(
                        name=f"s{index}",
                        queue=queue,
                        task_type="t",
                        cron="0 0 1 1 *",
                        payload=b"p" * limits.MAX_PAYLOAD_BYTES,
                    )
                ),
                PutScheduleResponse,
            )
        listed = client.call(
            "ListSchedules", ListSchedulesRequest(queue=queue), ListSchedulesResponse
        ).schedules
        assert 1 <= len(listed) < 6
        assert [s.name for s in listed] == [f"s{i}" for i in range(len(listed))]
        assert all(len(s.payload) == limits.MAX_PAYLOAD_BYTES for s in listed)

"""The Work stream over gRPC: against real daemons, against in-process daemons
on virtual time (`tests/_kit/virtual_daemon.py`), and, for faults a socket cannot be made to show
on cue, in-process against a fake stream.

Pushes are observed in stream order: a task pushed before a command was
executed reaches the worker before that command's result. "Nothing more was
pushed" is therefore checked on virtual time: after `quiet` (which returns
only once the daemon has done all it would do by itself) a command is sent,
and its result closes the window. Wake-ups are timed on the virtual clock:
a push woken by an event arrives at that event's instant.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import signal
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import anyio
import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ringo_trio._contract import limits
from ringo_trio._contract.work.server import PUSH_BUDGET_BYTES
from ringo_trio._proto.ringo.v1 import (
    AckRequest,
    CreditUpdate,
    EnqueueManyRequest,
    ErrorCode,
    ExtendLeaseRequest,
    Lease,
    LeasedTask,
    NackRequest,
    Progress,
    RejectRequest,
    ReleaseRequest,
    ReportProgressRequest,
    RequestContext,
    RetryBackoff,
    Task,
    TaskSpec,
    TaskState,
    WorkerDrain,
    WorkerRegistration,
    WorkRequest,
    WorkResponse,
    WorkResult,
)
from ringo_trio._wire.work import encode_work_result
from ringo_trio.server.clock import LoopClock
from ringo_trio.server.rpc import work_frames
from ringo_trio.server.rpc.service import QueueService
from ringo_trio.server.rpc.work import WorkerView
from ringo_trio.server.storage.base import Push
from ringo_trio.server.storage.sqlite import SQLiteEngine
from ringo_trio.testing import DaemonProcess, spawn_daemon
from tests._kit.grpc_client import Client, WorkStream, connect, elements, new_queue, open_work, ref
from tests._kit.virtual_daemon import PROMPT, QUIET, now, on_virtual_time, quiet, virtual_daemon
from tests._kit.work_stream import FakeStream, enqueue_n, in_process, ok, refused, worker

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def heartbeat_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with spawn_daemon(
        tmp_path_factory.mktemp("heartbeat") / "data", extra_args=["--heartbeat-interval", "0.05"]
    ) as process:
        yield process


@pytest.fixture(params=[9, 10], ids=["minor9", "minor10"])
def work_minor(request: pytest.FixtureRequest) -> int:
    """The stream tests that matter run at both frame forms: minor 9 (a frame
    per push and per result) and minor 10 (pushes in batch frames)."""
    return int(request.param)


# -- registration --------------------------------------------------------------


async def test_registration_is_answered_with_the_effective_settings(
    daemon: DaemonProcess,
) -> None:
    """Property: `registered` echoes worker_id and max_concurrency and reports
    the effective lease (unset or zero → the daemon default) and whether
    ordered request ids are on (honoured at minor ≥ 6)."""
    queue = new_queue()
    with anyio.fail_after(10):
        async with connect(daemon) as client:
            async with open_work(client) as work:
                got = await work.register(queue, worker_id="w-7", max_concurrency=7)
                assert (got.worker_id, got.max_concurrency) == ("w-7", 7)
                assert got.lease_duration == limits.DEFAULT_LEASE
                assert got.ordered_request_ids is False
            async with open_work(client) as work:
                got = await work.register(
                    queue,
                    lease_duration=timedelta(seconds=5),
                    ordered_request_ids=True,
                    max_concurrency=limits.MAX_BATCH,
                )
                assert got.lease_duration == timedelta(seconds=5)
                assert got.ordered_request_ids is True
                assert got.max_concurrency == limits.MAX_BATCH
            async with open_work(client) as work:
                got = await work.register(queue, lease_duration=timedelta(0))
                assert got.lease_duration == limits.DEFAULT_LEASE


REGISTRATION_REFUSALS: list[tuple[str, dict[str, Any], Status, str]] = [
    ("empty-queue", {"queue": ""}, Status.INVALID_ARGUMENT, "register.queue"),
    ("long-queue", {"queue": "q" * 201}, Status.INVALID_ARGUMENT, "register.queue"),
    ("no-worker-id", {"worker_id": ""}, Status.INVALID_ARGUMENT, "register.worker_id"),
    ("bad-type", {"task_types": ["ok", ""]}, Status.INVALID_ARGUMENT, "register.task_types[1]"),
    ("zero-concurrency", {"max_concurrency": 0}, Status.INVALID_ARGUMENT, "max_concurrency"),
    ("huge-concurrency", {"max_concurrency": 2**31}, Status.INVALID_ARGUMENT, "max_concurrency"),
    (
        "long-lease",
        {"lease_duration": limits.MAX_LEASE + timedelta(seconds=1)},
        Status.INVALID_ARGUMENT,
        "register.lease_duration",
    ),
    (
        "negative-lease",
        {"lease_duration": timedelta(seconds=-1)},
        Status.INVALID_ARGUMENT,
        "register.lease_duration",
    ),
    ("no-context", {"context": None}, Status.OUT_OF_RANGE, "Negotiate"),
    ("unknown-token", {"context": "bogus-token"}, Status.OUT_OF_RANGE, "unknown or expired"),
    ("other-major", {"context": "major-2"}, Status.OUT_OF_RANGE, "major 2"),
    ("minor-above-session", {"context": "minor-above"}, Status.OUT_OF_RANGE, "above"),
]


@pytest.mark.parametrize(
    ("fields", "status", "fragment"),
    [r[1:] for r in REGISTRATION_REFUSALS],
    ids=[r[0] for r in REGISTRATION_REFUSALS],
)
async def test_a_refused_registration_ends_the_stream_with_its_status(
    daemon: DaemonProcess, fields: dict[str, Any], status: Status, fragment: str
) -> None:
    """Property: a registration is checked like a unary call — context first
    (OUT_OF_RANGE, so the SDK renegotiates), then fields (INVALID_ARGUMENT
    naming `register.<field>`); a refusal ends the stream with that status and
    leases nothing."""
    queue = new_queue()
    with anyio.fail_after(10):
        async with connect(daemon, minor=1) as client:
            fields = dict(fields)
            target = fields.pop("queue", queue)
            [task_id] = await enqueue_n(client, queue, 1)
            context = client.context
            kind = fields.get("context", context)
            if kind == "bogus-token":
                fields["context"] = RequestContext(1, 1, "bogus")
            elif kind == "major-2":
                fields["context"] = RequestContext(2, 1, context.session_token)
            elif kind == "minor-above":
                fields["context"] = RequestContext(1, 6, context.session_token)
            async with open_work(client) as work:
                await work.send_register(target, **fields)
                await work.send(credit=CreditUpdate(available=1))
                got, message = await work.end_status()
                assert got is status, (got, message)
                assert fragment in message, message
                assert work.tasks == []
            assert (await client.get(queue, task_id)).state is TaskState.PENDING


@pytest.mark.parametrize(
    "first",
    [
        WorkRequest(request_id=1, credit=CreditUpdate(available=1)),
        WorkRequest(request_id=1, ack=AckRequest()),
        WorkRequest(request_id=1),
    ],
    ids=["credit", "ack", "empty"],
)
async def test_commands_before_register_end_the_stream(
    daemon: DaemonProcess, first: WorkRequest
) -> None:
    """Property: the first frame must be `register`; anything else ends the
    stream INVALID_ARGUMENT saying so, and nothing is pushed."""
    with anyio.fail_after(10):
        async with connect(daemon) as client, open_work(client) as work:
            await work.stream.send_message(first)
            got, message = await work.end_status()
            assert got is Status.INVALID_ARGUMENT
            assert "must be `register`" in message
            assert work.tasks == []


async def test_a_refusal_reaches_a_grpclib_client_as_its_status(daemon: DaemonProcess) -> None:
    """Property: a stream ended with a status is not also reset, so grpclib's
    client (the SDK transport) reads that status — here OUT_OF_RANGE, which
    makes the SDK renegotiate — instead of a bare StreamTerminatedError, and
    a result sent just before the end is not lost."""
    queue = new_queue()
    with anyio.fail_after(15):
        async with connect(daemon) as client:
            for _ in range(20):
                async with open_work(client) as work:
                    await work.send_register(queue, context=RequestContext(1, 6, "bogus"))
                    with pytest.raises(GRPCError) as refusal:
                        await work.frame()
                    assert refusal.value.status is Status.OUT_OF_RANGE


# -- credit --------------------------------------------------------------------


@on_virtual_time
async def test_credit_is_absolute_and_bounds_every_push(work_minor: int) -> None:
    """Property: credit is absolute ("`available` more from now on"): the
    daemon pushes exactly that many, a later update replaces (never adds to)
    it, and credit 0 stops pushes. ("Nothing more" is checked after `quiet`:
    on virtual time the daemon has pushed all it would by then.)"""
    queue = new_queue()
    async with (
        virtual_daemon() as served,
        connect(served.daemon, minor=work_minor) as client,
        worker(client, queue, max_concurrency=20) as work,
    ):
        await enqueue_n(client, queue, 5)
        ok(await work.call(credit=CreditUpdate(available=2)))
        await work.wait_tasks(2)
        await quiet()
        ok(await work.call(credit=CreditUpdate(available=0)))
        assert len(work.tasks) == 2
        leased = [await client.get(queue, t.task.id) for t in work.tasks if t.task]
        assert {t.state for t in leased} == {TaskState.LEASED}
        assert await client.activity(queue) == 5

        # 3 then 1 with nothing claimable: the second replaces the first.
        empty = new_queue()
        async with worker(client, empty, max_concurrency=20) as other:
            ok(await other.call(credit=CreditUpdate(available=3)))
            ok(await other.call(credit=CreditUpdate(available=1)))
            await enqueue_n(client, empty, 5)
            await other.wait_tasks(1)
            await quiet()
            ok(await other.call(credit=CreditUpdate(available=0)))
            assert len(other.tasks) == 1

        # Credit 0 stays 0: new work is not pushed.
        await enqueue_n(client, queue, 2)
        await quiet()
        ok(await work.call(credit=CreditUpdate(available=0)))
        assert len(work.tasks) == 2


async def test_every_push_is_covered_by_the_credit_answered_before_it(
    daemon: DaemonProcess, work_minor: int
) -> None:
    """Property (what lets a worker mirror its credit exactly): on the wire,
    every push spends the credit whose result came before it — a credit
    change and its result are one step, never split by a push. Checked with
    a burst of credit updates racing a busy dispatcher (on a real daemon, so
    each run races differently): a mirror that becomes N at each OK result
    and drops by one per push never goes below zero, and ends equal to what
    the daemon still owes — the result of a last credit{0} comes with no push
    before it, so none was pushed beyond the credit. (That no push comes
    later either is checked on virtual time, where a quiet period is free:
    test_credit_is_absolute_and_bounds_every_push.)"""
    queue = new_queue()
    values = [3, 0, 7, 2, 5, 1, 0, 9, 4, 6, 2, 8, 0, 3, 5] * 3
    with anyio.fail_after(20):
        async with (
            connect(daemon, minor=work_minor) as client,
            worker(client, queue, max_concurrency=10_000) as work,
        ):
            await enqueue_n(client, queue, 400)
            sent = {}
            for value in values:
                index = await work.send(credit=CreditUpdate(available=value))
                sent[work.sent_ids[index]] = value
            mirror = 0
            answered = 0
            while answered < len(values):
                for frame in elements(await work.frame()):
                    if frame.task is not None:
                        assert mirror > 0, "a task was pushed that no answered credit covered"
                        mirror -= 1
                    elif frame.result is not None:
                        ok(frame.result)
                        mirror = sent[frame.result.request_id]
                        answered += 1
            # The last credit is spent to the end and nothing more arrives.
            while mirror:
                for frame in elements(await work.frame()):
                    if frame.task is not None:
                        mirror -= 1
            pushed = len(work.tasks)
            ok(await work.call(credit=CreditUpdate(available=0)))
            assert len(work.tasks) == pushed, "a push beyond the credit"


@on_virtual_time
async def test_credit_beyond_capacity_is_refused_until_leases_are_settled(work_minor: int) -> None:
    """Property: pushed-and-unsettled ≤ capacity is enforced by the daemon. A
    credit with available + outstanding > capacity is RESOURCE_EXHAUSTED
    (reason=credit_capacity) and changes nothing; available 0 is always
    accepted; a lease stops counting once the worker acks/nacks/rejects it on
    the stream."""
    queue = new_queue()
    async with (
        virtual_daemon() as served,
        connect(served.daemon, minor=work_minor) as client,
        worker(client, queue, max_concurrency=2) as work,
    ):
        refused(
            await work.call(credit=CreditUpdate(available=3)),
            ErrorCode.RESOURCE_EXHAUSTED,
            reason="credit_capacity",
        )
        await enqueue_n(client, queue, 4)
        ok(await work.call(credit=CreditUpdate(available=1)))
        [first] = await work.wait_tasks(1)
        refused(
            await work.call(credit=CreditUpdate(available=2)),
            ErrorCode.RESOURCE_EXHAUSTED,
            reason="credit_capacity",
        )
        # The refused update granted nothing (the old credit, now 0, stands).
        await quiet()
        ok(await work.call(credit=CreditUpdate(available=0)))
        assert len(work.tasks) == 1
        ok(await work.call(ack=AckRequest(lease=ref(first))))
        ok(await work.call(credit=CreditUpdate(available=2)))
        second, third = (await work.wait_tasks(3))[1:]
        refused(
            await work.call(credit=CreditUpdate(available=1)),
            ErrorCode.RESOURCE_EXHAUSTED,
            reason="credit_capacity",
        )
        ok(await work.call(nack=NackRequest(lease=ref(second), retry_delay_override=None)))
        ok(await work.call(reject=RejectRequest(lease=ref(third), error="no")))
        ok(await work.call(credit=CreditUpdate(available=2)))


@on_virtual_time
async def test_a_grant_adds_to_the_credit_under_the_capacity_rule(work_minor: int) -> None:
    """Property (minor ≥ 10): a grant adds to what is left ("push me this many
    MORE") and is refused, changing nothing, exactly when credit + grant +
    outstanding would exceed the capacity; below minor 10 it is
    INCOMPATIBLE_VERSION and changes nothing; with ``available`` it is
    INVALID_ARGUMENT naming ``available``."""
    queue = new_queue()
    async with (
        virtual_daemon() as served,
        connect(served.daemon, minor=work_minor) as client,
        worker(client, queue, max_concurrency=3) as work,
    ):
        if work_minor < 10:
            refused(await work.call(credit=CreditUpdate(grant=1)), ErrorCode.INCOMPATIBLE_VERSION)
            await enqueue_n(client, queue, 1)
            await quiet()
            ok(await work.call(credit=CreditUpdate(available=0)))
            assert work.tasks == []
            return
        refused(
            await work.call(credit=CreditUpdate(available=1, grant=1)),
            ErrorCode.INVALID_ARGUMENT,
            field="credit.available",
        )
        ok(await work.call(credit=CreditUpdate(grant=2)))
        ok(await work.call(credit=CreditUpdate(grant=1)))  # 2 + 1: added, not replaced
        refused(
            await work.call(credit=CreditUpdate(grant=1)),
            ErrorCode.RESOURCE_EXHAUSTED,
            reason="credit_capacity",
        )
        await enqueue_n(client, queue, 5)
        leases = await work.wait_tasks(3)
        await quiet()
        refused(
            await work.call(credit=CreditUpdate(grant=1)),
            ErrorCode.RESOURCE_EXHAUSTED,
            reason="credit_capacity",
        )
        assert len(work.tasks) == 3  # the refused grant added nothing
        ok(await work.call(ack=AckRequest(lease=ref(leases[0]))))
        ok(await work.call(credit=CreditUpdate(grant=1)))
        await work.wait_tasks(4)
        await quiet()
        ok(await work.call(credit=CreditUpdate(available=0)))
        assert len(work.tasks) == 4


async def test_target_concurrency_is_the_capacity_from_then_on(
    daemon: DaemonProcess, work_minor: int
) -> None:
    """Property (minor ≥ 2): a credit's target_concurrency replaces the
    capacity the refusal rule uses, upwards and downwards, and a refused update
    leaves the old capacity in place."""
    queue = new_queue()
    with anyio.fail_after(15):
        async with (
            connect(daemon, minor=work_minor) as client,
            worker(client, queue, max_concurrency=1) as work,
        ):
            await enqueue_n(client, queue, 5)
            ok(await work.call(credit=CreditUpdate(available=3, target_concurrency=3)))
            leases = await work.wait_tasks(3)
            refused(
                await work.call(credit=CreditUpdate(available=1, target_concurrency=3)),
                ErrorCode.RESOURCE_EXHAUSTED,
                reason="credit_capacity",
            )
            ok(await work.call(credit=CreditUpdate(available=0, target_concurrency=1)))
            for leased in leases:
                ok(await work.call(ack=AckRequest(lease=ref(leased))))
            refused(
                await work.call(credit=CreditUpdate(available=2)),
                ErrorCode.RESOURCE_EXHAUSTED,
                reason="credit_capacity",
            )
            refused(
                await work.call(credit=CreditUpdate(available=4, target_concurrency=3)),
                ErrorCode.RESOURCE_EXHAUSTED,
            )
            # The refusal above did not raise the capacity to 3.
            refused(await work.call(credit=CreditUpdate(available=2)), ErrorCode.RESOURCE_EXHAUSTED)
            ok(await work.call(credit=CreditUpdate(available=1)))
            await work.wait_tasks(4)


@on_virtual_time
async def test_minor_1_refuses_target_concurrency_and_ignores_ordered_ids() -> None:
    """Property: on a daemon serving minor 1, target_concurrency (minor 2) is
    INCOMPATIBLE_VERSION and changes nothing, and ordered_request_ids
    (minor 6) is reported off and not enforced."""
    queue = new_queue()
    async with (
        virtual_daemon(protocol_minor=1) as served,
        connect(served.daemon) as client,
        open_work(client) as work,
    ):
        assert client.context.protocol_minor == 1
        got = await work.register(queue, ordered_request_ids=True)
        assert got.ordered_request_ids is False
        refused(
            await work.call(5, credit=CreditUpdate(available=1, target_concurrency=4)),
            ErrorCode.INCOMPATIBLE_VERSION,
        )
        await enqueue_n(client, queue, 1)
        await quiet()
        # Decreasing ids are executed: the stream did not turn ordering on.
        ok(await work.call(4, credit=CreditUpdate(available=0)))
        assert work.tasks == []
        ok(await work.call(3, credit=CreditUpdate(available=1)))
        await work.wait_tasks(1)


async def test_ordered_ids_refuse_a_non_increasing_id_without_executing_it(
    daemon: DaemonProcess,
) -> None:
    """Property: with ordered_request_ids (minor 6) a request_id ≤ the
    previous one is INVALID_ARGUMENT (field=request_id) and not executed;
    without it, repeated ids are executed and echoed."""
    queue = new_queue()
    with anyio.fail_after(15):
        async with connect(daemon) as client:
            await enqueue_n(client, queue, 2)
            async with worker(client, queue, ordered_request_ids=True) as work:
                ok(await work.call(10, credit=CreditUpdate(available=1)))
                [held] = await work.wait_tasks(1)
                progress = ReportProgressRequest(lease=ref(held), current=1, message="first")
                ok(await work.call(11, progress=progress))
                for stale_id in (11, 3):
                    again = ReportProgressRequest(lease=ref(held), current=2, message="again")
                    refused(
                        await work.call(stale_id, progress=again),
                        ErrorCode.INVALID_ARGUMENT,
                        field="request_id",
                    )
                assert held.task is not None
                task = await client.get(queue, held.task.id)
                assert task.progress is not None
                assert task.progress.message == "first"
                ok(await work.call(12, ack=AckRequest(lease=ref(held))))
            async with worker(client, queue) as work:
                ok(await work.call(1, credit=CreditUpdate(available=1)))
                [held] = await work.wait_tasks(1)
                for message in ("one", "two"):
                    progress = ReportProgressRequest(lease=ref(held), message=message)
                    ok(await work.call(7, progress=progress))
                assert held.task is not None
                task = await client.get(queue, held.task.id)
                assert task.progress is not None
                assert task.progress.message == "two"


# -- commands ------------------------------------------------------------------


async def test_every_command_is_answered_once_in_order_with_its_own_id(
    daemon: DaemonProcess, work_minor: int
) -> None:
    """Property: each command — valid or not, whatever it fails with — gets
    exactly one result carrying its request_id, in the order the commands
    were sent, and the stream survives every refusal."""
    queue = new_queue()
    with anyio.fail_after(15):
        async with connect(daemon, minor=work_minor) as client, worker(client, queue) as work:
            await enqueue_n(client, queue, 2)
            ok(await work.call(1, credit=CreditUpdate(available=2)))
            a, b = await work.wait_tasks(2)
            burst: list[tuple[int, dict[str, Any], ErrorCode | None, str | None]] = [
                (100, {"ack": AckRequest(lease=ref(a))}, None, None),
                (7, {"ack": AckRequest(lease=ref(a))}, ErrorCode.LEASE_LOST, None),
                (
                    55,
                    {"nack": NackRequest(lease=ref(b), retry_delay_override=timedelta(seconds=-1))},
                    ErrorCode.INVALID_ARGUMENT,
                    "nack.retry_delay_override",
                ),
                (
                    3,
                    {"extend_lease": ExtendLeaseRequest(lease=ref(b))},
                    ErrorCode.INVALID_ARGUMENT,
                    "extend_lease.extension",
                ),
                (
                    1000,
                    {
                        "extend_lease": ExtendLeaseRequest(
                            lease=ref(b), extension=timedelta(seconds=30)
                        )
                    },
                    None,
                    None,
                ),
                (
                    4,
                    {"progress": ReportProgressRequest(lease=ref(b), current=math.nan)},
                    ErrorCode.INVALID_ARGUMENT,
                    "progress.current",
                ),
                (5, {"progress": ReportProgressRequest(lease=ref(b), current=1)}, None, None),
                (6, {}, ErrorCode.INVALID_ARGUMENT, "body"),
                (
                    8,
                    {"register": WorkerRegistration(context=client.context, queue=queue)},
                    ErrorCode.FAILED_PRECONDITION,
                    None,
                ),
                (9, {"drain": WorkerDrain(begin=False)}, ErrorCode.INVALID_ARGUMENT, "drain.begin"),
                (10, {"ack": AckRequest()}, ErrorCode.INVALID_ARGUMENT, "ack.lease"),
                (11, {"credit": CreditUpdate(available=100)}, ErrorCode.RESOURCE_EXHAUSTED, None),
                (12, {"reject": RejectRequest(lease=ref(b), error="bad")}, None, None),
                (13, {"credit": CreditUpdate(available=0)}, None, None),
            ]
            for request_id, body, _, _ in burst:
                await work.send(request_id, **body)
            # The helper checks that the n-th result carries the n-th id.
            await work.answer(len(burst))
            assert [r.request_id for r in work.answers] == [1] + [i for i, *_ in burst]
            for result, (_, _, code, field) in zip(work.answers[1:], burst, strict=True):
                if code is None:
                    ok(result)
                else:
                    refused(result, code, **({"field": field} if field else {}))
            assert work.answers[5].lease is not None
            ok(await work.call(14, credit=CreditUpdate(available=0)))
            assert len(work.answers) == len(burst) + 2


async def test_lease_commands_on_the_stream_mirror_the_unary_rpcs(
    daemon: DaemonProcess, work_minor: int
) -> None:
    """Property: ack, nack, reject, extend_lease and progress on the stream do
    what the unary RPCs do (observed with GetTask): SUCCEEDED; PENDING after
    the override with the error; DEAD with the error; until = server now +
    extension, returned in the result; progress stored on the task."""
    queue = new_queue()
    with anyio.fail_after(15):
        async with connect(daemon, minor=work_minor) as client, worker(client, queue) as work:
            ids = await enqueue_n(client, queue, 5)
            ok(await work.call(credit=CreditUpdate(available=5)))
            leased = {t.task.id: t for t in await work.wait_tasks(5) if t.task}
            acked, nacked, rejected, extended, progressed = (leased[i] for i in ids)

            ok(await work.call(ack=AckRequest(lease=ref(acked))))
            ok(
                await work.call(
                    nack=NackRequest(
                        lease=ref(nacked), error="boom", retry_delay_override=timedelta(hours=1)
                    )
                )
            )
            ok(await work.call(reject=RejectRequest(lease=ref(rejected), error="bad input")))
            result = ok(
                await work.call(
                    extend_lease=ExtendLeaseRequest(
                        lease=ref(extended), extension=timedelta(minutes=7)
                    )
                )
            )
            ok(
                await work.call(
                    progress=ReportProgressRequest(
                        lease=ref(progressed), current=3, total=4, message="most"
                    )
                )
            )

            assert (await client.get(queue, ids[0])).state is TaskState.SUCCEEDED
            task = await client.get(queue, ids[1])
            assert (task.state, task.last_error) == (TaskState.PENDING, "boom")
            assert task.available_at == task.updated_at + timedelta(hours=1)
            task = await client.get(queue, ids[2])
            assert (task.state, task.last_error) == (TaskState.DEAD, "bad input")
            task = await client.get(queue, ids[3])
            assert result.lease is not None
            assert extended.lease is not None
            assert result.lease.lease_token == extended.lease.lease_token
            assert task.lease_until == result.lease.until
            assert result.lease.until == task.updated_at + timedelta(minutes=7)
            task = await client.get(queue, ids[4])
            assert task.progress is not None
            assert (task.progress.current, task.progress.total) == (3, 4)
            assert task.progress.message == "most"
            assert task.state is TaskState.LEASED


@on_virtual_time
async def test_a_nack_on_the_stream_wakes_an_idle_stream(work_minor: int) -> None:
    """Property: a nack on the stream notifies the queue like the unary Nack:
    another stream idling on the queue receives the next attempt at once, at
    the nack's own (virtual) instant — not when the old lease would have
    expired."""
    queue = new_queue()
    async with (
        virtual_daemon() as served,
        connect(served.daemon, minor=work_minor) as client,
        worker(client, queue, worker_id="a") as first,
        worker(client, queue, worker_id="b") as second,
    ):
        await enqueue_n(client, queue, 1)
        ok(await first.call(credit=CreditUpdate(available=1)))
        [held] = await first.wait_tasks(1)
        ok(await second.call(credit=CreditUpdate(available=1)))
        await quiet()  # the second stream is now asleep
        nacked_at = now()
        nack = NackRequest(lease=ref(held), retry_delay_override=timedelta(0))
        ok(await first.call(nack=nack))
        [again] = await second.wait_tasks(1)
        assert now() - nacked_at < PROMPT
        assert again.lease is not None
        assert again.lease.attempt == 2


@on_virtual_time
async def test_a_stale_lease_is_lease_lost_and_frees_its_slot(work_minor: int) -> None:
    """Property: a command about a lease that is no longer live is answered
    LEASE_LOST (and changes nothing), and that lease stops counting against
    the stream's capacity."""
    queue = new_queue()
    async with (
        virtual_daemon() as served,
        connect(served.daemon, minor=work_minor) as client,
        worker(client, queue, max_concurrency=1, lease_duration=timedelta(seconds=0.4)) as work,
    ):
        await enqueue_n(client, queue, 1)
        ok(await work.call(credit=CreditUpdate(available=1)))
        [held] = await work.wait_tasks(1)
        assert held.task is not None
        await quiet(0.8)  # the lease expires; the reaper returns the task
        refused(
            await work.call(credit=CreditUpdate(available=1)),
            ErrorCode.RESOURCE_EXHAUSTED,
            reason="credit_capacity",
        )
        refused(
            await work.call(progress=ReportProgressRequest(lease=ref(held), message="late")),
            ErrorCode.LEASE_LOST,
        )
        assert (await client.get(queue, held.task.id)).progress is None
        ok(await work.call(credit=CreditUpdate(available=1)))
        [_, again] = await work.wait_tasks(2)
        assert again.lease is not None
        assert again.lease.attempt == 2
        refused(
            await work.call(
                extend_lease=ExtendLeaseRequest(lease=ref(held), extension=timedelta(seconds=5))
            ),
            ErrorCode.LEASE_LOST,
        )


@on_virtual_time
async def test_a_release_returns_the_task_at_once_without_spending_its_attempt(
    work_minor: int,
) -> None:
    """Property (minor 7): a released lease makes its task PENDING and claimable
    at once with its attempt count as before the lease — even with
    max_attempts=1, where a nack would make it DEAD — frees the stream's slot,
    wakes a stream idling on the queue (at the release's own virtual instant),
    and the released ref is powerless afterwards (LEASE_LOST)."""
    queue = new_queue()
    async with (
        virtual_daemon() as served,
        connect(served.daemon, minor=work_minor) as client,
        worker(client, queue, worker_id="a", max_concurrency=1) as first,
        worker(client, queue, worker_id="b") as second,
    ):
        reply = await client.stub.enqueue_many(
            EnqueueManyRequest(
                context=client.context,
                queue=queue,
                tasks=[TaskSpec(task_type="t", max_attempts=1)],
            )
        )
        [task_id] = [r.task.id for r in reply.results if r.task is not None]
        ok(await first.call(credit=CreditUpdate(available=1)))
        [held] = await first.wait_tasks(1)
        assert held.lease is not None
        assert held.lease.attempt == 1
        ok(await second.call(credit=CreditUpdate(available=1)))
        await quiet()  # the second stream is now asleep
        released_at = now()
        ok(await first.call(release=ReleaseRequest(lease=ref(held), reason="stopping")))
        [again] = await second.wait_tasks(1)
        assert now() - released_at < PROMPT
        assert again.lease is not None
        assert again.lease.attempt == 1  # the released attempt was not spent
        assert again.lease.lease_token != held.lease.lease_token
        task = await client.get(queue, task_id)
        assert (task.state, task.attempt) == (TaskState.LEASED, 1)
        # The released lease no longer counts against the first stream's capacity.
        ok(await first.call(credit=CreditUpdate(available=1)))
        refused(await first.call(release=ReleaseRequest(lease=ref(held))), ErrorCode.LEASE_LOST)
        ok(await second.call(ack=AckRequest(lease=ref(again))))
        assert (await client.get(queue, task_id)).state is TaskState.SUCCEEDED


async def test_minor_6_refuses_release(daemon: DaemonProcess) -> None:
    """Property: a stream that runs below minor 7 refuses release with
    INCOMPATIBLE_VERSION and the lease stays held (the SDK nacks there instead)."""
    queue = new_queue()
    with anyio.fail_after(15):
        async with connect(daemon, minor=6) as client, worker(client, queue) as work:
            assert client.context.protocol_minor == 6
            [task_id] = await enqueue_n(client, queue, 1)
            ok(await work.call(credit=CreditUpdate(available=1)))
            [held] = await work.wait_tasks(1)
            refused(
                await work.call(release=ReleaseRequest(lease=ref(held))),
                ErrorCode.INCOMPATIBLE_VERSION,
            )
            task = await client.get(queue, task_id)
            assert (task.state, task.attempt) == (TaskState.LEASED, 1)


# -- pushing -------------------------------------------------------------------


@on_virtual_time
async def test_an_enqueue_reaches_an_idle_stream(work_minor: int) -> None:
    """Property: a registered stream with credit and nothing to claim sleeps
    on the queue's wake-up, so an enqueue is pushed at once (at the
    enqueue's own virtual instant) — with no other work and no scheduled
    moment, nothing but the wake-up could deliver it."""
    queue = new_queue()
    async with (
        virtual_daemon() as served,
        connect(served.daemon, minor=work_minor) as client,
        worker(client, queue) as work,
    ):
        ok(await work.call(credit=CreditUpdate(available=1)))
        await quiet()
        enqueued_at = now()
        [task_id] = await enqueue_n(client, queue, 1)
        [pushed] = await work.wait_tasks(1)
        assert now() - enqueued_at < PROMPT
        assert pushed.task is not None
        assert pushed.task.id == task_id
        assert pushed.lease is not None
        assert pushed.lease.worker_id == "w1"


@on_virtual_time
async def test_drain_stops_pushes_for_good_and_commands_still_work(work_minor: int) -> None:
    """Property: after drain{begin} nothing more is pushed on the stream,
    later credit is OK but grants nothing, and results of running tasks are
    still accepted on it."""
    queue = new_queue()
    async with (
        virtual_daemon() as served,
        connect(served.daemon, minor=work_minor) as client,
        worker(client, queue) as work,
    ):
        await enqueue_n(client, queue, 1)
        ok(await work.call(credit=CreditUpdate(available=3)))
        [held] = await work.wait_tasks(1)
        ok(await work.call(drain=WorkerDrain(begin=True)))
        [later] = await enqueue_n(client, queue, 1)
        ok(await work.call(credit=CreditUpdate(available=3)))
        await quiet()
        ok(await work.call(ack=AckRequest(lease=ref(held))))
        assert len(work.tasks) == 1
        assert (await client.get(queue, later)).state is TaskState.PENDING
        assert held.task is not None
        assert (await client.get(queue, held.task.id)).state is TaskState.SUCCEEDED


@on_virtual_time
async def test_two_streams_on_one_queue_both_receive_tasks(work_minor: int) -> None:
    """Property: dispatchers of one queue share it fairly — with ample credit
    on both, a burst is not swallowed by whichever stream woke first."""
    queue = new_queue()
    total = 200
    async with (
        virtual_daemon() as served,
        connect(served.daemon, minor=work_minor) as one,
        connect(served.daemon, minor=work_minor) as two,
        worker(one, queue, worker_id="one", max_concurrency=total) as first,
        worker(two, queue, worker_id="two", max_concurrency=total) as second,
    ):
        ok(await first.call(credit=CreditUpdate(available=total)))
        ok(await second.call(credit=CreditUpdate(available=total)))
        await quiet()  # both streams are asleep on the queue
        await enqueue_n(one, queue, total)

        async def read(work: WorkStream) -> None:
            while len(first.tasks) + len(second.tasks) < total:
                await work.frame()

        readers = {asyncio.create_task(read(first)), asyncio.create_task(read(second))}
        done, waiting = await asyncio.wait(readers, return_when=asyncio.FIRST_COMPLETED)
        for reader in waiting:  # blocked on a frame that will not come
            reader.cancel()
        await asyncio.wait(waiting)
        for reader in done:
            reader.result()
        assert len(first.tasks) + len(second.tasks) == total
        assert first.tasks
        assert second.tasks
        ids = [t.task.id for t in first.tasks + second.tasks if t.task]
        assert len(set(ids)) == total


@on_virtual_time
async def test_a_dropped_stream_keeps_its_leases_until_they_expire(work_minor: int) -> None:
    """Property: when a worker's connection drops, its delivered leases stay
    LEASED (its handlers may still run); the task is handed out again only
    after the lease expired, as a new attempt — never the same attempt early."""
    queue = new_queue()
    lease = timedelta(seconds=1.5)
    async with (
        virtual_daemon() as served,
        connect(served.daemon, minor=work_minor) as client,
        worker(client, queue, worker_id="b") as other,
    ):
        [task_id] = await enqueue_n(client, queue, 1)
        async with (
            connect(served.daemon, minor=work_minor) as doomed,
            worker(doomed, queue, worker_id="a", lease_duration=lease) as work,
        ):
            ok(await work.call(credit=CreditUpdate(available=1)))
            [held] = await work.wait_tasks(1)
            ok(await other.call(credit=CreditUpdate(available=1)))
            doomed.channel.close()
        await quiet(1.0)  # the drop has been seen; the lease has 0.5 s left
        task = await client.get(queue, task_id)
        assert (task.state, task.attempt, task.worker_id) == (TaskState.LEASED, 1, "a")
        [again] = await other.wait_tasks(1)
        assert again.lease is not None
        assert held.lease is not None
        assert again.lease.attempt == 2
        claimed_at = again.lease.until - limits.DEFAULT_LEASE
        assert claimed_at >= held.lease.until


@on_virtual_time
async def test_an_idle_stream_gets_heartbeats() -> None:
    """Property: a stream on which the daemon has sent nothing for the
    heartbeat interval gets heartbeat{server_time}: one interval after its
    last frame (virtual time) — not before — and again every interval while
    it stays quiet; server_time is the daemon's clock, and the stream still
    answers commands."""
    interval = 10.0
    async with (
        virtual_daemon(heartbeat_interval=interval) as served,
        connect(served.daemon) as client,
        worker(client, new_queue()) as work,
    ):
        beats = [now()]  # the registration was the last frame sent
        while len(work.heartbeats) < 2:
            await work.frame()
            if len(work.heartbeats) == len(beats):
                beats.append(now())
                beat = work.heartbeats[-1].heartbeat
                assert beat is not None
                assert beat.server_time is not None
                assert abs(beat.server_time - served.daemon.clock.now()) < timedelta(seconds=PROMPT)
        for before, after in itertools.pairwise(beats):
            assert interval <= after - before < interval + PROMPT
        ok(await work.call(credit=CreditUpdate(available=0)))


async def test_the_heartbeat_interval_flag_reaches_the_stream(
    heartbeat_daemon: DaemonProcess,
) -> None:
    """Property: ringod's --heartbeat-interval is the interval its streams use
    (the heartbeat itself is timed on virtual time above): at 0.05 s an idle
    stream gets a heartbeat within the guard, where the 10 s default would not."""
    with anyio.fail_after(5):
        async with connect(heartbeat_daemon) as client, worker(client, new_queue()) as work:
            while not work.heartbeats:
                await work.frame()
            beat = work.heartbeats[-1].heartbeat
            assert beat is not None
            assert beat.server_time is not None
            assert abs(beat.server_time - datetime.now(UTC)) < timedelta(minutes=1)


# -- shutdown ------------------------------------------------------------------


async def _draining(client: Client, queue: str) -> None:
    """Until the daemon refuses new calls (then its Work streams are stopped)."""
    while True:
        try:
            await client.activity(queue)
        except GRPCError as exc:
            status = exc.status
            break
        await anyio.sleep(0.02)
    assert status is Status.UNAVAILABLE


async def test_sigterm_with_an_idle_worker_exits_promptly(tmp_path: Path) -> None:
    """Property: shutdown ends a Work stream that holds no lease at once
    (UNAVAILABLE), so a connected idle worker does not hold the daemon for
    its shutdown timeout."""
    with (
        anyio.fail_after(15),
        spawn_daemon(tmp_path / "data", extra_args=["--shutdown-timeout", "30"]) as process,
    ):
        async with connect(process) as client, worker(client, new_queue()) as work:
            ok(await work.call(credit=CreditUpdate(available=4)))
            started = anyio.current_time()
            process.process.send_signal(signal.SIGTERM)
            status, message = await work.end_status()
            assert status is Status.UNAVAILABLE
            assert "shutting down" in message
            assert await anyio.to_thread.run_sync(process.process.wait) == 0
            assert anyio.current_time() - started < 10


@on_virtual_time
async def test_shutdown_waits_for_a_worker_holding_a_lease_to_ack(tmp_path: Path) -> None:
    """Property: on shutdown (what ringod's SIGTERM starts; see
    test_sigterm_with_an_idle_worker_exits_promptly) a stream stops pushing at
    once — even with credit left and a task falling due — but stays open while
    its worker holds leases, so a handler finishing within the timeout still
    acks; then the stream ends UNAVAILABLE and the daemon stops cleanly."""
    queue = new_queue()
    async with virtual_daemon(tmp_path, shutdown_timeout=30.0) as served:
        async with connect(served.daemon) as client, worker(client, queue) as work:
            [first] = await enqueue_n(client, queue, 1)
            due_soon = await client.enqueue(queue, delay=timedelta(seconds=0.6))
            ok(await work.call(credit=CreditUpdate(available=2)))
            [held] = await work.wait_tasks(1)
            served.stop.set()
            await _draining(client, queue)
            ok(await work.call(credit=CreditUpdate(available=2)))
            await quiet(0.6 + QUIET)  # the delayed task is due by now
            ok(await work.call(progress=ReportProgressRequest(lease=ref(held))))
            assert len(work.tasks) == 1
            assert not served.serving.done()
            ok(await work.call(ack=AckRequest(lease=ref(held))))
            status, message = await work.end_status()
            assert status is Status.UNAVAILABLE
            assert "shutting down" in message
            assert len(work.tasks) == 1
        await served.serving  # stopped, without an error
    engine = SQLiteEngine(tmp_path / "ringo.db")
    await engine.open()
    try:
        assert (await engine.get(queue, task_id=first)).state is TaskState.SUCCEEDED
        waiting = await engine.get(queue, task_id=due_soon.id)
        assert (waiting.state, waiting.attempt) == (TaskState.PENDING, 0)
    finally:
        await engine.close()


@on_virtual_time
async def test_shutdown_timeout_ends_a_stream_whose_worker_never_settles(
    tmp_path: Path,
) -> None:
    """Property: a worker that never settles holds shutdown for exactly
    --shutdown-timeout (virtual time: not less, and not much more); its
    stream ends UNAVAILABLE and its lease is left LEASED (to expire), not
    returned."""
    queue = new_queue()
    timeout = 0.5
    async with virtual_daemon(tmp_path, shutdown_timeout=timeout) as served:
        async with connect(served.daemon) as client, worker(client, queue) as work:
            [task_id] = await enqueue_n(client, queue, 1)
            ok(await work.call(credit=CreditUpdate(available=1)))
            await work.wait_tasks(1)
            stopped_at = now()
            served.stop.set()
            status, _ = await work.end_status()
            assert status is Status.UNAVAILABLE
            assert timeout <= now() - stopped_at < timeout + PROMPT
        await served.serving  # stopped, without an error
    engine = SQLiteEngine(tmp_path / "ringo.db")
    await engine.open()
    try:
        task = await engine.get(queue, task_id=task_id)
        assert (task.state, task.attempt) == (TaskState.LEASED, 1)
    finally:
        await engine.close()


# -- abandoned pushes (in-process, a fake stream) -----------------------------


async def _start(
    service: QueueService, engine: SQLiteEngine, context: Any, stream: FakeStream, credit: int
) -> tuple[list[str], asyncio.Task[None]]:
    now = datetime.now(UTC)
    outcomes = await engine.enqueue("q", [TaskSpec(task_type="t")] * 3, now)
    stream.inbox.put_nowait(
        WorkRequest(
            register=WorkerRegistration(
                context=context, queue="q", worker_id="w", max_concurrency=8
            )
        )
    )
    stream.inbox.put_nowait(WorkRequest(request_id=1, credit=CreditUpdate(available=credit)))
    serving = asyncio.create_task(service.work_streams.serve(stream))
    return [o.task.id for o in outcomes], serving


async def _assert_returned(
    engine: SQLiteEngine, task_ids: list[str], unsent: list[LeasedTask]
) -> None:
    """Each task is PENDING again with its attempt unspent, and a new claim
    gets the same attempt number under a fresh token."""
    for task_id in task_ids:
        task = await engine.get("q", task_id=task_id)
        assert (task.state, task.attempt, task.lease_until) == (TaskState.PENDING, 0, None)
    again = await engine.claim("q", [], 10, "w2", timedelta(seconds=30), datetime.now(UTC))
    assert sorted(t.task.id for t in again if t.task) == sorted(task_ids)
    assert {t.lease.attempt for t in again if t.lease} == {1}
    old_tokens = {t.lease.lease_token for t in unsent if t.lease}
    assert not old_tokens & {t.lease.lease_token for t in again if t.lease}


async def test_a_push_whose_send_fails_returns_the_unsent_tasks(
    tmp_path: Path, push_minor: int
) -> None:
    """Property (seed 004): a claimed batch whose push fails part-way leaves
    the delivered lease with the worker and returns every lease not yet sent
    — the failed one included — to PENDING with its attempt unspent; the
    stream ends INTERNAL."""

    async def fail_second(n: int) -> None:
        if n == 2:
            raise RuntimeError("the wire broke")

    with anyio.fail_after(10):
        async with in_process(tmp_path, minor=push_minor) as (service, engine, context):
            stream = FakeStream(fail_second)
            task_ids, serving = await _start(service, engine, context, stream, credit=3)
            with pytest.raises(GRPCError) as failure:
                await serving
            assert failure.value.status is Status.INTERNAL
            [delivered] = stream.tasks
            assert delivered.task is not None
            task = await engine.get("q", task_id=delivered.task.id)
            assert (task.state, task.attempt) == (TaskState.LEASED, 1)
            rest = [i for i in task_ids if i != delivered.task.id]
            await _assert_returned(engine, rest, [])
            assert len(service.work_streams) == 0


async def test_a_push_cancelled_mid_send_returns_every_unsent_task(
    tmp_path: Path, push_minor: int
) -> None:
    """Property (seed 004): when the stream is cancelled (the worker vanished)
    while a push is in flight, no lease of the claimed batch stays taken: all
    return to PENDING with their attempts unspent."""
    blocked = asyncio.Event()

    async def hang(n: int) -> None:
        blocked.set()
        await asyncio.Event().wait()

    with anyio.fail_after(10):
        async with in_process(tmp_path, minor=push_minor) as (service, engine, context):
            stream = FakeStream(hang)
            task_ids, serving = await _start(service, engine, context, stream, credit=3)
            await blocked.wait()
            for task_id in task_ids:
                assert (await engine.get("q", task_id=task_id)).state is TaskState.LEASED
            serving.cancel()
            with pytest.raises(asyncio.CancelledError):
                await serving
            assert stream.tasks == []
            await _assert_returned(engine, task_ids, [])


async def test_a_drain_that_overtakes_a_batch_returns_its_rest(
    tmp_path: Path, push_minor: int
) -> None:
    """Property: credit withdrawn while a batch is being pushed (here by a
    drain) stops the batch at once; the leases not yet sent go back to PENDING
    with their attempts unspent, and the stream carries on."""
    gate = asyncio.Event()
    blocked = asyncio.Event()

    async def hold_first(n: int) -> None:
        if n == 1:
            blocked.set()
            await gate.wait()

    with anyio.fail_after(10):
        async with in_process(tmp_path, minor=push_minor) as (service, engine, context):
            stream = FakeStream(hold_first)
            task_ids, serving = await _start(service, engine, context, stream, credit=3)
            await blocked.wait()
            stream.inbox.put_nowait(WorkRequest(request_id=2, drain=WorkerDrain(begin=True)))
            # The reader takes the drain, applies it, and queues its result
            # behind the push holding the send lock.
            await stream.until(lambda: stream.received == 3)
            gate.set()
            await stream.until(lambda: len(stream.sent) == 4)
            stream.inbox.put_nowait(None)
            await serving
            kinds = [betterproto_kind(m) for m in stream.sent]
            assert kinds == ["registered", "result", "task", "result"]
            [delivered] = stream.tasks
            assert delivered.task is not None
            rest = [i for i in task_ids if i != delivered.task.id]
            await _assert_returned(engine, rest, [])


@on_virtual_time
async def test_shutdown_waits_for_a_push_in_flight_to_be_settled(
    tmp_path: Path, push_minor: int
) -> None:
    """Property: a shutdown that lands while a task frame is on its way does
    not end the stream under the worker: once sent, that lease is
    outstanding, so the stream stays (through a `quiet` pause) until the
    worker settles it (and its ack is answered), then ends UNAVAILABLE."""
    gate = asyncio.Event()
    blocked = asyncio.Event()

    async def hold_first(n: int) -> None:
        blocked.set()
        await gate.wait()

    clock = LoopClock(asyncio.get_running_loop().time)
    async with in_process(tmp_path, clock, minor=push_minor) as (service, engine, context):
        stream = FakeStream(hold_first)
        _, serving = await _start(service, engine, context, stream, credit=1)
        await blocked.wait()
        service.work_streams.shutdown()
        gate.set()
        await stream.until(lambda: len(stream.tasks) == 1)
        await quiet()
        assert not serving.done()
        [delivered] = stream.tasks
        stream.inbox.put_nowait(WorkRequest(request_id=2, ack=AckRequest(lease=ref(delivered))))
        with pytest.raises(GRPCError) as ended:
            await serving
        assert ended.value.status is Status.UNAVAILABLE
        last = stream.sent[-1].result
        assert last is not None
        assert last.request_id == 2
        assert last.error is None
        assert delivered.task is not None
        task = await engine.get("q", task_id=delivered.task.id)
        assert task.state is TaskState.SUCCEEDED


def betterproto_kind(message: WorkResponse) -> str:
    for name in ("registered", "task", "result", "heartbeat"):
        if getattr(message, name) is not None:
            return name
    return ""


# -- frames encoded by the daemon itself ----------------------------------------

_moments = st.none() | st.datetimes(
    min_value=datetime(1900, 1, 1),
    max_value=datetime(2200, 1, 1),
    timezones=st.builds(
        timezone, st.timedeltas(min_value=timedelta(hours=-23), max_value=timedelta(hours=23))
    ),
)
# Negative durations only whole seconds: betterproto2 itself mis-encodes
# fractional negatives (see test_units), and the daemon never has any.
_durations = st.none() | st.one_of(
    st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=10**6)),
    st.integers(-(10**8), 0).map(lambda seconds: timedelta(seconds=seconds)),
)
_doubles = st.floats(allow_nan=True, allow_infinity=True)
_uint32 = st.integers(0, 2**32 - 1)
_tasks = st.builds(
    Task,
    id=st.text(),
    queue=st.text(),
    task_type=st.text(),
    payload=st.binary(),
    unique_key=st.text(),
    state=st.sampled_from(TaskState),
    attempt=_uint32,
    max_attempts=_uint32,
    priority=st.integers(-(2**31), 2**31 - 1),
    retry_backoff=st.none()
    | st.builds(RetryBackoff, initial=_durations, maximum=_durations, multiplier=_doubles),
    created_at=_moments,
    updated_at=_moments,
    available_at=_moments,
    finished_at=_moments,
    last_error=st.text(),
    progress=st.none()
    | st.builds(Progress, current=_doubles, total=_doubles, message=st.text(), updated_at=_moments),
    worker_id=st.text(),
    lease_until=_moments,
)
_leases = st.builds(
    Lease,
    task_id=st.text(),
    attempt=_uint32,
    lease_token=st.text(),
    worker_id=st.text(),
    until=_moments,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(task=st.none() | _tasks, lease=st.none() | _leases)
def test_a_task_frame_parses_as_its_work_response(task: Task | None, lease: Lease | None) -> None:
    """Property: the daemon's task frame (the reference push, `Push.of`, as
    the stream sends it) is an encoding of WorkResponse(task=...)
    (betterproto2 parses it back equal; its bytes are not pinned), and is a
    complete WorkResponse."""
    leased = LeasedTask(task=task, lease=lease)
    frame = work_frames.encoded(Push.of(leased).frame)
    assert WorkResponse.parse(bytes(frame)) == WorkResponse(task=leased)
    assert frame.task == leased


@given(request_id=st.integers(0, 2**64 - 1))
def test_an_ok_result_frame_parses_as_its_work_response(request_id: int) -> None:
    """Property: as above, for WorkResponse(result=WorkResult(request_id)),
    and byte-equal to the shared codec's encoding (the inline writer's
    reference)."""
    frame = work_frames.ok_frame(request_id)
    assert bytes(frame) == encode_work_result(request_id, None, None)
    expected = WorkResponse(result=WorkResult(request_id=request_id))
    assert WorkResponse.parse(bytes(frame)) == expected
    assert frame.result is not None
    assert frame.result.request_id == request_id


@on_virtual_time
async def test_the_operators_view_of_a_stream_says_who_it_is_and_what_it_did() -> None:
    """Property (the dashboard's /workers): each registered stream is listed
    with its worker id, queue, the host and pid it registered with (a host
    too long is cut, not refused), how long it has been connected on the
    daemon's clock, its concurrency, credit and leases, and the tasks it
    settled on this stream, succeeded apart from failed."""
    queue = new_queue()
    registration = {"worker_id": "w", "host": "h" * 300, "pid": 4242, "max_concurrency": 4}
    async with virtual_daemon() as served, connect(served.daemon) as client:
        await quiet(100)  # the loop's clock well past 0 when the stream registers
        async with worker(client, queue, **registration) as work:
            registered_at = now()
            await enqueue_n(client, queue, 3)
            ok(await work.call(credit=CreditUpdate(available=4)))
            first, second, _ = await work.wait_tasks(3)
            ok(await work.call(ack=AckRequest(lease=ref(first))))
            ok(await work.call(reject=RejectRequest(lease=ref(second), error="no")))
            await quiet(5)
            [view] = served.daemon.queue_service.work_streams.snapshot()
            connected_for = now() - registered_at
    assert connected_for >= 5
    assert view == WorkerView(
        worker_id="w",
        queue=queue,
        concurrency=4,
        credit=1,
        leases=1,
        host="h" * limits.MAX_NAME_BYTES,
        pid=4242,
        connected_for=pytest.approx(connected_for),
        succeeded=1,
        failed=1,
    )


@on_virtual_time
async def test_a_stream_registered_without_a_host_is_listed_by_its_peers_address() -> None:
    """Property: a worker that names no host (an SDK older than the field)
    is listed by its connection's peer address, the host part only (the
    in-memory connection's peer is ("in-memory", 0)), not its port."""
    queue = new_queue()
    async with (
        virtual_daemon() as served,
        connect(served.daemon) as client,
        worker(client, queue, worker_id="old", max_concurrency=1),
    ):
        [view] = served.daemon.queue_service.work_streams.snapshot()
    assert view.host == "in-memory"


@on_virtual_time
async def test_the_part_of_a_claim_beyond_the_push_budget_goes_back_at_once() -> None:
    """Property (no lease held unpushed): a claim sized by small tasks that
    turns out to hold big ones keeps what fits in the stream's push budget
    (`PUSH_BUDGET_BYTES`) and hands the rest back at once, no attempt spent,
    so they are claimed again and pushed within moments -- not held on
    leases nobody pushes until those expire."""
    queue = new_queue()
    big = b"x" * limits.MAX_PAYLOAD_BYTES
    count = PUSH_BUDGET_BYTES // len(big) + 3
    async with (
        virtual_daemon() as served,
        connect(served.daemon) as client,
        connect(served.daemon) as reading,  # its pushes fill its connection's window
        worker(reading, queue, max_concurrency=64, lease_duration=timedelta(seconds=60)) as work,
    ):
        await enqueue_n(client, queue, 4)
        ok(await work.call(credit=CreditUpdate(available=4)))
        for leased in await work.wait_tasks(4):
            ok(await work.call(ack=AckRequest(lease=ref(leased))))
        ids = [(await client.enqueue(queue, payload=big)).id for _ in range(count)]
        ok(await work.call(credit=CreditUpdate(available=count)))
        async with asyncio.timeout(5):
            pushed = (await work.wait_tasks(4 + count))[4:]
        stored = [await client.get(queue, task_id) for task_id in ids]
    assert sorted(t.task.id for t in pushed if t.task is not None) == sorted(ids)
    assert [(t.state, t.attempt) for t in stored] == [(TaskState.LEASED, 1)] * count

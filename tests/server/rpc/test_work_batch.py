"""Batch frames on the Work stream (minor >= 10): against a real daemon for
the wire rules, in-process (a fake stream) for the properties that need
the storage calls or a failure on cue."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ringo_trio._contract import limits
from ringo_trio._contract.versions import FEATURES, Feature
from ringo_trio._proto.ringo.v1 import (
    AckRequest,
    CreditUpdate,
    ErrorCode,
    ExtendLeaseRequest,
    LeasedTask,
    LeaseRef,
    NackRequest,
    RejectRequest,
    ReleaseRequest,
    ReportProgressRequest,
    TaskSpec,
    WorkerDrain,
    WorkerRegistration,
    WorkRequest,
    WorkRequestBatch,
    WorkResult,
)
from ringo_trio.server.storage.base import StorageUnavailable
from ringo_trio.testing import DaemonProcess
from tests._kit.grpc_client import connect, elements, new_queue, ref
from tests._kit.work_stream import FakeStream, enqueue_n, in_process, ok, refused, worker

BATCH_MINOR = FEATURES[Feature.BATCH_FRAMES]
OPERATE_MINOR = FEATURES[Feature.OPERATE]

pytestmark = pytest.mark.anyio

# -- against a real daemon -------------------------------------------------------


@pytest.mark.parametrize("minor", [OPERATE_MINOR, BATCH_MINOR])
async def test_a_claim_is_pushed_in_one_frame_from_minor_10_on(
    daemon: DaemonProcess, minor: int
) -> None:
    """Property: from minor 10 on, the pushes of one claim travel in batch
    frames (fewer frames than tasks), each push exactly once; below it every
    push is a frame of its own, as before."""
    queue = new_queue()
    with anyio.fail_after(20):
        async with (
            connect(daemon, minor=minor) as client,
            worker(client, queue, max_concurrency=20) as work,
        ):
            await enqueue_n(client, queue, 20)
            ok(await work.call(credit=CreditUpdate(available=20)))
            pushed = await work.wait_tasks(20)
            assert len({item.lease.lease_token for item in pushed if item.lease}) == 20
            if minor < BATCH_MINOR:
                assert work.batches == []
            else:
                assert work.batches, "no batch frame"
                assert max(work.batches) > 1
                assert sum(work.batches) == 20


async def test_a_batch_of_commands_is_answered_by_one_batch_in_order(
    daemon: DaemonProcess,
) -> None:
    """Property: a batch of commands is answered by ONE batch frame holding
    one result per command, in command order, each as that command alone
    would be answered (ack, a stale ack, extend, progress, nack, reject,
    release, credit)."""
    queue = new_queue()
    with anyio.fail_after(20):
        async with connect(daemon) as client, worker(client, queue) as work:
            await enqueue_n(client, queue, 5)
            ok(await work.call(credit=CreditUpdate(available=5)))
            a, b, c, d, e = (ref(item) for item in await work.wait_tasks(5))
            stale = LeaseRef(task_id=a.task_id, attempt=a.attempt, lease_token="nope")
            batches = len(work.batches)
            positions = await work.send_batch(
                {"ack": AckRequest(lease=a)},
                {"ack": AckRequest(lease=stale)},
                {"extend_lease": ExtendLeaseRequest(lease=b, extension=timedelta(seconds=30))},
                {"progress": ReportProgressRequest(lease=b, current=1, total=2)},
                {"nack": NackRequest(lease=c, error="boom")},
                {"reject": RejectRequest(lease=d, error="bad")},
                {"release": ReleaseRequest(lease=e)},
                {"ack": AckRequest(lease=b)},
                {"credit": CreditUpdate(available=0)},
            )
            answers = [await work.answer(i) for i in positions]
            assert work.batches[batches:] == [len(positions)]
            ok(answers[0])
            refused(answers[1], ErrorCode.LEASE_LOST)
            extended = ok(answers[2])
            assert extended.lease is not None
            for answer in answers[3:]:
                ok(answer)


@pytest.mark.parametrize(
    ("requests", "field"),
    [
        ([], "batch.requests"),
        ([WorkRequest(request_id=1, batch=WorkRequestBatch())], "batch.requests[0].batch"),
        (
            [WorkRequest(request_id=1), WorkRequest(register=WorkerRegistration())],
            "batch.requests[1].register",
        ),
        ([WorkRequest(request_id=i + 1) for i in range(limits.MAX_WORK_BATCH + 1)], "batch"),
    ],
    ids=["empty", "nested", "register", "too-many"],
)
async def test_a_malformed_batch_ends_the_stream_invalid_argument(
    daemon: DaemonProcess, requests: list[WorkRequest], field: str
) -> None:
    """A batch that breaks the rules (empty, nested, holding `register`, over
    MAX_WORK_BATCH) ends the stream INVALID_ARGUMENT naming the field, and
    none of its commands is executed."""
    queue = new_queue()
    with anyio.fail_after(20):
        async with connect(daemon) as client, worker(client, queue) as work:
            await work.stream.send_message(WorkRequest(batch=WorkRequestBatch(requests=requests)))
            status, message = await work.end_status()
            assert status is Status.INVALID_ARGUMENT
            assert message.startswith(field), message
            assert work.answers == []


async def test_below_minor_10_a_batch_is_refused_like_an_unknown_command(
    daemon: DaemonProcess,
) -> None:
    """A stream of minor 9 never gets a batch, and a batch sent there is
    answered like a request naming no command (INVALID_ARGUMENT on `body`):
    nothing in it is executed and the stream goes on."""
    queue = new_queue()
    with anyio.fail_after(20):
        async with (
            connect(daemon, minor=OPERATE_MINOR) as client,
            worker(client, queue) as work,
        ):
            await enqueue_n(client, queue, 1)
            ok(await work.call(credit=CreditUpdate(available=1)))
            [leased] = await work.wait_tasks(1)
            inner = WorkRequest(request_id=5, ack=AckRequest(lease=ref(leased)))
            await work.stream.send_message(
                WorkRequest(request_id=2, batch=WorkRequestBatch(requests=[inner]))
            )
            work.sent_ids.append(2)
            answer = refused(await work.answer(len(work.sent_ids) - 1), ErrorCode.INVALID_ARGUMENT)
            assert answer.error is not None
            assert answer.error.metadata["field"] == "body"
            # The ack inside was not executed: the lease still acks.
            ok(await work.call(ack=AckRequest(lease=ref(leased))))


@pytest.mark.parametrize("batched", [False, True], ids=["singles", "batches"])
async def test_credit_in_a_batch_is_one_step_with_its_result(
    daemon: DaemonProcess, batched: bool
) -> None:
    """Property (the credit mirror, in batch form): every push spends the
    credit whose result came before it on the wire, also when credit updates
    travel in batches, whose results then come in one frame."""
    queue = new_queue()
    values = [3, 0, 7, 2, 5, 1, 0, 9, 4, 6, 2, 8, 0, 3, 5] * 2
    with anyio.fail_after(20):
        async with connect(daemon) as client, worker(client, queue, max_concurrency=10_000) as work:
            await enqueue_n(client, queue, 300)
            sent = {}
            for start in range(0, len(values), 3 if batched else 1):
                chunk = values[start : start + (3 if batched else 1)]
                positions = await work.send_batch(
                    *({"credit": CreditUpdate(available=value)} for value in chunk)
                )
                for position, value in zip(positions, chunk, strict=True):
                    sent[work.sent_ids[position]] = value
            mirror = answered = 0
            while answered < len(values) or mirror:
                for frame in elements(await work.frame()):
                    if frame.task is not None:
                        assert mirror > 0, "a task was pushed that no answered credit covered"
                        mirror -= 1
                    elif frame.result is not None:
                        ok(frame.result)
                        mirror = sent[frame.result.request_id]
                        answered += 1


# -- in-process: storage calls and failures on cue -------------------------------


async def _pushed(
    service: Any, engine: Any, context: Any, stream: FakeStream, count: int
) -> tuple[asyncio.Task[None], list[LeasedTask]]:
    """A registered stream (ordered ids) holding `count` pushed leases."""
    await engine.enqueue("q", [TaskSpec(task_type="t")] * count, datetime.now(UTC))
    registration = WorkerRegistration(
        context=context, queue="q", worker_id="w", max_concurrency=8, ordered_request_ids=True
    )
    stream.inbox.put_nowait(WorkRequest(register=registration))
    stream.inbox.put_nowait(WorkRequest(request_id=1, credit=CreditUpdate(available=count)))
    serving = asyncio.create_task(service.work_streams.serve(stream))
    await stream.until(lambda: len(stream.tasks) == count)
    return serving, stream.tasks


def _results(stream: FakeStream) -> list[WorkResult]:
    return [m.result for sent in stream.sent for m in elements(sent) if m.result is not None]


def _count_calls(monkeypatch: pytest.MonkeyPatch, engine: Any, name: str) -> list[int]:
    """The length of the first argument of every call of `engine.<name>`."""
    calls: list[int] = []
    original = getattr(engine, name)

    async def counted(items: Any, *args: Any) -> Any:
        calls.append(len(items))
        return await original(items, *args)

    monkeypatch.setattr(engine, name, counted)
    return calls


async def test_a_batch_of_settlements_is_one_storage_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Property (group commit): the consecutive acks, nacks and rejects of a
    batch reach storage in ONE `settle_many` call, in order; a command of
    another kind between them splits the group, so that every command still
    sees the effects of those before it."""
    with anyio.fail_after(10):
        async with in_process(tmp_path) as (service, engine, context):
            stream = FakeStream()
            serving, (a, b, c, d) = await _pushed(service, engine, context, stream, 4)
            calls = _count_calls(monkeypatch, engine, "settle_many")
            commands = [
                WorkRequest(request_id=2, ack=AckRequest(lease=ref(a))),
                WorkRequest(request_id=3, nack=NackRequest(lease=ref(b), error="x")),
                WorkRequest(request_id=4, reject=RejectRequest(lease=ref(c), error="y")),
                WorkRequest(
                    request_id=5,
                    extend_lease=ExtendLeaseRequest(lease=ref(d), extension=timedelta(seconds=9)),
                ),
                WorkRequest(request_id=6, ack=AckRequest(lease=ref(d))),
            ]
            stream.inbox.put_nowait(WorkRequest(batch=WorkRequestBatch(requests=commands)))
            await stream.until(lambda: len(_results(stream)) == 1 + len(commands))
            assert calls == [3, 1]
            assert [r.request_id for r in _results(stream)[1:]] == [2, 3, 4, 5, 6]
            assert all(r.error is None for r in _results(stream))
            stream.inbox.put_nowait(None)
            await serving


async def test_a_credit_in_a_batch_precedes_its_pushes_even_when_storage_yields(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Property (the credit mirror, batch form, on an engine that yields in
    its calls, as PostgreSQL or a group committer does): a batch holding a
    credit and then a settlement writes its results before any push that
    spends the new credit, so a mirror that becomes N at the credit's result
    and drops by one per push never goes below zero."""
    values = [3, 0, 5, 2, 4, 1, 6, 0, 2, 3]
    stale = LeaseRef(task_id="gone", attempt=1, lease_token="gone")
    with anyio.fail_after(10):
        async with in_process(tmp_path) as (service, engine, context):
            await engine.enqueue("q", [TaskSpec(task_type="t")] * 40, datetime.now(UTC))
            settle_many = engine.settle_many

            async def yielding(items: Any, now: datetime) -> Any:
                for _ in range(3):
                    await asyncio.sleep(0)
                return await settle_many(items, now)

            monkeypatch.setattr(engine, "settle_many", yielding)
            stream = FakeStream()
            registration = WorkerRegistration(
                context=context, queue="q", worker_id="w", max_concurrency=1000
            )
            stream.inbox.put_nowait(WorkRequest(register=registration))
            serving = asyncio.create_task(service.work_streams.serve(stream))
            for index, value in enumerate(values):
                credit = WorkRequest(request_id=2 * index + 1, credit=CreditUpdate(available=value))
                ack = WorkRequest(request_id=2 * index + 2, ack=AckRequest(lease=stale))
                stream.inbox.put_nowait(WorkRequest(batch=WorkRequestBatch(requests=[credit, ack])))
            await stream.until(lambda: len(_results(stream)) == 2 * len(values))
            stream.inbox.put_nowait(None)
            await serving
    mirror = 0
    for frame in (m for sent in stream.sent for m in elements(sent)):
        if frame.task is not None:
            assert mirror > 0, "a task was pushed that no answered credit covered"
            mirror -= 1
        elif frame.result is not None and frame.result.request_id % 2:
            mirror = values[frame.result.request_id // 2]


async def test_storage_unavailable_mid_batch_answers_every_command_and_ends_the_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When storage is unavailable, the batch is still answered whole (one
    result per command: UNAVAILABLE for the group that failed and for every
    command after it, none of which is executed) and the stream ends
    UNAVAILABLE, as for a single command."""

    async def down(*args: Any) -> Any:
        raise StorageUnavailable("the database went away")

    with anyio.fail_after(10):
        async with in_process(tmp_path) as (service, engine, context):
            stream = FakeStream()
            serving, (a, b) = await _pushed(service, engine, context, stream, 2)
            monkeypatch.setattr(engine, "settle_many", down)
            extend = ExtendLeaseRequest(lease=ref(b), extension=timedelta(seconds=9))
            commands = [
                WorkRequest(request_id=2, ack=AckRequest(lease=ref(a))),
                WorkRequest(request_id=3, extend_lease=extend),
                WorkRequest(request_id=4, ack=AckRequest(lease=ref(b))),
            ]
            stream.inbox.put_nowait(WorkRequest(batch=WorkRequestBatch(requests=commands)))
            with pytest.raises(GRPCError) as ended:
                await serving
            assert ended.value.status is Status.UNAVAILABLE
            answers = _results(stream)[1:]
            assert [r.request_id for r in answers] == [2, 3, 4]
            assert all(r.error and r.error.code == ErrorCode.UNAVAILABLE for r in answers)
            # The extend behind the failed group was not executed.
            assert b.lease is not None
            held = await engine.get("q", task_id=b.lease.task_id)
            assert held.lease_until == b.lease.until


async def test_a_batch_whose_send_fails_returns_all_its_leases(tmp_path: Path) -> None:
    """Property (seed 004, batch form): a push frame carrying several leases
    that cannot be sent leaves none of them with the worker — each is PENDING
    again with its attempt unspent — and the stream ends INTERNAL."""

    async def fail(n: int) -> None:
        raise RuntimeError("the wire broke")

    with anyio.fail_after(10):
        async with in_process(tmp_path) as (service, engine, context):
            stream = FakeStream(fail)
            outcomes = await engine.enqueue("q", [TaskSpec(task_type="t")] * 3, datetime.now(UTC))
            registration = WorkerRegistration(
                context=context, queue="q", worker_id="w", max_concurrency=8
            )
            # One claim, within the first claim's budget: one frame of three.
            stream.inbox.put_nowait(WorkRequest(register=registration))
            stream.inbox.put_nowait(WorkRequest(request_id=1, credit=CreditUpdate(available=3)))
            with pytest.raises(GRPCError) as ended:
                await service.work_streams.serve(stream)
            assert ended.value.status is Status.INTERNAL
            assert stream.tasks == []
            for outcome in outcomes:
                task = await engine.get("q", task_id=outcome.task.id)
                assert (task.state.name, task.attempt) == ("PENDING", 0)


# -- a batch is the same as its elements in order (the daemon's side) ---------------

_KINDS = ["ack", "nack", "reject", "extend", "progress", "release", "credit", "drain", "none"]
_commands = st.lists(
    st.tuples(
        st.sampled_from(_KINDS),
        st.integers(0, 2),  # which lease
        st.sampled_from(["live", "live", "stale", "invalid"]),
        st.sampled_from([1, 1, 1, 0]),  # request id step: 0 breaks the ordering
    ),
    min_size=1,
    max_size=8,
)


def _request(request_id: int, kind: str, lease: LeaseRef, variant: str) -> WorkRequest:
    if variant == "stale":
        lease = LeaseRef(task_id=lease.task_id, attempt=lease.attempt, lease_token="stale")
    elif variant == "invalid":
        lease = LeaseRef(task_id="", attempt=0, lease_token="")
    body: dict[str, Any] = {
        "ack": lambda: {"ack": AckRequest(lease=lease, result=b"r")},
        "nack": lambda: {
            "nack": NackRequest(lease=lease, error="e", retry_delay_override=timedelta(0))
        },
        "reject": lambda: {"reject": RejectRequest(lease=lease, error="e")},
        "extend": lambda: {
            "extend_lease": ExtendLeaseRequest(lease=lease, extension=timedelta(seconds=60))
        },
        "progress": lambda: {"progress": ReportProgressRequest(lease=lease, current=1, total=2)},
        "release": lambda: {"release": ReleaseRequest(lease=lease)},
        "credit": lambda: {"credit": CreditUpdate(available=0)},
        "drain": lambda: {"drain": WorkerDrain(begin=variant != "invalid")},
        "none": dict,
    }[kind]()
    return WorkRequest(request_id=request_id, **body)


async def _outcome(
    root: Path, commands: list[tuple[str, int, str, int]], batched: bool
) -> tuple[list[Any], list[Any]]:
    """The results of `commands` on a fresh daemon (in order, as comparable
    tuples) and the tasks' states and attempts afterwards."""
    async with in_process(root / uuid.uuid4().hex) as (service, engine, context):
        stream = FakeStream()
        serving, leased = await _pushed(service, engine, context, stream, 3)
        refs = [ref(item) for item in leased]
        requests = []
        request_id = 1
        for kind, which, variant, step in commands:
            request_id += step
            requests.append(_request(request_id, kind, refs[which], variant))
        if batched:
            stream.inbox.put_nowait(WorkRequest(batch=WorkRequestBatch(requests=requests)))
        else:
            for request in requests:
                stream.inbox.put_nowait(request)
        await stream.until(lambda: len(_results(stream)) == 1 + len(requests))
        stream.inbox.put_nowait(None)
        await serving
        results = [
            (
                r.request_id,
                r.error.code if r.error else None,
                dict(r.error.metadata) if r.error else None,
                r.lease is not None,
            )
            for r in _results(stream)[1:]
        ]
        states = []
        for item in leased:
            assert item.task is not None
            task = await engine.get("q", task_id=item.task.id)
            states.append((task.state, task.attempt, task.last_error, task.result))
        return results, states


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(commands=_commands)
def test_a_batch_is_the_same_as_its_commands_one_by_one(
    tmp_path: Path, commands: list[tuple[str, int, str, int]]
) -> None:
    """Property: a batch is the same as its elements in order. The same
    commands — any mix of kinds, live, stale and invalid leases, request ids
    that break the registered ordering — sent as one batch and one by one to
    two identical daemons give the same results in the same order and leave
    the tasks in the same states."""

    def run(batched: bool) -> tuple[list[Any], list[Any]]:
        return asyncio.run(asyncio.wait_for(_outcome(tmp_path, commands, batched), 10))

    assert run(True) == run(False)

"""Claims cut off in flight, through the daemon: Work streams cut while their
dispatcher's claim runs, unary Claims whose caller goes away mid-claim, and
Claim replies that cannot be delivered. Nothing may stay LEASED to a worker
that never heard of it.

The daemon runs in-process (same event loop as the test) on either engine,
so the test can see what a cut cannot show on the wire: when a claim is
entered (a hook on the engine instance, as the metrics wrap it), which
leases went out on a stream (the metrics tap's `pushed`) and which Claim
replies were sent whole.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import anyio
import pytest
from grpclib.exceptions import StreamTerminatedError

from ringo_trio._contract import versions
from ringo_trio._proto.ringo.v1 import (
    ClaimRequest,
    ClaimResponse,
    CreditUpdate,
    EnqueueManyRequest,
    NegotiateRequest,
    RequestContext,
    Task,
    TaskSpec,
    TaskState,
)
from ringo_trio.server.clock import Clock
from ringo_trio.server.daemon import Daemon
from ringo_trio.server.http.metrics import Metrics, StreamTap
from ringo_trio.server.rpc.service import QueueService
from ringo_trio.server.rpc.sessions import SessionTable
from ringo_trio.server.rpc.wakeups import LeaseReaper, QueueWakeups
from ringo_trio.server.storage.base import Push, Storage, StorageUnavailable, TaskFilter
from ringo_trio.server.storage.postgres import PostgresEngine
from tests._kit.grpc_client import Client, connect, new_queue, open_work, serving
from tests._kit.postgres import fresh_database

pytestmark = pytest.mark.anyio

_CLAIM = "/ringo.v1.QueueService/Claim"


class _Tap(StreamTap):
    __slots__ = ("_pushed",)

    def __init__(self, pushed: set[str]) -> None:
        self._pushed = pushed

    def pushed(self, lease_token: str) -> None:
        self._pushed.add(lease_token)


class _Pushes(Metrics):
    """Every lease token a Work stream of the daemon put on the wire."""

    def __init__(self) -> None:
        self.tokens: set[str] = set()

    def work_stream(self, queue: str, credit: Callable[[], int]) -> StreamTap:
        return _Tap(self.tokens)


class _Claims:
    """Hooks `engine.claim_pushes` and `engine.claim` (on the instance): an
    event per worker id set as its claim is entered, the number of claims
    entered, and the task id of every lease a Work stream's claim returned."""

    def __init__(self, engine: Storage) -> None:
        self.entered: dict[str, asyncio.Event] = {}
        self.task_of: dict[str, str] = {}
        self.calls = 0
        pushes, leases = engine.claim_pushes, engine.claim

        async def claim_pushes(*args: Any) -> list[Push]:
            self._enter(args[3])
            batch = await pushes(*args)
            for item in batch:
                if item.lease_token is not None:
                    self.task_of[item.lease_token] = item.task_id
            return batch

        async def claim(*args: Any) -> Any:
            self._enter(args[3])
            return await leases(*args)

        engine.claim_pushes = claim_pushes  # type: ignore[method-assign]
        engine.claim = claim  # type: ignore[method-assign]

    def _enter(self, worker_id: str) -> None:
        self.calls += 1
        self.event(worker_id).set()

    def event(self, worker_id: str) -> asyncio.Event:
        return self.entered.setdefault(worker_id, asyncio.Event())


async def enqueue(client: Client, queue: str, count: int, **spec: Any) -> list[str]:
    ids: list[str] = []
    while len(ids) < count:
        n = min(count - len(ids), 1000)
        response = await client.stub.enqueue_many(
            EnqueueManyRequest(
                context=client.context,
                queue=queue,
                tasks=[TaskSpec(task_type="t", **spec) for _ in range(n)],
            )
        )
        ids += [r.task.id for r in response.results if r.task is not None]
    return ids


async def tasks_of(engine: Storage, queue: str) -> list[Task]:
    page = await engine.list_tasks(
        queue, TaskFilter(), newest_first=False, after=None, limit=100_000
    )
    assert page.next_after is None
    return page.tasks


def assert_leased_only(tasks: list[Task], received: set[str]) -> None:
    """Only tasks whose lease reached a worker are LEASED; every other one is
    PENDING with its attempt unspent."""
    for task in tasks:
        if task.state == TaskState.LEASED:
            assert task.id in received, f"LEASED, never received: {task}"
        else:
            assert (task.state, task.attempt) == (TaskState.PENDING, 0), task


async def quiet(daemon: Daemon) -> None:
    """Every call the daemon took has ended (its handler returned)."""
    assert await daemon.gate.wait_idle(30.0), f"{daemon.gate.in_flight} call(s) still running"


# -- Work streams --------------------------------------------------------------

CUT_STREAMS = 400
CUT_CREDIT = 4


async def cut_streams(make_engine: Callable[[], Storage], streams: int) -> tuple[int, int, int]:
    """Open `streams` Work streams one after the other, each cut (stream
    reset, or every third its whole connection dropped) as soon as its
    dispatcher's claim is in flight. Returns (tasks leased but never pushed,
    streams that left such a task, tasks pushed)."""
    engine = make_engine()
    claims = _Claims(engine)
    pushes = _Pushes()
    queue = new_queue("cut")

    def prepare(daemon: Daemon) -> None:
        daemon.queue_service.work_streams.metrics = pushes

    async with serving(engine, prepare) as daemon:
        async with connect(daemon.endpoint) as client:
            # max_attempts=1: an attempt spent on a lease nobody got is a task
            # DEAD without ever running.
            task_ids = await enqueue(client, queue, streams * CUT_CREDIT + 100, max_attempts=1)
            for n in range(streams):
                worker_id = f"w{n}"
                entered = claims.event(worker_id)
                drop = n % 3 == 2
                line_of = connect(daemon.endpoint, negotiate=False) if drop else _same(client)
                async with line_of as line:
                    line.context = client.context
                    async with open_work(line) as work:
                        await work.register(queue, worker_id=worker_id, max_concurrency=CUT_CREDIT)
                        await work.send(credit=CreditUpdate(available=CUT_CREDIT))
                        await entered.wait()
                        if drop:
                            line.channel.close()
                        else:
                            await work.stream.cancel()
        await quiet(daemon)
        pushed = {claims.task_of[token] for token in pushes.tokens}
        stored = await tasks_of(engine, queue)
    assert len(stored) == len(task_ids)
    unsent = [t for t in stored if t.state == TaskState.LEASED and t.id not in pushed]
    # Every task neither pushed nor leaked is untouched: PENDING, its only
    # attempt unspent.
    assert_leased_only([t for t in stored if t not in unsent], pushed)
    return len(unsent), len({t.worker_id for t in unsent}), len(pushed)


@asynccontextmanager
async def _same(client: Client) -> AsyncIterator[Client]:
    yield client


async def test_work_streams_cut_mid_claim_leave_no_lease_unsent(
    make_engine: Callable[[], Storage],
) -> None:
    """Property (seed 004, both engines): a Work stream cut — its call reset or
    its connection dropped — while its dispatcher's claim is in flight leaves
    no task LEASED that was never pushed: every lease of that claim goes back
    to PENDING with its attempt unspent (max_attempts=1 tasks stay runnable)."""
    with anyio.fail_after(60):
        unsent, leaky, _ = await cut_streams(make_engine, 40)
    assert unsent == 0, f"{leaky} stream(s) left {unsent} task(s) LEASED, never pushed"


@pytest.mark.slow
async def test_400_work_streams_cut_mid_claim_on_postgres_leave_no_lease_unsent() -> None:
    """Property (the issue's proof): 400 Work streams cut while their
    PostgreSQL claim is in flight leave 0 tasks LEASED and never pushed
    (before the claim was guarded: 220-300 streams, ~4 tasks each)."""
    with fresh_database("ringo_cut") as dsn, anyio.fail_after(300):
        unsent, leaky, pushed = await cut_streams(lambda: PostgresEngine(dsn), CUT_STREAMS)
    print(f"\n{CUT_STREAMS} cut streams: {leaky} left {unsent} task(s) LEASED unsent", end="")
    print(f" ({pushed} pushed)")
    assert unsent == 0, f"{leaky} stream(s) left {unsent} task(s) LEASED, never pushed"


# -- unary Claim, through the network --------------------------------------------

CUT_CLAIMS = 30


async def test_claims_whose_caller_goes_away_mid_claim_leave_nothing_leased(
    make_engine: Callable[[], Storage],
) -> None:
    """Property: a unary Claim whose caller is cancelled while the claim is
    in flight (the client resets the call) leaves LEASED only the tasks of
    replies the daemon sent whole; every other task is PENDING with its
    attempt unspent."""
    engine = make_engine()
    claims = _Claims(engine)
    queue = new_queue("claim")
    sent_whole: set[str] = set()

    def prepare(daemon: Daemon) -> None:
        # Which replies went out whole: the handler returned, having sent the
        # reply `claim` answered in the same task.
        service = daemon.queue_service
        answers: dict[asyncio.Task[Any] | None, ClaimResponse] = {}
        claim, serve_claim = service.claim, service._serve_claim

        async def claim_recorded(message: ClaimRequest) -> ClaimResponse:
            answers[asyncio.current_task()] = response = await claim(message)
            return response

        async def serve_claim_recorded(stream: Any) -> None:
            await serve_claim(stream)
            response = answers.pop(asyncio.current_task())
            sent_whole.update(t.task.id for t in response.tasks if t.task is not None)

        service.claim = claim_recorded  # type: ignore[method-assign]
        service._serve_claim = serve_claim_recorded  # type: ignore[method-assign]

    with anyio.fail_after(60):
        async with serving(engine, prepare) as daemon, connect(daemon.endpoint) as client:
            await enqueue(client, queue, 2 * CUT_CLAIMS)
            for n in range(CUT_CLAIMS):
                worker_id = f"w{n}"
                entered = claims.event(worker_id)
                calling = asyncio.ensure_future(client.claim(queue, 2, worker_id=worker_id))
                await entered.wait()
                calling.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await calling
            await quiet(daemon)
            assert_leased_only(await tasks_of(engine, queue), sent_whole)


# -- unary Claim, against a fake stream ------------------------------------------


class _ReplyStream:
    """The daemon's side of one Claim call: `request` in; the reply's message
    or trailers (`at`) can fail (``"fail"``: the client went away) or hang
    until cancelled (``"hang"``)."""

    def __init__(self, request: ClaimRequest, at: str = "", how: str = "") -> None:
        self.request = request
        self.at = at
        self.how = how
        self.hanging = asyncio.Event()
        self.reply: ClaimResponse | None = None
        self.ended = False

    async def recv_message(self) -> ClaimRequest:
        return self.request

    async def send_message(self, message: ClaimResponse) -> None:
        await self._step("message")
        self.reply = message

    async def send_trailing_metadata(self, **_: Any) -> None:
        await self._step("trailers")
        self.ended = True

    async def _step(self, what: str) -> None:
        if self.at != what:
            return
        if self.how == "hang":
            self.hanging.set()
            await asyncio.Event().wait()
        raise StreamTerminatedError("the client went away")


@asynccontextmanager
async def service_on(
    make_engine: Callable[[], Storage],
) -> AsyncIterator[tuple[QueueService, Storage, RequestContext, QueueWakeups]]:
    engine = make_engine()
    await engine.open()
    clock = Clock()
    wakeups = QueueWakeups()
    service = QueueService(
        engine,
        clock=clock,
        sessions=SessionTable(timedelta(hours=1)),
        served_minor=versions.MINOR,
        wakeups=wakeups,
        reaper=LeaseReaper(engine, clock, wakeups),
    )
    negotiated = await service.negotiate(
        NegotiateRequest(protocol_major=versions.MAJOR, protocol_minor=versions.MINOR)
    )
    context = RequestContext(versions.MAJOR, negotiated.protocol_minor, negotiated.session_token)
    try:
        yield service, engine, context, wakeups
    finally:
        await engine.close()


async def put(service: QueueService, context: RequestContext, queue: str, count: int) -> None:
    await service.enqueue_many(
        EnqueueManyRequest(context=context, queue=queue, tasks=[TaskSpec(task_type="t")] * count)
    )


def claim_request(context: RequestContext, queue: str, limit: int) -> ClaimRequest:
    return ClaimRequest(context=context, queue=queue, worker_id="w", limit=limit)


@pytest.mark.parametrize(
    ("at", "how"),
    [("message", "fail"), ("message", "hang"), ("trailers", "fail"), ("trailers", "hang")],
)
async def test_a_claim_reply_that_cannot_be_delivered_hands_its_leases_back(
    make_engine: Callable[[], Storage], at: str, how: str
) -> None:
    """Property: a Claim reply that cannot be delivered — its message or its
    trailers fail (the client went away) or hang until the call is cancelled —
    leaves nothing LEASED: every task of the reply is PENDING with its attempt
    unspent, and the queue's claimers are woken."""
    queue = new_queue()
    with anyio.fail_after(20):
        async with service_on(make_engine) as (service, engine, context, wakeups):
            await put(service, context, queue, 3)
            handler = service.__mapping__()[_CLAIM].func
            stream = _ReplyStream(claim_request(context, queue, 2), at, how)
            with wakeups.watch(queue) as watch:
                armed = watch.arm()
                serving = asyncio.ensure_future(handler(stream))
                if how == "hang":
                    await stream.hanging.wait()
                    serving.cancel()
                    with pytest.raises(asyncio.CancelledError):
                        await serving
                else:
                    with pytest.raises(StreamTerminatedError):
                        await serving
                assert armed.is_set()
            assert not stream.ended
            assert_leased_only(await tasks_of(engine, queue), set())


async def test_a_delivered_claim_reply_keeps_its_leases(
    make_engine: Callable[[], Storage],
) -> None:
    """Property: the Claim handler sends the reply and its OK trailers itself;
    a reply sent whole keeps its leases (exactly its tasks are LEASED)."""
    queue = new_queue()
    with anyio.fail_after(20):
        async with service_on(make_engine) as (service, engine, context, _):
            await put(service, context, queue, 3)
            stream = _ReplyStream(claim_request(context, queue, 2))
            await service.__mapping__()[_CLAIM].func(stream)
            assert stream.ended
            assert stream.reply is not None
            got = {t.task.id for t in stream.reply.tasks if t.task is not None}
            assert len(got) == 2
            tasks = await tasks_of(engine, queue)
            assert {t.id for t in tasks if t.state == TaskState.LEASED} == got
            assert_leased_only(tasks, got)


# Small tasks, more than one storage round of a Claim (each round is sized for
# the worst-case task: 50 of them).
_ROUNDS_TASKS = 120


@pytest.mark.parametrize("round_", [1, 2, 3])
@pytest.mark.parametrize("turns", [0, 1, 3])
async def test_a_claim_cancelled_in_any_round_hands_every_round_back(
    make_engine: Callable[[], Storage], round_: int, turns: int
) -> None:
    """Property: a Claim taken from storage in several rounds, its caller
    cancelled while round `round_` is in flight (`turns` loop turns after it
    was entered), leaves nothing LEASED — the round in flight and the rounds
    before it all go back to PENDING, attempts unspent — unless the reply
    was sent whole first (SQLite's rounds never suspend), in which case
    exactly its tasks are LEASED."""
    queue = new_queue()
    with anyio.fail_after(20):
        async with service_on(make_engine) as (service, engine, context, _):
            await put(service, context, queue, _ROUNDS_TASKS)
            claims = _Claims(engine)
            entered = asyncio.Event()
            hook = claims._enter

            def enter(worker_id: str) -> None:
                hook(worker_id)
                if claims.calls == round_:
                    entered.set()

            claims._enter = enter  # type: ignore[method-assign]
            stream = _ReplyStream(claim_request(context, queue, _ROUNDS_TASKS))
            serving = asyncio.ensure_future(service.__mapping__()[_CLAIM].func(stream))
            await entered.wait()
            for _ in range(turns):
                await asyncio.sleep(0)
            serving.cancel()
            try:
                await serving
            except asyncio.CancelledError:
                assert not stream.ended
            tasks = await tasks_of(engine, queue)
            if stream.ended:
                assert stream.reply is not None
                got = {t.task.id for t in stream.reply.tasks if t.task is not None}
                assert len(got) == _ROUNDS_TASKS
                assert_leased_only(tasks, got)
            else:
                assert claims.calls >= round_
                assert_leased_only(tasks, set())


async def test_a_claim_whose_later_round_fails_answers_with_the_earlier_rounds(
    make_engine: Callable[[], Storage],
) -> None:
    """Property: when a storage round after the first fails (the database
    went away), the Claim answers with what the earlier rounds leased — its
    caller is the only one who can learn of those leases — and exactly those
    tasks are LEASED."""
    queue = new_queue()
    with anyio.fail_after(20):
        async with service_on(make_engine) as (service, engine, context, _):
            await put(service, context, queue, _ROUNDS_TASKS)
            claim = engine.claim
            rounds = 0

            async def failing_second(*args: Any) -> Any:
                nonlocal rounds
                rounds += 1
                if rounds == 2:
                    raise StorageUnavailable("the database went away")
                return await claim(*args)

            engine.claim = failing_second  # type: ignore[method-assign]
            stream = _ReplyStream(claim_request(context, queue, _ROUNDS_TASKS))
            await service.__mapping__()[_CLAIM].func(stream)
            assert stream.ended
            assert stream.reply is not None
            got = {t.task.id for t in stream.reply.tasks if t.task is not None}
            assert 0 < len(got) < _ROUNDS_TASKS
            assert_leased_only(await tasks_of(engine, queue), got)


async def test_leases_an_engine_hands_back_wake_the_queue_claimers() -> None:
    """Property: tasks the engine itself handed back (a PostgreSQL claim whose
    caller was cancelled in flight) wake the queue's claimers, as any
    release does — the engine's own `watch` never hears its own writes, so
    without that wake-up they would sit PENDING until something else
    stirred the queue."""
    queue = new_queue()
    with fresh_database("ringo_cut") as dsn, anyio.fail_after(20):
        async with service_on(lambda: PostgresEngine(dsn)) as (service, engine, context, wakeups):
            await put(service, context, queue, 2)
            claims = _Claims(engine)
            with wakeups.watch(queue) as watch:
                armed = watch.arm()
                claiming = asyncio.ensure_future(
                    engine.claim_pushes(queue, [], 2, "w", timedelta(seconds=30), Clock().now())
                )
                await claims.event("w").wait()
                claiming.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await claiming
                assert armed.is_set()
            assert_leased_only(await tasks_of(engine, queue), set())

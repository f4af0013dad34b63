"""The daemon side of the ``Work`` bidi stream (``WorkRequest`` ⇄ ``WorkResponse``).

Theory of operation
-------------------
Every protocol decision of a stream — registration, request-id order, the
credit rule, the lease table, how many tasks to claim and push, what to
return, drain and the shutdown rule — is taken by its `ServerSession`
(`ringo_trio._contract.work.server`, sans-IO, property-tested with the
client's half). This module is its driver: it reads and decodes frames,
awaits storage, holds the send lock and writes bytes. The sections below say
what the pair does; the rules themselves live in the session.

One call is one `_WorkStream`. Everything it starts lives in an
`asyncio.TaskGroup` owned by the call: a **reader** that registers the worker
and then executes its commands, a **dispatcher** that claims and pushes
tasks, and a **heartbeat**. The call's own task only waits until one of them
decides how the stream ends (the worker half-closed, an error, the daemon
shutting down), then cancels the others and leaves the group, so nothing of a
stream outlives its call. Every frame goes out through `_WorkStream._send`
under one lock: frames of the three tasks never interleave on the wire, and
the call only cancels its tasks while holding that lock, so no frame is cut
in half.

**Registration.** The first frame must be ``register``. Its context is
checked like a unary call's (``OUT_OF_RANGE``, so the SDK renegotiates and
reopens) and its fields like a unary request's (``INVALID_ARGUMENT`` naming
``register.<field>``); either refusal ends the stream with that status. The
stream then runs at the context's minor for its whole life: the session
token is not looked at again, so a stream outlives its session's TTL.

**Commands** are executed by the reader in arrival order
(`work_commands.WorkCommands`), each answered by exactly one ``result`` that
is built once and sent before the next frame is read: results come back in
command order, with no task switch per command. A command that finds storage
unavailable (the database cannot be reached) is answered ``UNAVAILABLE`` and
the stream ends with status ``UNAVAILABLE``, as it does when the
dispatcher's claim hits an outage, so the worker reconnects instead of
settling into a stream that cannot work. Its leases are left to expire, as
for any stream that ends.

**Batches** (minor >= 10): a ``batch`` of commands is exactly its commands
in order (`WorkCommands.run`), answered by one batch of results. From the
first credit or drain on, the batch runs under the send lock (see *Credit*).
After storage was found unavailable, the rest of the batch is answered
``UNAVAILABLE`` without being executed, so the batch is still answered
whole. A malformed batch (empty, over ``MAX_WORK_BATCH``, nested, holding
``register``) ends the stream ``INVALID_ARGUMENT``; below minor 10 a batch
is a body the stream does not know.

**Credit** is the session's ledger (`ServerSession`: *credit*,
*outstanding*, *capacity*; an update that would leave ``credit +
outstanding > capacity`` is refused ``credit_capacity``), so whenever the
daemon pushes, pushed and unsettled ≤ capacity. The driver's part is the
send lock: a credit change is run and answered under it, and a push is
sized and spent under it, so every push before the result spent the old
credit and every push after it spends the new one — what lets the worker
mirror its remaining credit exactly.

**Dispatch** mirrors the long-poll Claim: arm the queue's wake-up, skip a
paused queue (`paused`: sleep until a wake-up, which a resume sends), claim
``min(credit, PUSH_BATCH)`` tasks in one storage call (fewer when payloads
are big, see *Budget*), push them; when nothing is claimable, sleep until a
wake-up or the queue's next scheduled moment (`wakeups.until_due`). With no
credit it sleeps on the stream's own credit event instead, so there is no
polling interval anywhere. Between rounds it yields to the loop, so every
woken dispatcher of a queue gets a turn.

**Abandoned pushes.** A claimed lease is sent, or returned: the ``finally``
that calls `Storage.release` is armed right after the claim, before the
first send can fail or be cancelled, and covers every lease of the batch not
yet sent. A returned lease costs no credit and no attempt, and its task is
claimable again at once. A *sent* lease is never returned: when a stream
ends, its delivered leases stay with the worker (whose handlers may still be
running) until they are settled or expire, so the same attempt is never
handed to anyone else early.

**Budget.** A worker that stops reading stops the sends (HTTP/2 flow
control), and whatever the dispatcher claimed but has not written waits in
the daemon's memory. So a batch holds at most ``PUSH_BUDGET_BYTES`` of
payload (and at least one task): the claim asks for as many tasks as the
largest payload of the previous batch fits into the budget, and what a batch
holds beyond it is returned at once. A stream's first claim assumes
payloads of the maximum size.

**Stalls.** A lease is pushed only while it has `_lease_margin` left (at
least ``LEASE_MARGIN``, at most half the lease); one that has less is
returned with the rest of the batch and the next round claims afresh, so a
worker never receives a lease that is about to run out. A frame that cannot
be written by then, or within ``STALL_TIMEOUT`` of its batch's claim (for
long leases), means the worker stopped reading: the stream is reset
(`StreamStalled`) and the frame and the rest of the batch are returned, no
attempt spent; the reset drops the partly written frame, so the worker never
sees it.

**Drain and shutdown** are the session's (`ServerSession.drain`,
`ServerSession.shutdown`): a drain stops pushes for good while commands run
on; `WorkStreams.shutdown` stops every stream's pushes at once, and each
stream then ends with ``UNAVAILABLE`` as soon as the session is `quiet` (no
outstanding lease, no command in progress, no task frame in flight), so idle
workers never hold the daemon up, while handlers that finish within the
shutdown timeout can still ack. A stream still holding leases when the timeout runs
out is cancelled with the other calls and answered ``UNAVAILABLE`` too.

**Ending with a status** sends trailers only, without the RST_STREAM grpclib
would add (`_end_with_status`), so a grpclib client reads the status and
every frame before it.

**Heartbeats**: a stream that has sent nothing for ``heartbeat_interval``
seconds sends ``heartbeat{server_time}``.

**Cost.** Task frames, the hot path, come encoded from storage:
`Storage.claim_pushes` writes each push straight from its row, with the
lease and payload size the stream keeps (`Push`), and the stream joins
their parts when it sends them (from minor 11 with the lease's ttl, which
counts from then) and sends those
bytes (`_encoded`) without building a message. Plain OK results, one per
settled task, are written inline (`ok_frame`, held byte-equal to the shared
codec's `encode_work_result`); every other frame is encoded by the shared
codec (`ringo_trio._wire`) at a fraction of betterproto2's cost; a batch
frame joins its elements' encodings (`batch_frame`, or the pushes' bytes). From
minor 10 a claim is pushed in as few messages as its credit allows (split
at ``PUSH_MESSAGE_BYTES``): per task, the message, its h2 frame and its
socket write were most of the daemon's CPU.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Coroutine, Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple, Protocol

import betterproto2
from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError
from h2.exceptions import H2Error

from ringo_trio._contract import limits
from ringo_trio._contract.versions import Feature
from ringo_trio._contract.work.server import (
    STALL_TIMEOUT,
    ServerSession,
    State,
    StreamEnd,
)
from ringo_trio._proto.ringo.v1 import (
    Heartbeat,
    LeaseRef,
    RequestContext,
    WorkerRegistered,
    WorkerRegistration,
    WorkRequest,
    WorkResponse,
)
from ringo_trio._wire.work import encode_work_response_batch

from ..clock import Clock
from ..http.metrics import NO_METRICS, NO_TAP, Metrics, StreamTap
from ..storage.base import (
    Push,
    Storage,
    StorageUnavailable,
)
from ..storage.handback import hand_back
from . import validate as v
from .connections import trailers_without_reset
from .leases import LeaseOperations
from .paused import PausedQueues
from .wakeups import LeaseReaper, QueueWakeups, until_due
from .work_commands import WorkCommands
from .work_frames import (
    batch_frame,
    batch_requests,
    encoded,
    push_frames,
)

__all__ = [
    "StreamStalled",
    "WorkStreamIO",
    "WorkStreams",
]

log = logging.getLogger("ringo_trio.server")

_SHUTTING_DOWN = "the daemon is shutting down"
_STORAGE_UNAVAILABLE = "storage unavailable"


class WorkerView(NamedTuple):
    """One registered Work stream, for operators (the dashboard's /workers)."""

    worker_id: str
    queue: str
    concurrency: int
    credit: int
    leases: int
    #: The worker's host and pid (minor >= 14; else the peer's address, 0).
    host: str
    pid: int
    #: Seconds since it registered, on the daemon's monotonic clock.
    connected_for: float
    #: Tasks it acked / nacked or rejected on this stream.
    succeeded: int
    failed: int


class WorkStreamIO(Protocol):
    """The part of `grpclib.server.Stream` a Work stream uses (a fake in tests)."""

    async def recv_message(self) -> WorkRequest | None: ...

    async def send_message(self, message: WorkResponse) -> None: ...


class StreamStalled(Exception):
    """The worker stopped reading: the stream is to be reset, not answered."""


class WorkStreams:
    """Every live Work stream of one daemon, and how a call becomes one."""

    def __init__(
        self,
        *,
        storage: Storage,
        clock: Clock,
        wakeups: QueueWakeups,
        reaper: LeaseReaper,
        ops: LeaseOperations,
        admit: Callable[[RequestContext | None, datetime], int],
        heartbeat_interval: float,
        paused: PausedQueues | None = None,
    ) -> None:
        if not heartbeat_interval > 0:
            raise ValueError("heartbeat_interval must be positive")
        self.storage = storage
        self.clock = clock
        self.wakeups = wakeups
        self.reaper = reaper
        self.ops = ops
        # The minor of a live session, or GRPCError(OUT_OF_RANGE): a
        # registration's context is checked like a unary call's.
        self.admit = admit
        self.heartbeat_interval = heartbeat_interval
        self.paused = paused if paused is not None else PausedQueues(storage, wakeups)
        self.closing = False
        self.metrics: Metrics = NO_METRICS
        self._live: set[_WorkStream] = set()

    def __len__(self) -> int:
        return len(self._live)

    async def serve(self, stream: WorkStreamIO) -> None:
        """Run one Work call to its end; GRPCError is the status to end it with,
        `StreamStalled` means the worker stopped reading."""
        work = _WorkStream(self, stream)
        self._live.add(work)
        try:
            await work.run()
        finally:
            self._live.discard(work)

    async def serve_call(self, stream: Any) -> None:
        """grpclib's handler for the method: `serve`, plus the final status."""
        try:
            await self.serve(stream)
        except GRPCError as exc:
            await _end_with_status(stream, exc.status, exc.message)
        except StreamStalled:
            await _reset(stream)
        except asyncio.CancelledError:
            # The shutdown timeout ran out (or the worker is gone, and then
            # this send fails quietly).
            if self.closing:
                await _end_with_status(stream, Status.UNAVAILABLE, _SHUTTING_DOWN)
            raise

    def shutdown(self) -> None:
        """Stop every stream's pushes now; each ends once it holds no lease."""
        self.closing = True
        for work in list(self._live):
            work.shutdown()

    def snapshot(self) -> list[WorkerView]:
        """Every registered stream as the dashboard's /workers shows it, read
        without changing anything."""
        now = self._loop_time()
        return [
            WorkerView(
                w._worker_id,
                w._queue,
                w._session.capacity,
                w._session.credit,
                w._session.outstanding,
                w._host,
                w._pid,
                max(now - w._since, 0.0),
                c.succeeded,
                c.failed,
            )
            for w in self._live
            if (c := w._commands) is not None
        ]

    @staticmethod
    def _loop_time() -> float:
        return asyncio.get_running_loop().time()


class _WorkStream:
    """One Work call: the driver of its `ServerSession` (see the module docstring)."""

    __slots__ = (
        "_children",
        "_commands",
        "_credit_changed",
        "_ended",
        "_host",
        "_last_sent",
        "_lease",
        "_loop",
        "_outcome",
        "_owner",
        "_pid",
        "_queue",
        "_send_lock",
        "_session",
        "_since",
        "_stream",
        "_tap",
        "_task_types",
        "_tasks",
        "_worker_id",
    )

    def __init__(self, owner: WorkStreams, stream: WorkStreamIO) -> None:
        self._owner = owner
        self._stream = stream
        self._loop = asyncio.get_running_loop()
        self._send_lock = asyncio.Lock()
        self._last_sent = self._loop.time()
        self._ended = asyncio.Event()
        self._outcome: BaseException | None = None
        self._tasks: asyncio.TaskGroup | None = None
        self._children: list[asyncio.Task[None]] = []
        self._session = ServerSession()
        if owner.closing:
            self._session.shutdown()
        self._credit_changed = asyncio.Event()
        self._queue = ""
        self._worker_id = ""
        self._host = ""
        self._pid = 0
        self._since = self._loop.time()
        self._task_types: list[str] = []
        self._lease = limits.DEFAULT_LEASE
        self._tap: StreamTap = NO_TAP
        # Set at registration: until then no command runs.
        self._commands: WorkCommands | None = None

    # -- lifetime ------------------------------------------------------------

    async def run(self) -> None:
        try:
            async with asyncio.TaskGroup() as tasks:
                self._tasks = tasks
                self._spawn(self._read(), final=True)
                await self._ended.wait()
                # Under the send lock no frame is half-written, so cancelling
                # here never truncates a message on the wire.
                async with self._send_lock:
                    for child in self._children:
                        child.cancel()
        finally:
            self._tasks = None
            self._tap.close()
            # The dispatcher returned whatever it had claimed and not sent
            # (its `finally`); whatever is left is on the wire, left to expire.
            unsent = self._session.end()
            if unsent:
                log.error("a Work stream ended holding %d unsent lease(s)", len(unsent))
        outcome = self._outcome
        if outcome is None:
            return
        if isinstance(outcome, GRPCError):
            raise outcome
        if isinstance(outcome, StreamStalled):
            log.warning("Work stream of worker %r stalled: %s", self._worker_id, outcome)
            raise outcome
        if isinstance(outcome, StorageUnavailable):
            log.warning(
                "Work stream of worker %r ended: storage unavailable: %s", self._worker_id, outcome
            )
            raise GRPCError(Status.UNAVAILABLE, f"{_STORAGE_UNAVAILABLE}: {outcome}")
        if isinstance(outcome, StreamTerminatedError | ConnectionError | H2Error):
            # The worker went away; there is nobody left to tell.
            log.debug("Work stream of worker %r lost: %r", self._worker_id, outcome)
            return
        log.error(
            "Work stream of worker %r failed unexpectedly",
            self._worker_id,
            exc_info=outcome,
        )
        raise GRPCError(
            Status.INTERNAL,
            f"internal error in the Work stream ({type(outcome).__name__}); see the daemon log",
        )

    def _spawn(self, work: Coroutine[Any, Any, None], *, final: bool) -> None:
        assert self._tasks is not None
        self._children.append(self._tasks.create_task(self._guard(work, final)))

    async def _guard(self, work: Coroutine[Any, Any, None], final: bool) -> None:
        # Children never raise into the TaskGroup: the first outcome decides
        # how the call ends, and `run` turns it into a status.
        try:
            await work
        except Exception as exc:
            self._end(exc)
        else:
            if final:
                self._end(None)

    def _end(self, outcome: BaseException | None) -> None:
        if not self._ended.is_set():
            self._outcome = outcome
            self._ended.set()

    def shutdown(self) -> None:
        self._session.shutdown()
        # A dispatcher waiting for credit learns there will be none.
        self._credit_changed.set()
        self._end_if_quiet()

    def _end_if_quiet(self) -> None:
        if self._session.quiet:
            self._end(GRPCError(Status.UNAVAILABLE, _SHUTTING_DOWN))

    async def _send(self, message: WorkResponse) -> None:
        async with self._send_lock:
            await self._stream.send_message(message)
        self._last_sent = self._loop.time()

    # -- reader --------------------------------------------------------------

    async def _read(self) -> None:
        stream = self._stream
        session = self._session
        first = await stream.recv_message()
        if first is None:
            return
        session.begin_frame()
        await self._send(self._register(first))
        self._spawn(self._dispatch(), final=False)
        self._spawn(self._heartbeat(), final=False)
        session.end_frame()
        self._end_if_quiet()
        commands = self._commands
        assert commands is not None  # `_register` built them
        answer = self._answer
        while True:
            request = await stream.recv_message()
            if request is None:
                return
            session.begin_frame()
            batch = request.batch
            if batch is not None and session.features.has(Feature.BATCH_FRAMES):
                await answer(commands, batch_requests(batch), batched=True)
            else:
                await answer(commands, (request,), batched=False)
            session.end_frame()
            self._end_if_quiet()

    def _register(self, request: WorkRequest) -> WorkResponse:
        registration = request.register
        if registration is None:
            name, _ = betterproto2.which_one_of(request, "body")
            raise GRPCError(
                Status.INVALID_ARGUMENT,
                "the first message of a Work stream must be `register`, not"
                f" {f'`{name}`' if name else 'an empty request'}",
            )
        session = self._session
        if session.state is State.STOPPING:
            raise GRPCError(Status.UNAVAILABLE, _SHUTTING_DOWN)
        minor = self._owner.admit(registration.context, self._owner.clock.now())
        try:
            queue, worker_id, task_types, lease = _registration_fields(registration)
            registered = session.register(
                minor=minor,
                ordered_request_ids=registration.ordered_request_ids,
                max_concurrency=registration.max_concurrency,
                lease_duration=lease.total_seconds(),
            )
        except v.FieldError as exc:
            raise GRPCError(Status.INVALID_ARGUMENT, str(exc)) from None
        except StreamEnd as exc:
            raise GRPCError(Status[exc.status], exc.message) from None
        self._queue = queue
        self._worker_id = worker_id
        # Informational only: cut, never refused (an older SDK sends none;
        # its peer address stands in).
        self._host = registration.host[: limits.MAX_NAME_BYTES] or _peer(self._stream)
        self._pid = registration.pid
        self._since = self._loop.time()
        self._task_types = task_types
        self._lease = lease
        self._tap = self._owner.metrics.work_stream(queue, lambda: session.credit)
        self._commands = WorkCommands(
            self._owner,
            session,
            queue=queue,
            worker_id=worker_id,
            tap=self._tap,
            end=self._end,
            credit_changed=self._credit_changed,
        )
        return WorkResponse(
            registered=WorkerRegistered(
                lease_duration=lease,
                max_concurrency=registered.max_concurrency,
                ordered_request_ids=registered.ordered_request_ids,
                worker_id=worker_id,
            )
        )

    async def _answer(
        self, commands: WorkCommands, requests: Sequence[WorkRequest], *, batched: bool
    ) -> None:
        """Run commands in order and send their results: one batch frame for
        a batch, the one result for a lone command."""
        # A credit change and its result are one step on the wire: every push
        # before the result spent the old credit, every push after it spends
        # the new one (that is what lets the worker mirror its remaining
        # credit exactly). So from the first credit or drain on, the commands
        # run under the send lock; what precedes it does not hold pushes up.
        cut = next(
            (
                index
                for index, request in enumerate(requests)
                if request.credit is not None or request.drain is not None
            ),
            len(requests),
        )
        answers = await commands.run(requests[:cut])
        if cut == len(requests):
            await self._send(batch_frame(answers) if batched else answers[0])
            return
        async with self._send_lock:
            answers += await commands.run(requests[cut:])
            await self._stream.send_message(batch_frame(answers) if batched else answers[0])
        self._last_sent = self._loop.time()

    # -- dispatcher ----------------------------------------------------------

    async def _dispatch(self) -> None:
        owner = self._owner
        storage = owner.storage
        clock = owner.clock
        session = self._session
        queue = self._queue
        task_types = self._task_types
        worker_id = self._worker_id
        lease_duration = self._lease
        paused = owner.paused.names
        with owner.wakeups.watch(queue) as watch:
            while True:
                limit = session.claim_size()
                if not limit:
                    if session.state is not State.OPEN:
                        return  # drained or stopping: nothing is pushed any more
                    self._credit_changed.clear()
                    await self._credit_changed.wait()
                    continue
                # Armed before the claim: a notify racing the claim sets this
                # very event, so the wait below returns at once.
                armed = watch.arm()
                if watch.closed:
                    return
                if queue in paused:
                    # Paused: nothing is pushed until a resume wakes the
                    # queue (`paused`); leases out run on and settle.
                    await armed.wait()
                    continue
                now = clock.now()
                batch = await storage.claim_pushes(
                    queue, task_types, limit, worker_id, lease_duration, now
                )
                if batch:
                    await self._push(batch)
                    # Fair share: every other woken dispatcher of this queue
                    # claims its round before this one claims again.
                    await asyncio.sleep(0)
                    continue
                wake_at = await storage.next_wakeup(queue, task_types, now)
                if wake_at is None:
                    await armed.wait()
                    continue
                await watch.wait(armed, until_due(wake_at, now, clock.now()))

    async def _push(self, batch: list[Push]) -> None:
        """Write a claim's pushes as the session sizes them; whatever is not
        on the wire when this returns or fails goes back to storage."""
        session = self._session
        sent = 0
        try:
            note = self._owner.reaper.note
            for item in batch:
                note(item.until)
            back = session.claimed(
                [(_token(item), _seconds(item.until), item.size) for item in batch]
            )
            if back:
                keep = len(batch) - len(back)
                await self._release(batch[keep:])
                del batch[keep:]
            lock = self._send_lock
            send_message = self._stream.send_message
            clock = self._owner.clock
            loop = self._loop
            tap = self._tap
            # What each push weighs in a message (within a few bytes of its
            # frame: the message cap is a size, not a count, to keep to).
            sizes = [len(item.task or b"") + len(item.lease or b"") + 16 for item in batch]
            stamp = session.features.has(Feature.LEASE_TTL)
            # One deadline for the batch (a timeout per frame cost the daemon
            # ~4 µs a task): the frame being written when it passes means the
            # worker stopped reading. Leases that merely aged are caught by
            # the session's check per push first, and returned without a reset.
            fresh_for = session.fresh_for(clock.now().timestamp())
            hard = loop.time() + min(STALL_TIMEOUT, fresh_for)
            stale = False
            try:
                async with asyncio.timeout_at(hard):
                    while sent < len(batch) and not stale:
                        async with lock:
                            # Sized and spent under the send lock, the lock a
                            # credit update holds while it changes the credit
                            # and answers: a push spends the credit whose
                            # result precedes it on the wire.
                            now = clock.now()
                            count, stale = session.next_pushes(now.timestamp(), sizes[sent:])
                            if not count:
                                break
                            frames = push_frames(batch[sent : sent + count], now if stamp else None)
                            try:
                                await send_message(
                                    encoded(
                                        frames[0]
                                        if count == 1
                                        else encode_work_response_batch(frames)
                                    )
                                )
                            except BaseException:
                                session.push_failed()
                                raise
                            # No await between the send and the bookkeeping: a
                            # lease on the wire is always counted.
                            session.pushed(count)
                            for item in batch[sent : sent + count]:
                                tap.pushed(_token(item))
                            sent += count
            except TimeoutError:
                raise StreamStalled(
                    f"a task frame could not be written by its batch's deadline;"
                    f" {len(batch) - sent} undelivered lease(s) returned"
                ) from None
            self._last_sent = self._loop.time()
        finally:
            if session.unsent():
                await self._release(batch[sent:])
        self._end_if_quiet()

    async def _release(self, unsent: Sequence[Push]) -> None:
        """Hand back leases never written: the storage layer's `hand_back`,
        which the unary Claim uses too, carries it out through the stream's
        own cancellation (bounded) and logs a failure instead of raising it
        over what brought us here; the leases then expire."""
        refs = [
            LeaseRef(task_id=item.task_id, attempt=item.attempt, lease_token=item.lease_token)
            for item in unsent
            if item.lease_token is not None
        ]
        owner = self._owner
        if await hand_back(owner.storage, refs, owner.clock.now()):
            owner.wakeups.notify(self._queue)

    # -- heartbeat -----------------------------------------------------------

    async def _heartbeat(self) -> None:
        interval = self._owner.heartbeat_interval
        clock = self._owner.clock
        loop = self._loop
        while True:
            sent = self._last_sent
            quiet_for = loop.time() - sent
            if quiet_for < interval:
                await asyncio.sleep(interval - quiet_for)
                if self._last_sent != sent:
                    continue  # something went out meanwhile: quiet from then on
                # Slept the whole remainder: due, even if float rounding left
                # the clock an ulp short (re-checking would then sleep ~0 s
                # again and again, forever on a virtual clock).
            await self._send(WorkResponse(heartbeat=Heartbeat(server_time=clock.now())))


def _token(push: Push) -> str:
    # Every claimed task is leased; a LeasedTask without a lease is storage's bug.
    token = push.lease_token
    if token is None:
        raise RuntimeError(f"storage claimed task {push.task_id!r} without a lease")
    return token


def _seconds(when: datetime | None) -> float:
    """A daemon-clock time as the session's seconds (no lease: never stale)."""
    return math.inf if when is None else when.timestamp()


async def _end_with_status(stream: Any, status: Status, message: str | None) -> None:
    """Trailers with `status`, without the RST_STREAM grpclib adds to them.

    grpclib follows a non-OK status with RST_STREAM(NO_ERROR) while the
    client's side is still open, which a Work stream's always is. grpclib's
    client (the SDK's transport) handles the reset by cancelling its pending
    read, so frames and a status that arrived in the same read as the reset
    are lost: the worker would see a bare "stream reset" instead of
    OUT_OF_RANGE (renegotiate) or the result of its last ack. The trailers
    alone end the call; the client closes its side when it reads them.
    """
    try:
        with trailers_without_reset(stream):
            async with asyncio.timeout(1.0):
                await stream.send_trailing_metadata(status=status, status_message=message)
    except Exception as exc:
        # The worker is gone or the connection is stuck: nobody to tell.
        log.debug("could not end a Work stream with %s: %r", status.name, exc)


async def _reset(stream: Any) -> None:
    """RST_STREAM: a stalled stream's partly written frame is dropped."""
    try:
        async with asyncio.timeout(1.0):
            await stream.cancel()
    except Exception as exc:
        # The connection is stuck too; keepalive will close it.
        log.debug("could not reset a stalled Work stream: %r", exc)


def _peer(stream: WorkStreamIO) -> str:
    """The host part of the worker's address as its connection shows it
    ("in-memory" for the testing kit's connections; "" without a peer)."""
    peer = getattr(stream, "peer", None)
    address = peer.addr() if peer is not None else None
    return str(address[0]) if address else ""


def _registration_fields(
    registration: WorkerRegistration,
) -> tuple[str, str, list[str], timedelta]:
    queue = v.name(registration.queue, "register.queue")
    worker_id = v.name(registration.worker_id, "register.worker_id")
    task_types = v.task_types(registration.task_types, "register.task_types")
    lease = v.duration(
        registration.lease_duration, "register.lease_duration", maximum=limits.MAX_LEASE
    )
    # proto3 cannot tell an unset Duration from zero in every client; both
    # mean the daemon default.
    return queue, worker_id, task_types, lease or limits.DEFAULT_LEASE

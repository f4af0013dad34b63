"""The daemon side of the ``Work`` bidi stream (``WorkRequest`` ⇄ ``WorkResponse``).

Theory of operation
-------------------
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

**Commands** are executed by the reader in arrival order, each answered by
exactly one ``result`` that is built once and sent before the next frame is
read: results come back in command order, with no task switch per command.
Lease commands run the unary RPCs' own validation and storage calls
(`LeaseOps`, implemented by `QueueService`), with their wake-ups; the
embedded ``context`` of a command is ignored (registration admitted the
stream). Acks, nacks and rejects go to storage through ONE function,
`LeaseOps.apply_settlements` (`Storage.settle_many`): a lone one as a group
of one, the consecutive ones of a batch as one group. A failure becomes the
result's `ErrorDetail` (a lease that ended because its task was cancelled:
``LEASE_LOST`` with ``metadata.reason = "cancelled"``) and the stream goes
on — except when storage is unavailable (the database cannot be reached):
that command is answered ``UNAVAILABLE`` and the stream ends with status
``UNAVAILABLE``, as it does when the dispatcher's claim hits an outage, so the
worker reconnects instead of settling into a stream that cannot work. Its
leases are left to expire, as for any stream that ends.

**Batches** (minor >= 10): a ``batch`` of commands is exactly its commands
in order (`_run`), answered by one batch of results. Its consecutive
settlements are one storage call; any other command first settles the group
before it, so every command sees the effects of those before it, as one by
one. From the first credit or drain on, the batch runs under the send lock
(a credit change and its result are one step on the wire, see *Credit*).
After storage was found unavailable, the rest of the batch is answered
``UNAVAILABLE`` without being executed, so the batch is still answered
whole. A malformed batch (empty, over ``MAX_WORK_BATCH``, nested, holding
``register``) ends the stream ``INVALID_ARGUMENT``; below minor 10 a batch
is a body the stream does not know.

**Credit.** Three numbers per stream: *credit* (pushes still allowed),
*outstanding* (leases pushed on this stream that the worker has not settled
on it) and *capacity* (the latest ``target_concurrency``, else
``max_concurrency``). An update is absolute (``available`` replaces the
credit) or, with ``grant`` set (minor >= 10), additive (credit += grant).
An update that adds something (``available > 0`` or ``grant > 0``) and
leaves ``credit + outstanding > capacity`` is refused
(``RESOURCE_EXHAUSTED``, ``reason=credit_capacity``) and changes nothing, not
even the capacity; ``available == 0`` is always accepted. A push moves one
unit from credit to outstanding, so whenever the daemon pushes, pushed and
unsettled ≤ capacity. A lease leaves outstanding when the worker acks, nacks
or rejects it on this stream (whatever the outcome), or when any command
about it is answered ``LEASE_LOST``.

**Dispatch** mirrors the long-poll Claim: arm the queue's wake-up, claim
``min(credit, PUSH_BATCH)`` tasks in one storage call (fewer when payloads
are big, see *Budget*), push them; when
nothing is claimable, sleep until a wake-up or the queue's next scheduled
moment. With no credit it sleeps on the stream's own credit event instead,
so there is no polling interval anywhere. Between rounds it yields to the
loop, so every woken dispatcher of a queue gets a turn.

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

**Release** (``release{lease}``, minor >= 7) is how a stopping worker hands
back a lease it did not finish: `Storage.release`, as for an undelivered
push — the task is PENDING at once and the attempt is not spent — then the
queue is woken. The lease leaves outstanding like a settlement.

**Drain** (``drain{begin}``) stops pushing for good; later credit is
answered OK and grants nothing. The stream keeps executing commands.

**Shutdown** (`WorkStreams.shutdown`) stops every stream's pushes at once;
each stream then ends with ``UNAVAILABLE`` as soon as it has no outstanding
lease, no command in progress and no task frame in flight, so idle workers
never hold the daemon up, while handlers that finish within the shutdown
timeout can still ack. A stream still holding leases when the timeout runs
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
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

import betterproto2
from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError
from h2.exceptions import H2Error

from ringo_trio._contract import limits, reasons
from ringo_trio._contract.versions import Feature, FeatureMissing, Features
from ringo_trio._proto.ringo.v1 import (
    CreditUpdate,
    ErrorCode,
    ErrorDetail,
    ExtendLeaseRequest,
    Heartbeat,
    Lease,
    LeaseRef,
    ReleaseRequest,
    ReportProgressRequest,
    RequestContext,
    TaskState,
    WorkerDrain,
    WorkerRegistered,
    WorkerRegistration,
    WorkRequest,
    WorkRequestBatch,
    WorkResponse,
    WorkResult,
)
from ringo_trio._wire.codec import decode, encode, tag_len, varint
from ringo_trio._wire.frames import encode_work_response_batch

from . import _validate as v
from ._clock import Clock
from ._metrics import NO_METRICS, NO_TAP, Metrics, StreamTap
from ._wakeups import LeaseReaper, QueueWakeups
from ._wire import Preencoded
from .storage._base import (
    FailedPrecondition,
    LeaseLost,
    NotFound,
    Push,
    Settlement,
    Storage,
    StorageUnavailable,
    stamp_ttl,
    ttl_field,
)

__all__ = [
    "MAX_CONCURRENCY",
    "PUSH_BATCH",
    "PUSH_BUDGET_BYTES",
    "LeaseOps",
    "PUSH_MESSAGE_BYTES",
    "StreamStalled",
    "WorkStreamIO",
    "WorkStreams",
    "batch_frame",
    "ok_frame",
]

log = logging.getLogger("ringo_trio.server")

# Tasks claimed per storage call (and per fair-share round).
PUSH_BATCH = 64
# Payload bytes one stream may hold claimed but not yet written (see Budget).
PUSH_BUDGET_BYTES = 4 * 1024 * 1024
# Encoded bytes of the pushes one batch frame carries (at least one push):
# a small message reaches the worker's handlers sooner than one big one.
PUSH_MESSAGE_BYTES = 1024 * 1024
# A lease is pushed only with this much of it left (at most half the lease).
LEASE_MARGIN = timedelta(seconds=5)
# Seconds a batch may take to be written, whatever its leases (see Stalls).
STALL_TIMEOUT = 30.0
MAX_CONCURRENCY = 2**31 - 1

# As in the long-poll Claim: sleep a little past a scheduled moment so the
# claim does not find the task a microsecond early, and back off briefly when
# storage calls a moment due yet nothing was claimable.
_SCHEDULE_SLACK = 0.002
_INCONSISTENT_WAKEUP_RETRY = 0.05

# The commands that settle a lease: run in groups by `Storage.settle_many`.
_SETTLEMENTS = frozenset({"ack", "nack", "reject"})

_SHUTTING_DOWN = "the daemon is shutting down"
# A placeholder in a list of answers being filled in (never sent).
_NOT_RUN = WorkResponse()
_STORAGE_UNAVAILABLE = "storage unavailable"


class WorkStreamIO(Protocol):
    """The part of `grpclib.server.Stream` a Work stream uses (a fake in tests)."""

    async def recv_message(self) -> WorkRequest | None: ...

    async def send_message(self, message: WorkResponse) -> None: ...


class LeaseOps(Protocol):
    """What the stream shares with the unary RPCs (`QueueService`)."""

    def stream_minor(self, context: RequestContext | None, now: datetime) -> int:
        """The minor of a live session, or GRPCError(OUT_OF_RANGE)."""
        ...

    async def apply_settlements(
        self, settlements: Sequence[Settlement], now: datetime
    ) -> list[str | LeaseLost]:
        """Acks, nacks and rejects of one stream, in order, in one storage call."""
        ...

    async def apply_extend(self, message: ExtendLeaseRequest, now: datetime) -> Lease: ...

    async def apply_progress(self, message: ReportProgressRequest, now: datetime) -> None: ...


class StreamStalled(Exception):
    """The worker stopped reading: the stream is to be reset, not answered."""


class _Refused(Exception):
    """A command refused with a code that has no storage exception."""

    def __init__(self, code: ErrorCode, message: str, **metadata: str) -> None:
        super().__init__(message)
        self.detail = ErrorDetail(code=code, message=message, metadata=metadata)


def _require(features: Features, feature: Feature, what: str) -> None:
    try:
        features.require(feature, what)
    except FeatureMissing as exc:
        raise _Refused(ErrorCode.INCOMPATIBLE_VERSION, str(exc)) from None


class WorkStreams:
    """Every live Work stream of one daemon, and how a call becomes one."""

    def __init__(
        self,
        *,
        storage: Storage,
        clock: Clock,
        wakeups: QueueWakeups,
        reaper: LeaseReaper,
        ops: LeaseOps,
        heartbeat_interval: float,
    ) -> None:
        if not heartbeat_interval > 0:
            raise ValueError("heartbeat_interval must be positive")
        self.storage = storage
        self.clock = clock
        self.wakeups = wakeups
        self.reaper = reaper
        self.ops = ops
        self.heartbeat_interval = heartbeat_interval
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

    def snapshot(self) -> list[tuple[str, str, int, int, int]]:
        """(worker id, queue, concurrency, unspent credit, leases held) of
        every registered stream, read without changing anything (the
        dashboard's /workers)."""
        return [
            (w._worker_id, w._queue, w._capacity, max(w._credit, 0), len(w._outstanding))
            for w in self._live
            if w._queue
        ]


class _WorkStream:
    """One Work call (see the module docstring)."""

    __slots__ = (
        "_busy",
        "_capacity",
        "_children",
        "_credit",
        "_credit_changed",
        "_down",
        "_drained",
        "_ended",
        "_features",
        "_handlers",
        "_last_request_id",
        "_last_sent",
        "_lease_duration",
        "_loop",
        "_ordered",
        "_outcome",
        "_outstanding",
        "_owner",
        "_payload_hint",
        "_pushing",
        "_queue",
        "_send_lock",
        "_stopping",
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
        # True while the reader is between receiving a frame and having sent
        # its answer: shutdown must not cut a command off mid-way.
        self._busy = False
        # True while a task frame is being sent: once it is out, that lease
        # is outstanding, so shutdown must wait for the send to end.
        self._pushing = False
        self._stopping = False
        self._drained = False
        # Set once storage was found unavailable: the stream is ending, and
        # commands still queued behind that one are answered, not executed.
        self._down: StorageUnavailable | None = None
        self._credit = 0
        self._credit_changed = asyncio.Event()
        self._capacity = 0
        # Lease tokens pushed here and not yet settled here.
        self._outstanding: set[str] = set()
        self._last_request_id: int | None = None
        self._features = Features(0)
        self._ordered = False
        self._queue = ""
        self._worker_id = ""
        self._task_types: list[str] = []
        self._lease_duration = limits.DEFAULT_LEASE
        # The largest payload of the last batch: how many tasks fit the budget.
        # Until a batch has been seen, assume the worst, so that the first
        # claims of many streams at once cannot load a full batch each.
        self._payload_hint = limits.MAX_PAYLOAD_BYTES
        self._tap: StreamTap = NO_TAP
        # Every command but the settlements (`_SETTLEMENTS`), which go to
        # storage in groups.
        self._handlers: dict[str, Callable[[Any], Awaitable[Lease | None]]] = {
            "credit": self._credit_update,
            "extend_lease": self._extend,
            "progress": self._progress,
            "drain": self._drain,
            "register": self._register_again,
            "release": self._release_command,
        }

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
        self._stopping = True
        self._credit = 0
        self._end_if_quiet()

    def _end_if_quiet(self) -> None:
        if self._stopping and not (self._outstanding or self._busy or self._pushing):
            self._end(GRPCError(Status.UNAVAILABLE, _SHUTTING_DOWN))

    async def _send(self, message: WorkResponse) -> None:
        async with self._send_lock:
            await self._stream.send_message(message)
        self._last_sent = self._loop.time()

    # -- reader --------------------------------------------------------------

    async def _read(self) -> None:
        stream = self._stream
        first = await stream.recv_message()
        if first is None:
            return
        self._busy = True
        await self._send(self._register(first))
        self._spawn(self._dispatch(), final=False)
        self._spawn(self._heartbeat(), final=False)
        self._busy = False
        self._end_if_quiet()
        answer = self._answer
        while True:
            request = await stream.recv_message()
            if request is None:
                return
            self._busy = True
            batch = request.batch
            if batch is not None and self._features.has(Feature.BATCH_FRAMES):
                await answer(_batch_requests(batch), batched=True)
            else:
                await answer((request,), batched=False)
            self._busy = False
            if self._stopping:
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
        if self._owner.closing:
            raise GRPCError(Status.UNAVAILABLE, _SHUTTING_DOWN)
        minor = self._owner.ops.stream_minor(registration.context, self._owner.clock.now())
        try:
            queue, worker_id, task_types, lease = _registration_fields(registration)
        except v.FieldError as exc:
            raise GRPCError(Status.INVALID_ARGUMENT, str(exc)) from None
        self._features = features = Features(minor)
        self._ordered = registration.ordered_request_ids and features.has(
            Feature.ORDERED_REQUEST_IDS
        )
        self._queue = queue
        self._worker_id = worker_id
        self._task_types = task_types
        self._lease_duration = lease
        self._capacity = registration.max_concurrency
        self._tap = self._owner.metrics.work_stream(queue, lambda: self._credit)
        return WorkResponse(
            registered=WorkerRegistered(
                lease_duration=lease,
                max_concurrency=registration.max_concurrency,
                ordered_request_ids=self._ordered,
                worker_id=worker_id,
            )
        )

    async def _answer(self, requests: Sequence[WorkRequest], *, batched: bool) -> None:
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
        answers = await self._run(requests[:cut])
        if cut == len(requests):
            await self._send(batch_frame(answers) if batched else answers[0])
            return
        async with self._send_lock:
            answers += await self._run(requests[cut:])
            await self._stream.send_message(batch_frame(answers) if batched else answers[0])
        self._last_sent = self._loop.time()

    async def _run(self, requests: Sequence[WorkRequest]) -> list[WorkResponse]:
        """The result of each command, in order, each executed as if alone,
        except that consecutive settlements go to storage in one call."""
        answers: list[WorkResponse] = []
        # (position in answers, command name, body, settlement)
        group: list[tuple[int, str, Any, Settlement]] = []
        for request in requests:
            request_id = request.request_id
            index = len(answers)
            answers.append(_NOT_RUN)
            if self._down is not None:
                answers[index] = self._not_run(request_id)
                continue
            refusal = self._out_of_order(request_id)
            if refusal is not None:
                answers[index] = refusal
                continue
            name, body = betterproto2.which_one_of(request, "body")
            if name == "batch":
                # Without batch frames: refused as an older daemon refuses a
                # body it does not know (it sees none).
                name, body = "", None
            if name in _SETTLEMENTS:
                try:
                    group.append((index, name, body, self._settlement(name, body)))
                except Exception as exc:
                    answers[index] = self._failure(request_id, name, body, exc)
                continue
            if group:
                await self._settle_together(group, requests, answers)
                group = []
                if self._down is not None:
                    answers[index] = self._not_run(request_id)
                    continue
            answers[index] = await self._command(request_id, name, body)
        if group:
            await self._settle_together(group, requests, answers)
        return answers

    def _not_run(self, request_id: int) -> WorkResponse:
        return _error_frame(
            request_id,
            ErrorCode.UNAVAILABLE,
            f"{_STORAGE_UNAVAILABLE} (not executed): {self._down}",
        )

    def _out_of_order(self, request_id: int) -> WorkResponse | None:
        if not self._ordered:
            return None
        last = self._last_request_id
        if last is not None and request_id <= last:
            return _error_frame(
                request_id,
                ErrorCode.INVALID_ARGUMENT,
                f"request_id: {request_id} is not above the previous id {last};"
                " this stream registered ordered_request_ids",
                field="request_id",
            )
        self._last_request_id = request_id
        return None

    async def _command(self, request_id: int, name: str, body: Any) -> WorkResponse:
        try:
            handler = self._handlers.get(name)
            if handler is None:
                raise v.FieldError("body", "the request names no command")
            lease = await handler(body)
            self._tap.done(name, body)
        except Exception as exc:
            return self._failure(request_id, name, body, exc)
        if lease is None:
            return ok_frame(request_id)
        return WorkResponse(result=WorkResult(request_id=request_id, lease=lease))

    def _settlement(self, name: str, body: Any) -> Settlement:
        if name == "ack":
            if body.result is not None:
                _require(self._features, Feature.RESULT_VALUES, "ack result")
            return v.ack_settlement(body)
        if name == "nack":
            return v.nack_settlement(body)
        return v.reject_settlement(body)

    async def _settle_together(
        self,
        group: Sequence[tuple[int, str, Any, Settlement]],
        requests: Sequence[WorkRequest],
        answers: list[WorkResponse],
    ) -> None:
        """One storage call for consecutive settlements; each answered as alone."""
        owner = self._owner
        try:
            outcomes = await owner.ops.apply_settlements(
                [item for _, _, _, item in group], owner.clock.now()
            )
        except Exception as exc:
            # The whole group failed (and, by the contract, none of it happened).
            for index, name, body, _ in group:
                answers[index] = self._failure(requests[index].request_id, name, body, exc)
            return
        tap = self._tap
        outstanding = self._outstanding
        for (index, name, body, item), outcome in zip(group, outcomes, strict=True):
            request_id = requests[index].request_id
            if not isinstance(outcome, LeaseLost):
                outstanding.discard(item.ref.lease_token)
                tap.done(name, body)
                answers[index] = ok_frame(request_id)
            else:
                answers[index] = self._failure(request_id, name, body, outcome)

    def _failure(self, request_id: int, name: str, body: Any, exc: Exception) -> WorkResponse:
        """The result that answers a command that raised `exc`."""
        if isinstance(exc, v.FieldError):
            path = f"{name}.{exc.path}" if name else exc.path
            return _error_frame(
                request_id, ErrorCode.INVALID_ARGUMENT, f"{path}: {exc.reason}", field=path
            )
        if isinstance(exc, LeaseLost):
            self._tap.lost(body)
            # The worker learns here that the lease is gone; it no longer
            # occupies one of its slots.
            self._settle(getattr(body, "lease", None))
            if exc.cancelled:
                # An operator cancelled the task: the worker cancels the
                # handler and says why, rather than reporting a lost lease.
                return _error_frame(
                    request_id,
                    ErrorCode.LEASE_LOST,
                    str(exc) or "the task was cancelled",
                    reason=reasons.CANCELLED,
                )
            return _error_frame(
                request_id,
                ErrorCode.LEASE_LOST,
                str(exc) or "the lease is not the task's current lease",
            )
        if isinstance(exc, NotFound):
            return _error_frame(request_id, ErrorCode.NOT_FOUND, str(exc) or "not found")
        if isinstance(exc, FailedPrecondition):
            return _error_frame(
                request_id, ErrorCode.FAILED_PRECONDITION, str(exc) or "not allowed in this state"
            )
        if isinstance(exc, _Refused):
            return WorkResponse(result=WorkResult(request_id=request_id, error=exc.detail))
        if isinstance(exc, StorageUnavailable):
            # The command's outcome is unknown and the next one would fail
            # alike: answer it, then end the stream so the worker reconnects
            # (here once the database is back, or to another daemon).
            self._down = exc
            self._end(exc)
            return _error_frame(request_id, ErrorCode.UNAVAILABLE, f"{_STORAGE_UNAVAILABLE}: {exc}")
        log.error(
            "Work command %s of worker %r failed unexpectedly",
            name,
            self._worker_id,
            exc_info=exc,
        )
        return _error_frame(
            request_id,
            ErrorCode.INTERNAL,
            f"internal error in {name} ({type(exc).__name__}); see the daemon log",
        )

    def _settle(self, lease: LeaseRef | None) -> None:
        if lease is not None:
            self._outstanding.discard(lease.lease_token)

    # -- commands: each returns the Lease a result carries, if any ------------

    async def _release_command(self, body: ReleaseRequest) -> None:
        _require(self._features, Feature.RELEASE, "release")
        ref = body.lease
        if ref is None:
            raise v.FieldError("lease", "is required")
        v.lease_ref(ref, "lease")
        owner = self._owner
        if not await owner.storage.release([ref], owner.clock.now()):
            raise await self._lost(ref)
        self._settle(ref)
        owner.wakeups.notify(self._queue)

    async def _lost(self, ref: LeaseRef) -> LeaseLost:
        """Why a release matched no lease (the bulk `Storage.release` does
        not say): cancelled when the task is CANCELLED at the ref's attempt."""
        try:
            task = await self._owner.storage.get(self._queue, task_id=ref.task_id)
        except NotFound:
            task = None
        if task is not None and task.state == TaskState.CANCELLED and task.attempt == ref.attempt:
            return LeaseLost(
                f"task {ref.task_id!r} attempt {ref.attempt}: the task was cancelled",
                cancelled=True,
            )
        return LeaseLost("the lease is not the task's current lease")

    async def _extend(self, body: ExtendLeaseRequest) -> Lease:
        clock = self._owner.clock
        lease = await self._owner.ops.apply_extend(body, clock.now())
        if self._features.has(Feature.LEASE_TTL):
            # Read after storage, as late as the result is built; the worker
            # times its renewals from their send, never by this ttl.
            stamp_ttl(lease, clock.now())
        return lease

    async def _progress(self, body: ReportProgressRequest) -> None:
        await self._owner.ops.apply_progress(body, self._owner.clock.now())

    async def _credit_update(self, body: CreditUpdate) -> None:
        target = body.target_concurrency
        if target is not None:
            _require(self._features, Feature.TARGET_CONCURRENCY, "target_concurrency")
            if target > MAX_CONCURRENCY:
                raise v.FieldError("target_concurrency", f"{target} exceeds {MAX_CONCURRENCY}")
        grant = body.grant
        if grant is not None:
            _require(self._features, Feature.CREDIT_GRANT, "credit grant")
            if body.available:
                raise v.FieldError("available", "must be 0 when a grant is given")
        if self._drained or self._stopping:
            return
        capacity = self._capacity if target is None else target
        # Absolute replaces what is left; a grant adds to it. Either way the
        # credit after the update is what the capacity check weighs.
        credit = body.available if grant is None else self._credit + grant
        outstanding = len(self._outstanding)
        adds = credit if grant is None else grant
        if adds and credit + outstanding > capacity:
            # Not clamped: the worker's view is stale (a push crossed this
            # update), so it resamples and sends a fresh snapshot.
            raise _Refused(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"credit {credit} with {outstanding} task(s) outstanding exceeds the"
                f" stream's capacity of {capacity}; resample and retry",
                reason=reasons.CREDIT_CAPACITY,
            )
        self._tap.credit(credit)
        self._capacity = capacity
        self._credit = credit
        if credit:
            self._credit_changed.set()

    async def _drain(self, body: WorkerDrain) -> None:
        if not body.begin:
            raise v.FieldError("begin", "must be true; a drain cannot be undone")
        self._drained = True
        self._credit = 0

    async def _register_again(self, body: WorkerRegistration) -> None:
        raise FailedPrecondition("this stream is already registered; open a new stream")

    # -- dispatcher ----------------------------------------------------------

    async def _dispatch(self) -> None:
        owner = self._owner
        storage = owner.storage
        clock = owner.clock
        queue = self._queue
        task_types = self._task_types
        worker_id = self._worker_id
        lease_duration = self._lease_duration
        with owner.wakeups.watch(queue) as watch:
            while True:
                if self._credit <= 0:
                    if self._stopping:
                        return
                    self._credit_changed.clear()
                    await self._credit_changed.wait()
                    continue
                # Armed before the claim: a notify racing the claim sets this
                # very event, so the wait below returns at once.
                armed = watch.arm()
                if watch.closed:
                    return
                now = clock.now()
                fits = PUSH_BUDGET_BYTES // max(self._payload_hint, 1)
                batch = await storage.claim_pushes(
                    queue,
                    task_types,
                    min(self._credit, PUSH_BATCH, max(fits, 1)),
                    worker_id,
                    lease_duration,
                    now,
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
                if wake_at <= now:
                    delay = _INCONSISTENT_WAKEUP_RETRY
                else:
                    delay = (wake_at - clock.now()).total_seconds()
                    delay = max(delay, 0.0) + _SCHEDULE_SLACK
                await watch.wait(armed, delay)

    async def _push(self, batch: list[Push]) -> None:
        sent = 0
        try:
            note = self._owner.reaper.note
            for item in batch:
                note(item.until)
            keep = self._within_budget(batch)
            if keep < len(batch):
                await self._release(batch[keep:])
                del batch[keep:]
            lock = self._send_lock
            send_message = self._stream.send_message
            outstanding = self._outstanding
            clock = self._owner.clock
            loop = self._loop
            margin = self._lease_margin()
            # One deadline for the batch (a timeout per frame cost the daemon
            # ~4 µs a task): the frame being written when it passes means the
            # worker stopped reading. Leases that merely aged are caught by
            # the check per item first, and returned without a reset.
            hard = loop.time() + STALL_TIMEOUT
            untils = [item.until for item in batch if item.until is not None]
            if untils:
                fresh_for = (min(untils) - margin - clock.now()).total_seconds()
                hard = min(hard, loop.time() + fresh_for)
            # One frame per push below minor 10; from it on, one frame for as
            # many pushes as the credit covers (split at PUSH_MESSAGE_BYTES).
            most = len(batch) if self._features.has(Feature.BATCH_FRAMES) else 1
            try:
                async with asyncio.timeout_at(hard):
                    while sent < len(batch):
                        async with lock:
                            # Checked and spent under the send lock, the same
                            # lock a credit update holds while it changes the
                            # credit and answers: a push spends the credit whose
                            # result precedes it on the wire. A drain, shutdown
                            # or smaller credit may have landed while this batch
                            # was being pushed.
                            frames, stale = self._next_pushes(
                                batch, sent, min(most, self._credit), margin
                            )
                            if not frames:
                                break
                            self._pushing = True
                            await send_message(
                                _encoded(
                                    frames[0]
                                    if len(frames) == 1
                                    else encode_work_response_batch(frames)
                                )
                            )
                            # No await between the send and the bookkeeping: a
                            # lease on the wire is always counted.
                            self._pushing = False
                            self._credit -= len(frames)
                            for item in batch[sent : sent + len(frames)]:
                                token = item.lease_token
                                if token is not None:
                                    outstanding.add(token)
                                    self._tap.pushed(token)
                            sent += len(frames)
                        if stale:
                            # Too stale to hand out: returned below, claimed afresh.
                            break
            except TimeoutError:
                raise StreamStalled(
                    f"a task frame could not be written by its batch's deadline;"
                    f" {len(batch) - sent} undelivered lease(s) returned"
                ) from None
            self._last_sent = self._loop.time()
        finally:
            self._pushing = False
            if sent < len(batch):
                await self._release(batch[sent:])
        if self._stopping:
            self._end_if_quiet()

    def _next_pushes(
        self, batch: Sequence[Push], start: int, most: int, margin: timedelta
    ) -> tuple[list[bytes], bool]:
        """The encoded task frames of the next message: up to `most` of
        `batch` from `start`, within PUSH_MESSAGE_BYTES (at least one),
        ending before the first lease too stale to push (then True)."""
        now = self._owner.clock.now()
        frames: list[bytes] = []
        size = 0
        # Minor >= 11: each lease says how long it runs from now, the moment
        # of sending (the worker arms its deadline at receipt on its own
        # clock). A claim's leases share one until, so one ttl per message.
        stamp = self._features.has(Feature.LEASE_TTL)
        ttl_until: datetime | None = None
        ttl = b""
        for item in batch[start : start + max(most, 0)]:
            until = item.until
            if until is not None and until - margin <= now:
                return frames, True
            if not stamp:
                frame = item.frame
            else:
                if until != ttl_until:
                    ttl_until = until
                    ttl = b"" if until is None else ttl_field(until, now)
                frame = item.frame_with(ttl)
            size += len(frame)
            if frames and size > PUSH_MESSAGE_BYTES:
                break
            frames.append(frame)
        return frames, False

    def _within_budget(self, batch: Sequence[Push]) -> int:
        """How many of `batch` fit `PUSH_BUDGET_BYTES` (at least one)."""
        total = 0
        largest = 0
        keep = len(batch)
        for index, item in enumerate(batch):
            size = item.size
            largest = max(largest, size)
            total += size
            if total > PUSH_BUDGET_BYTES and keep == len(batch):
                keep = max(index, 1)
        self._payload_hint = largest
        return keep

    def _lease_margin(self) -> timedelta:
        return min(LEASE_MARGIN, self._lease_duration / 2)

    async def _release(self, unsent: Sequence[Push]) -> None:
        refs = [
            LeaseRef(task_id=item.task_id, attempt=item.attempt, lease_token=item.lease_token)
            for item in unsent
            if item.lease_token is not None
        ]
        owner = self._owner
        try:
            released = await owner.storage.release(refs, owner.clock.now())
        except Exception:
            # Not raised over the error that brought us here; the leases then
            # simply expire.
            log.exception("returning %d undelivered lease(s) failed", len(refs))
            return
        if released:
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


# -- frames in wire form ----------------------------------------------------------

# betterproto2 spends ~150 µs encoding one task frame, which alone would cap
# the daemon near 2,500 tasks/s per core. Task frames and plain OK results,
# the two frames of the hot path, are encoded by `ringo_trio._wire.frames`
# and handed to the codec already encoded: `_Wire` is a complete `WorkResponse` whose
# `bytes()` is that encoding.


class _Wire(Preencoded, WorkResponse):
    """A `WorkResponse` that carries its own encoding."""


_new = object.__new__


class _Encoded(_Wire):
    """A `WorkResponse` known by its encoding alone (the pushes, encoded by
    storage): its fields are decoded when first read, which only tests do."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        decoded = decode(self._wire, WorkResponse)
        self.__dict__.update(decoded.__dict__)
        return getattr(decoded, name)


def _encoded(data: bytes) -> _Encoded:
    frame: _Encoded = _new(_Encoded)
    frame._wire = data
    return frame


def batch_frame(frames: Sequence[WorkResponse]) -> WorkResponse:
    """`WorkResponse(batch=WorkResponseBatch(responses=frames))`, encoded from
    the frames' own encodings."""
    return _encoded(
        encode_work_response_batch(
            [item._wire if isinstance(item, Preencoded) else encode(item) for item in frames]
        )
    )


# WorkResponse.result, and WorkResult.request_id (a varint: its body is at
# most 11 bytes, so its length is one byte).
_RESULT = tag_len(3)
_REQUEST_ID = b"\x08"
_OK_ZERO = _RESULT + b"\x00"


def ok_frame(request_id: int) -> WorkResponse:
    """`WorkResponse(result=WorkResult(request_id=request_id))`, written
    inline: one per settled task (`encode_work_result` is the reference,
    byte-equal by test)."""
    if not request_id:
        return _encoded(_OK_ZERO)
    body = _REQUEST_ID + varint(request_id)
    return _encoded(_RESULT + bytes((len(body),)) + body)


def _error_frame(request_id: int, code: ErrorCode, message: str, **metadata: str) -> WorkResponse:
    detail = ErrorDetail(code=code, message=message, metadata=metadata)
    return WorkResponse(result=WorkResult(request_id=request_id, error=detail))


def _batch_requests(batch: WorkRequestBatch) -> list[WorkRequest]:
    """The commands of a batch, or the INVALID_ARGUMENT that ends the stream."""
    requests = batch.requests
    if not requests:
        raise GRPCError(
            Status.INVALID_ARGUMENT, "batch.requests: a batch holds at least one command"
        )
    if len(requests) > limits.MAX_WORK_BATCH:
        raise GRPCError(
            Status.INVALID_ARGUMENT,
            f"batch.requests: {len(requests)} commands exceed MAX_WORK_BATCH"
            f" ({limits.MAX_WORK_BATCH})",
        )
    for index, request in enumerate(requests):
        for name in ("batch", "register"):
            if getattr(request, name) is not None:
                raise GRPCError(
                    Status.INVALID_ARGUMENT,
                    f"batch.requests[{index}].{name}: a batch cannot hold `{name}`",
                )
    return requests


def _no_reset(*args: Any, **kwargs: Any) -> None:
    pass


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
    h2_stream = stream._stream
    h2_stream.reset_nowait = _no_reset
    try:
        async with asyncio.timeout(1.0):
            await stream.send_trailing_metadata(status=status, status_message=message)
    except Exception as exc:
        # The worker is gone or the connection is stuck: nobody to tell.
        log.debug("could not end a Work stream with %s: %r", status.name, exc)
    finally:
        del h2_stream.reset_nowait


async def _reset(stream: Any) -> None:
    """RST_STREAM: a stalled stream's partly written frame is dropped."""
    try:
        async with asyncio.timeout(1.0):
            await stream.cancel()
    except Exception as exc:
        # The connection is stuck too; keepalive will close it.
        log.debug("could not reset a stalled Work stream: %r", exc)


def _registration_fields(
    registration: WorkerRegistration,
) -> tuple[str, str, list[str], timedelta]:
    queue = v.name(registration.queue, "register.queue")
    worker_id = v.name(registration.worker_id, "register.worker_id")
    task_types = v.task_types(registration.task_types, "register.task_types")
    if not 1 <= registration.max_concurrency <= MAX_CONCURRENCY:
        raise v.FieldError(
            "register.max_concurrency",
            f"{registration.max_concurrency} is outside 1..{MAX_CONCURRENCY}",
        )
    lease = v.duration(
        registration.lease_duration, "register.lease_duration", maximum=limits.MAX_LEASE
    )
    # proto3 cannot tell an unset Duration from zero in every client; both
    # mean the daemon default.
    return queue, worker_id, task_types, lease or limits.DEFAULT_LEASE

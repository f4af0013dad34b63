"""``ringo.v1.QueueService``: its unary RPCs, and the routes to Work and AttachLocal.

(``grpc.health.v1.Health`` is `health`.)

Theory of operation
-------------------
A unary call passes four stages, each of which can refuse it; a refusal at
any stage leaves every task exactly as it was:

1. **Gate** (`gate.Gate`, a grpclib ``RecvRequest`` hook): bearer token
   (``UNAUTHENTICATED``) and shutdown (``UNAVAILABLE``), before the body is
   even read.
2. **Codec** (`_wire.StrictCodec`): bytes that are not a well-formed
   encoding of the method's message are ``INVALID_ARGUMENT``; oversized
   frames are ``RESOURCE_EXHAUSTED``.
3. **Context**: every method but Negotiate first checks its
   ``RequestContext`` against the session table. Unknown or expired token,
   another major, or a minor above what the session negotiated is
   ``OUT_OF_RANGE``. Because this runs before the operation, the SDK may
   safely renegotiate and re-send even a mutation. An RPC newer than the
   session's minor is ``UNIMPLEMENTED``.
4. **Fields** (`validate`): ``INVALID_ARGUMENT`` naming the field path; the
   validators also normalize defaults so storage never sees an ambiguous spec.

Only then does the method call the storage engine, with ``now`` read once
from the daemon's single `Clock`. Engine conditions map one-to-one onto
status codes (`NotFound` → ``NOT_FOUND``, `LeaseLost` → ``ABORTED`` — its
message ends "(reason: cancelled)" when the task was cancelled —,
`FailedPrecondition` → ``FAILED_PRECONDITION``, `StorageFull` — no room to
write, nothing written — → ``RESOURCE_EXHAUSTED``, `StorageUnavailable` — the
database cannot be reached — → ``UNAVAILABLE``); anything unexpected is
logged with its traceback and answered ``INTERNAL`` — a bug costs one call,
never the daemon.

A call below minor 9 knows no CANCELLED state: GetTask, RetryTask and an
enqueue's duplicate show it such a task as DEAD (`_as_seen_at`), and an
``AckRequest.result`` it sets is refused ``UNIMPLEMENTED``.

Long-poll claims
----------------
Claim tries storage; if nothing is claimable and the caller allowed a
``wait_timeout``, it sleeps until the first of: a wake-up for its queue
(enqueue, nack, retry, an expired lease — `wakeups.QueueWakeups`, armed
before the attempt so none is lost), the queue's next scheduled moment
(`Storage.next_wakeup`: a delayed task or backoff becoming due, a lease
expiring), the caller's deadline, or shutdown. Then it tries again. There is
no polling interval: an enqueue reaches a waiting claimer in one event-loop
turn. A client deadline shorter than ``wait_timeout`` shortens the wait, so
the call answers (empty) instead of being cut off.

Every lease handed out is noted with the `LeaseReaper`, which expires leases
at their deadline even when nobody is claiming, so activity counts and task
states stay true.

Replies are bounded by ``MAX_REPLY_BYTES`` (`reply_bounds`): a Claim answers
fewer tasks rather than a bigger message, and hands back what it leased
beyond the reply's room before it answers, so it never holds a lease it
does not send.

A lease reaches its client only with the reply, so a Claim that ends any
other way hands its leases back (`Storage.release`: PENDING, the attempt
unspent) and wakes the queue: a caller cancelled while a round is in flight
(that round the engine returns, see `storage.handback.guard_claim`; the rounds
before it, `_claim_now`), and a reply that cannot be delivered
(`_serve_claim`). A later round that fails answers with the earlier ones.

The Work stream
---------------
``Work`` is served by `_work.WorkStreams` on grpclib's raw stream (see
`QueueService.__mapping__`). Its registration passes stages 1-4 like a unary
call, and its lease commands run the very operations the unary RPCs run
(`apply_ack` … `apply_progress`), so both paths validate, store and wake up
alike; only the error channel differs (`ErrorDetail` instead of a status).

WaitTask
--------
``WaitTask`` (minor 12) parks the call on its task id in `waits.TaskWaits`
(refused ``RESOURCE_EXHAUSTED`` past the per-connection or per-daemon limit)
and reads the task: terminal (SUCCEEDED, DEAD, CANCELLED) it answers at once,
else it waits for a wake-up and reads again, until its timeout (clamped to
``MAX_TASK_WAIT`` and to shortly before the client's deadline), when it
answers the task as it stands. Every path that settles tasks here names them
to `TaskWaits.settled` after its commit (`apply_ack` … `apply_settlements`,
CancelTask); paths that only count what they changed (lease expiry, purge,
retention) ask for `TaskWaits.recheck`; other daemons' settlements arrive
through the store (see `waits`). A task deleted while waited on is
``NOT_FOUND``; a daemon shutting down answers its parked calls with the task
as it stands, and the client asks again elsewhere or later.

Schedules
---------
The four schedule RPCs (minor 13) validate (`validate.schedule`: the cron
expression parsed in its zone, names, payload, the bounds of
`limits`) and call storage; a put or a resume pokes the daemon's
`schedules.ScheduleLoop`, which fires due schedules exactly once per tick.

AttachLocal
-----------
``AttachLocal`` (a shared daemon's membership stream) is served by
`members.Members` on grpclib's raw stream too; it carries no
``RequestContext`` (membership is not a session) and is refused
``FAILED_PRECONDITION`` by a daemon that is not shared.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from collections.abc import Callable, Coroutine, Sequence
from datetime import datetime
from typing import Any, TypeVar

import grpclib.const
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError

from ringo_trio._contract import limits, reasons, versions
from ringo_trio._contract.versions import SDK_VERSION, Feature, FeatureMissing, Features
from ringo_trio._proto.ringo.v1 import (
    AckRequest,
    AckResponse,
    AttachLocalRequest,
    AttachLocalResponse,
    CancelTaskRequest,
    CancelTaskResponse,
    CancelTasksRequest,
    CancelTasksResponse,
    ClaimRequest,
    ClaimResponse,
    DeleteLimitRequest,
    DeleteLimitResponse,
    DeleteScheduleRequest,
    DeleteScheduleResponse,
    DeleteTasksRequest,
    DeleteTasksResponse,
    EnqueueManyRequest,
    EnqueueManyResponse,
    EnqueueRequest,
    EnqueueResponse,
    EnqueueResult,
    ExtendLeaseRequest,
    ExtendLeaseResponse,
    GetQueueActivityRequest,
    GetQueueActivityResponse,
    GetQueueStatsRequest,
    GetQueueStatsResponse,
    GetTaskRequest,
    GetTaskResponse,
    Lease,
    LeasedTask,
    LeaseRef,
    ListLimitsRequest,
    ListLimitsResponse,
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
    QueueServiceBase,
    RejectRequest,
    RejectResponse,
    ReportProgressRequest,
    ReportProgressResponse,
    RequestContext,
    RetryTaskRequest,
    RetryTaskResponse,
    RetryTasksRequest,
    RetryTasksResponse,
    SetLimitRequest,
    SetLimitResponse,
    SetQueuePausedRequest,
    SetQueuePausedResponse,
    SetSchedulePausedRequest,
    SetSchedulePausedResponse,
    Task,
    TaskState,
    WaitTaskRequest,
    WaitTaskResponse,
    WorkRequest,
    WorkResponse,
)

from ..clock import Clock
from ..schedules import ScheduleLoop
from ..storage.base import (
    FailedPrecondition,
    LeaseLost,
    Nack,
    NotFound,
    Settlement,
    Storage,
    StorageFull,
    StorageUnavailable,
    stamp_ttl,
)
from ..storage.handback import hand_back
from . import validate as v
from .codec import Preencoded
from .commit import GroupCommit
from .enqueue_reply import encode_enqueue_many_reply
from .gate import current_connection, time_remaining
from .limits import Limits
from .members import ATTACH_LOCAL_METHOD, Members
from .operate import Operations
from .paused import PausedQueues
from .reply_bounds import claim_within, enqueue_results_fit, fitting
from .sessions import SessionTable
from .waits import TaskWaits, WaitLimitReached
from .wakeups import LeaseReaper, QueueWakeups
from .work import WorkStreams

__all__ = ["QUEUE_SERVICE_NAME", "QueueService"]

log = logging.getLogger("ringo_trio.server")

QUEUE_SERVICE_NAME = "ringo.v1.QueueService"
_WORK_METHOD = f"/{QUEUE_SERVICE_NAME}/Work"
_CLAIM_METHOD = f"/{QUEUE_SERVICE_NAME}/Claim"

# Minor that introduced each RPC newer than minor 0.

# A scheduled wake-up sleeps this much past the due moment so the retry does
# not race the deadline and find the task still a microsecond early.
_SCHEDULE_SLACK = 0.002
_INCONSISTENT_WAKEUP_RETRY = 0.05
# How long before the client's own deadline a long-poll gives up waiting.
_DEADLINE_MARGIN = 0.25
_TERMINAL = frozenset((TaskState.SUCCEEDED, TaskState.DEAD, TaskState.CANCELLED))


def _as_seen_at(minor: int, task: Task) -> Task:
    """`task` as a call at `minor` may see it: a session below minor 9 has no
    CANCELLED state, so it is shown such a task as DEAD (terminal too, and
    retry brings it back just the same)."""
    if task.state == TaskState.CANCELLED and not Features(minor).has(Feature.CANCELLED_STATE):
        return dataclasses.replace(task, state=TaskState.DEAD)
    return task


def _require(minor: int, feature: Feature, what: str) -> None:
    """UNIMPLEMENTED unless a session of `minor` has `feature`."""
    try:
        Features(minor).require(feature, what)
    except FeatureMissing as exc:
        raise GRPCError(Status.UNIMPLEMENTED, str(exc)) from None


class _ContextRejected(Exception):
    """The RequestContext does not name a live, compatible session."""


def _check_major(major: int, detail: str = "") -> None:
    if major != versions.MAJOR:
        raise _ContextRejected(
            f"protocol major {major} is not served;"
            f" this daemon speaks major {versions.MAJOR}{detail}"
        )


class _EncodedEnqueueMany(Preencoded, EnqueueManyResponse):
    """An `EnqueueManyResponse` encoded by `enqueue_reply` from the
    (task, created) pairs, without building an `EnqueueResult` per task here.
    Its fields stay empty: it exists to be sent."""

    def __init__(
        self, results: list[tuple[Task, bool]], created: int, duplicates: int, *, compact: bool
    ) -> None:
        super().__init__(created_count=created, duplicate_count=duplicates)
        self._wire = encode_enqueue_many_reply(results, created, duplicates, compact=compact)


_Service = TypeVar("_Service", bound="QueueService")
_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")
_Method = Callable[[_Service, _Req], Coroutine[Any, Any, _Resp]]


def _rpc(method: _Method[_Service, _Req, _Resp]) -> _Method[_Service, _Req, _Resp]:
    """Map every failure of a unary method onto its status code."""
    rpc_name = method.__name__

    @functools.wraps(method)
    async def wrapper(self: _Service, message: _Req) -> _Resp:
        try:
            return await method(self, message)
        except GRPCError:
            raise
        except v.FieldError as exc:
            raise GRPCError(Status.INVALID_ARGUMENT, str(exc)) from None
        except _ContextRejected as exc:
            raise GRPCError(Status.OUT_OF_RANGE, str(exc)) from None
        except NotFound as exc:
            raise GRPCError(Status.NOT_FOUND, str(exc) or "no such task") from None
        except LeaseLost as exc:
            if exc.cancelled:
                # The SDK tells the lease's holder why: the detail names the reason.
                raise GRPCError(
                    Status.ABORTED, f"{exc or 'the lease is gone'} (reason: {reasons.CANCELLED})"
                ) from None
            raise GRPCError(
                Status.ABORTED, str(exc) or "the lease is not the task's current lease"
            ) from None
        except FailedPrecondition as exc:
            raise GRPCError(
                Status.FAILED_PRECONDITION, str(exc) or "not allowed in this state"
            ) from None
        except WaitLimitReached as exc:
            raise GRPCError(Status.RESOURCE_EXHAUSTED, str(exc)) from None
        except StorageFull as exc:
            # Not UNAVAILABLE: the outcome is known (nothing was written), and
            # the SDK answers UNAVAILABLE by reconnecting, even restarting a
            # local daemon, which frees no disk.
            log.warning("%s: storage full: %s", rpc_name, exc)
            raise GRPCError(
                Status.RESOURCE_EXHAUSTED, f"storage full, nothing was written: {exc}"
            ) from None
        except StorageUnavailable as exc:
            # The call may or may not have committed; the SDK never replays a
            # mutation on UNAVAILABLE, so the caller decides.
            log.warning("%s: storage unavailable: %s", rpc_name, exc)
            raise GRPCError(Status.UNAVAILABLE, f"storage unavailable: {exc}") from None
        except Exception as exc:
            log.exception("%s failed unexpectedly", rpc_name)
            raise GRPCError(
                Status.INTERNAL,
                f"internal error in {rpc_name} ({type(exc).__name__}); see the daemon log",
            ) from None

    return wrapper


class QueueService(QueueServiceBase):
    """``ringo.v1.QueueService``: the unary RPCs here, the Work stream in
    `_work`, AttachLocal in `members` (`members`; by default a daemon that
    is not shared, which refuses it)."""

    def __init__(
        self,
        storage: Storage,
        *,
        clock: Clock,
        sessions: SessionTable,
        served_minor: int,
        wakeups: QueueWakeups,
        reaper: LeaseReaper,
        heartbeat_interval: float = 10.0,
        members: Members | None = None,
        commit: GroupCommit | None = None,
        waits: TaskWaits | None = None,
        paused: PausedQueues | None = None,
        schedules: ScheduleLoop | None = None,
    ) -> None:
        if not 0 <= served_minor <= versions.MINOR:
            raise ValueError(f"served minor must be within 0..{versions.MINOR}")
        self._storage = storage
        self._clock = clock
        self._sessions = sessions
        self._served_minor = served_minor
        self._wakeups = wakeups
        self._reaper = reaper
        # The daemon's committer groups settlements across Work streams;
        # without one (in-process tests), each stream's group is its own
        # transaction.
        self._commit = commit
        self.members = members if members is not None else Members(None)
        # Without the daemon's (in-process tests), one whose `run` nobody
        # runs: settlements wake its calls, nothing rechecks them.
        self.waits = waits if waits is not None else TaskWaits(storage)
        # Without the daemon's (in-process tests), one nobody loads.
        self.paused = paused or PausedQueues(storage, wakeups)
        self._operations = Operations(storage, wakeups, self.waits, self.paused)
        # Without the daemon's loop (in-process tests), nothing is poked.
        self._schedules = schedules
        self._limits = Limits(storage, wakeups)
        # Leases of a claim nobody received, handed back by the engine itself:
        # their tasks are claimable again, so the queue's claimers are woken
        # as after any release.
        storage.released_listener = wakeups.notify
        self.work_streams = WorkStreams(
            storage=storage,
            clock=clock,
            wakeups=wakeups,
            reaper=reaper,
            ops=self,
            heartbeat_interval=heartbeat_interval,
            paused=self.paused,
        )

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        mapping = super().__mapping__()
        # The generated `work` sees requests only as an iterator it must
        # consume in order; the stream reads and pushes concurrently, so it
        # takes grpclib's raw stream (the Gate still wraps and counts it).
        mapping[_WORK_METHOD] = grpclib.const.Handler(
            self.work_streams.serve_call, Cardinality.STREAM_STREAM, WorkRequest, WorkResponse
        )
        # Claim sends its own reply, so that one never delivered is handed
        # back (`_serve_claim`).
        mapping[_CLAIM_METHOD] = grpclib.const.Handler(
            self._serve_claim, Cardinality.UNARY_UNARY, ClaimRequest, ClaimResponse
        )
        # A member's stream stays open with nothing to send; `Members` counts
        # it from the raw stream so every end (cancel, lost connection,
        # shutdown) is seen.
        mapping[ATTACH_LOCAL_METHOD] = grpclib.const.Handler(
            self.members.serve_call,
            Cardinality.UNARY_STREAM,
            AttachLocalRequest,
            AttachLocalResponse,
        )
        return mapping

    # -- session -----------------------------------------------------------

    def _admit(self, context: RequestContext | None) -> datetime:
        """`now` for a call whose context names a live, compatible session;
        `_ContextRejected` otherwise."""
        now = self._clock.now()
        self._session_minor(context, now)
        return now

    def _admit_at(self, context: RequestContext | None) -> tuple[datetime, int]:
        """`_admit`, and the minor the call runs at."""
        now = self._clock.now()
        return now, self._session_minor(context, now)

    def _session_minor(self, context: RequestContext | None, now: datetime) -> int:
        """The minor this call runs at, or `_ContextRejected`."""
        if context is None:
            raise _ContextRejected("context: missing RequestContext; call Negotiate first")
        _check_major(context.protocol_major)
        session = self._sessions.lookup(context.session_token, now)
        if session is None:
            raise _ContextRejected("session token is unknown or expired; negotiate again")
        if context.protocol_minor > session.minor:
            raise _ContextRejected(
                f"protocol minor {context.protocol_minor} is above the session's"
                f" negotiated minor {session.minor}; negotiate again"
            )
        return context.protocol_minor

    def stream_minor(self, context: RequestContext | None, now: datetime) -> int:
        """`_session_minor` for a Work stream's registration, which reports a
        rejected context as its status."""
        try:
            return self._session_minor(context, now)
        except _ContextRejected as exc:
            raise GRPCError(Status.OUT_OF_RANGE, str(exc)) from None

    @_rpc
    async def negotiate(self, message: NegotiateRequest) -> NegotiateResponse:
        _check_major(message.protocol_major, f" (minors 0..{self._served_minor})")
        minor = min(message.protocol_minor, self._served_minor)
        token = self._sessions.open(minor, self._clock.now())
        log.debug(
            "negotiated minor %d with %s %s", minor, message.sdk_name or "?", message.sdk_version
        )
        return NegotiateResponse(
            protocol_major=versions.MAJOR,
            protocol_minor=minor,
            session_token=token,
            server_version=SDK_VERSION,
            session_ttl=self._sessions.ttl,
        )

    # -- submission --------------------------------------------------------

    async def _enqueued(self, queue: str) -> None:
        """New tasks of `queue` are committed: wake its waiting dispatchers
        and let them start their claims before this reply is encoded and
        written. One loop turn is all it takes for a dispatcher waiting on the
        wake-up; the work, not the producer's answer, is what a waiting
        worker waits on (bench/results.md, "Levers (issue 29)": the push
        leaves ~0.7 ms sooner, the reply ~0.4 ms later, with a worker idle;
        nothing changes when none waits). A call cancelled in this turn
        leaves its tasks committed and unanswered, as one cancelled while its
        reply is written always did."""
        self._wakeups.notify(queue)
        await asyncio.sleep(0)

    @_rpc
    async def enqueue(self, message: EnqueueRequest) -> EnqueueResponse:
        now, minor = self._admit_at(message.context)
        queue = v.name(message.queue, "queue")
        spec = v.task_spec(message.task, "task", now)
        [outcome] = await self._storage.enqueue(queue, [spec], now)
        if outcome.created:
            await self._enqueued(queue)
        return EnqueueResponse(
            result=EnqueueResult(task=_as_seen_at(minor, outcome.task), created=outcome.created)
        )

    @_rpc
    async def enqueue_many(self, message: EnqueueManyRequest) -> EnqueueManyResponse:
        now, minor = self._admit_at(message.context)
        queue = v.name(message.queue, "queue")
        specs = v.task_specs(message.tasks, "tasks", now)
        outcomes = await self._storage.enqueue(queue, specs, now)
        created = sum(1 for outcome in outcomes if outcome.created)
        if created:
            await self._enqueued(queue)
        features = Features(minor)
        results = (
            [(o.task, o.created) for o in outcomes]
            if features.has(Feature.CANCELLED_STATE)  # `_as_seen_at` changes nothing then
            else [(_as_seen_at(minor, o.task), o.created) for o in outcomes]
        )
        # The batch is committed: the reply must reach the client whatever
        # the tasks hold, so an echo too big for one reply goes compact at
        # any minor.
        compact = features.has(Feature.COMPACT_ENQUEUE_REPLY) or not enqueue_results_fit(
            [task for task, _ in results]
        )
        return _EncodedEnqueueMany(results, created, len(outcomes) - created, compact=compact)

    @_rpc
    async def get_task(self, message: GetTaskRequest) -> GetTaskResponse:
        _, minor = self._admit_at(message.context)
        queue = v.name(message.queue, "queue")
        task_id, unique_key = v.lookup(message.task_id, message.unique_key)
        task = await self._storage.get(
            queue,
            task_id=task_id,
            unique_key=unique_key,
            history=Features(minor).has(Feature.TASK_HISTORY),
        )
        return GetTaskResponse(task=_as_seen_at(minor, task))

    @_rpc
    async def retry_task(self, message: RetryTaskRequest) -> RetryTaskResponse:
        now, minor = self._admit_at(message.context)
        queue = v.name(message.queue, "queue")
        task_id, unique_key = v.lookup(message.task_id, message.unique_key)
        task = await self._storage.retry(queue, now, task_id=task_id, unique_key=unique_key)
        self._wakeups.notify(queue)
        return RetryTaskResponse(task=_as_seen_at(minor, task))

    # -- waiting (minor 12) ------------------------------------------------

    @_rpc
    async def wait_task(self, message: WaitTaskRequest) -> WaitTaskResponse:
        _, minor = self._admit_at(message.context)
        _require(minor, Feature.WAIT_TASK, "WaitTask")
        queue = v.name(message.queue, "queue")
        task_id = v.name(message.task_id, "task_id", limits.MAX_UNIQUE_KEY_BYTES)
        timeout = v.wait_timeout(message.timeout)
        client_left = time_remaining()
        if client_left is not None:
            # Answer (the task as it stands) before the client gives up.
            timeout = min(timeout, client_left - _DEADLINE_MARGIN)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        history = Features(minor).has(Feature.TASK_HISTORY)
        with self.waits.park(task_id, current_connection()) as waiter:
            await waiter.ready()
            while True:
                # Armed before the read: a settlement racing it resolves
                # this very future, so the wait below returns at once.
                armed = waiter.arm()
                task = await self._storage.get(queue, task_id=task_id, history=history)
                remaining = deadline - loop.time()
                if task.state in _TERMINAL or remaining <= 0 or waiter.closed:
                    return WaitTaskResponse(task=task)
                await waiter.wait(armed, remaining)

    # -- leases ------------------------------------------------------------

    @_rpc
    async def claim(self, message: ClaimRequest) -> ClaimResponse:
        _, minor = self._admit_at(message.context)
        args = v.claim_args(message)
        tasks = await self._long_poll(args)
        if Features(minor).has(Feature.LEASE_TTL):
            now = self._clock.now()
            for item in tasks:
                stamp_ttl(item.lease, now)
        return ClaimResponse(tasks=tasks)

    async def _serve_claim(self, stream: Any) -> None:
        """grpclib's handler for Claim: `claim`, then its reply and the OK
        trailers, sent here. grpclib's client drops a reply whose trailers
        never come, so until they are handed to the connection, a reply that
        fails or is cancelled (the client went away, its deadline passed)
        gives every lease in it back."""
        request = await stream.recv_message()
        assert request is not None
        response = await self.claim(request)
        try:
            await stream.send_message(response)
            await stream.send_trailing_metadata()
        except BaseException:
            await self._hand_back(response.tasks)
            raise

    async def _hand_back(self, leased: Sequence[LeasedTask]) -> None:
        refs = [
            LeaseRef(task_id=lease.task_id, attempt=lease.attempt, lease_token=lease.lease_token)
            for lease in (item.lease for item in leased)
            if lease is not None
        ]
        queues = {item.task.queue for item in leased if item.task is not None}
        if await hand_back(self._storage, refs, self._clock.now()):
            for queue in queues:
                self._wakeups.notify(queue)

    async def _long_poll(self, args: v.ClaimArgs) -> list[LeasedTask]:
        loop = asyncio.get_running_loop()
        wait = args.wait_timeout.total_seconds()
        client_left = time_remaining()
        if client_left is not None:
            # Answer (empty) shortly before the client gives up rather than be
            # cancelled at its deadline, possibly right after leasing tasks.
            wait = min(wait, client_left - _DEADLINE_MARGIN)
        deadline = loop.time() + wait
        with self._wakeups.watch(args.queue) as watch:
            while True:
                # Armed before the attempt: a notify racing the attempt sets
                # this very event, so the wait below returns at once.
                armed = watch.arm()
                if watch.closed:
                    # Shutting down: hand out no lease whose response may
                    # never be delivered.
                    return []
                now = self._clock.now()
                paused = args.queue in self.paused.names  # claims nothing (`paused`)
                leased = [] if paused else await self._claim_now(args, now)
                if leased:
                    return leased
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return []
                wake_at = None
                if not paused:
                    wake_at = await self._storage.next_wakeup(args.queue, args.task_types, now)
                if wake_at is not None:
                    if wake_at <= now:
                        # Storage calls it due yet the claim found nothing:
                        # back off briefly instead of spinning on it.
                        until_due = _INCONSISTENT_WAKEUP_RETRY
                    else:
                        until_due = (wake_at - self._clock.now()).total_seconds()
                        until_due = max(until_due, 0.0) + _SCHEDULE_SLACK
                    remaining = min(remaining, until_due)
                await watch.wait(armed, remaining)

    async def _claim_now(self, args: v.ClaimArgs, now: datetime) -> list[LeasedTask]:
        leased: list[LeasedTask] = []  # every round's leases, answered or not

        async def claim(limit: int) -> list[LeasedTask]:
            try:
                batch = await self._storage.claim(
                    args.queue, args.task_types, limit, args.worker_id, args.lease_duration, now
                )
            except Exception:
                if not leased:
                    raise
                # The earlier rounds are leased to this caller, and the reply
                # is the only way it learns of them: an empty round ends the
                # claim with them.
                log.warning(
                    "Claim: a later round failed; answering with the %d task(s) before it",
                    len(leased),
                    exc_info=True,
                )
                return []
            for item in batch:
                # Noted per batch, before the next await; `note` skips a repeat
                # of the deadline it just saw (every lease of a batch shares one).
                if item.lease is not None:
                    self._reaper.note(item.lease.until)
            leased.extend(batch)
            return batch

        try:
            # What a round leased beyond the reply's room is handed back
            # before the reply (`claim_within`).
            return await claim_within(claim, self._hand_back, args.limit)
        except asyncio.CancelledError:
            # The round in flight is the engine's to hand back; the rounds
            # before it are only here (a ref handed back twice is skipped).
            await self._hand_back(leased)
            raise

    @_rpc
    async def ack(self, message: AckRequest) -> AckResponse:
        now, minor = self._admit_at(message.context)
        if message.result is not None:
            _require(minor, Feature.RESULT_VALUES, "Ack result")
        await self.apply_ack(message, now)
        return AckResponse()

    @_rpc
    async def nack(self, message: NackRequest) -> NackResponse:
        await self.apply_nack(message, self._admit(message.context))
        return NackResponse()

    @_rpc
    async def reject(self, message: RejectRequest) -> RejectResponse:
        await self.apply_reject(message, self._admit(message.context))
        return RejectResponse()

    @_rpc
    async def extend_lease(self, message: ExtendLeaseRequest) -> ExtendLeaseResponse:
        now, minor = self._admit_at(message.context)
        lease = await self.apply_extend(message, now)
        if Features(minor).has(Feature.LEASE_TTL):
            stamp_ttl(lease, self._clock.now())
        return ExtendLeaseResponse(lease=lease)

    @_rpc
    async def report_progress(self, message: ReportProgressRequest) -> ReportProgressResponse:
        await self.apply_progress(message, self._admit(message.context))
        return ReportProgressResponse()

    # -- lease operations: the unary RPCs above and the Work stream's commands.
    # Field validation and storage only; the caller has admitted the context
    # (a Work stream once, at registration) and maps the failures.

    async def apply_ack(self, message: AckRequest, now: datetime) -> None:
        """The caller has checked that its minor allows a result."""
        ack = v.ack_settlement(message)
        task = await self._storage.ack(ack.ref, now, ack.result)
        self._freed(task.queue, task.limit_key)
        self.waits.settled((ack.ref.task_id,))

    async def apply_nack(self, message: NackRequest, now: datetime) -> None:
        nack = v.nack_settlement(message)
        task = await self._storage.nack(nack.ref, nack.error, nack.retry_delay, now)
        self._wakeups.notify(task.queue)
        # DEAD when that was the last attempt; a waiter reads which.
        self.waits.settled((task.id,))

    async def apply_reject(self, message: RejectRequest, now: datetime) -> None:
        reject = v.reject_settlement(message)
        task = await self._storage.reject(reject.ref, reject.error, now)
        self._freed(task.queue, task.limit_key)
        self.waits.settled((reject.ref.task_id,))

    def _freed(self, queue: str, limit_key: str | None) -> None:
        """A lease of `queue` ended without making its task claimable: on a
        queue with limit rules that frees a slot of its key's concurrency,
        so the queue's claimers are woken as after an enqueue (the engine's
        concurrency recheck stays as the backstop for leases that end on
        another daemon)."""
        if limit_key and self._storage.limited(queue):
            self._wakeups.notify(queue)

    async def apply_settlements(
        self, settlements: Sequence[Settlement], now: datetime
    ) -> list[str | LeaseLost]:
        """A Work stream's settlements, in order, committed together (with
        other streams' through the daemon's `GroupCommit`;
        `Storage.settle_many` has the contract). The queues whose tasks a
        nack made claimable again have their dispatchers woken."""
        if self._commit is not None:
            answers = await self._commit.settle(settlements, now)
        else:
            answers = await self._storage.settle_many(settlements, now)
        # A nack makes its task claimable again; any settlement on a queue
        # with limit rules may free its key's concurrency (`_freed`).
        woken = {
            answer
            for item, answer in zip(settlements, answers, strict=True)
            if isinstance(answer, str) and (type(item) is Nack or self._storage.limited(answer))
        }
        for queue in woken:
            self._wakeups.notify(queue)
        if self.waits.parked:
            self.waits.settled(
                item.ref.task_id
                for item, answer in zip(settlements, answers, strict=True)
                if isinstance(answer, str)
            )
        return answers

    async def apply_extend(self, message: ExtendLeaseRequest, now: datetime) -> Lease:
        ref = v.lease_ref(message.lease)
        extension = v.duration(
            message.extension, "extension", positive=True, maximum=limits.MAX_LEASE
        )
        if extension is None:
            raise v.FieldError("extension", "is required")
        lease = await self._storage.extend_lease(ref, extension, now)
        self._reaper.note(lease.until)
        return lease

    async def apply_progress(self, message: ReportProgressRequest, now: datetime) -> None:
        ref = v.lease_ref(message.lease)
        v.progress_values(message.current, message.total, message.message)
        await self._storage.report_progress(
            ref, message.current, message.total, message.message, now
        )

    # -- observation -------------------------------------------------------

    @_rpc
    async def get_queue_activity(
        self, message: GetQueueActivityRequest
    ) -> GetQueueActivityResponse:
        now, minor = self._admit_at(message.context)
        _require(minor, Feature.ACTIVITY, "GetQueueActivity")
        if message.due_only:
            _require(minor, Feature.DUE_ONLY_ACTIVITY, "GetQueueActivity due_only")
        queue = v.name(message.queue, "queue")
        types = v.task_types(message.task_types)
        count = await self._storage.activity(queue, types, due_by=now if message.due_only else None)
        return GetQueueActivityResponse(active_task_count=count)

    # -- operating the queues (minor 9; the work is in `operate`) ---------

    def _admit_for(self, context: RequestContext | None, rpc: str, feature: Feature) -> datetime:
        """`_admit`, refused below the minor that brought `feature`: the
        call's `now`."""
        now, minor = self._admit_at(context)
        _require(minor, feature, rpc)
        return now

    # -- keyed limits (minor 13) ----------------------------------------------

    @_rpc
    async def set_limit(self, message: SetLimitRequest) -> SetLimitResponse:
        now = self._admit_for(message.context, "SetLimit", Feature.LIMITS)
        return await self._limits.set_limit(message, now)

    @_rpc
    async def list_limits(self, message: ListLimitsRequest) -> ListLimitsResponse:
        now = self._admit_for(message.context, "ListLimits", Feature.LIMITS)
        return await self._limits.list_limits(message, now)

    @_rpc
    async def delete_limit(self, message: DeleteLimitRequest) -> DeleteLimitResponse:
        now = self._admit_for(message.context, "DeleteLimit", Feature.LIMITS)
        return await self._limits.delete_limit(message, now)

    @_rpc
    async def list_tasks(self, message: ListTasksRequest) -> ListTasksResponse:
        now = self._admit_for(message.context, "ListTasks", Feature.OPERATE)
        return await self._operations.list_tasks(message, now)

    @_rpc
    async def get_queue_stats(self, message: GetQueueStatsRequest) -> GetQueueStatsResponse:
        now = self._admit_for(message.context, "GetQueueStats", Feature.OPERATE)
        return await self._operations.get_queue_stats(message, now)

    @_rpc
    async def list_queues(self, message: ListQueuesRequest) -> ListQueuesResponse:
        now = self._admit_for(message.context, "ListQueues", Feature.OPERATE)
        return await self._operations.list_queues(message, now)

    @_rpc
    async def cancel_task(self, message: CancelTaskRequest) -> CancelTaskResponse:
        now = self._admit_for(message.context, "CancelTask", Feature.OPERATE)
        return await self._operations.cancel_task(message, now)

    @_rpc
    async def cancel_tasks(self, message: CancelTasksRequest) -> CancelTasksResponse:
        now = self._admit_for(message.context, "CancelTasks", Feature.BULK_BY_FILTER)
        return await self._operations.cancel_tasks(message, now)

    @_rpc
    async def delete_tasks(self, message: DeleteTasksRequest) -> DeleteTasksResponse:
        now = self._admit_for(message.context, "DeleteTasks", Feature.OPERATE)
        return await self._operations.delete_tasks(message, now)

    @_rpc
    async def retry_tasks(self, message: RetryTasksRequest) -> RetryTasksResponse:
        now = self._admit_for(message.context, "RetryTasks", Feature.OPERATE)
        return await self._operations.retry_tasks(message, now)

    @_rpc
    async def set_queue_paused(self, message: SetQueuePausedRequest) -> SetQueuePausedResponse:
        now = self._admit_for(message.context, "SetQueuePaused", Feature.PAUSE_QUEUES)
        return await self._operations.set_queue_paused(message, now)

    # -- schedules (minor 13; the firing is `schedules.ScheduleLoop`) -----

    def _poke(self) -> None:
        if self._schedules is not None:
            self._schedules.poke()

    @_rpc
    async def put_schedule(self, message: PutScheduleRequest) -> PutScheduleResponse:
        now = self._admit_for(message.context, "PutSchedule", Feature.SCHEDULES)
        schedule = v.schedule(message.schedule)
        stored, created = await self._storage.put_schedule(
            schedule, now, max_per_queue=limits.MAX_SCHEDULES_PER_QUEUE
        )
        self._poke()
        return PutScheduleResponse(schedule=stored, created=created)

    @_rpc
    async def list_schedules(self, message: ListSchedulesRequest) -> ListSchedulesResponse:
        self._admit_for(message.context, "ListSchedules", Feature.SCHEDULES)
        queue = v.name(message.queue, "queue") if message.queue else None
        schedules = await self._storage.list_schedules(queue)
        # Within MAX_REPLY_BYTES (a schedule's payload may be 1 MiB): the
        # longest prefix that fits, in (queue, name) order.
        fit = fitting([len(bytes(schedule)) for schedule in schedules])
        return ListSchedulesResponse(schedules=schedules[:fit])

    @_rpc
    async def delete_schedule(self, message: DeleteScheduleRequest) -> DeleteScheduleResponse:
        self._admit_for(message.context, "DeleteSchedule", Feature.SCHEDULES)
        queue = v.name(message.queue, "queue")
        name = v.name(message.name, "name")
        return DeleteScheduleResponse(deleted=await self._storage.delete_schedule(queue, name))

    @_rpc
    async def set_schedule_paused(
        self, message: SetSchedulePausedRequest
    ) -> SetSchedulePausedResponse:
        now = self._admit_for(message.context, "SetSchedulePaused", Feature.SCHEDULES)
        queue = v.name(message.queue, "queue")
        name = v.name(message.name, "name")
        stored = await self._storage.set_schedule_paused(queue, name, message.paused, now)
        self._poke()
        return SetSchedulePausedResponse(schedule=stored)

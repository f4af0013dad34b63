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

Claim
-----
The unary Claim is a long poll (`claims.LongPollClaims`): it waits for
claimable work up to its ``wait_timeout``, and a lease reaches its client
only with the reply — a Claim that ends any other way, its reply
undelivered included (`QueueService._serve_claim`), hands its leases back.

The Work stream
---------------
``Work`` is served by `_work.WorkStreams` on grpclib's raw stream (see
`QueueService.__mapping__`). Its registration passes stages 1-4 like a unary
call, and its lease commands run the very operations the unary RPCs run
(`leases.LeaseOperations`), so both paths validate, store and wake up alike;
only the error channel differs (`ErrorDetail` instead of a status).

WaitTask
--------
``WaitTask`` (minor 12) parks the call on its task id in `waits.TaskWaits`
(refused ``RESOURCE_EXHAUSTED`` past the per-connection or per-daemon limit)
and reads the task: terminal (SUCCEEDED, DEAD, CANCELLED) it answers at once,
else it waits for a wake-up and reads again, until its timeout (clamped to
``MAX_TASK_WAIT`` and to shortly before the client's deadline), when it
answers the task as it stands. Every path that settles tasks here names them
to `TaskWaits.settled` after its commit (`leases.LeaseOperations`,
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
from collections.abc import Callable, Coroutine
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
    NotFound,
    Storage,
    StorageFull,
    StorageUnavailable,
    stamp_ttl,
)
from . import validate as v
from .claims import DEADLINE_MARGIN, LongPollClaims
from .codec import Preencoded
from .commit import GroupCommit
from .enqueue_reply import encode_enqueue_many_reply
from .gate import current_connection, time_remaining
from .leases import LeaseOperations
from .limits import Limits
from .members import ATTACH_LOCAL_METHOD, Members
from .operate import Operations
from .paused import PausedQueues
from .reply_bounds import enqueue_results_fit, fitting
from .sessions import SessionTable
from .waits import TaskWaits, WaitLimitReached
from .wakeups import LeaseReaper, QueueWakeups
from .work import WorkStreams

__all__ = ["QUEUE_SERVICE_NAME", "QueueService"]

log = logging.getLogger("ringo_trio.server")

QUEUE_SERVICE_NAME = "ringo.v1.QueueService"
_WORK_METHOD = f"/{QUEUE_SERVICE_NAME}/Work"
_CLAIM_METHOD = f"/{QUEUE_SERVICE_NAME}/Claim"

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
                    Status.ABORTED,
                    f"{str(exc) or 'the lease is gone'} (reason: {reasons.CANCELLED})",
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
        self.claims = LongPollClaims(storage, clock, wakeups, reaper, self.paused)
        self.leases = LeaseOperations(storage, wakeups, reaper, self.waits, commit)
        # Leases of a claim nobody received, handed back by the engine itself:
        # their tasks are claimable again, so the queue's claimers are woken
        # as after any release.
        storage.released_listener = wakeups.notify
        self.work_streams = WorkStreams(
            storage=storage,
            clock=clock,
            wakeups=wakeups,
            reaper=reaper,
            ops=self.leases,
            admit=self.stream_minor,
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
            timeout = min(timeout, client_left - DEADLINE_MARGIN)
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
        tasks = await self.claims.claim(args)
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
            await self.claims.hand_back(response.tasks)
            raise

    @_rpc
    async def ack(self, message: AckRequest) -> AckResponse:
        now, minor = self._admit_at(message.context)
        if message.result is not None:
            _require(minor, Feature.RESULT_VALUES, "Ack result")
        await self.leases.ack(message, now)
        return AckResponse()

    @_rpc
    async def nack(self, message: NackRequest) -> NackResponse:
        await self.leases.nack(message, self._admit(message.context))
        return NackResponse()

    @_rpc
    async def reject(self, message: RejectRequest) -> RejectResponse:
        await self.leases.reject(message, self._admit(message.context))
        return RejectResponse()

    @_rpc
    async def extend_lease(self, message: ExtendLeaseRequest) -> ExtendLeaseResponse:
        now, minor = self._admit_at(message.context)
        lease = await self.leases.extend(message, now)
        if Features(minor).has(Feature.LEASE_TTL):
            stamp_ttl(lease, self._clock.now())
        return ExtendLeaseResponse(lease=lease)

    @_rpc
    async def report_progress(self, message: ReportProgressRequest) -> ReportProgressResponse:
        await self.leases.progress(message, self._admit(message.context))
        return ReportProgressResponse()

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

"""A Work stream's commands, run in order, each answered by exactly one result.

The reader of a Work stream (`work`) hands every command frame, or a batch's
commands, to `WorkCommands.run` and sends the results it returns. Lease
commands run the unary RPCs' own validation and storage calls
(`leases.LeaseOperations`), with their wake-ups; the embedded ``context`` of
a command is ignored (registration admitted the stream). Acks, nacks and
rejects go to storage through ONE function, `LeaseOperations.settle`
(`Storage.settle_many`): a lone one as a group of one, the consecutive ones
of a batch as one group; any other command first settles the group before
it, so every command sees the effects of those before it, as one by one.
Whether a command may run at all (its id, its minor, the credit rule, drain)
is the `ServerSession`'s decision (`admit`, `credit_update`, `drain`).

**Release** (``release{lease}``, minor >= 7) is how a stopping worker hands
back a lease it did not finish: `Storage.release`, as for an undelivered
push — the task is PENDING at once and the attempt is not spent — then the
queue is woken. The lease leaves outstanding like a settlement.

A failure becomes the result's `ErrorDetail` (`_failure`: a lease that ended
because its task was cancelled is ``LEASE_LOST`` with ``metadata.reason =
"cancelled"``) and the stream goes on — except when storage is unavailable:
that command is answered ``UNAVAILABLE`` and the stream is ended (``end``),
so the worker reconnects instead of settling into a stream that cannot work.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import betterproto2

from ringo_trio._contract.versions import Feature
from ringo_trio._contract.work.server import Ending, ServerSession
from ringo_trio._proto.ringo.v1 import (
    CreditUpdate,
    ErrorCode,
    ExtendLeaseRequest,
    LeaseRef,
    ReleaseRequest,
    ReportProgressRequest,
    TaskState,
    WorkerDrain,
    WorkRequest,
    WorkResponse,
    WorkResult,
)

from ..http.metrics import StreamTap
from ..storage.base import (
    FailedPrecondition,
    LeaseLost,
    NotFound,
    Settlement,
    StorageUnavailable,
    stamp_ttl,
)
from . import validate as v
from .work_frames import answer_frame, error_frame, ok_frame

if TYPE_CHECKING:
    from .work import WorkStreams

__all__ = ["WorkCommands"]

log = logging.getLogger("ringo_trio.server")

# The commands that settle a lease: run in groups by `Storage.settle_many`.
_SETTLEMENTS = frozenset({"ack", "nack", "reject"})

# A placeholder in a list of answers being filled in (never sent).
_NOT_RUN = WorkResponse()


class WorkCommands:
    """The commands of one registered Work stream (see the module docstring)."""

    __slots__ = (
        "_credit_changed",
        "_end",
        "_handlers",
        "_owner",
        "_queue",
        "_session",
        "_tap",
        "_worker_id",
        "failed",
        "succeeded",
    )

    def __init__(
        self,
        owner: WorkStreams,
        session: ServerSession,
        *,
        queue: str,
        worker_id: str,
        tap: StreamTap,
        end: Callable[[BaseException], None],
        credit_changed: asyncio.Event,
    ) -> None:
        self._owner = owner
        self._session = session
        self._queue = queue
        self._worker_id = worker_id
        self._tap = tap
        # Ends the stream: storage was found unavailable.
        self._end = end
        # Set when the dispatcher may push again (or learns it never will).
        self._credit_changed = credit_changed
        #: Tasks acked / nacked or rejected on this stream.
        self.succeeded = 0
        self.failed = 0
        # The commands that are neither settlements (`_SETTLEMENTS`, which go
        # to storage in groups) nor decided by the session alone.
        self._handlers: dict[str, Callable[[int, Any], Awaitable[WorkResponse]]] = {
            "credit": self._credit_update,
            "extend_lease": self._extend,
            "progress": self._progress,
            "drain": self._drain,
            "release": self._release_command,
        }

    async def run(self, requests: Sequence[WorkRequest]) -> list[WorkResponse]:
        """The result of each command, in order, each executed as if alone,
        except that consecutive settlements go to storage in one call."""
        session = self._session
        answers: list[WorkResponse] = []
        # (position in answers, command name, body, settlement)
        group: list[tuple[int, str, Any, Settlement]] = []
        for request in requests:
            request_id = request.request_id
            name, body = betterproto2.which_one_of(request, "body")
            settles = name in _SETTLEMENTS
            if group and not settles:
                # Each command sees the effects of the settlements before it.
                await self._settle_together(group, requests, answers)
                group = []
            index = len(answers)
            answers.append(_NOT_RUN)
            refusal = session.admit(
                request_id, name, has_result=getattr(body, "result", None) is not None
            )
            if refusal is not None:
                answers[index] = answer_frame(refusal)
                continue
            if settles:
                try:
                    group.append((index, name, body, _settlement(name, body)))
                except Exception as exc:
                    answers[index] = self._failure(request_id, name, body, exc)
                continue
            answers[index] = await self._command(request_id, name, body)
        if group:
            await self._settle_together(group, requests, answers)
        return answers

    async def _command(self, request_id: int, name: str, body: Any) -> WorkResponse:
        try:
            answer = await self._handlers[name](request_id, body)
        except Exception as exc:
            return self._failure(request_id, name, body, exc)
        self._tap.done(name, body)
        return answer

    async def _settle_together(
        self,
        group: Sequence[tuple[int, str, Any, Settlement]],
        requests: Sequence[WorkRequest],
        answers: list[WorkResponse],
    ) -> None:
        """One storage call for consecutive settlements; each answered as alone."""
        owner = self._owner
        session = self._session
        for _, _, _, item in group:
            session.settling(item.ref.lease_token)
        try:
            outcomes = await owner.ops.settle([item for _, _, _, item in group], owner.clock.now())
        except Exception as exc:
            # The whole group failed (and, by the contract, none of it happened).
            for index, name, body, item in group:
                session.settled(item.ref.lease_token, None)
                answers[index] = self._failure(requests[index].request_id, name, body, exc)
            return
        tap = self._tap
        for (index, name, body, item), outcome in zip(group, outcomes, strict=True):
            request_id = requests[index].request_id
            if not isinstance(outcome, LeaseLost):
                session.settled(item.ref.lease_token, Ending.SETTLED)
                if name == "ack":
                    self.succeeded += 1
                else:
                    self.failed += 1
                tap.done(name, body)
                answers[index] = ok_frame(request_id)
            else:
                answers[index] = self._failure(request_id, name, body, outcome)

    def _failure(self, request_id: int, name: str, body: Any, exc: Exception) -> WorkResponse:
        """The result that answers a command that raised `exc`."""
        if isinstance(exc, v.FieldError):
            path = f"{name}.{exc.path}" if name else exc.path
            return error_frame(
                request_id, ErrorCode.INVALID_ARGUMENT, f"{path}: {exc.reason}", field=path
            )
        if isinstance(exc, LeaseLost):
            self._tap.lost(body)
            ref = getattr(body, "lease", None)
            return answer_frame(
                self._session.lost(
                    request_id,
                    None if ref is None else ref.lease_token,
                    cancelled=exc.cancelled,
                    message=str(exc),
                )
            )
        if isinstance(exc, NotFound):
            return error_frame(request_id, ErrorCode.NOT_FOUND, str(exc) or "not found")
        if isinstance(exc, FailedPrecondition):
            return error_frame(
                request_id, ErrorCode.FAILED_PRECONDITION, str(exc) or "not allowed in this state"
            )
        if isinstance(exc, StorageUnavailable):
            # The command's outcome is unknown and the next one would fail
            # alike: the session answers it and ends the stream.
            answer = self._session.storage_down(request_id, str(exc))
            self._end(exc)
            return answer_frame(answer)
        log.error(
            "Work command %s of worker %r failed unexpectedly",
            name,
            self._worker_id,
            exc_info=exc,
        )
        return error_frame(
            request_id,
            ErrorCode.INTERNAL,
            f"internal error in {name} ({type(exc).__name__}); see the daemon log",
        )

    # -- the commands that neither settle nor are decided by the session alone:
    # each returns its result frame

    async def _release_command(self, request_id: int, body: ReleaseRequest) -> WorkResponse:
        ref = body.lease
        if ref is None:
            raise v.FieldError("lease", "is required")
        v.lease_ref(ref, "lease")
        owner = self._owner
        session = self._session
        session.settling(ref.lease_token)
        try:
            released = await owner.storage.release([ref], owner.clock.now())
        except BaseException:
            session.settled(ref.lease_token, None)
            raise
        if not released:
            raise await self._lost(ref)
        session.settled(ref.lease_token, Ending.SETTLED)
        owner.wakeups.notify(self._queue)
        return ok_frame(request_id)

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

    async def _extend(self, request_id: int, body: ExtendLeaseRequest) -> WorkResponse:
        clock = self._owner.clock
        lease = await self._owner.ops.extend(body, clock.now())
        if self._session.features.has(Feature.LEASE_TTL):
            # Read after storage, as late as the result is built; the worker
            # times its renewals from their send, never by this ttl.
            stamp_ttl(lease, clock.now())
        return WorkResponse(result=WorkResult(request_id=request_id, lease=lease))

    async def _progress(self, request_id: int, body: ReportProgressRequest) -> WorkResponse:
        await self._owner.ops.progress(body, self._owner.clock.now())
        return ok_frame(request_id)

    async def _credit_update(self, request_id: int, body: CreditUpdate) -> WorkResponse:
        session = self._session
        before = session.credit
        answer = session.credit_update(
            request_id,
            available=body.available,
            target=body.target_concurrency,
            grant=body.grant,
        )
        if answer.error is None:
            self._tap.credit(session.credit - before)
            if session.credit:
                self._credit_changed.set()
        return answer_frame(answer)

    async def _drain(self, request_id: int, body: WorkerDrain) -> WorkResponse:
        answer = self._session.drain(request_id, begin=body.begin)
        # A dispatcher waiting for credit learns there will be none.
        self._credit_changed.set()
        return answer_frame(answer)


def _settlement(name: str, body: Any) -> Settlement:
    if name == "ack":
        return v.ack_settlement(body)
    if name == "nack":
        return v.nack_settlement(body)
    return v.reject_settlement(body)

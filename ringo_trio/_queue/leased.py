"""LeasedTask: one attempt of one task, claimed with `TaskQueue.claim` (manual leases).

Its settlement calls (ack, nack, reject), lease extension and progress go
through the connection's retry rules like every call of the queue: they are
mutations, never re-sent after the daemon became unavailable.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import anyio

from .._contract import limits as _limits
from .._errors import InvalidArgumentError
from .._models import Task, check_duration, truncate_utf8
from .._proto.ringo.v1 import (
    AckRequest,
    AckResponse,
    ExtendLeaseRequest,
    ExtendLeaseResponse,
    LeaseRef,
    NackRequest,
    NackResponse,
    RejectRequest,
    RejectResponse,
    ReportProgressRequest,
    ReportProgressResponse,
)
from .._proto.ringo.v1 import LeasedTask as _WireLeasedTask
from .._work._handlers import encode_result, results_stored

if TYPE_CHECKING:
    from .._connection import Connection

__all__ = ["LeasedTask"]


def _error_text(error: object) -> str:
    if not isinstance(error, str):
        raise InvalidArgumentError(f"error must be a string, got {type(error).__name__}")
    return truncate_utf8(error, _limits.MAX_ERROR_BYTES)


class LeasedTask:
    """One attempt of one task, claimed with `TaskQueue.claim`.

    The lease is identified by (task id, attempt, lease token): once it has
    expired or been settled, every operation on it raises `LeaseLostError`
    and changes nothing.

    Its time is kept on this process's monotonic clock (`lease_deadline`),
    never by comparing the daemon's ``until`` with the local wall clock:
    hosts' clocks drift (docs/protocol.md, "Lease time").
    """

    def __init__(
        self,
        connection: Connection,
        wire: _WireLeasedTask,
        *,
        received: float,
        lease_duration: timedelta | None = None,
    ) -> None:
        lease = wire.lease
        if lease is None:
            raise InvalidArgumentError("daemon reply carried a task without a lease")
        self._connection = connection
        self.task = Task.from_wire(wire.task)
        self.attempt: int = lease.attempt
        self.worker_id: str = lease.worker_id
        self._token = lease.lease_token
        self._lease_until = lease.until
        # The ttl counts from the reply's send; below minor 11, the duration
        # asked for (the daemon's default is not known here).
        runs = lease.ttl if lease.ttl is not None else lease_duration
        self._deadline = None if runs is None else received + runs.total_seconds()

    def __repr__(self) -> str:
        return f"<LeasedTask {self.task.id} attempt={self.attempt} until={self._lease_until}>"

    @property
    def lease_until(self) -> datetime | None:
        """When the lease ends unless extended, by the daemon's wall clock:
        for display. To time work against the lease, use `lease_deadline`."""
        return self._lease_until

    @property
    def lease_deadline(self) -> float | None:
        """The `anyio.current_time()` at which the lease ends unless extended,
        on this process's monotonic clock: the reply's arrival plus the
        lease's ttl (protocol minor >= 11; below it, plus the
        ``lease_duration`` the claim asked for). After `extend_lease`: its
        send time plus the extension (the daemon extended from when it
        received it, no earlier). None when unknown (a daemon below minor 11
        and its default lease duration)."""
        return self._deadline

    def _ref(self) -> LeaseRef:
        return LeaseRef(task_id=self.task.id, attempt=self.attempt, lease_token=self._token)

    async def ack(self, result: bytes | str | None = None) -> None:
        """Mark the task SUCCEEDED, storing ``result`` with it (bytes, or a
        str as UTF-8; at most ``MAX_RESULT_BYTES``, `InvalidArgumentError`
        beyond). A daemon below protocol minor 9 cannot store results: the
        task is acked without it (one warning per process)."""
        request = AckRequest(lease=self._ref())
        if result is not None:
            if not isinstance(result, bytes | bytearray | memoryview | str):
                raise InvalidArgumentError(
                    f"result must be bytes or str, got {type(result).__name__}"
                )
            if results_stored(self._connection.protocol_minor):
                request.result = encode_result(result)
        await self._connection.call("Ack", request, AckResponse)

    async def nack(self, error: str = "", *, delay: timedelta | None = None) -> None:
        """Fail this attempt: the task is retried after its backoff (or ``delay``),
        or becomes DEAD if it has no attempts left. ``error`` is kept as
        ``last_error`` (truncated to 256 KiB)."""
        request = NackRequest(lease=self._ref(), error=_error_text(error))
        if delay is not None:
            request.retry_delay_override = check_duration("delay", delay, maximum=_limits.MAX_DELAY)
        await self._connection.call("Nack", request, NackResponse)

    async def reject(self, error: str = "") -> None:
        """Fail the task permanently: it becomes DEAD with no further attempts."""
        await self._connection.call(
            "Reject", RejectRequest(lease=self._ref(), error=_error_text(error)), RejectResponse
        )

    async def extend_lease(self, extension: timedelta) -> None:
        """Make the lease end ``extension`` after now (daemon clock; a reset, not an addition)."""
        extension = check_duration("extension", extension, maximum=_limits.MAX_LEASE, positive=True)
        sent = anyio.current_time()
        reply = await self._connection.call(
            "ExtendLease",
            ExtendLeaseRequest(lease=self._ref(), extension=extension),
            ExtendLeaseResponse,
        )
        # From the send, as the worker's renewals: the daemon extended from
        # its receipt, no earlier, while the reply's ttl would count the
        # reply's own transit in the lease's favour.
        self._deadline = sent + extension.total_seconds()
        if reply.lease is not None:
            self._lease_until = reply.lease.until

    async def report_progress(self, current: float, total: float = 0.0, message: str = "") -> None:
        """Store progress on the task (visible in `Task.progress`)."""
        for what, value in (("current", current), ("total", total)):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidArgumentError(f"{what} must be a number")
        if not isinstance(message, str):
            raise InvalidArgumentError("message must be a string")
        await self._connection.call(
            "ReportProgress",
            ReportProgressRequest(
                lease=self._ref(),
                current=float(current),
                total=float(total),
                message=truncate_utf8(message, _limits.MAX_PROGRESS_MESSAGE_BYTES),
            ),
            ReportProgressResponse,
        )

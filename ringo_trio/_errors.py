"""The exceptions of ringo_trio: one class per condition a caller can act on.

Transport errors are mapped to these at exactly one boundary
(`ringo_trio._transport`); nothing above it sees grpclib or asyncio errors.
The daemon reports unary failures as gRPC status codes and Work-stream
failures as `ErrorDetail.code`; both map through `error_for_code`.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import TYPE_CHECKING

from ._contract.durations import describe_duration
from ._contract.limits import MAX_DELAY
from ._contract.versions import Feature, FeatureMissing, Features

if TYPE_CHECKING:
    from ._models import Task

__all__ = [
    "FailedPreconditionError",
    "IncompatibleVersionError",
    "InvalidArgumentError",
    "LeaseLostError",
    "NotFoundError",
    "PermanentTaskError",
    "ResourceExhaustedError",
    "RetryTaskError",
    "RingoError",
    "TaskCancelledError",
    "TaskFailedError",
    "UnauthenticatedError",
    "UnavailableError",
    "WorkerFencedError",
    "error_for_code",
]


class RingoError(Exception):
    """Base class of every error ringo_trio raises on its own behalf."""


class InvalidArgumentError(RingoError, ValueError):
    """The request was malformed; the daemon changed nothing."""


class NotFoundError(RingoError, LookupError):
    """No task (or queue entry) matches the given id or unique key."""


class FailedPreconditionError(RingoError):
    """The task is not in a state that allows the operation (e.g. retrying a PENDING task)."""


class UnavailableError(RingoError):
    """The daemon could not be reached or the connection dropped.

    A mutation that fails this way may or may not have been applied: the SDK
    never replays it, so the caller decides (unique keys make re-enqueueing safe).
    """


class UnauthenticatedError(RingoError):
    """The daemon refused the bearer token (or the shared-daemon local token)."""


class ResourceExhaustedError(RingoError):
    """The daemon refused a request that would pass one of its documented
    bounds (a waiter too many, a message too large, storage full)."""


class IncompatibleVersionError(RingoError):
    """The negotiated protocol cannot serve the request (major mismatch, a
    feature newer than the server's minor, or a rejected session token)."""


class LeaseLostError(RingoError):
    """The lease named by the request is no longer the task's current lease:
    it expired, was superseded by a newer attempt, or the task finished."""


class WorkerFencedError(RingoError):
    """The worker fenced itself: a handler ignored its cancellation past
    ``TaskTimeouts.cancel_grace``, or the event loop was starved past
    ``no_start``. The worker stopped taking work; `Worker.run` raises this
    once every handler has exited. Only ending the process stops code that
    ignores cancellation, so run workers under ``ringo supervise``."""


class WorkerAlreadyRunError(RingoError, RuntimeError):
    """`Worker.run` was called a second time (a worker runs once)."""


class RetryTaskError(Exception):
    """Raised by a handler to nack its task.

    ``delay`` (a `timedelta`, or seconds as a number, as the asyncio SDK took
    it) overrides the task's backoff for this retry; ``congestion`` tells an
    adaptive concurrency controller to back off.
    """

    def __init__(
        self,
        message: str = "",
        *,
        delay: timedelta | float | None = None,
        congestion: bool = False,
    ) -> None:
        super().__init__(message)
        if delay is not None and not isinstance(delay, timedelta):
            if isinstance(delay, bool) or not isinstance(delay, int | float):
                raise InvalidArgumentError(
                    "RetryTaskError delay must be a timedelta or a number of seconds"
                )
            if not math.isfinite(delay) or delay > MAX_DELAY.total_seconds():
                raise InvalidArgumentError(
                    "RetryTaskError delay must be a finite number of seconds, at most"
                    f" {describe_duration(MAX_DELAY)} (got {delay!r} seconds)"
                )
            delay = timedelta(seconds=delay)
        if delay is not None and delay < timedelta(0):
            raise InvalidArgumentError("RetryTaskError delay must not be negative")
        if delay is not None and delay > MAX_DELAY:
            raise InvalidArgumentError(
                f"RetryTaskError delay must be at most {describe_duration(MAX_DELAY)}"
                f" (got {describe_duration(delay)})"
            )
        self.delay: timedelta | None = delay
        self.congestion = congestion


class PermanentTaskError(Exception):
    """Raised by a handler to reject its task: it becomes DEAD, no more attempts."""


class TaskFailedError(RingoError):
    """The awaited task ended DEAD: ``task`` is its final snapshot and
    ``last_error`` what its last attempt failed with."""

    def __init__(self, task: Task) -> None:
        super().__init__(
            f"task {task.id} ({task.task_type}) is DEAD: {task.last_error or 'no error'}"
        )
        self.task = task
        self.last_error = task.last_error


class TaskCancelledError(RingoError):
    """The awaited task was cancelled by an operator (``task`` is its final snapshot)."""

    def __init__(self, task: Task) -> None:
        super().__init__(f"task {task.id} ({task.task_type}) was cancelled")
        self.task = task


# Keyed by the ErrorCode / gRPC status *name* so that this module imports no
# transport or generated code.
_BY_CODE: dict[str, type[RingoError]] = {
    "INVALID_ARGUMENT": InvalidArgumentError,
    # The daemon's status for a rejected RequestContext (unknown or expired
    # session token, other protocol major): the SDK renegotiates once.
    "OUT_OF_RANGE": IncompatibleVersionError,
    "NOT_FOUND": NotFoundError,
    "FAILED_PRECONDITION": FailedPreconditionError,
    "ALREADY_EXISTS": FailedPreconditionError,
    "LEASE_LOST": LeaseLostError,
    # The daemon's status for a stale LeaseRef on a unary call.
    "ABORTED": LeaseLostError,
    "UNAVAILABLE": UnavailableError,
    "DEADLINE_EXCEEDED": UnavailableError,
    "UNAUTHENTICATED": UnauthenticatedError,
    "PERMISSION_DENIED": UnauthenticatedError,
    "INCOMPATIBLE_VERSION": IncompatibleVersionError,
    "UNIMPLEMENTED": IncompatibleVersionError,
    "RESOURCE_EXHAUSTED": ResourceExhaustedError,
}


def error_for_code(code: str, message: str) -> RingoError:
    """Build the exception for a status or ErrorDetail code name."""
    return _BY_CODE.get(code, RingoError)(message or code.lower().replace("_", " "))


def require(minor: int, feature: Feature, what: str | None = None) -> None:
    """`IncompatibleVersionError` when the negotiated ``minor`` lacks ``feature``
    (the feature table decides; ``what`` names the call in the message)."""
    try:
        Features(minor).require(feature, what)
    except FeatureMissing as exc:
        raise IncompatibleVersionError(str(exc)) from None

"""The unary methods' one error boundary (`service._rpc`): every engine
condition reaches the caller as its status code, with a detail that says
what happened even when the engine gave no text."""

from __future__ import annotations

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from ringo_trio.server.rpc.service import _rpc
from ringo_trio.server.storage.base import FailedPrecondition, LeaseLost, NotFound

pytestmark = pytest.mark.anyio


class _Raising:
    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    @_rpc
    async def get_task(self, message: object) -> None:
        raise self.exc


@pytest.mark.parametrize(
    ("exc", "status", "detail"),
    [
        (NotFound(), Status.NOT_FOUND, "no such task"),
        (NotFound("task 'x' of queue 'q'"), Status.NOT_FOUND, "task 'x' of queue 'q'"),
        (LeaseLost(), Status.ABORTED, "the lease is not the task's current lease"),
        (LeaseLost(cancelled=True), Status.ABORTED, "the lease is gone (reason: cancelled)"),
        (LeaseLost("attempt 2", cancelled=True), Status.ABORTED, "attempt 2 (reason: cancelled)"),
        (FailedPrecondition(), Status.FAILED_PRECONDITION, "not allowed in this state"),
        (RuntimeError("bug"), Status.INTERNAL, "internal error in get_task (RuntimeError)"),
    ],
)
async def test_an_engine_condition_becomes_its_status_with_a_detail(
    exc: Exception, status: Status, detail: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Property: each engine condition is its own status code; its detail is
    the engine's text, or, when the engine gave none, a default that still
    names the condition (never an empty message), and a lease lost to a
    cancel says so in the detail the SDK reads. A bug is INTERNAL, named,
    and logged, never the daemon's end."""
    with pytest.raises(GRPCError) as raised:
        await _Raising(exc).get_task(None)
    assert raised.value.status is status
    assert raised.value.message is not None
    assert raised.value.message.startswith(detail)

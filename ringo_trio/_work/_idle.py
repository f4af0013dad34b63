"""The on_idle monitor: call ``on_idle`` once a worker's queue has been idle a while.

Every ``POLL_SECONDS`` it asks the daemon how many tasks of the worker's
types are active (``GetQueueActivity``; due ones only with
``idle_counts_scheduled=False``); after ``QUIET_SECONDS`` of zeros — with a
registered stream, no handler running and the worker not stopping — it calls
``on_idle`` once. A handler starting, a stream ending or a failed poll
restarts the quiet period. What ``on_idle`` raises ends the worker's ``run``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio

from .._errors import NotFoundError, RingoError
from .._interrupts import protected
from .._proto.ringo.v1 import GetQueueActivityRequest, GetQueueActivityResponse

if TYPE_CHECKING:
    from .._connection import Connection

__all__ = ["POLL_SECONDS", "QUIET_SECONDS", "IdleMonitor"]

#: on_idle cadence (seed semantics): poll every 250 ms, fire after 1 s of zeros.
POLL_SECONDS = 0.25
QUIET_SECONDS = 1.0


class IdleMonitor:
    """One worker's on_idle state: ``armed`` while a registered stream is
    live, ``since`` the start of the current quiet period (None: not quiet).

    ``busy`` says whether the worker runs handlers or stops; ``failed``
    takes what ``on_idle`` raised."""

    def __init__(
        self,
        connection: Connection,
        request: GetQueueActivityRequest,
        callback: Callable[[], Any],
        *,
        busy: Callable[[], bool],
        failed: Callable[[BaseException], None],
    ) -> None:
        self.armed = False
        self.since: float | None = None
        self._connection = connection
        self._request = request
        self._callback = callback
        self._busy = busy
        self._failed = failed

    @protected
    async def run(self, run_scope: anyio.CancelScope) -> None:
        """Poll until ``on_idle`` was called; if it raises, report it and
        cancel ``run_scope`` (the worker's run group)."""
        while True:
            await anyio.sleep(POLL_SECONDS)
            if not self.armed or self._busy():
                self.since = None
                continue
            try:
                reply = await self._connection.call(
                    "GetQueueActivity", self._request, GetQueueActivityResponse, read_only=True
                )
                active = reply.active_task_count
            except NotFoundError:
                active = 0
            except RingoError:
                self.since = None
                continue
            if active or not self.armed or self._busy():
                self.since = None
                continue
            now = anyio.current_time()
            if self.since is None:
                self.since = now
                continue
            if now - self.since < QUIET_SECONDS:
                continue
            try:
                result = self._callback()
                if inspect.isawaitable(result):
                    await result
            except anyio.get_cancelled_exc_class():
                raise
            except BaseException as exc:
                self._failed(exc)
                run_scope.cancel()
            return

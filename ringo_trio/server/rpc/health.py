"""``grpc.health.v1.Health``: the daemon's serving status, for probes and load balancers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from ringo_trio._proto.grpc.health.v1 import (
    HealthBase,
    HealthCheckRequest,
    HealthCheckResponse,
    HealthCheckResponseServingStatus,
)

from .service import QUEUE_SERVICE_NAME

__all__ = ["HealthService"]

_ServingStatus = HealthCheckResponseServingStatus


class HealthService(HealthBase):
    """``grpc.health.v1.Health`` for the overall server ("") and the queue service.

    Starts NOT_SERVING; the daemon flips it to SERVING once it accepts calls
    (`set_serving`). While any *trouble* is present (`set_trouble`: storage
    has no room to write, storage cannot be reached) it is NOT_SERVING, and
    SERVING again once the last one is gone. It turns NOT_SERVING for good
    when the daemon starts draining, which also ends every Watch stream
    after it has delivered NOT_SERVING, so shutdown never waits on a prober.
    """

    SERVICES = frozenset({"", QUEUE_SERVICE_NAME})

    def __init__(self) -> None:
        self._status = _ServingStatus.NOT_SERVING
        self._changed = asyncio.Event()
        self._final = False
        self._started = False
        self._troubles: set[str] = set()

    @property
    def serving(self) -> bool:
        return self._status == _ServingStatus.SERVING

    def set_serving(self) -> None:
        """The daemon accepts calls: SERVING unless a trouble is present."""
        self._started = True
        self._refresh()

    def set_trouble(self, trouble: str, present: bool) -> None:
        """Note that ``trouble`` (a name) is present or gone."""
        if present:
            self._troubles.add(trouble)
        else:
            self._troubles.discard(trouble)
        self._refresh()

    def _refresh(self) -> None:
        if self._final:
            return
        ok = self._started and not self._troubles
        status = _ServingStatus.SERVING if ok else _ServingStatus.NOT_SERVING
        if status != self._status:
            self._set(status)

    def shutdown(self) -> None:
        self._final = True
        self._set(_ServingStatus.NOT_SERVING)

    def _set(self, status: HealthCheckResponseServingStatus) -> None:
        # Always wakes the watchers: an unchanged status costs them one look,
        # and `shutdown` needs them to see `_final` even then.
        self._status = status
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def check(self, message: HealthCheckRequest) -> HealthCheckResponse:
        if message.service not in self.SERVICES:
            raise GRPCError(Status.NOT_FOUND, f"unknown service {message.service!r}")
        return HealthCheckResponse(status=self._status)

    async def watch(self, message: HealthCheckRequest) -> AsyncIterator[HealthCheckResponse]:
        known = message.service in self.SERVICES
        sent: HealthCheckResponseServingStatus | None = None
        while True:
            changed = self._changed
            status = self._status if known else _ServingStatus.SERVICE_UNKNOWN
            if status != sent:
                yield HealthCheckResponse(status=status)
                sent = status
            if self._final:
                return
            await changed.wait()

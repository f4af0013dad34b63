"""TaskQueue's schedule calls (protocol minor >= 13; docs/schedules.md)."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from .._contract import limits as _limits
from .._contract.cron import MAX_EVERY, MIN_EVERY, CronError, parse_cron, zone
from .._contract.durations import describe_duration
from .._contract.versions import Feature
from .._errors import InvalidArgumentError, require
from .._models import Schedule, check_int, check_name
from .._proto.ringo.v1 import (
    DeleteScheduleRequest,
    DeleteScheduleResponse,
    ListSchedulesRequest,
    ListSchedulesResponse,
    PutScheduleRequest,
    PutScheduleResponse,
    SetSchedulePausedRequest,
    SetSchedulePausedResponse,
)
from .._proto.ringo.v1 import MisfirePolicy as WireMisfirePolicy
from .._proto.ringo.v1 import Schedule as WireSchedule

if TYPE_CHECKING:
    from .._connection import Connection

__all__ = ["ScheduleCalls"]


class ScheduleCalls:
    """The schedule methods of `TaskQueue` (which sets these two)."""

    name: str
    _connection: Connection

    async def put_schedule(
        self,
        name: str,
        task_type: str,
        *,
        cron: str | None = None,
        every: timedelta | None = None,
        payload: bytes = b"",
        timezone: str = "UTC",
        misfire: str = "skip",
        catch_up: int = 1,
        paused: bool = False,
        priority: int = 0,
        max_attempts: int | None = None,
    ) -> Schedule:
        """Create or replace the schedule `name` of this queue: each tick of
        ``cron`` (5 fields, or 6 with seconds first, read in ``timezone``, an
        IANA name) or of ``every`` (counted from the schedule's creation)
        enqueues one task of `task_type` with `payload`, exactly once
        whatever the number of daemons (docs/schedules.md). Exactly one of
        ``cron`` and ``every``. ``misfire`` says what becomes of ticks missed
        while no daemon ran: "skip" them, or "catch_up" (at most
        ``catch_up`` of the latest fire). Replacing a schedule with the same
        timing keeps its next tick; a new timing counts from now.
        `InvalidArgumentError` (naming the field; a cron error names the
        position too) before anything is sent; `FailedPreconditionError`
        past the queue's number of schedules. ``max_attempts`` None or 0: the
        daemon's default for each task. Needs protocol minor >= 13."""
        require(self._connection.protocol_minor, Feature.SCHEDULES, "TaskQueue.put_schedule")
        wire = _schedule_wire(
            self.name,
            name,
            task_type,
            cron=cron,
            every=every,
            payload=payload,
            timezone=timezone,
            misfire=misfire,
            catch_up=catch_up,
            paused=paused,
            priority=priority,
            max_attempts=max_attempts,
        )
        reply = await self._connection.call(
            "PutSchedule", PutScheduleRequest(schedule=wire), PutScheduleResponse
        )
        return Schedule.from_wire(reply.schedule)

    async def schedules(self) -> list[Schedule]:
        """This queue's schedules, by name. Needs protocol minor >= 13."""
        require(self._connection.protocol_minor, Feature.SCHEDULES, "TaskQueue.schedules")
        reply = await self._connection.call(
            "ListSchedules",
            ListSchedulesRequest(queue=self.name),
            ListSchedulesResponse,
            read_only=True,
        )
        return [Schedule.from_wire(s) for s in reply.schedules]

    async def delete_schedule(self, name: str) -> bool:
        """Delete the schedule (the tasks it made stay); whether it existed."""
        require(self._connection.protocol_minor, Feature.SCHEDULES, "TaskQueue.delete_schedule")
        reply = await self._connection.call(
            "DeleteSchedule",
            DeleteScheduleRequest(queue=self.name, name=check_name("name", name)),
            DeleteScheduleResponse,
        )
        return reply.deleted

    async def pause_schedule(self, name: str) -> Schedule:
        """Stop the schedule's ticks until `resume_schedule`; `NotFoundError`."""
        return await self._set_schedule_paused(name, True)

    async def resume_schedule(self, name: str) -> Schedule:
        """Tick again, from now: the ticks due while paused never fire."""
        return await self._set_schedule_paused(name, False)

    async def _set_schedule_paused(self, name: str, paused: bool) -> Schedule:
        require(self._connection.protocol_minor, Feature.SCHEDULES, "SetSchedulePaused")
        reply = await self._connection.call(
            "SetSchedulePaused",
            SetSchedulePausedRequest(queue=self.name, name=check_name("name", name), paused=paused),
            SetSchedulePausedResponse,
        )
        return Schedule.from_wire(reply.schedule)


_MISFIRE = {"skip": WireMisfirePolicy.SKIP, "catch_up": WireMisfirePolicy.CATCH_UP}


def _schedule_wire(
    queue: str,
    name: str,
    task_type: str,
    *,
    cron: str | None,
    every: timedelta | None,
    payload: bytes,
    timezone: str,
    misfire: str,
    catch_up: int,
    paused: bool,
    priority: int,
    max_attempts: int | None,
) -> WireSchedule:
    """The schedule as PutSchedule sends it, checked as the daemon will."""
    check_name("name", name)
    check_name("task_type", task_type)
    if (cron is None) == (every is None):
        raise InvalidArgumentError("put_schedule needs exactly one of cron and every")
    if cron is not None:
        if not isinstance(cron, str):
            raise InvalidArgumentError("cron must be a str")
        try:
            parse_cron(cron, zone(timezone))
        except CronError as exc:
            raise InvalidArgumentError(f"cron: {exc}") from None
        except ValueError as exc:
            raise InvalidArgumentError(f"timezone: {exc}") from None
    else:
        if not isinstance(every, timedelta):
            raise InvalidArgumentError("every must be a datetime.timedelta")
        if not MIN_EVERY <= every <= MAX_EVERY:
            raise InvalidArgumentError(
                f"every must be from {describe_duration(MIN_EVERY)} to"
                f" {describe_duration(MAX_EVERY)} (got {describe_duration(every)})"
            )
        try:
            zone(timezone)
        except ValueError as exc:
            raise InvalidArgumentError(f"timezone: {exc}") from None
    if not isinstance(payload, bytes) or len(payload) > _limits.MAX_PAYLOAD_BYTES:
        raise InvalidArgumentError(f"payload must be bytes of at most {_limits.MAX_PAYLOAD_BYTES}")
    if misfire not in _MISFIRE:
        raise InvalidArgumentError('misfire must be "skip" or "catch_up"')
    check_int("catch_up", catch_up, 1, _limits.MAX_CATCH_UP)
    if not isinstance(paused, bool):
        raise InvalidArgumentError("paused must be a bool")
    check_int("priority", priority, -(2**31), 2**31 - 1)
    if max_attempts is not None:
        # 0: the daemon's default, as None (the wire's "unset").
        check_int("max_attempts", max_attempts, 0, _limits.MAX_ATTEMPTS_LIMIT)
    return WireSchedule(
        name=name,
        queue=queue,
        task_type=task_type,
        cron=cron or "",
        every=every,
        payload=payload,
        timezone=timezone,
        misfire=_MISFIRE[misfire],
        catch_up=catch_up,
        paused=paused,
        priority=priority,
        max_attempts=max_attempts or 0,
    )

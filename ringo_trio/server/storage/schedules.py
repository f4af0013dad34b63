"""What both engines do alike for schedules (sans-IO): the timing of a
`Schedule`, what a firing does with a due one (`plan_firing`), and the tick
tasks it enqueues.

Theory of operation
-------------------
A stored schedule has one ``next_fire_at`` (NULL while paused). A *firing*
(`Storage.fire_schedules`) takes the due schedules (``next_fire_at <= now``)
and, for each, in the same transaction as everything below:

1. works out the ticks from ``next_fire_at`` up to ``now`` and which of them
   fire (`plan_firing`, the misfire policy);
2. moves ``next_fire_at`` to the first tick after ``now`` with a
   compare-and-set on the value it read (``... WHERE queue = ? AND name = ?
   AND next_fire_at = <read>``), so of two daemons that read the same row
   only one moves it; the other's transaction changes nothing;
3. enqueues one task per firing tick through the engine's ordinary insert,
   with the unique key ``schedule:<name>:<tick, ISO 8601 UTC>`` (`tick_key`),
   so even a tick enqueued twice by some path the compare-and-set does not
   cover is one task.

A crash anywhere before the commit leaves the row and the tasks as they
were: the next firing (this daemon restarted, or another) sees the same
``next_fire_at`` and fires the same ticks, within the misfire policy as of
its own ``now``.

Misfire: a tick is *on time* when it is at most `limits.SCHEDULE_GRACE`
old at the firing. SKIP fires the latest due tick if on time and counts the
others skipped; CATCH_UP fires the latest ``catch_up`` due ticks, on time
or not, and counts the rest skipped. Ticks are enumerated only as far as
needed: an ``every`` schedule's are counted by arithmetic, a cron
schedule's ticks before the ones that fire are counted up to
`limits.MAX_SKIPPED_COUNTED` per firing (an outage of more ticks than that
counts that many).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from ringo_trio._contract import limits
from ringo_trio._contract.cron import Every, Timing, parse_cron, zone
from ringo_trio._proto.ringo.v1 import MisfirePolicy, Schedule, Task, TaskSpec

from .rows import from_us, opt_from_us, to_us

__all__ = [
    "FiringReport",
    "Plan",
    "plan_firing",
    "tick_key",
    "tick_spec",
    "timing_of",
    "first_fire",
]

_EPSILON = timedelta(microseconds=1)


def timing_of(schedule: Schedule) -> Timing:
    """The schedule's ticks (`ValueError` for an invalid one: the service
    has refused those before they are stored)."""
    if schedule.cron:
        return parse_cron(schedule.cron, zone(schedule.timezone))
    if schedule.every is None or schedule.created_at is None:
        raise ValueError("a schedule needs cron or every (and a creation time)")
    return Every(schedule.every, schedule.created_at)


def first_fire(schedule: Schedule, now: datetime) -> datetime | None:
    """``next_fire_at`` for a schedule put or resumed at `now` (None: paused)."""
    if schedule.paused:
        return None
    return _to_ms(timing_of(schedule).next_fire(now))


def tick_key(name: str, tick: datetime) -> str:
    """The unique key of a schedule's tick task."""
    return f"schedule:{name}:{tick.astimezone(UTC).isoformat(timespec='milliseconds')}"


def tick_spec(schedule: Schedule, tick: datetime) -> TaskSpec:
    return TaskSpec(
        task_type=schedule.task_type,
        payload=schedule.payload,
        unique_key=tick_key(schedule.name, tick),
        max_attempts=schedule.max_attempts,
        priority=schedule.priority,
    )


@dataclass(frozen=True, slots=True)
class Plan:
    """What a firing at `now` does with one due schedule."""

    fire: list[datetime]
    skipped: int
    next_fire_at: datetime


@dataclass(slots=True)
class FiringReport:
    """One `Storage.fire_schedules` call: the tasks it enqueued (created ones
    only), the ticks it skipped per (queue, schedule), and the earliest
    ``next_fire_at`` left (None: no active schedule)."""

    created: list[Task] = field(default_factory=list)
    fired: dict[tuple[str, str], int] = field(default_factory=dict)
    skipped: dict[tuple[str, str], int] = field(default_factory=dict)
    next_due: datetime | None = None
    # Whether the batch limit stopped it (more due schedules are waiting).
    more: bool = False


def _to_ms(moment: datetime) -> datetime:
    # Stored in microseconds; ticks are whole seconds anyway.
    return moment.astimezone(UTC)


def plan_firing(schedule: Schedule, due: datetime, now: datetime) -> Plan:
    """The ticks of `schedule` that fire at `now`, from its ``next_fire_at``
    `due` (<= now), by its misfire policy; the skipped count; the next tick."""
    timing = timing_of(schedule)
    keep = (
        max(1, min(schedule.catch_up, limits.MAX_CATCH_UP))
        if schedule.misfire == MisfirePolicy.CATCH_UP
        else 1
    )
    if isinstance(timing, Every):
        step = timing.interval
        count = (now - due) // step + 1
        latest = [due + step * i for i in range(max(0, count - keep), count)]
        before = count - len(latest)
        next_fire_at = due + step * count
    else:
        latest, before = _latest_cron(timing, due, now, keep)
        next_fire_at = timing.next_fire(now)
    if schedule.misfire != MisfirePolicy.CATCH_UP:
        on_time = [t for t in latest if now - t <= limits.SCHEDULE_GRACE]
        before += len(latest) - len(on_time)
        latest = on_time
    return Plan(fire=latest, skipped=before, next_fire_at=_to_ms(next_fire_at))


def _latest_cron(
    timing: Timing, due: datetime, now: datetime, keep: int
) -> tuple[list[datetime], int]:
    """The latest `keep` ticks in [due, now] and how many came before them
    (counted up to `MAX_SKIPPED_COUNTED`)."""
    window = timedelta(minutes=1)
    while True:
        start = max(due, now - window)
        ticks: list[datetime] = []
        t = due if start == due else timing.next_fire(start - _EPSILON)
        while t <= now:
            ticks.append(t)
            t = timing.next_fire(t)
        if len(ticks) >= keep or start == due:
            break
        window *= 4
    latest = ticks[-keep:]
    before = len(ticks) - len(latest)
    if start > due:
        # Counted one by one, up to the bound.
        t = due
        counted = 0
        while t < start and counted < limits.MAX_SKIPPED_COUNTED:
            counted += 1
            t = timing.next_fire(t)
        before += counted
    return latest, before


# The stored columns, in `schedule_row` / `row_schedule` order (both engines).
SCHEDULE_COLS = (
    "queue, name, task_type, cron, every_us, payload, timezone, misfire, catch_up, paused,"
    " priority, max_attempts, next_fire_at, last_fired_at, last_task_id, fired, skipped,"
    " created_at, updated_at"
)


def schedule_row(s: Schedule) -> tuple[Any, ...]:
    """The INSERT row of `s` (every time field set but the optional ones)."""
    assert s.created_at is not None
    assert s.updated_at is not None
    return (
        s.queue,
        s.name,
        s.task_type,
        s.cron,
        None if s.every is None else to_us_delta(s.every),
        s.payload,
        s.timezone,
        int(s.misfire),
        s.catch_up,
        s.paused,
        s.priority,
        s.max_attempts,
        None if s.next_fire_at is None else to_us(s.next_fire_at),
        None if s.last_fired_at is None else to_us(s.last_fired_at),
        s.last_task_id,
        s.fired,
        s.skipped,
        to_us(s.created_at),
        to_us(s.updated_at),
    )


def row_schedule(row: Sequence[Any]) -> Schedule:
    return Schedule(
        queue=row[0],
        name=row[1],
        task_type=row[2],
        cron=row[3],
        every=None if row[4] is None else timedelta(microseconds=row[4]),
        payload=bytes(row[5]),
        timezone=row[6],
        misfire=MisfirePolicy(row[7]),
        catch_up=row[8],
        paused=bool(row[9]),
        priority=row[10],
        max_attempts=row[11],
        next_fire_at=opt_from_us(row[12]),
        last_fired_at=opt_from_us(row[13]),
        last_task_id=row[14],
        fired=row[15],
        skipped=row[16],
        created_at=from_us(row[17]),
        updated_at=from_us(row[18]),
    )


def to_us_delta(delta: timedelta) -> int:
    return delta // timedelta(microseconds=1)


def replacement(new: Schedule, old: Schedule | None, now: datetime) -> Schedule:
    """What `put_schedule` stores for `new` over `old` (None: created now).
    Counters, the creation time (``every``'s anchor) and, when the timing is
    unchanged and it was not paused, ``next_fire_at`` are kept."""
    now = from_us(to_us(now))
    created_at = old.created_at if old is not None else now
    stored = Schedule(
        name=new.name,
        queue=new.queue,
        task_type=new.task_type,
        cron=new.cron,
        every=new.every,
        payload=new.payload,
        timezone=new.timezone,
        misfire=new.misfire,
        catch_up=new.catch_up,
        paused=new.paused,
        priority=new.priority,
        max_attempts=new.max_attempts,
        last_fired_at=None if old is None else old.last_fired_at,
        last_task_id="" if old is None else old.last_task_id,
        fired=0 if old is None else old.fired,
        skipped=0 if old is None else old.skipped,
        created_at=created_at,
        updated_at=now,
    )
    same_timing = (
        old is not None
        and not old.paused
        and (old.cron, old.every, old.timezone) == (new.cron, new.every, new.timezone)
    )
    if same_timing and not new.paused:
        assert old is not None
        stored.next_fire_at = old.next_fire_at
    else:
        stored.next_fire_at = first_fire(stored, now)
    return stored


def resumed(old: Schedule, paused: bool, now: datetime) -> Schedule:
    """`old` paused, or resumed at `now` (``next_fire_at`` from `now`)."""
    if old.paused == paused:
        return old
    now = from_us(to_us(now))
    stored = dataclasses.replace(old, paused=paused, updated_at=now)
    stored.next_fire_at = first_fire(stored, now)
    return stored

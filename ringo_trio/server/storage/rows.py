"""What every engine shares: the task row's column order, time and state
encodings, and building wire dataclasses from rows.

Both engines store times as integer microseconds since the Unix epoch (UTC)
and select the columns in `COLS` order, so one row decoder serves both and a
Task read back is field for field what the engine returned when it wrote it.

Decoding never fails on a stored time. The service's limits (`MAX_DELAY`,
`MAX_NOT_BEFORE`) keep every time it writes far inside what `datetime` and a
protobuf Timestamp can express, but a row written before those limits
existed, or by hand, may hold any int64 (or, in SQLite, a REAL). Such a value
reads as the nearest representable moment (or duration) instead of raising:
one bad row must not fail every GetTask, claim and long poll that meets it.
A task whose `available_at` or `lease_until` lies beyond `LATEST_US` could
never run again by itself; `stuck` names it, and retry accepts it.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, cast

from ringo_trio._contract.limits import (
    DEFAULT_BACKOFF_INITIAL,
    DEFAULT_BACKOFF_MAX,
    DEFAULT_BACKOFF_MULTIPLIER,
    DEFAULT_MAX_ATTEMPTS,
    MAX_DELAY,
    MAX_LEASE,
    MAX_NOT_BEFORE,
)
from ringo_trio._proto.ringo.v1 import (
    Lease,
    LeasedTask,
    Progress,
    RetryBackoff,
    Task,
    TaskSpec,
    TaskState,
)
from ringo_trio._wire.codec import build
from ringo_trio._wire.rows import EPOCH, MAX_DURATION_US, Push, TaskRow

# The storage's times are the wire's: µs since the epoch, one clamp (re-exported).
from ringo_trio._wire.rows import MICRO as MICRO
from ringo_trio._wire.rows import from_us as from_us

PENDING = int(TaskState.PENDING)
LEASED = int(TaskState.LEASED)
SUCCEEDED = int(TaskState.SUCCEEDED)
DEAD = int(TaskState.DEAD)
CANCELLED = int(TaskState.CANCELLED)
FINISHED = (SUCCEEDED, DEAD, CANCELLED)
STATES = {int(s): s for s in TaskState}

UINT32_MAX = 2**32 - 1
LEASE_EXPIRED = "lease expired"


# The columns both engines select, in `TaskRow` order.
COLS = ", ".join(TaskRow._fields)


def task_row(cells: Iterable[Any]) -> TaskRow:
    """A selected row (`COLS`) as a `TaskRow`: ``TaskRow._make`` without its
    classmethod call, about 60 ns a row less on the claim path."""
    return _new_tuple(TaskRow, cells)


_new_tuple = tuple.__new__
# Positions in COLS that the engines read by name.
C_SEQ, C_ID, C_QUEUE, C_TASK_TYPE, C_ATTEMPT, C_PRIORITY, C_AVAILABLE = (
    TaskRow._fields.index(name)
    for name in ("seq", "id", "queue", "task_type", "attempt", "priority", "available_at")
)
C_WORKER, C_LEASE_UNTIL, C_TOKEN = (
    TaskRow._fields.index(name) for name in ("worker_id", "lease_until", "lease_token")
)


def new_lease_token() -> str:
    """A new lease token, the one way both engines mint them: 32 lowercase
    hex digits, 128 random bits."""
    return secrets.token_hex(16)


def new_lease_tokens(count: int) -> list[str]:
    """`count` tokens as `new_lease_token` mints them, from one draw of the
    system's randomness (a claim mints one per task it may lease)."""
    digits = secrets.token_hex(16 * count)
    return [digits[start : start + 32] for start in range(0, 32 * count, 32)]


def to_us(moment: datetime) -> int:
    if moment.tzinfo is None:
        raise ValueError(f"naive datetime {moment!r}: the storage needs aware (UTC) times")
    return (moment - EPOCH) // MICRO


def cutoff_us(finished_before: datetime | None) -> int:
    """A purge's or bulk retry's cutoff as stored times compare with it:
    unset, later than any time the daemon stores."""
    return 2**63 - 1 if finished_before is None else to_us(finished_before)


LATEST_US = to_us(MAX_NOT_BEFORE + MAX_DELAY + MAX_LEASE)
"""No time written within the limits is later than this."""


def duration_from_us(us: int) -> timedelta:
    if not 0 <= us <= MAX_DURATION_US:
        us = MAX_DURATION_US if us > 0 else 0
    return timedelta(microseconds=us)


def stuck(available_us: int, lease_until_us: int | None) -> bool:
    """Whether a PENDING or LEASED task waits for a moment beyond the limits
    (its row predates them or was written by hand): it would never run again
    by itself, so retry may reset it."""
    return available_us > LATEST_US or (lease_until_us is not None and lease_until_us > LATEST_US)


def opt_from_us(us: int | None) -> datetime | None:
    return None if us is None else from_us(us)


def row_task(row: Sequence[Any]) -> Task:
    # By name: TaskRow is the one statement of the column order (COLS is
    # its fields), so no position is written twice.
    r = task_row(row)
    progress = None
    if r.progress_at is not None:
        # The engines write the four progress columns together.
        progress = Progress(
            current=cast(float, r.progress_current),
            total=cast(float, r.progress_total),
            message=cast(str, r.progress_message),
            updated_at=from_us(r.progress_at),
        )
    return Task(
        id=r.id,
        queue=r.queue,
        task_type=r.task_type,
        payload=r.payload,
        unique_key=r.unique_key,
        state=STATES[r.state],
        attempt=r.attempt,
        max_attempts=r.max_attempts,
        priority=r.priority,
        retry_backoff=RetryBackoff(
            initial=duration_from_us(r.backoff_initial_us),
            maximum=duration_from_us(r.backoff_max_us),
            multiplier=r.backoff_multiplier,
        ),
        created_at=from_us(r.created_at),
        updated_at=from_us(r.updated_at),
        available_at=from_us(r.available_at),
        finished_at=opt_from_us(r.finished_at),
        last_error=r.last_error,
        progress=progress,
        worker_id=r.worker_id,
        lease_until=opt_from_us(r.lease_until),
        result=None if r.result is None else bytes(r.result),
        limit_key=r.limit_key,
    )


def leased(row: Sequence[Any]) -> LeasedTask:
    return LeasedTask(
        task=row_task(row),
        lease=Lease(
            task_id=row[C_ID],
            attempt=row[C_ATTEMPT],
            lease_token=row[C_TOKEN],
            worker_id=row[C_WORKER],
            until=from_us(row[C_LEASE_UNTIL]),
        ),
    )


def reference_push(row: Sequence[Any]) -> Push:
    """The push of a claimed row by the generic codec: what
    `_wire.rows.push_rows` falls back to for a row it does not encode itself."""
    return Push.of(leased(row))


def lease(row: Sequence[Any]) -> Lease:
    """From `_EXTEND`'s RETURNING row."""
    return Lease(
        task_id=row[0],
        attempt=row[1],
        lease_token=row[2],
        worker_id=row[3],
        until=from_us(row[4]),
    )


class NewTasks:
    """The Tasks a batch of specs becomes, with their INSERT rows (built
    together so each returned Task is exactly what a later `get` reads back).

    Per batch, not per task: one read of the random source for every id
    (48 bits of the enqueue time in ms, then 80 random bits); a spec's retry
    policy worked out once per policy object (the service gives every spec
    without one the same object) and one `RetryBackoff` per policy; each Task
    a copy of the batch's template instead of a dataclass ``__init__``. The
    engine's Python share of an ``enqueue_many`` of 1,000 was ~3.4 ms before.
    """

    __slots__ = ("_next", "_now_us", "_policies", "_prefix", "_queue", "_random", "_template")

    def __init__(
        self, queue: str, now: datetime, now_us: int, count: int, prefix: str | None = None
    ) -> None:
        self._queue = queue
        self._now_us = now_us
        self._prefix = (
            f"{max(now_us // 1000, 0) & 0xFFFF_FFFF_FFFF:012x}" if prefix is None else prefix
        )
        self._random = secrets.token_hex(10 * count)
        self._next = 0
        # Policy objects are the specs' own, alive for the whole batch, so
        # their ids are stable keys.
        self._policies: dict[int, tuple[int, int, float, RetryBackoff]] = {}
        self._template = build(
            Task, queue=queue, state=TaskState.PENDING, created_at=now, updated_at=now
        ).__dict__

    def _policy(self, backoff: RetryBackoff | None) -> tuple[int, int, float, RetryBackoff]:
        initial = DEFAULT_BACKOFF_INITIAL
        maximum = DEFAULT_BACKOFF_MAX
        multiplier = DEFAULT_BACKOFF_MULTIPLIER
        if backoff is not None:
            if backoff.initial is not None:
                initial = max(backoff.initial, timedelta(0))
            # Same rule as the service's validator: an unset maximum never caps
            # the backoff below its own initial delay.
            maximum = (
                max(backoff.maximum, timedelta(0))
                if backoff.maximum is not None
                else max(DEFAULT_BACKOFF_MAX, initial)
            )
            if backoff.multiplier:
                multiplier = backoff.multiplier
        initial_us, maximum_us = initial // MICRO, maximum // MICRO
        for known in self._policies.values():
            if known[:3] == (initial_us, maximum_us, multiplier):
                return known
        # Rebuilt from microseconds so the Task equals what the row reads back.
        shared = build(
            RetryBackoff,
            initial=timedelta(microseconds=initial_us),
            maximum=timedelta(microseconds=maximum_us),
            multiplier=float(multiplier),
        )
        return (initial_us, maximum_us, float(multiplier), shared)

    def make(self, spec: TaskSpec) -> tuple[Task, tuple[Any, ...]]:
        """The next task (at most ``count`` of them) and its INSERT row."""
        backoff = spec.retry_backoff
        policy = self._policies.get(id(backoff))
        if policy is None:
            policy = self._policies[id(backoff)] = self._policy(backoff)
        max_attempts = spec.max_attempts or DEFAULT_MAX_ATTEMPTS
        now_us = self._now_us
        # A task cannot become available before it exists; when both delay and
        # not_before are given the later moment wins.
        available_us = now_us
        if spec.delay is not None:
            available_us = max(available_us, now_us + spec.delay // MICRO)
        if spec.not_before is not None:
            available_us = max(available_us, to_us(spec.not_before))
        start = self._next
        self._next = stop = start + 20
        if stop > len(self._random):
            raise IndexError("NewTasks: more tasks than its count")
        task_id = self._prefix + self._random[start:stop]
        values = self._template.copy()
        values["id"] = task_id
        values["task_type"] = spec.task_type
        values["payload"] = spec.payload
        values["unique_key"] = spec.unique_key
        values["max_attempts"] = max_attempts
        values["priority"] = spec.priority
        values["limit_key"] = spec.limit_key
        values["retry_backoff"] = policy[3]
        values["available_at"] = (
            values["created_at"] if available_us == now_us else from_us(available_us)
        )
        task: Task = _new(Task)
        _setattr(task, "__dict__", values)
        row = (
            task_id,
            self._queue,
            spec.task_type,
            spec.payload,
            spec.unique_key,
            PENDING,
            max_attempts,
            max_attempts,
            spec.priority,
            policy[0],
            policy[1],
            policy[2],
            now_us,
            now_us,
            available_us,
            spec.limit_key,
        )
        return task, row


_new = object.__new__
_setattr = object.__setattr__


def cancelled_text(reason: str) -> str:
    """A cancelled task's last_error."""
    return f"cancelled: {reason}" if reason else "cancelled"


def one_lookup(task_id: str | None, unique_key: str | None) -> None:
    """A lookup names exactly one of task_id / unique_key (the service
    refuses any other before it gets here)."""
    if (task_id is None) == (unique_key is None):
        raise ValueError("exactly one of task_id / unique_key")


def describe(queue: str, task_id: str | None, unique_key: str | None) -> str:
    if task_id is not None:
        return f"task {task_id!r} in queue {queue!r}"
    return f"task with unique key {unique_key!r} in queue {queue!r}"


def finished_states(states: Sequence[int]) -> list[int]:
    """`states` without repeats, for `delete_finished`; ValueError for one
    that is not finished (the service refuses those before they get here)."""
    wanted = list(dict.fromkeys(states))
    if not set(wanted) <= set(FINISHED):
        raise ValueError(f"only finished states can be deleted, got {wanted}")
    return wanted

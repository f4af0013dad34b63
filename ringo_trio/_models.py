"""Public value types and their wire conversion.

Every type here is a frozen dataclass: what the SDK hands out is a snapshot of
the daemon's state at one moment, never a live view. Validation mirrors the
daemon's (`ringo_trio._limits`) so that a malformed spec fails before any
network activity with an `InvalidArgumentError` naming the field; the daemon
stays the authority. Conversion lives next to the types (`to_wire` /
`from_wire`) so the rest of the SDK never builds wire messages field by field.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from ._contract import limits as _limits
from ._contract.durations import describe_duration
from ._errors import InvalidArgumentError
from ._proto.ringo.v1 import AttemptOutcome as _WireAttemptOutcome
from ._proto.ringo.v1 import EnqueueResult as _WireEnqueueResult
from ._proto.ringo.v1 import MisfirePolicy as _WireMisfirePolicy
from ._proto.ringo.v1 import Progress as _WireProgress
from ._proto.ringo.v1 import QueueStats as _WireQueueStats
from ._proto.ringo.v1 import RetryBackoff as _WireRetryBackoff
from ._proto.ringo.v1 import Schedule as _WireSchedule
from ._proto.ringo.v1 import Task as _WireTask
from ._proto.ringo.v1 import TaskAttempt as _WireTaskAttempt
from ._proto.ringo.v1 import TaskSpec as _WireTaskSpec
from ._proto.ringo.v1 import TaskState as _WireTaskState
from ._proto.ringo.v1 import TaskTypeStats as _WireTaskTypeStats

__all__ = [
    "BatchResult",
    "Schedule",
    "EnqueueResult",
    "PostgresStorage",
    "Progress",
    "QueueStats",
    "RetryBackoff",
    "SQLiteStorage",
    "Task",
    "TaskSpec",
    "TaskState",
    "TaskTypeStats",
]

_INT32_MIN = -(2**31)
_INT32_MAX = 2**31 - 1


def check_name(what: str, value: object, limit: int = _limits.MAX_NAME_BYTES) -> str:
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{what} must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidArgumentError(f"{what} is required")
    if len(value.encode("utf-8")) > limit:
        raise InvalidArgumentError(f"{what} is longer than {limit} UTF-8 bytes")
    return value


def check_int(what: str, value: object, low: int, high: int) -> int:
    # bool is an int subclass; True as "max_attempts" is a bug, not a 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{what} must be an integer, got {type(value).__name__}")
    if not low <= value <= high:
        raise InvalidArgumentError(f"{what} must be between {low} and {high}, got {value}")
    return value


def check_duration(
    what: str, value: object, *, maximum: timedelta | None = None, positive: bool = False
) -> timedelta:
    if not isinstance(value, timedelta):
        raise InvalidArgumentError(f"{what} must be a datetime.timedelta")
    if positive and value <= timedelta(0):
        raise InvalidArgumentError(f"{what} must be positive")
    if value < timedelta(0):
        raise InvalidArgumentError(f"{what} must not be negative")
    if maximum is not None and value > maximum:
        raise InvalidArgumentError(
            f"{what} must be at most {describe_duration(maximum)} (got {describe_duration(value)})"
        )
    return value


def check_unique_key(value: object) -> str:
    return check_name("unique_key", value, _limits.MAX_UNIQUE_KEY_BYTES)


def truncate_utf8(text: str, limit: int) -> str:
    """Cut ``text`` to at most ``limit`` UTF-8 bytes without splitting a character."""
    encoded = text.encode("utf-8")
    if len(encoded) <= limit:
        return text
    # errors="ignore" drops the partial trailing sequence the byte cut produced.
    return encoded[:limit].decode("utf-8", errors="ignore")


class TaskState(enum.Enum):
    """Where a task is in its lifecycle (see DESIGN §3)."""

    UNSPECIFIED = "unspecified"
    """A state this SDK does not know (a newer daemon)."""
    PENDING = "pending"
    """Waiting for ``available_at``; a future ``available_at`` means scheduled."""
    LEASED = "leased"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"
    """Cancelled by `TaskQueue.cancel` (terminal; `retry` brings it back)."""

    @classmethod
    def from_wire(cls, value: int) -> TaskState:
        try:
            return cls[_WireTaskState(value).name]
        except (ValueError, KeyError):
            return cls.UNSPECIFIED

    @property
    def is_terminal(self) -> bool:
        return self in (TaskState.SUCCEEDED, TaskState.DEAD, TaskState.CANCELLED)

    def to_wire(self) -> _WireTaskState:
        if self is TaskState.UNSPECIFIED:
            raise InvalidArgumentError("state: UNSPECIFIED is not a state a task can be in")
        return _WireTaskState[self.name]


@dataclass(frozen=True, slots=True)
class RetryBackoff:
    """Delay before retry *n* is ``initial * multiplier**(n-1)``, capped at ``maximum``."""

    initial: timedelta = _limits.DEFAULT_BACKOFF_INITIAL
    maximum: timedelta = _limits.DEFAULT_BACKOFF_MAX
    multiplier: float = _limits.DEFAULT_BACKOFF_MULTIPLIER

    def __post_init__(self) -> None:
        check_duration("retry_backoff.initial", self.initial, maximum=_limits.MAX_DELAY)
        check_duration("retry_backoff.maximum", self.maximum, maximum=_limits.MAX_DELAY)
        if self.maximum < self.initial:
            raise InvalidArgumentError("retry_backoff.maximum must be >= initial")
        if (
            isinstance(self.multiplier, bool)
            or not isinstance(self.multiplier, int | float)
            or not 1.0 <= self.multiplier <= 1000.0
        ):
            raise InvalidArgumentError("retry_backoff.multiplier must be between 1 and 1000")

    def to_wire(self) -> _WireRetryBackoff:
        return _WireRetryBackoff(
            initial=self.initial, maximum=self.maximum, multiplier=float(self.multiplier)
        )

    @classmethod
    def from_wire(cls, wire: _WireRetryBackoff | None) -> RetryBackoff | None:
        if wire is None:
            return None
        # Built without validation: the daemon's values are facts, not input.
        value = object.__new__(cls)
        object.__setattr__(value, "initial", wire.initial or timedelta(0))
        object.__setattr__(value, "maximum", wire.maximum or timedelta(0))
        object.__setattr__(value, "multiplier", wire.multiplier)
        return value


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """What to enqueue.

    ``payload`` is bytes (a ``str`` is stored as its UTF-8 encoding).
    ``unique_key`` dedupes within the queue: enqueueing an existing key
    returns the existing task with ``created=False``. ``max_attempts`` and
    ``retry_backoff`` default to the daemon's policy (5 attempts);
    ``max_attempts=0`` says the same as None, as on the wire (it reads back
    as None), and a negative number is refused. ``delay`` and
    ``not_before`` (timezone-aware) schedule the first attempt; give at most
    one. Higher ``priority`` runs first. ``limit_key`` names the key the
    queue's limit rules apply to (docs/limits.md; protocol minor >= 13).
    """

    task_type: str
    payload: bytes = b""
    unique_key: str | None = None
    max_attempts: int | None = None
    retry_backoff: RetryBackoff | None = None
    delay: timedelta | None = None
    not_before: datetime | None = None
    priority: int = 0
    limit_key: str | None = None

    def __post_init__(self) -> None:
        check_name("task_type", self.task_type)
        payload: object = self.payload
        if isinstance(payload, str):
            payload = payload.encode("utf-8")
        elif isinstance(payload, bytearray | memoryview):
            payload = bytes(payload)
        if not isinstance(payload, bytes):
            raise InvalidArgumentError(
                f"payload must be bytes or str, got {type(self.payload).__name__}"
            )
        if len(payload) > _limits.MAX_PAYLOAD_BYTES:
            raise InvalidArgumentError(
                f"payload is {len(payload)} bytes; the limit is {_limits.MAX_PAYLOAD_BYTES}"
            )
        object.__setattr__(self, "payload", payload)
        if self.unique_key is not None:
            check_unique_key(self.unique_key)
        # 0 is what the wire sends for "unset": the daemon's default, as None;
        # one spelling of it, so that equal specs compare equal.
        if (
            self.max_attempts is not None
            and check_int("max_attempts", self.max_attempts, 0, _limits.MAX_ATTEMPTS_LIMIT) == 0
        ):
            object.__setattr__(self, "max_attempts", None)
        if self.retry_backoff is not None and not isinstance(self.retry_backoff, RetryBackoff):
            raise InvalidArgumentError("retry_backoff must be a RetryBackoff")
        if self.delay is not None:
            check_duration("delay", self.delay, maximum=_limits.MAX_DELAY)
        if self.not_before is not None:
            if not isinstance(self.not_before, datetime):
                raise InvalidArgumentError("not_before must be a datetime")
            if self.not_before.tzinfo is None or self.not_before.utcoffset() is None:
                raise InvalidArgumentError("not_before must be timezone-aware")
            if self.delay is not None:
                raise InvalidArgumentError("give at most one of delay and not_before")
            if self.not_before > _limits.MAX_NOT_BEFORE:
                raise InvalidArgumentError(
                    f"not_before must be at most {_limits.MAX_NOT_BEFORE.isoformat()}"
                )
        check_int("priority", self.priority, _INT32_MIN, _INT32_MAX)
        if self.limit_key is not None:
            check_name("limit_key", self.limit_key, _limits.MAX_LIMIT_KEY_BYTES)

    def to_wire(self) -> _WireTaskSpec:
        return _WireTaskSpec(
            task_type=self.task_type,
            payload=self.payload,
            unique_key=self.unique_key or "",
            max_attempts=self.max_attempts or 0,
            retry_backoff=self.retry_backoff.to_wire() if self.retry_backoff else None,
            delay=self.delay,
            not_before=self.not_before,
            priority=self.priority,
            limit_key=self.limit_key or "",
        )


@dataclass(frozen=True, slots=True)
class Progress:
    """The last progress a handler reported for a task."""

    current: float
    total: float
    message: str = ""
    updated_at: datetime | None = None

    @classmethod
    def from_wire(cls, wire: _WireProgress | None) -> Progress | None:
        if wire is None:
            return None
        return cls(
            current=wire.current,
            total=wire.total,
            message=wire.message,
            updated_at=wire.updated_at,
        )


class AttemptOutcome(enum.Enum):
    """How one attempt of a task ended (`TaskAttempt.outcome`)."""

    RUNNING = "running"
    """Not ended: the task's current lease."""
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    """The handler failed (nack): retried, or DEAD on the last attempt."""
    REJECTED = "rejected"
    """The handler refused the task (reject): DEAD at once."""
    EXPIRED = "expired"
    """The lease ran out: the worker died, hung or lost its connection."""
    CANCELLED = "cancelled"
    """The task was cancelled while this attempt ran."""
    RELEASED = "released"
    """Handed back by a stopping worker: not counted, so the next attempt
    carries the same number."""

    @classmethod
    def from_wire(cls, value: int) -> AttemptOutcome:
        # An outcome this SDK does not know (a newer daemon) reads as ended
        # without a word on how: FAILED is the safe reading for an operator.
        return _OUTCOMES.get(int(value), cls.FAILED)


_OUTCOMES = {
    int(_WireAttemptOutcome.UNSPECIFIED): AttemptOutcome.RUNNING,
    **{int(w): AttemptOutcome[w.name] for w in _WireAttemptOutcome if w.name != "UNSPECIFIED"},
}


@dataclass(frozen=True, slots=True)
class TaskAttempt:
    """One attempt of a task (`Task.history`, protocol minor >= 14)."""

    attempt: int
    worker_id: str
    started_at: datetime | None
    """The daemon's clock when the lease was granted."""
    ended_at: datetime | None
    """None while the attempt runs."""
    outcome: AttemptOutcome
    error: str | None = None
    """The nack's or reject's error, the expiry or the cancel reason (at
    most 512 characters; the task's `last_error` keeps the whole last one)."""

    @classmethod
    def from_wire(cls, wire: _WireTaskAttempt) -> TaskAttempt:
        return cls(
            attempt=wire.attempt,
            worker_id=wire.worker_id,
            started_at=wire.started_at,
            ended_at=wire.ended_at,
            outcome=AttemptOutcome.from_wire(wire.outcome),
            error=wire.error or None,
        )


@dataclass(frozen=True, slots=True)
class Task:
    """A snapshot of one task as the daemon stored it."""

    id: str
    queue: str
    task_type: str
    payload: bytes
    state: TaskState
    attempt: int
    """Attempts started so far (every lease bumps it)."""
    max_attempts: int
    priority: int = 0
    unique_key: str | None = None
    retry_backoff: RetryBackoff | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    available_at: datetime | None = None
    finished_at: datetime | None = None
    last_error: str | None = None
    progress: Progress | None = None
    worker_id: str | None = None
    """Set while LEASED."""
    lease_until: datetime | None = None
    """Set while LEASED."""
    result: bytes | None = None
    """What the successful attempt's handler returned (a str is stored as
    its UTF-8 bytes); set only while SUCCEEDED, and never on listed tasks."""
    limit_key: str | None = None
    """`TaskSpec.limit_key` (protocol minor >= 13)."""
    history: tuple[TaskAttempt, ...] = ()
    """Every attempt, oldest first, the running one last (the newest 20):
    filled by `TaskQueue.get_by_id`, `get_by_unique_key` and `wait` against a
    daemon at protocol minor >= 14; empty on listed and pushed tasks."""

    @classmethod
    def from_wire(cls, wire: _WireTask | None) -> Task:
        if wire is None:
            # The daemon always sets it; an empty reply is a protocol bug.
            raise InvalidArgumentError("daemon reply carried no task")
        return cls(
            id=wire.id,
            queue=wire.queue,
            task_type=wire.task_type,
            payload=wire.payload,
            state=TaskState.from_wire(wire.state),
            attempt=wire.attempt,
            max_attempts=wire.max_attempts,
            priority=wire.priority,
            unique_key=wire.unique_key or None,
            retry_backoff=RetryBackoff.from_wire(wire.retry_backoff),
            created_at=wire.created_at,
            updated_at=wire.updated_at,
            available_at=wire.available_at,
            finished_at=wire.finished_at,
            last_error=wire.last_error or None,
            progress=Progress.from_wire(wire.progress),
            worker_id=wire.worker_id or None,
            lease_until=wire.lease_until,
            result=wire.result,
            limit_key=wire.limit_key or None,
            history=tuple(TaskAttempt.from_wire(a) for a in wire.history),
        )


@dataclass(frozen=True, slots=True)
class TaskTypeStats:
    """One task type's share of `QueueStats`."""

    task_type: str
    pending: int = 0
    leased: int = 0
    succeeded: int = 0
    dead: int = 0
    cancelled: int = 0

    @classmethod
    def from_wire(cls, wire: _WireTaskTypeStats) -> TaskTypeStats:
        return cls(
            task_type=wire.task_type,
            pending=wire.pending,
            leased=wire.leased,
            succeeded=wire.succeeded,
            dead=wire.dead,
            cancelled=wire.cancelled,
        )


@dataclass(frozen=True, slots=True)
class QueueStats:
    """Counts of one queue's tasks by state, as the daemon read them at `as_of`."""

    queue: str
    pending: int = 0
    """Every PENDING task, scheduled ones included."""
    leased: int = 0
    succeeded: int = 0
    dead: int = 0
    cancelled: int = 0
    oldest_pending_at: datetime | None = None
    """available_at of the oldest PENDING task that is due; None when none is."""
    as_of: datetime | None = None
    by_type: tuple[TaskTypeStats, ...] = ()
    """`TaskQueue.stats` only (`RingoClient.queues` leaves it empty); at most
    10,000 task types, the first by name (the counts above cover every type)."""
    paused: bool = False
    """`TaskQueue.pause`d: nothing is pushed or claimed (always False from a
    daemon below protocol minor 13)."""

    @classmethod
    def from_wire(cls, wire: _WireQueueStats | None) -> QueueStats:
        if wire is None:
            # The daemon always sets it; an empty reply is a protocol bug.
            raise InvalidArgumentError("daemon reply carried no queue stats")
        return cls(
            queue=wire.queue,
            pending=wire.pending,
            leased=wire.leased,
            succeeded=wire.succeeded,
            dead=wire.dead,
            cancelled=wire.cancelled,
            oldest_pending_at=wire.oldest_pending_at,
            as_of=wire.as_of,
            by_type=tuple(TaskTypeStats.from_wire(t) for t in wire.by_type),
            paused=wire.paused,
        )

    @property
    def oldest_pending_age(self) -> timedelta | None:
        """How long the oldest due PENDING task has waited, at `as_of`."""
        if self.oldest_pending_at is None or self.as_of is None:
            return None
        return max(self.as_of - self.oldest_pending_at, timedelta(0))


@dataclass(frozen=True, slots=True)
class Schedule:
    """A schedule stored in the daemon (docs/schedules.md): each tick of
    `cron` (in `timezone`) or of `every` enqueues one task of `task_type`
    with `payload`, however many daemons and workers there are."""

    name: str
    queue: str
    task_type: str
    cron: str | None = None
    every: timedelta | None = None
    payload: bytes = b""
    timezone: str = "UTC"
    misfire: str = "skip"
    """"skip" or "catch_up" (docs/schedules.md, Misfire)."""
    catch_up: int = 1
    paused: bool = False
    priority: int = 0
    max_attempts: int | None = None
    next_fire_at: datetime | None = None
    """None while paused."""
    last_fired_at: datetime | None = None
    last_task_id: str | None = None
    fired: int = 0
    """Ticks that became tasks."""
    skipped: int = 0
    """Ticks missed by the misfire policy."""
    created_at: datetime | None = None
    updated_at: datetime | None = None

    @classmethod
    def from_wire(cls, wire: _WireSchedule | None) -> Schedule:
        if wire is None:
            raise InvalidArgumentError("daemon reply carried no schedule")
        return cls(
            name=wire.name,
            queue=wire.queue,
            task_type=wire.task_type,
            cron=wire.cron or None,
            every=wire.every,
            payload=wire.payload,
            timezone=wire.timezone or "UTC",
            misfire="catch_up" if wire.misfire == _WireMisfirePolicy.CATCH_UP else "skip",
            catch_up=wire.catch_up,
            paused=wire.paused,
            priority=wire.priority,
            max_attempts=wire.max_attempts or None,
            next_fire_at=wire.next_fire_at,
            last_fired_at=wire.last_fired_at,
            last_task_id=wire.last_task_id or None,
            fired=wire.fired,
            skipped=wire.skipped,
            created_at=wire.created_at,
            updated_at=wire.updated_at,
        )


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    """``created`` is False when the unique key existed; ``task`` is then the
    existing task — from `TaskQueue.enqueue_many`, without its payload and
    result, ``last_error`` and progress message cut to 1,024 bytes
    (`TaskQueue.get_by_id` reads it whole)."""

    task: Task
    created: bool

    @classmethod
    def from_wire(cls, wire: _WireEnqueueResult | None) -> EnqueueResult:
        if wire is None:
            raise InvalidArgumentError("daemon reply carried no enqueue result")
        return cls(task=Task.from_wire(wire.task), created=wire.created)


@dataclass(frozen=True, slots=True)
class BatchResult:
    """Per-spec results of `TaskQueue.enqueue_many`, in submission order."""

    results: tuple[EnqueueResult, ...]
    created_count: int
    duplicate_count: int

    def __len__(self) -> int:
        return len(self.results)


@dataclass(frozen=True, slots=True)
class SQLiteStorage:
    """The embedded default: a SQLite database (WAL) inside the local data dir."""


@dataclass(frozen=True, slots=True)
class PostgresStorage:
    """A user-managed PostgreSQL database, given by a libpq DSN or URL.

    ``schema`` names the PostgreSQL schema holding the daemon's tables
    (created if missing), so several independent Ringo deployments can
    share one database.
    """

    # repr=False: a DSN usually carries a password and reprs end up in logs.
    dsn: str = field(repr=False)
    schema: str = "public"

    def __post_init__(self) -> None:
        if not isinstance(self.dsn, str) or not self.dsn.strip():
            raise InvalidArgumentError("PostgresStorage needs a non-empty dsn")
        # PostgreSQL truncates identifiers beyond 63 bytes.
        check_name("PostgresStorage.schema", self.schema, 63)


@dataclass(frozen=True, slots=True)
class LimitRule:
    """A limit rule of a queue (docs/limits.md): it applies separately to
    every ``limit_key`` starting with ``prefix`` (the longest matching
    prefix wins). ``rate`` starts per ``per`` with bursts of ``burst``
    (None: no rate limit); ``concurrency`` leased tasks at once (None: no
    concurrency limit)."""

    prefix: str
    rate: float | None = None
    per: timedelta = timedelta(seconds=1)
    burst: int = 1
    concurrency: int | None = None

    @classmethod
    def from_wire(cls, wire: Any) -> LimitRule:
        return cls(
            prefix=wire.prefix,
            rate=wire.rate or None,
            per=wire.per or timedelta(seconds=1),
            burst=wire.burst or 1,
            concurrency=wire.concurrency or None,
        )


@dataclass(frozen=True, slots=True)
class LimitKeyState:
    """One key of a rule: its due waiting and its leased tasks, and when
    its rate lets it start the next one (None: now)."""

    key: str
    waiting: int
    leased: int
    next_start_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class LimitStatus:
    """A rule of a queue and, when asked for, its keys with tasks waiting
    or leased (the most waiting first)."""

    queue: str
    rule: LimitRule
    keys: tuple[LimitKeyState, ...] = ()

    @classmethod
    def from_wire(cls, wire: Any) -> LimitStatus:
        return cls(
            queue=wire.queue,
            rule=LimitRule.from_wire(wire.rule),
            keys=tuple(
                LimitKeyState(k.key, k.waiting, k.leased, k.next_start_at) for k in wire.keys
            ),
        )

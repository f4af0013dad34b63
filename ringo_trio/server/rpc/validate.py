"""Request validation of the daemon: pure functions, no I/O, no clock reads.

Every check raises `FieldError` naming the offending field by its path in the
request (``tasks[3].payload``), so a refused request tells the caller exactly
what to fix. The service maps `FieldError` to ``INVALID_ARGUMENT`` and calls
these before it touches storage: a refused request changes nothing.

Validators also *normalize*: defaults the protocol leaves to the daemon
(``max_attempts = 0``, an unset backoff, an unset lease duration) are filled
in here, and a relative ``delay`` becomes an absolute ``not_before``, so the
storage engines never see an ambiguous spec.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from ringo_trio._contract import cron, limits
from ringo_trio._contract.durations import describe_duration
from ringo_trio._proto.ringo.v1 import (
    AckRequest,
    ClaimRequest,
    LeaseRef,
    LimitRule,
    ListOrder,
    MisfirePolicy,
    NackRequest,
    RejectRequest,
    RetryBackoff,
    Schedule,
    TaskSpec,
    TaskState,
)

from ..storage.base import Ack, Nack, Reject
from ..storage.limits import Rule

__all__ = [
    "ClaimArgs",
    "ack_settlement",
    "nack_settlement",
    "reject_settlement",
    "FieldError",
    "batch_limit",
    "claim_args",
    "duration",
    "error_text",
    "finished_states",
    "key_prefix",
    "list_order",
    "lease_ref",
    "lookup",
    "name",
    "page_size",
    "progress_values",
    "result_value",
    "task_spec",
    "task_specs",
    "task_states",
    "task_types",
]

_ZERO = timedelta(0)


class FieldError(ValueError):
    """One invalid field; ``str()`` is ``"<path>: <reason>"``."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def _utf8_len(value: str) -> int:
    # Limits are in bytes on the wire; ASCII (the common case) skips the encode.
    return len(value) if value.isascii() else len(value.encode("utf-8"))


def _bounded_text(value: str, path: str, limit: int) -> None:
    size = _utf8_len(value)
    if size > limit:
        raise FieldError(path, f"{size} bytes exceeds the {limit}-byte limit")
    # PostgreSQL text cannot hold NUL; refused on every engine alike so a
    # request means the same whichever storage serves it.
    if "\x00" in value:
        raise FieldError(path, "must not contain a NUL character")


def name(value: str, path: str, limit: int = limits.MAX_NAME_BYTES) -> str:
    """A required identifier: queue, task type, worker id."""
    if not value:
        raise FieldError(path, "must not be empty")
    _bounded_text(value, path, limit)
    return value


def task_types(values: Sequence[str], path: str = "task_types") -> list[str]:
    """A task-type filter: empty means every type; each entry is a name."""
    if len(values) > limits.MAX_TASK_TYPES:
        raise FieldError(
            path, f"{len(values)} entries exceeds the limit of {limits.MAX_TASK_TYPES}"
        )
    for index, value in enumerate(values):
        name(value, f"{path}[{index}]")
    # Duplicates are harmless for the filter; dropping them keeps storage
    # queries small and deterministic.
    return list(dict.fromkeys(values))


def duration(
    value: timedelta | None,
    path: str,
    *,
    positive: bool = False,
    maximum: timedelta | None = None,
) -> timedelta | None:
    """None passes through (unset); otherwise non-negative (or > 0) and bounded."""
    if value is None:
        return None
    if positive and value <= _ZERO:
        raise FieldError(path, "must be positive")
    if value < _ZERO:
        raise FieldError(path, "must not be negative")
    if maximum is not None and value > maximum:
        raise FieldError(path, f"{_fmt(value)} exceeds the maximum of {_fmt(maximum)}")
    return value


def wait_timeout(value: timedelta | None, path: str = "timeout") -> float:
    """WaitTask's timeout in seconds: unset is 0 (answer at once); longer
    than `limits.MAX_TASK_WAIT` is clamped to it (a caller asks again)."""
    checked = duration(value, path)
    if checked is None:
        return 0.0
    return min(checked, limits.MAX_TASK_WAIT).total_seconds()


def _fmt(value: timedelta) -> str:
    # In words (``365 days``), as the SDK says it: 31536000s had to be divided out.
    return describe_duration(value)


# One object for every spec without a policy: validated specs only go to the
# storage engine, which reads them.
_DEFAULT_BACKOFF = RetryBackoff(
    initial=limits.DEFAULT_BACKOFF_INITIAL,
    maximum=limits.DEFAULT_BACKOFF_MAX,
    multiplier=limits.DEFAULT_BACKOFF_MULTIPLIER,
)


def _backoff(backoff: RetryBackoff | None, path: str) -> RetryBackoff:
    if backoff is None:
        return _DEFAULT_BACKOFF
    initial = duration(backoff.initial, f"{path}.initial", maximum=limits.MAX_DELAY)
    maximum = duration(backoff.maximum, f"{path}.maximum", maximum=limits.MAX_DELAY)
    multiplier = backoff.multiplier
    if math.isnan(multiplier) or math.isinf(multiplier):
        raise FieldError(f"{path}.multiplier", "must be a finite number")
    if multiplier == 0:
        # proto3 cannot tell "unset" from 0; 0 would stop backoff growth
        # silently, so it means the default.
        multiplier = limits.DEFAULT_BACKOFF_MULTIPLIER
    elif multiplier < 1:
        raise FieldError(f"{path}.multiplier", f"{multiplier:g} is below 1")
    if initial is None:
        initial = limits.DEFAULT_BACKOFF_INITIAL
    if maximum is None:
        maximum = max(limits.DEFAULT_BACKOFF_MAX, initial)
    elif maximum < initial:
        raise FieldError(f"{path}.maximum", "must not be less than initial")
    return RetryBackoff(initial=initial, maximum=maximum, multiplier=multiplier)


def task_spec(spec: TaskSpec | None, path: str, now: datetime) -> TaskSpec:
    """Validate one spec and return a normalized copy (the request is not mutated)."""
    if spec is None:
        raise FieldError(path, "is required")
    name(spec.task_type, f"{path}.task_type")
    if len(spec.payload) > limits.MAX_PAYLOAD_BYTES:
        raise FieldError(
            f"{path}.payload",
            f"{len(spec.payload)} bytes exceeds the {limits.MAX_PAYLOAD_BYTES}-byte limit",
        )
    _bounded_text(spec.unique_key, f"{path}.unique_key", limits.MAX_UNIQUE_KEY_BYTES)
    _bounded_text(spec.limit_key, f"{path}.limit_key", limits.MAX_LIMIT_KEY_BYTES)
    if spec.max_attempts > limits.MAX_ATTEMPTS_LIMIT:
        raise FieldError(
            f"{path}.max_attempts",
            f"{spec.max_attempts} exceeds the limit of {limits.MAX_ATTEMPTS_LIMIT}",
        )
    delay = duration(spec.delay, f"{path}.delay", maximum=limits.MAX_DELAY)
    not_before = spec.not_before
    if delay is not None and not_before is not None:
        raise FieldError(f"{path}.delay", "at most one of delay and not_before may be set")
    if not_before is not None and not_before > limits.MAX_NOT_BEFORE:
        raise FieldError(
            f"{path}.not_before",
            f"{not_before.isoformat()} is after the latest allowed"
            f" {limits.MAX_NOT_BEFORE.isoformat()}",
        )
    if delay is not None:
        not_before = now + delay
    # `dataclasses.replace` without the dataclass __init__ (a third of the
    # validation of an EnqueueMany of 1,000): every field kept, four changed.
    values = spec.__dict__.copy()
    values["max_attempts"] = spec.max_attempts or limits.DEFAULT_MAX_ATTEMPTS
    values["retry_backoff"] = _backoff(spec.retry_backoff, f"{path}.retry_backoff")
    values["delay"] = None
    values["not_before"] = not_before
    normalized: TaskSpec = object.__new__(TaskSpec)
    object.__setattr__(normalized, "__dict__", values)
    return normalized


def limit_prefix(prefix: str, path: str) -> None:
    _bounded_text(prefix, path, limits.MAX_LIMIT_KEY_BYTES)


def limit_rule(rule: LimitRule | None, path: str) -> Rule:
    """A SetLimit rule as storage keeps it (see docs/limits.md for the bounds)."""
    if rule is None:
        raise FieldError(path, "is required")
    _bounded_text(rule.prefix, f"{path}.prefix", limits.MAX_LIMIT_KEY_BYTES)
    rate = rule.rate
    if not math.isfinite(rate) or rate < 0:
        raise FieldError(f"{path}.rate", "must be a finite number >= 0")
    if rate > limits.MAX_LIMIT_RATE:
        raise FieldError(f"{path}.rate", f"{rate:g} exceeds the limit of {limits.MAX_LIMIT_RATE:g}")
    per = duration(rule.per, f"{path}.per", maximum=limits.MAX_LIMIT_PER)
    if per is None:
        per = timedelta(seconds=1)
    if per <= timedelta(0):
        raise FieldError(f"{path}.per", "must be positive")
    if rule.burst > limits.MAX_LIMIT_BURST:
        raise FieldError(
            f"{path}.burst", f"{rule.burst} exceeds the limit of {limits.MAX_LIMIT_BURST}"
        )
    if rule.concurrency > limits.MAX_LIMIT_CONCURRENCY:
        raise FieldError(
            f"{path}.concurrency",
            f"{rule.concurrency} exceeds the limit of {limits.MAX_LIMIT_CONCURRENCY}",
        )
    if rate == 0 and rule.concurrency == 0:
        raise FieldError(path, "sets neither a rate nor a concurrency")
    return Rule(
        prefix=rule.prefix,
        rate=float(rate),
        per_us=per // timedelta(microseconds=1),
        burst=max(rule.burst, 1),
        concurrency=rule.concurrency,
    )


def task_specs(specs: Sequence[TaskSpec], path: str, now: datetime) -> list[TaskSpec]:
    if not specs:
        raise FieldError(path, f"0 tasks is outside 1..{limits.MAX_BATCH}")
    if len(specs) > limits.MAX_BATCH:
        raise FieldError(path, f"{len(specs)} tasks exceeds the limit of {limits.MAX_BATCH}")
    return [task_spec(spec, f"{path}[{index}]", now) for index, spec in enumerate(specs)]


def lookup(task_id: str | None, unique_key: str | None) -> tuple[str | None, str | None]:
    """The ``lookup`` oneof of GetTask / RetryTask: exactly one, non-empty."""
    if (task_id is None) == (unique_key is None):
        raise FieldError("lookup", "exactly one of task_id or unique_key is required")
    if task_id is not None:
        name(task_id, "task_id", limits.MAX_UNIQUE_KEY_BYTES)
    if unique_key is not None:
        name(unique_key, "unique_key", limits.MAX_UNIQUE_KEY_BYTES)
    return task_id, unique_key


def lease_ref(ref: LeaseRef | None, path: str = "lease") -> LeaseRef:
    if ref is None:
        raise FieldError(path, "is required")
    name(ref.task_id, f"{path}.task_id", limits.MAX_UNIQUE_KEY_BYTES)
    if ref.attempt < 1:
        raise FieldError(f"{path}.attempt", "must be at least 1")
    name(ref.lease_token, f"{path}.lease_token", limits.MAX_UNIQUE_KEY_BYTES)
    return ref


def error_text(value: str, path: str = "error") -> str:
    _bounded_text(value, path, limits.MAX_ERROR_BYTES)
    return value


def progress_values(current: float, total: float, message: str) -> None:
    for path, number in (("current", current), ("total", total)):
        if math.isnan(number) or math.isinf(number):
            raise FieldError(path, "must be a finite number")
    _bounded_text(message, "message", limits.MAX_PROGRESS_MESSAGE_BYTES)


@dataclass(frozen=True, slots=True)
class ClaimArgs:
    queue: str
    worker_id: str
    task_types: list[str]
    limit: int
    wait_timeout: timedelta
    lease_duration: timedelta


def claim_args(request: ClaimRequest) -> ClaimArgs:
    queue = name(request.queue, "queue")
    worker_id = name(request.worker_id, "worker_id")
    types = task_types(request.task_types)
    if not 1 <= request.limit <= limits.MAX_BATCH:
        raise FieldError("limit", f"{request.limit} is outside 1..{limits.MAX_BATCH}")
    wait = duration(request.wait_timeout, "wait_timeout", maximum=limits.MAX_WAIT_TIMEOUT)
    lease = duration(
        request.lease_duration, "lease_duration", positive=True, maximum=limits.MAX_LEASE
    )
    return ClaimArgs(
        queue=queue,
        worker_id=worker_id,
        task_types=types,
        limit=request.limit,
        wait_timeout=wait if wait is not None else _ZERO,
        lease_duration=lease if lease is not None else limits.DEFAULT_LEASE,
    )


def batch_limit(value: int, path: str = "limit") -> int:
    """How many tasks one bulk call (RetryTasks, DeleteTasks) changes: 0 means
    `MAX_DELETE_BATCH`, more is refused."""
    if value == 0:
        return limits.MAX_DELETE_BATCH
    if value > limits.MAX_DELETE_BATCH:
        raise FieldError(path, f"{value} exceeds the limit of {limits.MAX_DELETE_BATCH}")
    return value


def result_value(value: bytes | None, path: str = "result") -> bytes | None:
    """A handler's return value (AckRequest.result); None when unset."""
    if value is not None and len(value) > limits.MAX_RESULT_BYTES:
        raise FieldError(
            path, f"{len(value)} bytes exceeds the {limits.MAX_RESULT_BYTES}-byte limit"
        )
    return value


_FINISHED_STATES = (TaskState.SUCCEEDED, TaskState.DEAD, TaskState.CANCELLED)


def finished_states(values: Sequence[TaskState], path: str = "states") -> list[int]:
    """A filter of finished states (DeleteTasks): at most one entry per
    finished state; empty means all three."""
    if len(values) > len(_FINISHED_STATES):
        raise FieldError(
            path, f"{len(values)} entries exceeds the limit of {len(_FINISHED_STATES)}"
        )
    for index, state in enumerate(values):
        if state not in _FINISHED_STATES:
            # An unknown value decodes to a member without a name.
            label = getattr(state, "name", "") or str(int(state))
            raise FieldError(
                f"{path}[{index}]",
                f"{label} is not a finished state;"
                " only SUCCEEDED, DEAD or CANCELLED tasks can be deleted",
            )
    return [int(state) for state in dict.fromkeys(values or _FINISHED_STATES)]


_ACTIVE_STATES = (TaskState.PENDING, TaskState.LEASED)


def active_states(values: Sequence[TaskState], path: str = "states") -> list[int]:
    """A filter of active states (CancelTasks): PENDING and/or LEASED;
    empty means both."""
    if len(values) > len(_ACTIVE_STATES):
        raise FieldError(path, f"{len(values)} entries exceeds the limit of {len(_ACTIVE_STATES)}")
    for index, state in enumerate(values):
        if state not in _ACTIVE_STATES:
            label = getattr(state, "name", "") or str(int(state))
            raise FieldError(
                f"{path}[{index}]",
                f"{label} is not an active state; only PENDING or LEASED tasks can be cancelled",
            )
    return [int(state) for state in dict.fromkeys(values or _ACTIVE_STATES)]


# -- inspection (minor 9) ----------------------------------------------------

_LISTABLE_STATES = frozenset(int(s) for s in TaskState if s != TaskState.UNSPECIFIED)


def task_states(values: Sequence[int], path: str = "states") -> tuple[int, ...]:
    """A state filter: empty means every state; each a known state other than
    UNSPECIFIED. Duplicates are dropped."""
    for index, value in enumerate(values):
        if int(value) not in _LISTABLE_STATES:
            raise FieldError(f"{path}[{index}]", f"{int(value)} is not a task state")
    return tuple(dict.fromkeys(int(v) for v in values))


def key_prefix(value: str, path: str = "unique_key_prefix") -> str:
    """A unique-key prefix filter; empty means no filter."""
    _bounded_text(value, path, limits.MAX_UNIQUE_KEY_BYTES)
    return value


def page_size(value: int, path: str = "page_size") -> int:
    """0 is DEFAULT_LIST_PAGE; above MAX_LIST_PAGE is refused, not clamped, so
    a caller never mistakes a short page for the end."""
    if value == 0:
        return limits.DEFAULT_LIST_PAGE
    if value > limits.MAX_LIST_PAGE:
        raise FieldError(path, f"{value} exceeds the limit of {limits.MAX_LIST_PAGE}")
    return value


def list_order(value: int, path: str = "order") -> bool:
    """Whether the listing is newest first."""
    if int(value) not in (int(o) for o in ListOrder):
        raise FieldError(path, f"{int(value)} is not a list order")
    return int(value) == ListOrder.NEWEST_FIRST


# -- settlements: the storage form of an ack / nack / reject ------------------------


def ack_settlement(message: AckRequest) -> Ack:
    """The caller has checked that its minor allows a result."""
    return Ack(lease_ref(message.lease), result_value(message.result))


def nack_settlement(message: NackRequest) -> Nack:
    ref = lease_ref(message.lease)
    error = error_text(message.error)
    delay = duration(message.retry_delay_override, "retry_delay_override", maximum=limits.MAX_DELAY)
    return Nack(ref, error, delay)


def reject_settlement(message: RejectRequest) -> Reject:
    return Reject(lease_ref(message.lease), error_text(message.error))


def schedule(value: Schedule | None, path: str = "schedule") -> Schedule:
    """A PutSchedule's schedule: its writable fields checked and defaulted
    (misfire SKIP, catch_up 1, timezone UTC), the read-only ones dropped."""
    if value is None:
        raise FieldError(path, "is required")
    name(value.name, f"{path}.name")
    queue = name(value.queue, f"{path}.queue")
    task_type = name(value.task_type, f"{path}.task_type")
    if len(value.payload) > limits.MAX_PAYLOAD_BYTES:
        raise FieldError(
            f"{path}.payload",
            f"{len(value.payload)} bytes exceeds the {limits.MAX_PAYLOAD_BYTES}-byte limit",
        )
    timezone = value.timezone or "UTC"
    _bounded_text(timezone, f"{path}.timezone", limits.MAX_NAME_BYTES)
    try:
        tz = cron.zone(timezone)
    except ValueError as exc:
        raise FieldError(f"{path}.timezone", f"{exc}; use an IANA name") from None
    if bool(value.cron) == (value.every is not None):
        raise FieldError(path, "needs exactly one of cron and every")
    if value.cron:
        _bounded_text(value.cron, f"{path}.cron", limits.MAX_CRON_BYTES)
        try:
            cron.parse_cron(value.cron, tz)
        except cron.CronError as exc:
            raise FieldError(f"{path}.cron", str(exc)) from None
    else:
        assert value.every is not None
        if not cron.MIN_EVERY <= value.every <= cron.MAX_EVERY:
            raise FieldError(
                f"{path}.every",
                f"{_fmt(value.every)} is not from {_fmt(cron.MIN_EVERY)} to {_fmt(cron.MAX_EVERY)}",
            )
    misfire = value.misfire or MisfirePolicy.SKIP
    if misfire not in (MisfirePolicy.SKIP, MisfirePolicy.CATCH_UP):
        raise FieldError(f"{path}.misfire", f"unknown policy {int(misfire)}")
    catch_up = value.catch_up or 1
    if catch_up > limits.MAX_CATCH_UP:
        raise FieldError(
            f"{path}.catch_up", f"{catch_up} exceeds the limit of {limits.MAX_CATCH_UP}"
        )
    if value.max_attempts > limits.MAX_ATTEMPTS_LIMIT:
        raise FieldError(
            f"{path}.max_attempts",
            f"{value.max_attempts} exceeds the limit of {limits.MAX_ATTEMPTS_LIMIT}",
        )
    return Schedule(
        name=value.name,
        queue=queue,
        task_type=task_type,
        cron=value.cron.strip(),
        every=value.every,
        payload=value.payload,
        timezone=timezone,
        misfire=MisfirePolicy(misfire),
        catch_up=catch_up,
        paused=value.paused,
        priority=value.priority,
        max_attempts=value.max_attempts,
    )

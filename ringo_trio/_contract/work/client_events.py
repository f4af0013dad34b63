"""The Work session's vocabulary: what the driver feeds in and what comes out.

`ringo_trio._contract.work.client.WorkSession` (the machine) takes these and
returns these; the driver (``ringo_trio._work._driver``) turns frames into
bytes and events into what happens to handlers. Kept apart as h11 keeps its
events (``_events.py``) apart from its state machine: every one is a
frozen, slotted value with no behaviour, and the hot ones (built once per
task) get a faster ``__init__`` (`_fast_init`).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

__all__ = [
    "Answered",
    "CancelHandler",
    "CommandDone",
    "CommandError",
    "CommandKind",
    "Credit",
    "Drain",
    "Extend",
    "Frame",
    "LeaseKey",
    "Outcome",
    "Output",
    "Progress",
    "Pushed",
    "Register",
    "Settle",
    "StartHandler",
    "TaskCancelled",
]

_E = TypeVar("_E")


def _fast_init(cls: type[_E]) -> type[_E]:
    """A frozen dataclass built per task, with an ``__init__`` that fills
    each slot through its own descriptor: the generated one goes through
    ``object.__setattr__`` per field, about twice the cost (0.8 µs for a
    `Settle`, 0.5 µs this way). Same signature and defaults; the class
    stays what it was — frozen, compared and hashed by its fields (the
    tests hold both to the generated ``__init__``)."""
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    scope: dict[str, Any] = {}
    params = []
    for field in fields:
        if field.default_factory is not dataclasses.MISSING:
            raise TypeError(f"{cls.__name__}.{field.name}: a default factory is not supported")
        if field.default is not dataclasses.MISSING:
            scope[f"default_{field.name}"] = field.default
            params.append(f"{field.name}=default_{field.name}")
        else:
            params.append(field.name)
        scope[f"set_{field.name}"] = getattr(cls, field.name).__set__
    body = "".join(f"    set_{field.name}(self, {field.name})\n" for field in fields)
    exec(f"def __init__(self, {', '.join(params)}):\n{body}", scope)
    init = scope["__init__"]
    init.generated = cls.__init__  # the reference (tests)
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    cls.__init__ = init  # type: ignore[method-assign]
    return cls


class CommandKind(enum.Enum):
    CREDIT = "credit"
    SETTLE = "settle"
    EXTEND = "extend"
    PROGRESS = "progress"
    DRAIN = "drain"


class Outcome(enum.Enum):
    ACK = "ack"
    NACK = "nack"
    REJECT = "reject"
    #: The worker stops before the handler finished: give the lease back
    #: without spending the attempt (a nack below minor 7).
    RELEASE = "release"


class LeaseKey(NamedTuple):
    """One lease: a task's attempt. A tuple, so that hashing and comparing
    it — it keys every lease table, a few lookups per task — run in C: as a
    frozen dataclass its Python-level ``__hash__`` was ~1.5 % of a worker's
    CPU. Only LeaseKeys are ever compared with it."""

    task_id: str
    attempt: int


# -- what the driver feeds in ----------------------------------------------


@dataclass(frozen=True, slots=True)
class CommandError:
    """An ``ErrorDetail``: ``code`` is the ErrorCode name without its prefix
    (``"LEASE_LOST"``), ``reason`` is ``metadata["reason"]`` if any."""

    code: str
    message: str = ""
    reason: str = ""


# -- frames out -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Register:
    ordered_request_ids: bool
    #: What the stream asks for: its free share of the concurrency, at least
    #: 1 (the wire refuses 0) — credit, not this, is what lets work in.
    max_concurrency: int


@dataclass(frozen=True, slots=True)
class Credit:
    """A credit update: absolute (``available`` replaces what is left) or,
    with ``grant`` set (minor >= 10, ``available`` then 0), additive."""

    request_id: int
    available: int
    target_concurrency: int | None
    grant: int | None = None


@_fast_init
@dataclass(frozen=True, slots=True)
class Settle:
    request_id: int
    key: LeaseKey
    lease_token: str
    outcome: Outcome
    error: str = ""
    retry_delay: float | None = None
    result: bytes | None = None
    """An ACK's result value (minor >= 9; the session drops it below)."""


@dataclass(frozen=True, slots=True)
class Extend:
    request_id: int
    key: LeaseKey
    lease_token: str
    extension: float


@dataclass(frozen=True, slots=True)
class Progress:
    request_id: int
    key: LeaseKey
    lease_token: str
    current: float
    total: float
    message: str


@dataclass(frozen=True, slots=True)
class Drain:
    request_id: int


Frame = Register | Credit | Settle | Extend | Progress | Drain


# -- the elements of a batch frame (minor >= 10) ------------------------------


@_fast_init
@dataclass(frozen=True, slots=True)
class Pushed:
    """A pushed task in a batch: `WorkSession.task_pushed`'s arguments."""

    key: LeaseKey
    lease_token: str
    lease_remaining: float


@_fast_init
@dataclass(frozen=True, slots=True)
class Answered:
    """A command result in a batch: `WorkSession.result`'s arguments."""

    request_id: int
    error: CommandError | None


# -- events out ---------------------------------------------------------------


@_fast_init
@dataclass(frozen=True, slots=True)
class StartHandler:
    key: LeaseKey


@dataclass(frozen=True, slots=True)
class CancelHandler:
    """The lease is gone (lost, expired locally, or the stream ended)."""

    key: LeaseKey
    reason: str


@dataclass(frozen=True, slots=True)
class TaskCancelled:
    """The daemon answered a command on this lease ``LEASE_LOST`` with reason
    ``cancelled``: an operator cancelled the task (CancelTask). Told once per
    lease, before the `CancelHandler` that follows when its handler runs."""

    key: LeaseKey


@_fast_init
@dataclass(frozen=True, slots=True)
class CommandDone:
    """The result of a command the driver may be waiting for (settle,
    progress, drain); ``error`` None means success."""

    request_id: int
    kind: CommandKind
    error: CommandError | None


Output = (
    Register
    | Credit
    | Settle
    | Extend
    | Progress
    | Drain
    | StartHandler
    | CancelHandler
    | TaskCancelled
    | CommandDone
)

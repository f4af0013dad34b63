"""Hypothesis strategies for testing Ringo handlers (needs ``hypothesis``).

* `task_specs` draws valid `TaskSpec`s (every value within the protocol's
  limits, so the daemon accepts them all);
* `outcome_scripts` draws what a handler does on each attempt of a task
  (``"ack"``, ``"retry"``, ``"crash"``, ``"reject"``); `scripted_handler`
  plays such scripts, and `expected_history` says where the daemon must
  leave a task that followed one: its final state, attempts and last error.

A property test of the retry rules, then, is: enqueue any specs, give each
task any script, work the queue until settled, and compare every task with
`expected_history` (docs/testing.md has it in full).

For typed tasks (docs/tasks.md): `task_arguments` draws keyword arguments
for a task's payload parameters, `codec_values` values of one annotation,
both only values the task codec carries unchanged (no NaN, no infinite
float, whole-minute UTC offsets).
"""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import string
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any, Literal, Protocol

import msgspec
from hypothesis import strategies as st

from .._errors import PermanentTaskError, RetryTaskError
from .._models import RetryBackoff, Task, TaskSpec, TaskState
from .._tasks.codec import TaskSignature
from .._work._handlers import Handler, TaskContext

__all__ = [
    "OUTCOMES",
    "Outcome",
    "codec_values",
    "expected_history",
    "names",
    "outcome_scripts",
    "retry_backoffs",
    "scripted_handler",
    "task_arguments",
    "task_specs",
]

Outcome = Literal["ack", "retry", "crash", "reject"]
OUTCOMES: tuple[Outcome, ...] = ("ack", "retry", "crash", "reject")

_NAME_CHARS = string.ascii_letters + string.digits + "-_."


def names(max_size: int = 20) -> st.SearchStrategy[str]:
    """Queue names, task types and unique keys: 1..``max_size`` plain characters."""
    return st.text(_NAME_CHARS, min_size=1, max_size=max_size)


def retry_backoffs(
    longest: timedelta = timedelta(minutes=10),
) -> st.SearchStrategy[RetryBackoff]:
    """Backoffs whose delays are at most ``longest`` (each virtual second of
    waiting costs a little real time, so keep it modest)."""
    seconds = longest.total_seconds()

    @st.composite
    def build(draw: st.DrawFn) -> RetryBackoff:
        initial = draw(st.floats(0.0, seconds, allow_nan=False))
        maximum = draw(st.floats(initial, seconds, allow_nan=False))
        multiplier = draw(st.floats(1.0, 4.0, allow_nan=False))
        return RetryBackoff(
            initial=timedelta(seconds=initial),
            maximum=timedelta(seconds=maximum),
            multiplier=multiplier,
        )

    return build()


def task_specs(
    *,
    task_types: st.SearchStrategy[str] | None = None,
    payloads: st.SearchStrategy[bytes] | None = None,
    max_attempts: st.SearchStrategy[int] | None = None,
    delays: st.SearchStrategy[timedelta | None] | None = None,
    unique_keys: st.SearchStrategy[str | None] | None = None,
    backoffs: st.SearchStrategy[RetryBackoff | None] | None = None,
) -> st.SearchStrategy[TaskSpec]:
    """Valid `TaskSpec`s; each field's strategy can be replaced.

    Defaults: a short task type, up to 64 payload bytes, 1..5 attempts, no
    delay or one of up to an hour, no unique key (give ``unique_keys`` to
    test deduplication), a backoff of up to ten minutes or the daemon's
    default, and a priority in -5..5.
    """
    return st.builds(
        TaskSpec,
        task_type=task_types if task_types is not None else names(),
        payload=payloads if payloads is not None else st.binary(max_size=64),
        unique_key=unique_keys if unique_keys is not None else st.none(),
        max_attempts=max_attempts if max_attempts is not None else st.integers(1, 5),
        retry_backoff=backoffs if backoffs is not None else st.none() | retry_backoffs(),
        delay=(
            delays
            if delays is not None
            else st.none() | st.timedeltas(timedelta(0), timedelta(hours=1))
        ),
        priority=st.integers(-5, 5),
    )


def outcome_scripts(max_size: int = 5) -> st.SearchStrategy[list[Outcome]]:
    """What the handler does on attempts 1, 2, ...; past the script's end it acks."""
    return st.lists(st.sampled_from(OUTCOMES), max_size=max_size)


def _error(outcome: Outcome, attempt: int) -> str:
    return f"scripted {outcome} (attempt {attempt})"


def scripted_handler(scripts: Mapping[str, Sequence[Outcome]]) -> Handler:
    """A handler doing, for the task with id ``i`` on attempt ``n``, what
    ``scripts[i][n - 1]`` says (ack past the end, and for unknown ids)."""

    async def handler(task: Task, ctx: TaskContext) -> None:
        script = scripts.get(task.id, ())
        outcome = script[task.attempt - 1] if task.attempt <= len(script) else "ack"
        if outcome == "retry":
            raise RetryTaskError(_error(outcome, task.attempt))
        if outcome == "crash":
            raise RuntimeError(_error(outcome, task.attempt))
        if outcome == "reject":
            raise PermanentTaskError(_error(outcome, task.attempt))

    return handler


def expected_history(
    script: Sequence[Outcome], max_attempts: int
) -> tuple[TaskState, int, str | None]:
    """Where a task following ``script`` ends: (state, attempts, last error).

    The rules it models: an ack succeeds, a reject is DEAD at once, a retry
    or a crash spends the attempt and is DEAD once ``max_attempts`` are
    spent; the last error stays after a later success.
    """
    last_error: str | None = None
    for attempt in range(1, max_attempts + 1):
        outcome = script[attempt - 1] if attempt <= len(script) else "ack"
        if outcome == "ack":
            return TaskState.SUCCEEDED, attempt, last_error
        last_error = _error(outcome, attempt)
        if outcome == "crash":
            last_error = f"RuntimeError: {last_error}"
        if outcome == "reject":
            return TaskState.DEAD, attempt, last_error
    return TaskState.DEAD, max_attempts, last_error


class _TypedTask(Protocol):
    signature: TaskSignature


def task_arguments(task: Callable[..., Any] | _TypedTask) -> st.SearchStrategy[dict[str, Any]]:
    """Keyword arguments for ``task``'s payload parameters (never its context):
    one `codec_values` draw per parameter; a parameter with a default is
    sometimes left out. ``task`` is a task function, or an object with a
    ``signature`` (`TaskSignature`), as the ``@task`` decorator returns."""
    signature = getattr(task, "signature", None)
    if not isinstance(signature, TaskSignature):
        signature = TaskSignature.of(_callable(task))
    values = {name: codec_values(tp) for name, tp in signature.parameter_types.items()}
    required = signature.required_parameters
    return st.fixed_dictionaries(
        {name: value for name, value in values.items() if name in required},
        optional={name: value for name, value in values.items() if name not in required},
    )


def _callable(task: object) -> Callable[..., Any]:
    if not callable(task):
        raise TypeError(f"{task!r} is neither a task function nor has a TaskSignature")
    return task


_OFFSETS = st.integers(-(24 * 60 - 1), 24 * 60 - 1).map(
    lambda minutes: timezone(timedelta(minutes=minutes))
)
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=10,
)
_SIMPLE: dict[Any, st.SearchStrategy[Any]] = {
    Any: _JSON,
    object: _JSON,
    type(None): st.none(),
    bool: st.booleans(),
    float: st.floats(allow_nan=False, allow_infinity=False),
    Decimal: st.decimals(allow_nan=False, allow_infinity=False),
    datetime: st.datetimes(timezones=st.none() | _OFFSETS),
    time: st.times(timezones=st.none() | _OFFSETS),
    bytearray: st.binary().map(bytearray),
}


def codec_values(annotation: Any) -> st.SearchStrategy[Any]:
    """Values of ``annotation`` that the task codec encodes and decodes back
    to an equal value: `hypothesis.strategies.from_type`, except where JSON
    or the codec narrows it (finite floats, Decimals without NaN, datetimes
    and times naive or at a whole-minute UTC offset, ``Any`` as JSON values)
    — inside containers, unions, dataclasses, TypedDicts, NamedTuples,
    msgspec Structs and pydantic models too."""
    return _values(annotation, {})


def _values(tp: Any, building: dict[Any, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    if tp is None:
        return st.none()
    while typing.get_origin(tp) in (typing.Annotated, typing.Required, typing.NotRequired):
        tp = tp.__origin__ if typing.get_origin(tp) is typing.Annotated else typing.get_args(tp)[0]
    try:
        simple = _SIMPLE.get(tp)
    except TypeError:  # an unhashable annotation
        simple = None
    if simple is not None:
        return simple
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return st.one_of([_values(arg, building) for arg in args])
    if origin is Literal:
        return st.sampled_from(args)
    if origin in (list, collections.abc.Sequence, collections.abc.MutableSequence):
        return st.lists(_values(args[0] if args else Any, building))
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return st.lists(_values(args[0], building)).map(tuple)
        return st.tuples(*(_values(arg, building) for arg in args if arg != ()))
    if origin in (set, collections.abc.Set, collections.abc.MutableSet):
        return st.sets(_values(args[0], building))
    if origin is frozenset:
        return st.frozensets(_values(args[0], building))
    if origin in (dict, collections.abc.Mapping, collections.abc.MutableMapping):
        return st.dictionaries(_values(args[0], building), _values(args[1], building))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return st.sampled_from(list(tp))
    if isinstance(tp, type) and _fields(tp) is not None:
        if tp not in building:  # a class may refer to itself
            building[tp] = st.deferred(lambda: built)
            built = _record(tp, building)
        return building[tp]
    return st.from_type(tp)


def _fields(cls: type) -> dict[str, tuple[Any, bool]] | None:
    """A record class's fields: name -> (annotation, required); None if not one."""
    pydantic = sys.modules.get("pydantic")
    if pydantic is not None and issubclass(cls, pydantic.BaseModel):
        return {
            name: (field.annotation, field.is_required())
            for name, field in typing.cast(Any, cls).model_fields.items()
        }
    if issubclass(cls, msgspec.Struct):
        return {f.name: (f.type, f.required) for f in msgspec.structs.fields(cls)}
    if dataclasses.is_dataclass(cls):
        hints = typing.get_type_hints(cls, include_extras=True)
        return {f.name: (hints[f.name], True) for f in dataclasses.fields(cls) if f.init}
    if typing.is_typeddict(cls):
        hints = typing.get_type_hints(cls, include_extras=True)
        required: frozenset[str] = getattr(cls, "__required_keys__", frozenset(hints))
        return {name: (hints[name], name in required) for name in hints}
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):  # a NamedTuple
        return {name: (tp, True) for name, tp in typing.get_type_hints(cls).items()}
    return None


def _record(cls: type, building: dict[Any, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    fields = _fields(cls) or {}
    kwargs = st.fixed_dictionaries(
        {name: _values(tp, building) for name, (tp, required) in fields.items() if required},
        optional={
            name: _values(tp, building) for name, (tp, required) in fields.items() if not required
        },
    )
    if typing.is_typeddict(cls):
        return kwargs
    return kwargs.map(lambda values: cls(**values))

"""A typed task's arguments and result as JSON bytes, validated against its annotations.

`TaskSignature.of(fn)` reads a task function's annotations once (string
annotations and ``from __future__ import annotations`` included) and builds
what encoding and decoding need: a msgspec encoder, and decoders of the
arguments (a TypedDict built from the signature, so a decode is the kwargs
dict itself) and of the result. msgspec was chosen by measurement
(``bench/task_codec.py``, numbers in bench/results.md and docs/tasks.md).

Rules (docs/tasks.md, "Encoding"):

* The parameter annotated `TaskContext` (or ``TaskContext | None``, or a
  subclass) is the context: the worker passes it, the payload never has it.
* Every other parameter needs an annotation the codec encodes and decodes;
  ``Any`` is allowed and takes any JSON value unvalidated. An unannotated
  parameter, ``*args`` / ``**kwargs``, a positional-only parameter (the worker
  calls ``fn(**kwargs)``) or an unsupported annotation is refused when the
  task is declared (`InvalidArgumentError`). A missing return annotation is
  ``Any``.
* The payload is a JSON object, one key per argument the caller passed;
  defaults are NOT applied at enqueue time: an argument left out is left out
  of the payload and the function's default applies when the task runs (the
  worker's code decides). Unknown keys are ignored when decoding, so
  removing a parameter is safe for tasks already queued.
* Encoding validates: the bytes are decoded once against the annotations
  before they are returned, so what is enqueued (or stored as a result)
  decodes on the worker (or for the awaiting caller) with the same code. A
  wrong call, an unencodable or invalid argument -> `InvalidArgumentError`
  (nothing sent); an invalid result -> `CodecError` (the attempt fails).
* pydantic models are encoded with ``model_dump(mode="json")`` and decoded
  with ``model_validate``; pydantic is never imported here (only looked up in
  ``sys.modules``: an annotation that is a pydantic model means the user
  imported it).
"""

from __future__ import annotations

import inspect
import re
import sys
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NotRequired, Required, cast

import msgspec

from .._errors import InvalidArgumentError
from .._work._handlers import TaskContext

__all__ = ["CodecError", "TaskSignature"]


class CodecError(Exception):
    """A payload or result that does not decode, or does not validate against the annotations.

    ``str(exc)`` is one line naming the task, the argument (or the result)
    and what was wrong; it becomes the task's last error.
    """


def _pydantic_model(tp: object) -> bool:
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and isinstance(tp, type) and issubclass(tp, pydantic.BaseModel)


def _enc_hook(value: Any) -> Any:
    pydantic = sys.modules.get("pydantic")
    if pydantic is not None and isinstance(value, pydantic.BaseModel):
        return value.model_dump(mode="json")
    raise TypeError(f"Encoding objects of type {type(value).__qualname__} is unsupported")


def _dec_hook(tp: type, value: Any) -> Any:
    if _pydantic_model(tp):
        pydantic = sys.modules["pydantic"]
        try:
            return cast(Any, tp).model_validate(value)
        except pydantic.ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, error['loc'])) or '(model)'}: {error['msg']}"
                for error in exc.errors()
            )
            raise ValueError(f"invalid {tp.__qualname__}: {problems}") from None
    raise NotImplementedError


_ENCODER = msgspec.json.Encoder(enc_hook=_enc_hook)
_PATH = re.compile(r"^(?P<message>.*) - at `(?P<path>\$[^`]*)`$", re.DOTALL)
_MISSING = re.compile(r"^Object missing required field `(?P<name>[^`]*)`$")
_PARAMETER = re.compile(r"^\$\.(?P<name>\w+)")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _strip_annotated(tp: Any) -> Any:
    while typing.get_origin(tp) is typing.Annotated:
        tp = tp.__origin__
    return tp


def _is_context(tp: Any) -> bool:
    tp = _strip_annotated(tp)
    if isinstance(tp, type):
        return issubclass(tp, TaskContext)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        others = [arg for arg in typing.get_args(tp) if arg is not type(None)]
        return len(others) == 1 and _is_context(others[0])
    return False


def _children(node: msgspec.inspect.Type) -> Iterator[msgspec.inspect.Type]:
    for value in msgspec.structs.astuple(node):
        for item in value if isinstance(value, tuple) else (value,):
            if isinstance(item, msgspec.inspect.Field):
                yield item.type
            elif isinstance(item, msgspec.inspect.Type):
                yield item


def _unsupported(tp: Any) -> str | None:
    """Why msgspec (plus the pydantic hook) cannot carry ``tp``, or None."""
    try:
        msgspec.json.Decoder(tp, dec_hook=_dec_hook)
        stack = [msgspec.inspect.type_info(tp)]
    except (TypeError, ValueError, NameError) as exc:
        return _one_line(str(exc))
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, msgspec.inspect.CustomType):
            if not _pydantic_model(node.cls):
                return f"values of type {node.cls.__qualname__} cannot be encoded as JSON"
            continue
        stack.extend(_children(node))
    return None


def _describe(tp: Any) -> str:
    return tp.__qualname__ if isinstance(tp, type) else repr(tp)


class TaskSignature:
    """A task function's payload parameters and result type, with their codec built once.

    `of` reads the function; `encode_arguments` runs where a task is enqueued,
    `decode_arguments` and `encode_result` on the worker, `decode_result`
    where a result is awaited.
    """

    __slots__ = (
        "_arguments",
        "_bind",
        "_names",
        "_result",
        "_task",
        "context_parameter",
        "parameter_types",
        "parameters",
        "required_parameters",
        "return_type",
    )

    #: The name of the `TaskContext` parameter, or None.
    context_parameter: str | None
    #: The payload's parameters (all but the context), in the function's order.
    parameters: tuple[str, ...]
    #: Each payload parameter's annotation (resolved, ``Annotated`` kept).
    parameter_types: Mapping[str, Any]
    #: The payload parameters without a default: a payload must have them.
    required_parameters: frozenset[str]
    #: The return annotation (``Any`` when there is none).
    return_type: Any
    _task: str
    _names: frozenset[str]
    _bind: inspect.Signature
    _arguments: msgspec.json.Decoder[Any]
    _result: msgspec.json.Decoder[Any] | None

    @classmethod
    def of(cls, fn: Callable[..., Any]) -> TaskSignature:
        """Read ``fn``'s signature and annotations; `InvalidArgumentError` if the
        codec cannot carry them (see the module docstring)."""
        name = getattr(fn, "__qualname__", None) or repr(fn)
        try:
            signature = inspect.signature(fn)
            hints = typing.get_type_hints(fn, include_extras=True)
        except (TypeError, ValueError, NameError, AttributeError) as exc:
            raise InvalidArgumentError(
                f"task {name}: cannot read its annotations: {_one_line(str(exc))}"
            ) from None
        context: str | None = None
        payload: list[inspect.Parameter] = []
        fields: dict[str, Any] = {}
        types_: dict[str, Any] = {}
        for parameter in signature.parameters.values():
            where = f"task {name}: parameter {parameter.name!r}"
            if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                raise InvalidArgumentError(
                    f"{where}: *args and **kwargs cannot be encoded; name each parameter"
                )
            if parameter.name not in hints:
                raise InvalidArgumentError(
                    f"{where} has no annotation (annotate it; `Any` takes any JSON value"
                    " unvalidated)"
                )
            tp = hints[parameter.name]
            if _is_context(tp):
                if context is not None:
                    raise InvalidArgumentError(
                        f"{where}: a second TaskContext parameter (the first is {context!r})"
                    )
                context = parameter.name
                continue
            if parameter.kind is parameter.POSITIONAL_ONLY:
                raise InvalidArgumentError(
                    f"{where} is positional-only; the worker passes arguments by name"
                )
            why = _unsupported(tp)
            if why is not None:
                raise InvalidArgumentError(
                    f"{where}: annotation {_describe(tp)} is not supported: {why}"
                )
            payload.append(parameter)
            types_[parameter.name] = tp
            has_default = parameter.default is not parameter.empty
            fields[parameter.name] = NotRequired[tp] if has_default else Required[tp]
        return_type = hints.get("return", Any)
        why = _unsupported(return_type)
        if why is not None:
            raise InvalidArgumentError(
                f"task {name}: return annotation {_describe(return_type)} is not supported: {why}"
            )
        arguments = cast(Any, typing.TypedDict)(f"{name}.arguments", fields)

        self = cls.__new__(cls)
        self._task = name
        self.context_parameter = context
        self.parameters = tuple(fields)
        self.parameter_types = types.MappingProxyType(types_)
        self.return_type = return_type
        self._names = frozenset(fields)
        self.required_parameters = frozenset(
            p.name for p in payload if p.default is inspect.Parameter.empty
        )
        self._bind = signature.replace(parameters=payload)
        self._arguments = msgspec.json.Decoder(arguments, dec_hook=_dec_hook)
        self._result = (
            None
            if return_type is Any or return_type is object
            else msgspec.json.Decoder(return_type, dec_hook=_dec_hook)
        )
        return self

    def __repr__(self) -> str:
        return f"<TaskSignature of {self._task} {self._bind}>"

    # -- arguments -------------------------------------------------------------

    def encode_arguments(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bytes:
        """The payload of a call ``fn(*args, **kwargs)`` (without the context):
        a JSON object of the arguments passed (defaults are not filled in),
        checked to decode. `InvalidArgumentError` for a wrong call or an
        argument that does not encode or validate."""
        if not args and self.required_parameters <= kwargs.keys() <= self._names:
            values = kwargs if type(kwargs) is dict else dict(kwargs)
        else:
            try:
                values = self._bind.bind(*args, **kwargs).arguments
            except TypeError as exc:
                raise InvalidArgumentError(f"task {self._task}: {exc}") from None
        try:
            data = _ENCODER.encode(values)
        except (TypeError, ValueError, OverflowError) as exc:
            raise InvalidArgumentError(self._unencodable(values, exc)) from None
        try:
            self._arguments.decode(data)
        except msgspec.DecodeError as exc:
            raise InvalidArgumentError(self._arguments_error(exc)) from None
        return data

    def decode_arguments(self, payload: bytes) -> dict[str, Any]:
        """The keyword arguments (without the context) a payload holds, each
        validated against its annotation; unknown keys are ignored, arguments
        left out get the function's defaults when it is called. `CodecError`
        if it is not a JSON object, misses a required argument or holds an
        invalid one."""
        try:
            return cast(dict[str, Any], self._arguments.decode(payload))
        except msgspec.DecodeError as exc:
            raise CodecError(self._arguments_error(exc)) from None

    def _unencodable(self, values: Mapping[str, Any], exc: Exception) -> str:
        for name, value in values.items():  # which one: the error path only
            try:
                _ENCODER.encode(value)
            except (TypeError, ValueError, OverflowError) as one:
                return f"task {self._task}: argument {name!r} does not encode: {one}"
        return f"task {self._task}: the arguments do not encode: {exc}"

    def _arguments_error(self, exc: msgspec.DecodeError) -> str:
        task = f"task {self._task}"
        text = _one_line(str(exc))
        if not isinstance(exc, msgspec.ValidationError):
            return f"{task}: the payload is not valid JSON ({text})"
        found = _PATH.match(text)
        if found is None:
            missing = _MISSING.match(text)
            if missing is not None:
                return f"{task}: missing required argument {missing['name']!r}"
            return f"{task}: the payload is not a JSON object of arguments ({text})"
        message, path = found["message"], found["path"]
        parameter = _PARAMETER.match(path)
        if parameter is None:  # pragma: no cover - every argument error has a path below $
            return f"{task}: {text}"
        where = "" if path == parameter.group(0) else f" (at `{path}`)"
        return f"{task}: argument {parameter['name']!r}: {message}{where}"

    # -- result ----------------------------------------------------------------

    def encode_result(self, value: Any) -> bytes | None:
        """The stored result: None for None (nothing stored), else JSON bytes
        checked to decode as the return annotation. `CodecError` otherwise."""
        if value is None:
            return None
        try:
            data = _ENCODER.encode(value)
        except (TypeError, ValueError, OverflowError) as exc:
            raise CodecError(f"task {self._task}: the result does not encode: {exc}") from None
        if self._result is not None:
            try:
                self._result.decode(data)
            except msgspec.DecodeError as exc:
                raise CodecError(self._result_error(exc)) from None
        return data

    def decode_result(self, data: bytes | None) -> Any:
        """A stored result as the return annotation says (None when nothing was
        stored); `CodecError` if it does not decode or validate."""
        if data is None:
            return None
        try:
            if self._result is None:
                return msgspec.json.decode(data)
            return self._result.decode(data)
        except msgspec.DecodeError as exc:
            raise CodecError(self._result_error(exc)) from None

    def _result_error(self, exc: msgspec.DecodeError) -> str:
        text = _one_line(str(exc))
        if not isinstance(exc, msgspec.ValidationError):
            return f"task {self._task}: the result is not valid JSON ({text})"
        found = _PATH.match(text)
        if found is None or found["path"] == "$":
            return f"task {self._task}: the result is not a {_describe(self.return_type)}: {text}"
        return (
            f"task {self._task}: the result is not a {_describe(self.return_type)}: "
            f"{found['message']} (at `{found['path']}`)"
        )

"""Typed tasks' codec (ringo_trio/_tasks/codec.py): what a task's arguments and
result become on the wire and back, and what it refuses (docs/tasks.md, "Encoding").

This module uses ``from __future__ import annotations``: every annotation the
codec reads here is a string."""

from __future__ import annotations

import dataclasses
import enum
import sys
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple, NotRequired, TypedDict
from uuid import UUID

import msgspec
import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringo_trio import InvalidArgumentError, TaskContext
from ringo_trio._tasks.codec import CodecError, TaskSignature
from ringo_trio.testing.strategies import codec_values, task_arguments

ROOT = Path(__file__).resolve().parents[2]


class Colour(enum.StrEnum):
    RED = "red"
    GREEN = "green"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@dataclasses.dataclass
class Line:
    sku: str
    quantity: int
    price: Decimal


@dataclasses.dataclass
class Order:
    id: UUID
    placed_at: datetime
    lines: list[Line]
    total: Decimal
    note: str | None = None


@dataclasses.dataclass
class Tree:
    label: str
    children: list[Tree]


class Address(TypedDict):
    street: str
    number: int
    floor: NotRequired[int]


class Point(NamedTuple):
    x: float
    y: float


class Receipt(msgspec.Struct):
    id: UUID
    sent_at: datetime
    recipients: list[str]
    cost: Decimal = Decimal("0")


class Customer(pydantic.BaseModel):
    name: str
    since: date
    tags: list[str] = []
    balance: Decimal


SUPPORTED: list[Any] = [
    str,
    int,
    float,
    bool,
    None,
    bytes,
    list[int],
    tuple[str, int],
    tuple[float, ...],
    set[int],
    frozenset[str],
    dict[str, float],
    dict[int, str],
    int | None,
    int | str | None,
    Literal["a", "b", 3],
    datetime,
    date,
    time,
    timedelta,
    UUID,
    Decimal,
    Colour,
    Level,
    Order,
    Tree,
    Address,
    Point,
    Receipt,
    Customer,
    list[Customer] | None,
    Annotated[int, msgspec.Meta(description="annotated")],
    Any,
]


async def everything(
    text: str,
    number: int,
    ratio: float,
    flag: bool,
    blob: bytes,
    moment: datetime,
    day: date,
    clock: time,
    span: timedelta,
    ident: UUID,
    amount: Decimal,
    colour: Colour,
    level: Level,
    order: Order,
    tree: Tree,
    address: Address,
    point: Point,
    receipt: Receipt,
    customer: Customer,
    ctx: TaskContext,
    pair: tuple[str, int],
    numbers: list[int] = [],  # noqa: B006 - never mutated: the codec's default policy
    mapping: dict[str, float] | None = None,
    choice: Literal["a", "b", 3] = "a",
    anything: Any = None,
    *,
    tags: frozenset[str] = frozenset(),
    maybe: int | str | None = None,
) -> Order: ...


def send_email(to: str, subject: str, ctx: TaskContext, retries: int = 3) -> Receipt: ...


SEND = TaskSignature.of(send_email)


def _roundtrip_function(annotation: Any) -> TaskSignature:
    def fn() -> None: ...

    fn.__annotations__["return"] = annotation
    return TaskSignature.of(fn)


# -- the round-trip properties ---------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(kwargs=task_arguments(everything))
def test_arguments_round_trip(kwargs: dict[str, Any]) -> None:
    """Property: for any keyword arguments of a task whose parameters cover every
    supported type (primitives, containers, unions, Literal, datetimes, UUID,
    Decimal, enums, dataclasses incl. a recursive one, TypedDict, NamedTuple, a
    msgspec Struct, a pydantic model, Any), decode(encode(kwargs)) == kwargs —
    and nothing more: parameters left out (they have defaults) stay out."""
    signature = TaskSignature.of(everything)
    payload = signature.encode_arguments((), kwargs)
    assert isinstance(payload, bytes)
    assert signature.decode_arguments(payload) == kwargs


@pytest.mark.parametrize("annotation", SUPPORTED, ids=repr)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_results_round_trip(annotation: Any, data: st.DataObject) -> None:
    """Property: for every supported return annotation and any value of it,
    decode_result(encode_result(value)) == value (None is stored as nothing)."""
    signature = _roundtrip_function(annotation)
    value = data.draw(codec_values(annotation))
    assert signature.decode_result(signature.encode_result(value)) == value


@settings(max_examples=60, deadline=None)
@given(moment=codec_values(datetime), amount=codec_values(Decimal))
def test_offsets_and_decimal_digits_survive_exactly(moment: datetime, amount: Decimal) -> None:
    """Property: equality is not enough for these two — an aware datetime keeps its
    UTC offset (not just its instant), a Decimal its every digit and exponent."""
    signature = _roundtrip_function(tuple[datetime, Decimal])
    back_moment, back_amount = signature.decode_result(signature.encode_result((moment, amount)))
    assert back_moment.utcoffset() == moment.utcoffset()
    assert back_moment.replace(tzinfo=None) == moment.replace(tzinfo=None)
    assert str(back_amount) == str(amount)


def test_decimal_is_exact_and_aware_datetimes_keep_their_offset() -> None:
    """Decimals travel as strings (no float rounding); an aware datetime's offset is kept."""

    def fn(amount: Decimal, at: datetime) -> None: ...

    signature = TaskSignature.of(fn)
    amount = Decimal("0.1000000000000000000000000001")
    at = datetime(2026, 12, 4, 9, 30, 12, 345678, tzinfo=timezone(timedelta(hours=-5, minutes=-30)))
    payload = signature.encode_arguments((amount, at), {})
    assert b'"0.1000000000000000000000000001"' in payload
    decoded = signature.decode_arguments(payload)
    assert str(decoded["amount"]) == "0.1000000000000000000000000001"
    assert decoded["at"].utcoffset() == timedelta(hours=-5, minutes=-30)
    assert decoded["at"] == at
    assert (
        str(
            signature.decode_arguments(b'{"amount": "1.10", "at": "2026-01-01T00:00:00"}')["amount"]
        )
        == "1.10"
    )


# -- the signature ---------------------------------------------------------------------


def test_the_context_parameter_is_not_part_of_the_payload() -> None:
    """The TaskContext parameter (also `TaskContext | None`) is named, excluded from
    `parameters`, and cannot be passed at enqueue time."""
    assert SEND.context_parameter == "ctx"
    assert SEND.parameters == ("to", "subject", "retries")
    assert SEND.required_parameters == {"to", "subject"}

    def optional(ctx: TaskContext | None, n: int) -> None: ...

    assert TaskSignature.of(optional).context_parameter == "ctx"
    assert TaskSignature.of(optional).parameters == ("n",)

    def none(n: int) -> None: ...

    assert TaskSignature.of(none).context_parameter is None
    with pytest.raises(InvalidArgumentError, match="unexpected keyword argument 'ctx'"):
        SEND.encode_arguments((), {"to": "a", "subject": "b", "ctx": None})


def test_string_annotations_are_resolved() -> None:
    """Quoted annotations (and this module's `from __future__ import annotations`)
    resolve against the function's module."""

    def fn(order: "Order", when: "datetime | None" = None) -> "Receipt": ...  # noqa: UP037

    signature = TaskSignature.of(fn)
    assert signature.parameter_types == {"order": Order, "when": datetime | None}
    assert signature.return_type is Receipt


def _star_args(*args: int) -> None: ...


def _star_kwargs(**kwargs: int) -> None: ...


def _unannotated(to, subject: str) -> None: ...  # type: ignore[no-untyped-def]


def _unsupported(sock: Path) -> None: ...


def _nested_unsupported(items: list[object | Path]) -> None: ...


def _dataclass_field_unsupported(sock: Holder) -> None: ...


@dataclasses.dataclass
class Holder:
    path: Path


def _unresolved(x: NoSuchType) -> None: ...  # type: ignore[name-defined]  # noqa: F821


def _positional_only(x: int, /) -> None: ...


def _two_contexts(a: TaskContext, b: TaskContext) -> None: ...


def _ambiguous_union(x: str | datetime) -> None: ...


def _bad_return() -> Path: ...


@pytest.mark.parametrize(
    ("fn", "match"),
    [
        (_star_args, r"parameter 'args': \*args and \*\*kwargs"),
        (_star_kwargs, r"parameter 'kwargs': \*args and \*\*kwargs"),
        (_unannotated, "parameter 'to' has no annotation"),
        (_unsupported, "parameter 'sock': annotation Path is not supported"),
        (_nested_unsupported, "parameter 'items'.*not supported"),
        (_dataclass_field_unsupported, "parameter 'sock'.*Path cannot be encoded"),
        (_unresolved, "cannot read its annotations.*NoSuchType"),
        (_positional_only, "parameter 'x' is positional-only"),
        (_two_contexts, "parameter 'b': a second TaskContext parameter"),
        (_ambiguous_union, "parameter 'x'.*more than one str-like type"),
        (_bad_return, "return annotation Path is not supported"),
    ],
    ids=lambda value: getattr(value, "__name__", ""),
)
def test_declaring_a_task_the_codec_cannot_carry_is_refused(fn: Any, match: str) -> None:
    """Refused when the task is declared, with the parameter named: nothing fails
    later on a worker."""
    with pytest.raises(InvalidArgumentError, match=match):
        TaskSignature.of(fn)


def test_no_return_annotation_is_any() -> None:
    """Missing return annotation: Any — any JSON value, unvalidated."""

    def fn(x: int):  # type: ignore[no-untyped-def]
        ...

    signature = TaskSignature.of(fn)
    assert signature.return_type is Any
    assert signature.decode_result(signature.encode_result({"a": [1, "b"]})) == {"a": [1, "b"]}


# -- encoding arguments ----------------------------------------------------------------


def test_arguments_bind_like_a_call_and_defaults_stay_out_of_the_payload() -> None:
    """Positional and keyword arguments bind as a call would; an argument not passed is
    not in the payload, so the function's default applies when the task runs."""
    payload = SEND.encode_arguments(("a@example.org",), {"subject": "hi"})
    assert msgspec.json.decode(payload) == {"to": "a@example.org", "subject": "hi"}
    assert SEND.decode_arguments(payload) == {"to": "a@example.org", "subject": "hi"}
    assert msgspec.json.decode(SEND.encode_arguments(("a", "b", 5), {})) == {
        "to": "a",
        "subject": "b",
        "retries": 5,
    }


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((), {"to": "a"}, "missing a required argument: 'subject'"),
        ((), {"to": "a", "subject": "b", "cc": "c"}, "unexpected keyword argument 'cc'"),
        (("a", "b", 1, 2), {}, "too many positional arguments"),
        (("a",), {"to": "b", "subject": "c"}, "multiple values for argument 'to'"),
        ((), {"to": 5, "subject": "b"}, "argument 'to': Expected `str`, got `int`"),
        ((), {"to": "a", "subject": object()}, "argument 'subject' does not encode"),
        ((), {"to": "a", "subject": "b", "retries": True}, "argument 'retries': Expected `int`"),
    ],
)
def test_a_wrong_call_is_refused_at_enqueue_time(
    args: tuple[Any, ...], kwargs: dict[str, Any], match: str
) -> None:
    """A call that would not bind, or an argument that does not encode or validate:
    InvalidArgumentError before anything is sent, naming the argument."""
    with pytest.raises(InvalidArgumentError, match=match):
        SEND.encode_arguments(args, kwargs)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_floats_are_refused(value: float) -> None:
    """JSON has no NaN or infinity (they would come back as null): refused at enqueue."""

    def fn(x: float) -> None: ...

    with pytest.raises(InvalidArgumentError, match="argument 'x': Expected `float`, got `null`"):
        TaskSignature.of(fn).encode_arguments((value,), {})


# -- decoding arguments ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (b"not json", "the payload is not valid JSON"),
        (b'{"to": "a"', "the payload is not valid JSON"),
        (b'["a", "b"]', "the payload is not a JSON object"),
        (b'"a"', "the payload is not a JSON object"),
        (b'{"to": "a"}', "missing required argument 'subject'"),
        (b'{"to": 1, "subject": "b"}', "argument 'to': Expected `str`, got `int`$"),
        (b'{"to": "a", "subject": "b", "retries": "3"}', "argument 'retries': Expected `int`"),
    ],
)
def test_a_bad_payload_is_a_codec_error_naming_the_argument(payload: bytes, match: str) -> None:
    """Not JSON, not an object, a required argument missing, an argument of the wrong
    type: CodecError, one line, naming the task and the argument."""
    with pytest.raises(CodecError, match=match) as caught:
        SEND.decode_arguments(payload)
    assert "\n" not in str(caught.value)
    assert str(caught.value).startswith("task send_email: ")


def test_a_nested_error_names_the_argument_and_the_path() -> None:
    """Deep inside an argument, the message names the argument and where in it."""

    def place(order: Order) -> None: ...

    payload = (
        b'{"order": {"id": "5f0c3a4e-8d4b-4f7e-9a51-0c2b9f4d7e11", "placed_at":'
        b' "2026-01-01T00:00:00Z", "total": "1", "lines": [{"sku": "a", "quantity": "x",'
        b' "price": "1"}]}}'
    )
    with pytest.raises(
        CodecError, match=r"argument 'order': Expected `int`, got `str` \(at `\$\.order\.lines\[0\]"
    ):
        TaskSignature.of(place).decode_arguments(payload)


def test_unknown_keys_are_ignored() -> None:
    """A key no parameter has (a parameter since removed) is ignored: tasks queued
    before the change still run."""
    assert SEND.decode_arguments(b'{"to": "a", "subject": "b", "removed": [1, 2]}') == {
        "to": "a",
        "subject": "b",
    }


# -- msgspec Structs and pydantic models -----------------------------------------------


def test_structs_and_pydantic_models_round_trip_and_validate() -> None:
    """A msgspec Struct and a pydantic model as arguments and results; a pydantic
    validation error is a one-line CodecError naming the argument and the field."""

    def register(customer: Customer, receipt: Receipt, ctx: TaskContext) -> Customer: ...

    signature = TaskSignature.of(register)
    customer = Customer(name="Ada", since=date(2020, 1, 2), tags=["vip"], balance=Decimal("1.10"))
    receipt = Receipt(id=UUID(int=7), sent_at=datetime(2026, 1, 1, tzinfo=UTC), recipients=["a"])
    payload = signature.encode_arguments((customer,), {"receipt": receipt})
    assert signature.decode_arguments(payload) == {"customer": customer, "receipt": receipt}
    assert signature.decode_result(signature.encode_result(customer)) == customer
    bad = payload.replace(b'"since":"2020-01-02"', b'"since":"yesterday"')
    with pytest.raises(
        CodecError, match=r"argument 'customer': invalid Customer: since: "
    ) as caught:
        signature.decode_arguments(bad)
    assert "\n" not in str(caught.value)


def test_the_codec_never_imports_pydantic(monkeypatch: pytest.MonkeyPatch) -> None:
    """The codec only looks pydantic up in sys.modules (an annotation that is a model
    means the user imported it); without pydantic, everything else works."""
    source = (ROOT / "ringo_trio" / "_tasks" / "codec.py").read_text()
    assert "import pydantic" not in source
    monkeypatch.setitem(sys.modules, "pydantic", None)  # as if not installed

    def fn(x: int, y: list[Receipt]) -> dict[str, int]: ...

    signature = TaskSignature.of(fn)
    receipt = Receipt(id=UUID(int=1), sent_at=datetime(2026, 1, 1), recipients=[])
    payload = signature.encode_arguments((1, [receipt]), {})
    assert signature.decode_arguments(payload) == {"x": 1, "y": [receipt]}
    assert signature.decode_result(signature.encode_result({"a": 1})) == {"a": 1}
    with pytest.raises(InvalidArgumentError, match="does not encode"):
        signature.encode_arguments((1, [Customer(name="a", since=date(2020, 1, 1), balance=1)]), {})


# -- results ---------------------------------------------------------------------------


def test_results_none_is_nothing_and_mismatches_are_codec_errors() -> None:
    """None stores nothing; a result that is not the return annotation fails where it is
    produced (encode_result) and where it is read (decode_result)."""
    assert SEND.encode_result(None) is None
    assert SEND.decode_result(None) is None
    with pytest.raises(CodecError, match="result is not a Receipt: Expected `object`, got `str`"):
        SEND.encode_result("sent")
    with pytest.raises(CodecError, match="result does not encode"):
        SEND.encode_result(object())
    with pytest.raises(CodecError, match=r"result is not a Receipt: .*\(at `\$\.recipients`\)"):
        SEND.decode_result(
            b'{"id": "5f0c3a4e-8d4b-4f7e-9a51-0c2b9f4d7e11", "sent_at": "2026-01-01T00:00:00Z",'
            b' "recipients": "a"}'
        )
    with pytest.raises(CodecError, match="result is not valid JSON"):
        SEND.decode_result(b"{")


def test_decoders_are_built_once_per_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's hot path builds nothing: every decoder is made in `of`."""
    signature = TaskSignature.of(everything)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a decoder built per call")

    monkeypatch.setattr(msgspec.json, "Decoder", refuse)
    payload = signature.encode_arguments((), {"text": "x"} | _EVERYTHING_REQUIRED)
    signature.decode_arguments(payload)
    signature.decode_result(signature.encode_result(_EVERYTHING_REQUIRED["order"]))


_EVERYTHING_REQUIRED: dict[str, Any] = {
    "number": 1,
    "ratio": 0.5,
    "flag": True,
    "blob": b"\x00\xff",
    "moment": datetime(2026, 1, 1),
    "day": date(2026, 1, 1),
    "clock": time(12),
    "span": timedelta(seconds=3),
    "ident": UUID(int=1),
    "amount": Decimal("1"),
    "colour": Colour.RED,
    "level": Level.HIGH,
    "order": Order(UUID(int=2), datetime(2026, 1, 1), [Line("a", 1, Decimal("2"))], Decimal("2")),
    "tree": Tree("root", [Tree("leaf", [])]),
    "address": {"street": "Main", "number": 1},
    "point": Point(1.0, 2.0),
    "receipt": Receipt(id=UUID(int=3), sent_at=datetime(2026, 1, 1), recipients=[]),
    "customer": Customer(name="Ada", since=date(2020, 1, 1), balance=Decimal("0")),
    "pair": ("a", 1),
}


# -- the strategies --------------------------------------------------------------------


def test_task_arguments_takes_a_function_or_a_typed_task() -> None:
    """`task_arguments` reads a plain function, or anything with a `signature`
    (the @task decorator's TaskFunction); parameters with a default are sometimes
    left out, required ones never, the context never."""

    class TypedTask:
        signature = SEND

    seen: set[frozenset[str]] = set()

    @settings(max_examples=50, deadline=None)
    @given(a=task_arguments(send_email), b=task_arguments(TypedTask()))
    def check(a: dict[str, Any], b: dict[str, Any]) -> None:
        for kwargs in (a, b):
            assert {"to", "subject"} <= kwargs.keys() <= {"to", "subject", "retries"}
            seen.add(frozenset(kwargs))

    check()
    assert seen == {frozenset({"to", "subject"}), frozenset({"to", "subject", "retries"})}

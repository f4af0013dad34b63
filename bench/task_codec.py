"""Typed tasks' codec: msgspec vs pydantic for a task's arguments.

    python bench/task_codec.py [--repeat 5]

(needs pydantic, in the ``test`` extra; `bench/codec.py` is the wire codec's
benchmark.) µs per operation, best of ``--repeat`` samples (each >= 0.1 s;
a row's columns take their samples in turn, so load from elsewhere on a
shared machine falls on all of them alike). Two payloads:

* **2 str**: ``send_email(to: str, subject: str)``;
* **nested**: ``place(order: Order, note: str)``, ``Order`` a dataclass with a
  UUID, an aware datetime, a Decimal total and a list of 20 ``Line``
  dataclasses (str, int, Decimal).

Per library, what a producer does (*encode*: keyword arguments -> JSON bytes,
validated) and what the worker does (*decode*: bytes -> validated keyword
arguments, the dataclasses rebuilt):

* **msgspec**: the encoder over the arguments' dict, then a ``Decoder`` of a
  `msgspec.defstruct` built from the signature (the worker's decode; the
  encoder runs it too, as its validation);
* **pydantic model**: `pydantic.create_model` from the signature:
  ``Args(**kwargs).model_dump_json()`` / ``Args.model_validate_json``;
* **pydantic TypedDict**: a `pydantic.TypeAdapter` of a TypedDict built from
  the signature: ``validate_python`` + ``dump_json`` / ``validate_json``;
* **ours**: `ringo_trio._tasks.codec.TaskSignature` (msgspec, as shipped):
  ``encode_arguments`` / ``decode_arguments``.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import timeit
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID

import msgspec
import pydantic
from typing_extensions import TypedDict

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this tree's package, not an installed one
from ringo_trio._tasks.codec import TaskSignature  # noqa: E402


@dataclass
class Line:
    sku: str
    quantity: int
    price: Decimal


@dataclass
class Order:
    id: UUID
    placed_at: datetime
    lines: list[Line]
    total: Decimal


def send_email(to: str, subject: str) -> None: ...


def place(order: Order, note: str) -> None: ...


ORDER = Order(
    id=UUID("5f0c3a4e-8d4b-4f7e-9a51-0c2b9f4d7e11"),
    placed_at=datetime(2026, 12, 4, 9, 30, 12, 345678, tzinfo=timezone(timedelta(hours=1))),
    lines=[Line(sku=f"SKU-{i:05d}", quantity=i + 1, price=Decimal(f"{i}.99")) for i in range(20)],
    total=Decimal("409.80"),
)
CASES: list[tuple[str, Callable[..., Any], dict[str, Any]]] = [
    ("2 str", send_email, {"to": "a@example.org", "subject": "Welcome to Ringo"}),
    ("nested (20 lines)", place, {"order": ORDER, "note": "leave at the door"}),
]


def msgspec_pair(fields: list[tuple[str, Any]]) -> tuple[Callable[..., bytes], Callable[..., Any]]:
    args = msgspec.defstruct("Args", fields)
    decoder = msgspec.json.Decoder(args)
    encoder = msgspec.json.Encoder()
    names = [name for name, _ in fields]

    def decode(data: bytes) -> dict[str, Any]:
        decoded = decoder.decode(data)
        return {name: getattr(decoded, name) for name in names}

    def encode(kwargs: dict[str, Any]) -> bytes:
        data = encoder.encode(kwargs)
        decoder.decode(data)  # the validation
        return data

    return encode, decode


def pydantic_model_pair(
    fields: list[tuple[str, Any]],
) -> tuple[Callable[..., bytes], Callable[..., Any]]:
    model: Any = pydantic.create_model("Args", **{name: (tp, ...) for name, tp in fields})  # type: ignore[call-overload]
    names = [name for name, _ in fields]

    def decode(data: bytes) -> dict[str, Any]:
        decoded = model.model_validate_json(data)
        return {name: getattr(decoded, name) for name in names}

    def encode(kwargs: dict[str, Any]) -> bytes:
        return model(**kwargs).model_dump_json().encode()  # type: ignore[no-any-return]

    return encode, decode


def pydantic_typeddict_pair(
    fields: list[tuple[str, Any]],
) -> tuple[Callable[..., bytes], Callable[..., Any]]:
    adapter: Any = pydantic.TypeAdapter(TypedDict("Args", dict(fields)))  # type: ignore[operator]

    def encode(kwargs: dict[str, Any]) -> bytes:
        return adapter.dump_json(adapter.validate_python(kwargs))  # type: ignore[no-any-return]

    return encode, adapter.validate_json


def ours_pair(fn: Callable[..., Any]) -> tuple[Callable[..., bytes], Callable[..., Any]]:
    signature = TaskSignature.of(fn)
    return (lambda kwargs: signature.encode_arguments((), kwargs)), signature.decode_arguments


def best_us(funcs: list[Callable[[], object]], repeat: int) -> list[float]:
    """Best µs per call of each function; their samples alternate."""
    timers = [timeit.Timer(func) for func in funcs]
    numbers = []
    for timer in timers:
        number = 1
        while timer.timeit(number) < 0.1:
            number *= 2
        numbers.append(number)
    best = [float("inf")] * len(funcs)
    for _ in range(repeat):
        for index, (timer, number) in enumerate(zip(timers, numbers, strict=True)):
            best[index] = min(best[index], timer.timeit(number) / number * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    libraries = ["msgspec", "pydantic model", "pydantic TypedDict", "ours (msgspec)"]
    print(
        f"# task codec µs/op — CPython {platform.python_version()}, {platform.machine()}, "
        f"{os.cpu_count()} cores, best of {args.repeat}; msgspec {msgspec.__version__}, "
        f"pydantic {pydantic.VERSION}; {datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
    )
    print()
    print("| payload | library | encode | decode + validate | total |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name, fn, kwargs in CASES:
        fields = [(p, fn.__annotations__[p]) for p in kwargs]
        fields = [(p, eval(tp) if isinstance(tp, str) else tp) for p, tp in fields]
        pairs = [
            msgspec_pair(fields),
            pydantic_model_pair(fields),
            pydantic_typeddict_pair(fields),
            ours_pair(fn),
        ]
        for encode, decode in pairs:  # every library reads back what it wrote
            assert decode(encode(kwargs)) == kwargs, (name, encode)
        funcs: list[Callable[[], object]] = []
        for encode, decode in pairs:
            data = encode(kwargs)
            funcs += [lambda e=encode, k=kwargs: e(k), lambda d=decode, b=data: d(b)]
        timings = best_us(funcs, args.repeat)
        for index, library in enumerate(libraries):
            encode_us, decode_us = timings[2 * index], timings[2 * index + 1]
            print(
                f"| {name} | {library} | {encode_us:,.2f} | {decode_us:,.2f} "
                f"| {encode_us + decode_us:,.2f} |"
            )
        sys.stdout.flush()


if __name__ == "__main__":
    main()

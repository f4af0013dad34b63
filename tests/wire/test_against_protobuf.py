"""The shared codec against a parser nobody here wrote: Google's ``protobuf``
runtime, over modules generated from ``protos/`` at test time.

The other codec tests compare with betterproto2, whose parser is lenient
and whose classes are ours too. Here the reference is the runtime a client
generating its own stubs (docs/protocol.md) would use. On every input the
two agree: where protobuf refuses the bytes, so does the codec; where the
codec reads a message, protobuf reads the same one; and where the codec
refuses bytes protobuf accepts, the reason is one the codec documents as
stricter than protobuf (`STRICTER`), never another.
"""

from __future__ import annotations

import importlib.util
import pathlib
import re
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from types import ModuleType
from typing import Any

import betterproto2
import grpc_tools
import pytest
from google.protobuf.message import DecodeError
from grpc_tools import protoc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ringo_trio._proto.grpc.health import v1 as health
from ringo_trio._proto.ringo import v1
from ringo_trio._proto.ringo.v1 import (
    AckRequest,
    AttemptOutcome,
    EnqueueManyRequest,
    ErrorCode,
    ErrorDetail,
    Lease,
    LeasedTask,
    LeaseRef,
    NackRequest,
    Progress,
    RetryBackoff,
    Task,
    TaskAttempt,
    TaskSpec,
    TaskState,
    WorkRequest,
    WorkResponse,
    WorkResponseBatch,
    WorkResult,
)
from ringo_trio._wire.codec import WireError, decode, encode, message_classes
from ringo_trio._wire.primitives import varint
from tests._kit.wire_strategies import BETTERPROTO_DURATIONS, edits, messages

ROOT = pathlib.Path(__file__).resolve().parents[2]

#: Where the codec refuses what protobuf reads (the module docstring of
#: `ringo_trio._wire.codec`): a known field on another wire type (protobuf
#: keeps it as unknown), a group (protobuf skips it), two members of a
#: oneof (protobuf keeps the last), a message field sent twice (protobuf
#: merges them), a Timestamp or Duration outside Python's range.
STRICTER = re.compile(
    r"wire type \d does not match|unsupported wire type [34]$|more than one of"
    r"|message field sent twice|outside (datetime|timedelta)'s range"
)

_MODULES: dict[str, ModuleType] = {}


def _reference() -> dict[str, ModuleType]:
    """``queue_pb2`` and ``health_pb2``, generated once per process (protobuf's
    descriptor pool takes a .proto file once)."""
    if _MODULES:
        return _MODULES
    bundled = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory(prefix="ringo-pb2-") as out:
        files = {"queue": "ringo/v1/queue.proto", "health": "grpc_health/v1/health.proto"}
        status = protoc.main(
            [
                "protoc",
                f"-I{bundled}",
                f"-I{ROOT / 'protos'}",
                f"--python_out={out}",
                *(str(ROOT / "protos" / name) for name in files.values()),
            ]
        )
        assert status == 0
        for short, name in files.items():
            path = pathlib.Path(out) / name.replace(".proto", "_pb2.py")
            spec = importlib.util.spec_from_file_location(f"_reference_{short}_pb2", path)
            assert spec is not None
            assert spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
            _MODULES[short] = module
    return _MODULES


def _reference_class(cls: type[betterproto2.Message]) -> Any:
    module = _reference()["health" if cls.__module__ == health.__name__ else "queue"]
    return getattr(module, cls.__name__)


def _agree(cls: type[betterproto2.Message], data: bytes) -> None:
    """The codec and protobuf read ``data`` alike, or the codec is stricter
    for a documented reason."""
    ours: Any = None
    refused: WireError | None = None
    try:
        ours = decode(data, cls)
    except WireError as error:
        refused = error
    reference = _reference_class(cls)
    try:
        theirs = reference.FromString(data)
    except DecodeError:
        assert refused is not None, f"protobuf refuses {data.hex()}; the codec read {ours!r}"
        return
    if refused is not None:
        if refused.reason == "field number 0 is invalid" and not reference.DESCRIPTOR.fields:
            return  # the wire format forbids it; upb reads ``00 00`` as an empty `AckResponse`
        assert STRICTER.search(refused.reason), f"{data.hex()}: {refused}"
        return
    # Protobuf's canonical bytes of what it read, read by the codec: the
    # same message (bytes compared too, for a NaN that != itself).
    again = decode(theirs.SerializeToString(), cls)
    assert again == ours or encode(again) == encode(ours), data.hex()


_MOMENT = datetime(2026, 12, 7, 7, 30, 1, 123456, tzinfo=UTC)
_LEASE_REF = LeaseRef(task_id="01J", attempt=2, lease_token="tok")
_TASK = Task(
    id="01J",
    queue="q",
    task_type="t",
    payload=b"\x00\xff",
    unique_key="u",
    state=TaskState.LEASED,
    attempt=3,
    max_attempts=5,
    priority=-7,
    retry_backoff=RetryBackoff(
        initial=timedelta(seconds=1.5), maximum=timedelta(seconds=60), multiplier=1.5
    ),
    created_at=_MOMENT,
    updated_at=_MOMENT,
    available_at=_MOMENT,
    last_error="boom",
    progress=Progress(current=0.25, total=1.5, message="m", updated_at=_MOMENT),
    worker_id="w",
    lease_until=_MOMENT,
    result=b"r",
    limit_key="k",
    history=[
        TaskAttempt(
            attempt=1,
            worker_id="w",
            started_at=_MOMENT,
            ended_at=_MOMENT,
            outcome=AttemptOutcome.FAILED,
            error="e",
        )
    ],
)
_PUSH = WorkResponse(
    task=LeasedTask(
        task=_TASK,
        lease=Lease(
            task_id="01J",
            attempt=3,
            lease_token="tok",
            until=_MOMENT,
            ttl=timedelta(seconds=30),
        ),
    )
)
#: A message of each shape the Work stream and the unary calls carry: every
#: field of a task, both commands with a lease, a Duration of either sign, a
#: repeated message, a map, a oneof, a batch.
EXAMPLES: dict[str, betterproto2.Message] = {
    "task": _TASK,
    "ack": WorkRequest(request_id=300, ack=AckRequest(lease=_LEASE_REF, result=b"ok")),
    "nack": WorkRequest(
        request_id=1,
        nack=NackRequest(lease=_LEASE_REF, error="e", retry_delay_override=timedelta(seconds=-0.5)),
    ),
    "enqueue": EnqueueManyRequest(
        tasks=[
            TaskSpec(task_type="a", payload=b"p", delay=timedelta(seconds=3), priority=4),
            TaskSpec(task_type="b", not_before=_MOMENT, max_attempts=2),
        ]
    ),
    "error": WorkResponse(
        result=WorkResult(
            request_id=2,
            error=ErrorDetail(
                code=ErrorCode.LEASE_LOST, message="gone", metadata={"reason": "cancelled"}
            ),
        )
    ),
    "batch": WorkResponse(batch=WorkResponseBatch(responses=[_PUSH, _PUSH])),
}


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_byte_edited_reads_as_protobuf_reads_it(name: str) -> None:
    """Property (the same reading as protobuf's, at every point of a message):
    each example, cut at every byte, with every byte dropped, and with every
    byte replaced by or preceded by each byte that matters to the wire
    format, is refused by the codec wherever protobuf refuses it, read as
    protobuf reads it wherever the codec reads it, and refused where
    protobuf reads it only for a reason in `STRICTER`."""
    message = EXAMPLES[name]
    data = encode(message)
    assert decode(data, type(message)) == message
    for edited in edits(data):
        _agree(type(message), edited)


MESSAGES = [*message_classes(v1), *message_classes(health)]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(MESSAGES).flatmap(lambda cls: messages(cls, BETTERPROTO_DURATIONS)),
    st.data(),
)
def test_any_message_edited_reads_as_protobuf_reads_it(
    message: betterproto2.Message, data: st.DataObject
) -> None:
    """Property (the same reading as protobuf's): any message of any type the
    contract defines, its unknown fields included, with up to three bytes
    replaced or inserted anywhere, reads as in the test above."""
    encoded = bytearray(encode(message))
    _agree(type(message), bytes(encoded))
    for _ in range(data.draw(st.integers(1, 3))):
        index = data.draw(st.integers(0, len(encoded)))
        byte = data.draw(st.integers(0, 255))
        if index < len(encoded) and data.draw(st.booleans()):
            encoded[index] = byte
        else:
            encoded.insert(index, byte)
    _agree(type(message), bytes(encoded))


def test_what_the_codec_refuses_and_protobuf_reads_is_refused_on_purpose() -> None:
    """Examples of `STRICTER`, each read by protobuf and refused by the codec
    naming the field: a message field sent twice (protobuf merges the two: a
    Duration's seconds from one and nanos from the other), a Timestamp past
    year 9999, a known field on another wire type. And the one the codec used
    to keep that protobuf refuses: an unknown field numbered past 2**29 - 1,
    which re-encoded would be a field no peer reads."""
    twice = encode(RetryBackoff(maximum=timedelta(seconds=60))) + encode(
        RetryBackoff(maximum=timedelta(microseconds=5))
    )
    assert _reference_class(RetryBackoff).FromString(twice).maximum.ToMicroseconds() == 60_000_005
    with pytest.raises(WireError) as refused:
        decode(twice, RetryBackoff)
    assert str(refused.value) == "maximum: message field sent twice"
    lease_twice = encode(AckRequest(lease=_LEASE_REF)) + encode(AckRequest(lease=_LEASE_REF))
    with pytest.raises(WireError, match=r"^lease: message field sent twice$"):
        decode(lease_twice, AckRequest)
    nack_twice = encode(WorkRequest(nack=NackRequest(error="a"))) * 2
    with pytest.raises(WireError, match=r"^nack: message field sent twice$"):
        decode(nack_twice, WorkRequest)
    for cls, data in ((RetryBackoff, twice), (AckRequest, lease_twice), (WorkRequest, nack_twice)):
        _agree(cls, data)

    def created_at(seconds: int) -> bytes:
        body = b"\x08" + varint(seconds)
        return b"\x5a" + varint(len(body)) + body

    assert decode(created_at(2**37), Task).created_at.year == 6325
    past = created_at(2**38)  # year 10680
    _reference_class(Task).FromString(past)
    with pytest.raises(WireError, match=r"^created_at: Timestamp .* outside datetime's range$"):
        decode(past, Task)
    for key in (b"\xf8\xff\xff\xff\x0f", b"\x80\x80\x80\x80\x10"):  # 2**29 - 1, 2**29
        _agree(Task, key + b"\x01")
    with pytest.raises(DecodeError):
        _reference_class(Task).FromString(b"\x80\x80\x80\x80\x10\x01")
    with pytest.raises(WireError, match=r"field number 536870912 is past 2\*\*29 - 1"):
        decode(b"\x80\x80\x80\x80\x10\x01", Task)
    assert decode(b"\xf8\xff\xff\xff\x0f\x01", Task)._unknown_fields == b"\xf8\xff\xff\xff\x0f\x01"

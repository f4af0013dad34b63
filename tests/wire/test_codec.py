"""`ringo_trio._wire.codec`, the one codec of the SDK and the daemon, against betterproto2.

The reference is betterproto2's *parse*, not its bytes: for every message
of every type the generated modules define, ``decode(bytes(m)) == m`` and
``parse(encode(m)) == m``; malformed input is one `WireError` naming the
field path. The message types and their fields are enumerated from the
generated code, so a new RPC or field is covered without touching this file.
"""

# ruff: noqa: RUF009  (betterproto2 declares fields with a call, as its generated code does)

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import betterproto2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ringo_trio._errors import InvalidArgumentError
from ringo_trio._models import BatchResult, EnqueueResult
from ringo_trio._models import Task as ModelTask
from ringo_trio._models import TaskSpec as ModelTaskSpec
from ringo_trio._proto.google.protobuf import Timestamp
from ringo_trio._proto.grpc.health import v1 as health
from ringo_trio._proto.ringo import v1
from ringo_trio._proto.ringo.v1 import (
    AckRequest,
    CreditUpdate,
    EnqueueManyRequest,
    EnqueueManyResponse,
    ErrorCode,
    ErrorDetail,
    ExtendLeaseRequest,
    Heartbeat,
    Lease,
    LeasedTask,
    LeaseRef,
    NackRequest,
    RejectRequest,
    RequestContext,
    Task,
    TaskSpec,
    TaskState,
    WorkRequest,
    WorkRequestBatch,
    WorkResponse,
    WorkResponseBatch,
    WorkResult,
)
from ringo_trio._wire import work
from ringo_trio._wire.codec import WireError, build, decode, encode, message_classes
from ringo_trio._wire.primitives import read_seconds_nanos, varint
from ringo_trio._work._frames import PushedTask, WorkResultFrame
from tests._kit import generic_frames as generic
from tests._kit.wire_strategies import (
    BETTERPROTO_DURATIONS,
    DURATIONS,
    edits,
    message_fields,
    messages,
)

PROPERTY = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])

#: Every message type that crosses the wire, from the generated modules.
WIRE_MESSAGES = [*message_classes(v1), *message_classes(health)]


@dataclasses.dataclass(eq=False, repr=False)
class Inner(betterproto2.Message):
    """Proto types the contract does not use (yet): the codec is generic over them."""

    zigzag: int = betterproto2.field(1, betterproto2.TYPE_SINT32)
    big_zigzag: int = betterproto2.field(2, betterproto2.TYPE_SINT64)
    fixed: int = betterproto2.field(3, betterproto2.TYPE_FIXED32)
    signed_fixed: int = betterproto2.field(4, betterproto2.TYPE_SFIXED64)
    single: float = betterproto2.field(5, betterproto2.TYPE_FLOAT)
    flag: bool = betterproto2.field(6, betterproto2.TYPE_BOOL)
    maybe: int | None = betterproto2.field(7, betterproto2.TYPE_INT64, optional=True)


@dataclasses.dataclass(eq=False, repr=False)
class Kitchen(betterproto2.Message):
    numbers: list[int] = betterproto2.field(1, betterproto2.TYPE_INT64, repeated=True)
    doubles: list[float] = betterproto2.field(2, betterproto2.TYPE_DOUBLE, repeated=True)
    zigzags: list[int] = betterproto2.field(3, betterproto2.TYPE_SINT32, repeated=True)
    blobs: list[bytes] = betterproto2.field(4, betterproto2.TYPE_BYTES, repeated=True)
    names: dict[int, str] = betterproto2.field(
        5,
        betterproto2.TYPE_MAP,
        map_meta=betterproto2.map_meta(betterproto2.TYPE_INT32, betterproto2.TYPE_STRING),
    )
    inners: dict[str, Inner] = betterproto2.field(
        6,
        betterproto2.TYPE_MAP,
        map_meta=betterproto2.map_meta(betterproto2.TYPE_STRING, betterproto2.TYPE_MESSAGE),
    )
    inner: Inner | None = betterproto2.field(7, betterproto2.TYPE_MESSAGE, optional=True)
    text: str | None = betterproto2.field(8, betterproto2.TYPE_STRING, optional=True, group="pick")
    count: int | None = betterproto2.field(9, betterproto2.TYPE_UINT64, optional=True, group="pick")
    moments: list[datetime] = betterproto2.field(
        10, betterproto2.TYPE_MESSAGE, repeated=True, unwrap=lambda: Timestamp
    )
    states: dict[str, TaskState] = betterproto2.field(
        11,
        betterproto2.TYPE_MAP,
        map_meta=betterproto2.map_meta(betterproto2.TYPE_STRING, betterproto2.TYPE_ENUM),
    )


MESSAGES = [*WIRE_MESSAGES, Inner, Kitchen]

# -- strategies, built from the metadata ------------------------------------------------


def any_message(durations: st.SearchStrategy[timedelta]) -> st.SearchStrategy[Any]:
    return st.sampled_from(MESSAGES).flatmap(lambda cls: messages(cls, durations))


# -- parse-equivalence -------------------------------------------------------------------


def test_every_message_type_is_covered() -> None:
    """Meta: the strategies enumerate the generated modules (Task, WorkRequest, health)."""
    names = {cls.__name__ for cls in WIRE_MESSAGES}
    assert {"Task", "WorkRequest", "WorkResponse", "EnqueueManyRequest"} <= names
    assert "HealthCheckRequest" in names
    assert {cls.__name__ for cls in message_classes(v1)} == {
        name
        for name in v1.__all__
        if isinstance(getattr(v1, name), type)
        and issubclass(getattr(v1, name), betterproto2.Message)
    }
    for cls in MESSAGES:
        assert decode(b"", cls) == cls()


@pytest.mark.parametrize("cls", MESSAGES, ids=lambda cls: cls.__name__)
@PROPERTY
@given(data=st.data())
def test_decode_gives_back_what_betterproto_encoded(
    cls: type[betterproto2.Message], data: st.DataObject
) -> None:
    """Property: decode(bytes(m)) == m for every message of every type, and its
    unknown fields come back (re-encoding gives our encoding of m)."""
    message = data.draw(messages(cls, BETTERPROTO_DURATIONS))
    decoded = decode(bytes(message), cls)
    assert decoded == message
    assert encode(decoded) == encode(message)


@pytest.mark.parametrize("cls", MESSAGES, ids=lambda cls: cls.__name__)
@PROPERTY
@given(data=st.data())
def test_betterproto_parses_what_we_encode(
    cls: type[betterproto2.Message], data: st.DataObject
) -> None:
    """Property: betterproto2's parse(encode(m)) == m and decode(encode(m)) == m,
    negative and huge Durations included."""
    message = data.draw(messages(cls))
    encoded = encode(message)
    assert cls.parse(encoded) == message
    assert decode(encoded, cls) == message


@PROPERTY
@given(any_message(BETTERPROTO_DURATIONS), st.data())
def test_any_prefix_decodes_or_is_refused(message: betterproto2.Message, data: Any) -> None:
    """Property: any prefix of an encoding decodes or raises WireError — and a
    cut inside a top-level field is refused (betterproto2 would accept it)."""
    encoded = encode(message)
    cut = data.draw(st.integers(0, len(encoded)))
    boundaries = {0, *(_ends(encoded))}
    if cut in boundaries:
        decode(encoded[:cut], type(message))
    else:
        with pytest.raises(WireError):
            decode(encoded[:cut], type(message))


def _ends(encoded: bytes) -> Iterator[int]:
    position = 0
    for field in betterproto2.parse_fields(encoded):
        position += len(field.raw)
        yield position


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(MESSAGES), st.binary(max_size=80))
def test_any_bytes_decode_or_raise_wire_error(cls: type[betterproto2.Message], data: bytes) -> None:
    """Property: arbitrary bytes give a message of the type or one WireError,
    never another exception (the daemon maps WireError to INVALID_ARGUMENT)."""
    decoded: object = None
    with contextlib.suppress(WireError):
        decoded = decode(data, cls)
    assert decoded is None or type(decoded) is cls


@PROPERTY
@given(any_message(BETTERPROTO_DURATIONS), st.data())
def test_corrupted_encodings_decode_or_raise_wire_error(
    message: betterproto2.Message, data: Any
) -> None:
    """Property: flipping a byte of a valid encoding decodes or raises WireError."""
    encoded = bytearray(encode(message))
    if not encoded:
        return
    index = data.draw(st.integers(0, len(encoded) - 1))
    encoded[index] = data.draw(st.integers(0, 255))
    with contextlib.suppress(WireError):
        decode(bytes(encoded), type(message))


def test_two_members_of_a_oneof_are_refused() -> None:
    """Example: a request naming two commands is refused naming the oneof, where
    betterproto2 keeps both (and ``which_one_of`` then raises RuntimeError)."""
    both = bytes(WorkRequest(ack=AckRequest())) + bytes(WorkRequest(drain=v1.WorkerDrain()))
    assert str(_refused(both, WorkRequest)).startswith("body: more than one of ack, ")
    again = bytes(WorkRequest(ack=AckRequest())) + bytes(WorkRequest(ack=AckRequest()))
    assert str(_refused(again, WorkRequest)) == "ack: message field sent twice"
    # A scalar member sent twice is the last one, as protobuf reads it.
    lookups = bytes(v1.GetTaskRequest(task_id="a")) + bytes(v1.GetTaskRequest(task_id="b"))
    assert decode(lookups, v1.GetTaskRequest) == v1.GetTaskRequest(task_id="b")


def test_repeated_scalars_decode_packed_and_unpacked() -> None:
    """Example: a repeated packable field is read in both encodings (protobuf allows
    either, concatenated too); a packed run that splits a value is refused."""
    packed = encode(Kitchen(numbers=[1, -2, 300]))
    assert packed == b"\x0a\x0d\x01" + b"\xfe" + b"\xff" * 8 + b"\x01\xac\x02"
    unpacked = b"\x08\x01\x08" + b"\xfe" + b"\xff" * 8 + b"\x01"
    assert decode(unpacked + packed, Kitchen).numbers == [1, -2, 1, -2, 300]
    assert str(_refused(b"\x12\x03\x00\x00\x00", Kitchen)) == "doubles[0]: truncated field"


def test_map_entries_may_leave_out_key_or_value() -> None:
    """Example: a map entry missing its key or value holds the type's default (an
    empty message for a message value), as protobuf says."""
    assert decode(b"\x32\x03\x0a\x01k", Kitchen).inners == {"k": Inner()}
    assert decode(b"\x2a\x03\x12\x01v", Kitchen).names == {0: "v"}
    assert decode(b"\x2a\x02\x08\x07", Kitchen).names == {7: ""}
    states = decode(b"\x5a\x03\x0a\x01k", Kitchen).states
    assert states == {"k": TaskState(0)}
    assert type(states["k"]) is TaskState


def test_a_map_entry_s_key_and_value_are_named_in_its_errors() -> None:
    """Examples: an entry's key and value are known fields, so one sent with
    another wire type is refused naming it — skipped as unknown, it would
    leave the default in its place and the map silently wrong — and a fault
    inside either names which. A field the entry does not know is skipped,
    whatever its key's width."""
    value_as_varint = b"\x08\x01" + b"\x10\x05"
    error = _refused(b"\x2a\x04" + value_as_varint, Kitchen)
    assert str(error) == "names[0].value: wire type 0 does not match a map value field"
    key_as_bytes = b"\x0a\x01k" + b"\x12\x01v"
    error = _refused(b"\x2a\x06" + key_as_bytes, Kitchen)
    assert str(error) == "names[0].key: wire type 2 does not match a map key field"
    assert decode(b"\x2a\x04\x08\x01\x18\x07", Kitchen).names == {1: ""}
    # A fault inside the key or the value names which.
    error = _refused(b"\x32\x03\x0a\x01\xff", Kitchen)
    assert str(error) == "inners[0].key: string is not valid UTF-8"
    error = _refused(b"\x2a\x05\x08\x01\x12\x01\xff", Kitchen)
    assert str(error) == "names[0].value: string is not valid UTF-8"
    error = _refused(b"\x2a\x02\x08\xff", Kitchen)
    assert str(error) == "names[0].key: truncated varint"
    # A value sent twice: a string is the last one; a message is refused, as
    # a message field sent twice anywhere is.
    assert decode(b"\x2a\x08\x08\x01\x12\x01a\x12\x01b", Kitchen).names == {1: "b"}
    error = _refused(b"\x32\x09\x0a\x01k\x12\x00\x12\x02\x30\x01", Kitchen)
    assert str(error) == "inners[0].value: message field sent twice"
    # An unknown field 16's key takes two bytes, 0x80 0x01; 0x7f is a whole
    # key (field 15, wire type 7), not a varint's first byte.
    assert decode(b"\x2a\x05\x08\x01\x80\x01\x05", Kitchen).names == {1: ""}
    error = _refused(b"\x2a\x04\x7f\x08\x01\x00", Kitchen)
    assert str(error) == "names[0].#15: unsupported wire type 7"
    assert decode(b"\x2a\x07\x08\x01\x18\x07\x12\x01v", Kitchen).names == {1: "v"}


@pytest.mark.parametrize(
    "nanos", [1, 499, 500, 501, 600, 999, 1_000, 1_499, 1_500, 1_501, 2_500, 501_501, 999_999_999]
)
@pytest.mark.parametrize("seconds", [0, 7, -7])
def test_a_duration_s_nanos_round_to_microseconds_as_betterproto_does(
    seconds: int, nanos: int
) -> None:
    """Property (one reading of a Duration): nanoseconds that are not whole
    microseconds round as betterproto2's ``Duration.to_timedelta`` rounds
    them (half to even), below one microsecond too (600 ns is 1 µs, 500 ns
    is 0), whoever sent them; whole microseconds take the exact path."""
    if seconds < 0:
        nanos = -nanos  # a Duration's seconds and nanos share their sign
    body = bytes(Timestamp(seconds=seconds, nanos=nanos))  # the same two fields
    data = b"\x22" + bytes([len(body)]) + body  # NackRequest field 4, length-delimited
    expected = NackRequest.parse(data).retry_delay_override
    assert decode(data, NackRequest).retry_delay_override == expected
    assert expected == timedelta(seconds=seconds, microseconds=nanos / 1e3)


def test_negative_durations_keep_their_sign() -> None:
    """Example: -0.5 s survives our encoder (betterproto2's sends +0.5 s; not pinned)."""
    nack = NackRequest(retry_delay_override=timedelta(seconds=-0.5))
    assert NackRequest.parse(encode(nack)).retry_delay_override == timedelta(seconds=-0.5)
    assert decode(encode(nack), NackRequest).retry_delay_override == timedelta(seconds=-0.5)


def test_a_varint_holds_64_bits_and_no_more() -> None:
    """Examples: int64's, uint64's and sint64's extremes round trip through both parsers;
    a value past 64 bits either way is refused on encode (ValueError), never
    written as a varint longer than 10 bytes that every peer then refuses."""
    for value in (-(2**63), -(2**62), -1, 2**63 - 1):
        message = Inner(maybe=value)
        assert decode(encode(message), Inner) == Inner.parse(encode(message)) == message
        assert len(encode(message)) == (11 if value < 0 else 10)  # the key, 10 or 9 bytes
    for zigzag in (Inner(big_zigzag=-(2**63)), Inner(big_zigzag=2**63 - 1), Inner(zigzag=-(2**31))):
        assert decode(encode(zigzag), Inner) == Inner.parse(encode(zigzag)) == zigzag
    most = Kitchen(count=2**64 - 1)
    assert decode(encode(most), Kitchen) == Kitchen.parse(encode(most)) == most
    for past in (Inner(maybe=-(2**63) - 1), Kitchen(count=2**64)):
        with pytest.raises(ValueError, match="does not fit a 64-bit varint"):
            encode(past)


@pytest.mark.parametrize("size", [0, 1, 127, 128, 129, 16383, 16384])
def test_lengths_of_every_varint_width(size: int) -> None:
    """Examples: a string, bytes, a packed run, a map entry and nested messages
    whose lengths take one, two and three bytes round trip through our codec
    and betterproto2's, both ways. The one-byte length is written and read
    inline, apart from the general path, so the widths' edge (127 / 128) is
    where a slip would show; random messages rarely reach it."""
    text = "x" * size
    kitchen = Kitchen(
        numbers=[1] * size,
        blobs=[b"y" * size],
        names={1: text},
        inners={text: Inner(flag=True)},
        text=text,
    )
    enqueue = EnqueueManyRequest(tasks=[TaskSpec(task_type="t", payload=b"p" * size)])
    for message in (kitchen, enqueue):
        cls = type(message)
        assert decode(encode(message), cls) == message
        assert cls.parse(encode(message)) == message
        assert decode(bytes(message), cls) == message


def test_naive_datetime_is_refused_on_encode() -> None:
    with pytest.raises(ValueError, match="timezone"):
        encode(Heartbeat(server_time=datetime(2026, 1, 1)))


# -- malformed input names the field -----------------------------------------------------

_NATIVE = {
    **dict.fromkeys(("int32", "int64", "uint32", "uint64", "sint32", "sint64", "bool", "enum"), 0),
    **dict.fromkeys(("fixed64", "sfixed64", "double"), 1),
    **dict.fromkeys(("fixed32", "sfixed32", "float"), 5),
    **dict.fromkeys(("string", "bytes", "message", "map"), 2),
}
_VALUE_OF_WIRE = {0: b"\x01", 1: b"\x00" * 8, 2: b"\x00", 5: b"\x00" * 4}

FIELDS = [
    pytest.param(cls, name, meta, id=f"{cls.__name__}.{name}")
    for cls in MESSAGES
    for name, meta in message_fields(cls)
]


def _key(number: int, wire_type: int) -> bytes:
    return betterproto2.encode_varint(number << 3 | wire_type)


def _label(name: str, meta: betterproto2.FieldMetadata) -> str:
    return f"{name}[0]" if meta.repeated or meta.proto_type == "map" else name


def _refused(data: bytes, cls: type[betterproto2.Message]) -> WireError:
    with pytest.raises(WireError) as refused:
        decode(data, cls)
    assert isinstance(refused.value, ValueError)
    return refused.value


@pytest.mark.parametrize(("cls", "name", "meta"), FIELDS)
def test_malformed_fields_are_refused_naming_the_field(
    cls: type[betterproto2.Message], name: str, meta: betterproto2.FieldMetadata
) -> None:
    """Property: for every field of every message, a wrong wire type, a truncated
    value, an over-long varint, invalid UTF-8 and a malformed nested message are
    each one WireError whose path is the field."""
    native = _NATIVE[meta.proto_type]
    packable = meta.repeated and native != 2
    for wire_type in (0, 1, 2, 5):
        if wire_type == native or (packable and wire_type == 2):
            continue
        error = _refused(_key(meta.number, wire_type) + _VALUE_OF_WIRE[wire_type], cls)
        assert error.path == name
        assert error.reason == f"wire type {wire_type} does not match a {meta.proto_type} field"
    for unsupported in (3, 4, 6, 7):
        error = _refused(_key(meta.number, unsupported), cls)
        assert (error.path, error.reason) == (name, f"unsupported wire type {unsupported}")
    key = _key(meta.number, native)
    if native == 0:
        error = _refused(key + b"\xff" * 10 + b"\x01", cls)
        assert (error.path, error.reason) == (_label(name, meta), "varint longer than 10 bytes")
        assert _refused(key + b"\xff", cls).reason == "truncated varint"
    elif native == 2:
        error = _refused(key + b"\x05ab", cls)
        assert (error.path, error.reason) == (_label(name, meta), "truncated field")
    else:
        assert _refused(key + b"\x00", cls).reason == "truncated field"
    if meta.proto_type == "string":
        error = _refused(key + b"\x02a\xff", cls)
        assert (error.path, error.reason) == (_label(name, meta), "string is not valid UTF-8")
    if meta.proto_type == "message":
        error = _refused(key + b"\x02\x00\x00", cls)  # field number 0 inside
        assert error.path == _label(name, meta)
        assert str(error) == f"{_label(name, meta)}: field number 0 is invalid"
    if meta.proto_type == "map":
        error = _refused(key + b"\x03\x0a\x01\xff", cls)  # a key of one invalid byte
        assert error.path.startswith(f"{name}[0].")


def test_paths_name_nested_and_repeated_fields() -> None:
    """Examples: the path walks messages, repeated indexes and map entries."""
    good = bytes(TaskSpec(task_type="t"))
    backoff = b"\x2a\x04" + b"\x0a\x02\x08\xff"  # retry_backoff.initial: truncated varint
    data = b"\x1a" + bytes([len(good)]) + good + b"\x1a" + bytes([len(backoff)]) + backoff
    error = _refused(data, EnqueueManyRequest)
    assert str(error) == "tasks[1].retry_backoff.initial: truncated varint"
    entry = b"\x0a\x01k\x12\x01\xc3"
    error = _refused(
        b"\x12" + bytes([len(entry) + 2]) + b"\x1a" + bytes([len(entry)]) + entry, WorkResult
    )
    assert error.path == "error.metadata[0].value"
    assert _refused(b"\x00\x00", Task).path == ""
    assert str(_refused(b"\xfb\x01", Task)) == "#31: unsupported wire type 3"


def _read_time(reader: Any, data: bytes) -> Any:
    try:
        return reader(data)
    except WireError as error:
        return error.reason


def _generic_time(data: bytes) -> tuple[int, int]:
    message = decode(data, Timestamp)
    return message.seconds, message.nanos


def test_a_time_s_body_reads_as_the_generic_codec_reads_a_timestamp() -> None:
    """Property (same answer, at every point of the body): the inline reader of
    a Timestamp's or Duration's body (`read_seconds_nanos`, the innermost loop
    of every task) reads each body, edited at every byte, as the generic
    codec reads the same bytes as a ``google.protobuf.Timestamp`` message:
    the same seconds and nanos, sign and width included, or a refusal for
    the same reason (an eleventh varint byte, a cut, a wrong wire type, an
    unknown field's own faults)."""
    bodies = [
        Timestamp(seconds=1_733_556_601, nanos=123_456_789),
        Timestamp(seconds=-1, nanos=-999_999_999),  # a Duration's negative half
        Timestamp(seconds=2**63 - 1, nanos=2**31 - 1),
        Timestamp(seconds=-(2**63), nanos=-(2**31)),
    ]
    for body in bodies:
        data = bytes(body)
        assert read_seconds_nanos(data, 0, len(data)) == (body.seconds, body.nanos)
        eleven = b"\x08" + b"\xff" * 10 + b"\x01"
        for edited in (*edits(data), data + b"\x18\x05", data + eleven, eleven + data):
            inline = _read_time(lambda b: read_seconds_nanos(b, 0, len(b)), edited)
            assert inline == _read_time(_generic_time, edited), edited.hex()
    # Varints a sender wrote unsigned, one past each field's largest value:
    # read as the field's width wraps them, int64 and int32 alike.
    for seconds, nanos, read in (
        (2**63, 2**31, (-(2**63), -(2**31))),
        (2**64 - 1, 2**32 + 2**30, (-1, 2**30)),  # int32 keeps the low 32 bits
    ):
        wrapped = b"\x08" + varint(seconds) + b"\x10" + varint(nanos)
        assert read_seconds_nanos(wrapped, 0, len(wrapped)) == read
        assert _read_time(_generic_time, wrapped) == read


def test_out_of_range_timestamps_and_durations_are_refused() -> None:
    """Property: well-formed values that overflow datetime/timedelta are WireErrors
    naming the field, not OverflowError (which the daemon would report as INTERNAL)."""
    huge = b"\x08" + betterproto2.encode_varint(10**15)
    error = _refused(b"\x0a" + bytes([len(huge)]) + huge, Heartbeat)
    assert error.path == "server_time"
    assert "range" in error.reason
    error = _refused(b"\x32" + bytes([len(huge)]) + huge, v1.ClaimRequest)
    assert error.path == "wait_timeout"


def test_unknown_fields_are_kept_and_re_encoded() -> None:
    """Example: a newer peer's fields of every wire type survive a decode/encode
    round trip, each skipped by its own width; one cut short, or of a wire
    type protobuf has no value for, is refused naming its number."""
    extra = (
        _key(99, 2)
        + b"\x02hi"
        + _key(98, 0)
        + b"\x85\x01"
        + _key(97, 1)
        + bytes(range(8))
        + _key(96, 5)
        + bytes(range(4))
    )
    decoded = decode(bytes(LeaseRef(task_id="t")) + extra, LeaseRef)
    assert decoded == LeaseRef(task_id="t")
    assert encode(decoded).endswith(extra)
    known = bytes(LeaseRef(task_id="t"))
    for field, value in ((97, bytes(range(7))), (96, bytes(range(3))), (99, b"\x03hi")):
        wire_type = {97: 1, 96: 5, 99: 2}[field]
        error = _refused(known + _key(field, wire_type) + value, LeaseRef)
        assert str(error) == f"#{field}: truncated field"
    assert str(_refused(known + _key(98, 0) + b"\x85", LeaseRef)) == "#98: truncated varint"
    for unsupported in (3, 4, 6, 7):
        error = _refused(known + _key(95, unsupported), LeaseRef)
        assert str(error) == f"#95: unsupported wire type {unsupported}"


# -- the named hot frames ----------------------------------------------------------------

LEASES = messages(Lease)
TASKS = messages(Task, BETTERPROTO_DURATIONS, nan=False)


@PROPERTY
@given(messages(LeasedTask, BETTERPROTO_DURATIONS, nan=False))
def test_push_frames(leased: LeasedTask) -> None:
    """Property: the daemon's push parses back as WorkResponse(task=leased), and the
    SDK reads it as the task model plus the lease's fields (its ttl as seconds)."""
    data = work.encode_work_push(leased)
    assert WorkResponse.parse(data) == WorkResponse(task=leased)
    frame = generic.decode_work_response(data)
    if leased.task is None or leased.lease is None:
        assert frame == WorkResponse(task=leased)
        return
    assert isinstance(frame, PushedTask)
    lease = leased.lease
    expected = PushedTask(
        ModelTask.from_wire(leased.task),
        lease.task_id,
        lease.attempt,
        lease.lease_token,
        lease.worker_id,
        lease.until,
        None if lease.ttl is None else lease.ttl.total_seconds(),
    )
    assert frame == expected


@PROPERTY
@given(
    st.integers(0, 2**64 - 1),
    st.none() | messages(ErrorDetail),
    st.none() | LEASES,
)
def test_result_frames(request_id: int, error: ErrorDetail | None, lease: Lease | None) -> None:
    """Property: a result frame parses back as the WorkResult; the SDK sees the
    error's name, message and reason, and the lease's until."""
    data = work.encode_work_result(request_id, error, lease)
    expected = WorkResult(request_id=request_id, error=error, lease=lease)
    assert WorkResponse.parse(data) == WorkResponse(result=expected)
    frame = generic.decode_work_response(data)
    assert isinstance(frame, WorkResultFrame)
    assert frame.request_id == request_id
    assert frame.lease_until == (lease.until if lease else None)
    if error is None or not error.code:
        assert (frame.error_value, frame.error_code) == (0, "")
    else:
        assert frame.error_value == error.code
        assert frame.error_code == error.code.name
        assert frame.reason == error.metadata.get("reason", "")
        assert frame.error_message == error.message


def test_result_error_codes() -> None:
    """Examples: error_code is the ErrorCode name, "" for an unknown code; error_value
    tells an unknown code from no error."""
    unknown = generic.decode_work_response(
        work.encode_work_result(9, ErrorDetail(code=ErrorCode(-7)), None)
    )
    assert isinstance(unknown, WorkResultFrame)
    assert (unknown.error_code, unknown.error_value) == ("", -7)


@PROPERTY
@given(
    st.integers(0, 2**64 - 1),
    st.text(max_size=30),
    st.integers(0, 2**32 - 1),
    st.text(max_size=40),
    st.integers(0, 2**32 - 1),
    st.none() | st.integers(0, 2**32 - 1),
    DURATIONS,
    st.none() | DURATIONS,
)
def test_command_frames(
    request_id: int,
    task_id: str,
    attempt: int,
    token: str,
    available: int,
    target: int | None,
    extension: timedelta,
    delay: timedelta | None,
) -> None:
    """Property: each of the worker's commands parses back as the WorkRequest its
    docstring names (a credit target of 0 included: it is ``optional``)."""
    ref = LeaseRef(task_id=task_id, attempt=attempt, lease_token=token)
    cases = [
        (
            work.encode_credit(request_id, available, target),
            WorkRequest(
                request_id=request_id,
                credit=CreditUpdate(available=available, target_concurrency=target),
            ),
        ),
        (
            work.encode_ack(request_id, task_id, attempt, token),
            WorkRequest(request_id=request_id, ack=AckRequest(lease=ref)),
        ),
        (
            work.encode_nack(request_id, task_id, attempt, token, "boom", delay),
            WorkRequest(
                request_id=request_id,
                nack=NackRequest(lease=ref, error="boom", retry_delay_override=delay),
            ),
        ),
        (
            work.encode_reject(request_id, task_id, attempt, token, "bad"),
            WorkRequest(request_id=request_id, reject=RejectRequest(lease=ref, error="bad")),
        ),
        (
            work.encode_extend(request_id, task_id, attempt, token, extension),
            WorkRequest(
                request_id=request_id,
                extend_lease=ExtendLeaseRequest(lease=ref, extension=extension),
            ),
        ),
    ]
    for data, expected in cases:
        assert WorkRequest.parse(data) == expected
        assert decode(data, WorkRequest) == expected


@PROPERTY
@given(
    st.lists(st.tuples(TASKS, st.booleans()), max_size=4),
    st.integers(0, 2**32 - 1),
    st.integers(0, 2**32 - 1),
)
def test_enqueue_many_responses(
    results: list[tuple[Task, bool]], created: int, duplicates: int
) -> None:
    """Property: the daemon's batch reply parses back as the EnqueueManyResponse,
    and the SDK reads it as the BatchResult of the results' models."""
    data = generic.encode_enqueue_many_response(results, created, duplicates)
    reply = EnqueueManyResponse.parse(data)
    assert [(r.task, r.created) for r in reply.results] == results
    assert (reply.created_count, reply.duplicate_count) == (created, duplicates)
    assert generic.decode_enqueue_many_response(data) == BatchResult(
        results=tuple(EnqueueResult(ModelTask.from_wire(t), c) for t, c in results),
        created_count=created,
        duplicate_count=duplicates,
    )


def test_enqueue_result_without_task_is_the_sdk_error() -> None:
    """Example: a result without its task is a protocol bug, reported as the SDK does."""
    with pytest.raises(InvalidArgumentError):
        generic.decode_enqueue_many_response(b"\x0a\x00")


@PROPERTY
@given(
    st.none() | messages(RequestContext),
    st.text(max_size=20),
    st.lists(
        st.builds(
            ModelTaskSpec,
            task_type=st.text(st.characters(codec="utf-8"), min_size=1, max_size=20),
            payload=st.binary(max_size=30),
            unique_key=st.none() | st.text(st.characters(codec="utf-8"), min_size=1, max_size=20),
            priority=st.integers(-(2**31), 2**31 - 1),
        ),
        max_size=4,
    ),
)
def test_enqueue_many_requests(
    context: RequestContext | None, queue: str, specs: list[ModelTaskSpec]
) -> None:
    """Property: the SDK's batch request parses back as the request of the specs'
    wire forms, and the daemon decodes the same."""
    data = generic.encode_enqueue_many_request_from_specs(context, queue, specs)
    expected = EnqueueManyRequest(
        context=context, queue=queue, tasks=[spec.to_wire() for spec in specs]
    )
    assert EnqueueManyRequest.parse(data) == expected
    assert decode(data, EnqueueManyRequest) == expected
    assert generic.encode_enqueue_many_request(context, queue, expected.tasks) == data


def test_non_hot_frames_come_back_decoded() -> None:
    """Example: a heartbeat (or registration) reaches the reader as the WorkResponse."""
    beat = WorkResponse(heartbeat=Heartbeat(server_time=datetime(2026, 1, 1, tzinfo=UTC)))
    assert generic.decode_work_response(encode(beat)) == beat
    assert generic.decode_work_response(bytearray(encode(beat))) == beat


def test_decoded_messages_are_ordinary_dataclasses() -> None:
    """Example: what decode builds without __init__ behaves like a constructed one
    (copy, replace, repr, fresh containers)."""
    first = decode(b"", v1.ClaimRequest)
    second = decode(b"", v1.ClaimRequest)
    first.task_types.append("x")
    assert second.task_types == []
    task = decode(encode(Task(id="a", attempt=2)), Task)
    assert dataclasses.replace(task, attempt=3) == Task(id="a", attempt=3)
    assert repr(task) == repr(Task(id="a", attempt=2))


def test_build_is_the_constructor_without_its_cost() -> None:
    """Example: `build` makes the same message as the class, with fresh containers,
    and refuses a name the class does not have."""
    assert build(Task, id="a", attempt=2) == Task(id="a", attempt=2)
    first, second = build(v1.ClaimRequest), build(v1.ClaimRequest)
    first.task_types.append("x")
    assert second.task_types == []
    assert encode(build(LeaseRef, task_id="t")) == bytes(LeaseRef(task_id="t"))
    with pytest.raises(TypeError):
        build(Task, nope=1)


# -- batch frames (minor >= 10) ------------------------------------------------------


@PROPERTY
@given(
    st.lists(
        st.one_of(
            messages(LeasedTask, BETTERPROTO_DURATIONS, nan=False).map(work.encode_work_push),
            st.builds(
                work.encode_work_result,
                st.integers(0, 2**64 - 1),
                st.none() | messages(ErrorDetail),
                st.none() | LEASES,
            ),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_push_and_result_batches(elements: list[bytes]) -> None:
    """Property: a batch of encoded pushes and results parses back (betterproto2
    and the shared codec alike) as WorkResponse(batch=...) of exactly those
    frames in order, and the SDK reads it as the list of what it reads each
    frame as."""
    data = work.encode_work_response_batch(elements)
    expected = WorkResponse(
        batch=WorkResponseBatch(responses=[WorkResponse.parse(e) for e in elements])
    )
    assert WorkResponse.parse(data) == expected
    assert decode(data, WorkResponse) == expected
    singles = [generic.decode_work_response(e) for e in elements]
    if any(isinstance(single, WorkResponse) for single in singles):
        # A push without its task or lease is no push the SDK can take.
        with pytest.raises(ValueError, match=r"batch\.responses\[\d+\]"):
            generic.decode_work_response(data)
    else:
        assert generic.decode_work_response(data) == singles


@PROPERTY
@given(
    st.lists(
        st.one_of(
            st.builds(
                work.encode_ack,
                st.integers(0, 2**64 - 1),
                st.text(),
                st.integers(0, 9),
                st.text(),
            ),
            st.builds(
                work.encode_credit,
                st.integers(0, 2**64 - 1),
                st.integers(0, 2**32 - 1),
                st.none() | st.integers(0, 2**32 - 1),
            ),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_command_batches(elements: list[bytes]) -> None:
    """Property: a batch of encoded commands parses back as
    WorkRequest(batch=...) of exactly those commands in order."""
    data = work.encode_work_request_batch(elements)
    expected = WorkRequest(
        batch=WorkRequestBatch(requests=[WorkRequest.parse(e) for e in elements])
    )
    assert WorkRequest.parse(data) == expected
    assert decode(data, WorkRequest) == expected


def test_a_heartbeat_or_a_nested_batch_in_a_batch_is_refused_by_the_sdk() -> None:
    """A batch holds pushes and results only: the SDK refuses anything else
    in one (the driver then ends the stream as broken)."""
    for inner in (
        WorkResponse(heartbeat=Heartbeat()),
        WorkResponse(batch=WorkResponseBatch(responses=[WorkResponse(result=WorkResult())])),
    ):
        data = work.encode_work_response_batch([bytes(inner)])
        with pytest.raises(ValueError, match=r"batch\.responses\[0\]"):
            generic.decode_work_response(data)

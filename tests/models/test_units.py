"""Pure unit tests: endpoint parsing, option validation, value types. No sockets, no processes."""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from ringo_trio import (
    BatchResult,
    InvalidArgumentError,
    PostgresStorage,
    RetryBackoff,
    RetryTaskError,
    Ringo,
    RingoError,
    SQLiteStorage,
    TaskSpec,
    TaskState,
)
from ringo_trio._contract.limits import MAX_ERROR_BYTES, MAX_PAYLOAD_BYTES
from ringo_trio._endpoint import Endpoint, parse_endpoint
from ringo_trio._models import truncate_utf8

GOOD_ENDPOINTS = [
    ("localhost", Endpoint("localhost", 7233, False)),
    ("localhost:1234", Endpoint("localhost", 1234, False)),
    ("10.0.0.1", Endpoint("10.0.0.1", 7233, False)),
    ("10.0.0.1:80", Endpoint("10.0.0.1", 80, False)),
    ("grpc://ringo.example.com", Endpoint("ringo.example.com", 7233, False)),
    ("grpc://ringo.example.com:9000/", Endpoint("ringo.example.com", 9000, False)),
    ("http://h:1", Endpoint("h", 1, False)),
    ("grpcs://h", Endpoint("h", 7233, True)),
    ("GRPCS://h:443", Endpoint("h", 443, True)),
    ("https://h:8443/", Endpoint("h", 8443, True)),
    ("[::1]", Endpoint("::1", 7233, False)),
    ("[::1]:7000", Endpoint("::1", 7000, False)),
    ("grpcs://[2001:db8::1]:65535", Endpoint("2001:db8::1", 65535, True)),
]

BAD_ENDPOINTS = [
    ("", "required"),
    ("ftp://h", "unsupported scheme"),
    ("unix:///tmp/sock", "unsupported scheme"),
    ("grpc://", "no host"),
    (":7233", "no host"),
    ("h:", "not a number"),
    ("h:abc", "not a number"),
    ("h:0", "out of range"),
    ("h:65536", "out of range"),
    ("h:-1", "not a number"),
    ("h:1/path", "path"),
    ("h:1?x=1", "query"),
    ("user@h:1", "userinfo"),
    ("::1", "brackets"),
    ("[::1", "unterminated"),
    ("[nope]:1", "not an IPv6"),
    ("[::1]x", "unexpected"),
    ("bad host:1", "invalid host"),
    ("h:1:2", "brackets"),
]


@pytest.mark.parametrize(("text", "expected"), GOOD_ENDPOINTS)
def test_endpoint_forms(text: str, expected: Endpoint) -> None:
    """Every documented endpoint form parses to (host, port, tls); default port 7233."""
    assert parse_endpoint(text) == expected


@pytest.mark.parametrize(("text", "reason"), BAD_ENDPOINTS)
def test_invalid_endpoints_are_refused_with_the_reason(text: str, reason: str) -> None:
    """An invalid endpoint is an InvalidArgumentError naming the defect, before any I/O."""
    with pytest.raises(InvalidArgumentError, match=reason):
        parse_endpoint(text)
    with pytest.raises(InvalidArgumentError):
        Ringo.connect(text)


def test_endpoint_authority_brackets_ipv6() -> None:
    assert parse_endpoint("[::1]:5").authority == "[::1]:5"
    assert str(parse_endpoint("grpcs://h")) == "grpcs://h:7233"


def test_gzip_compression_is_refused_with_the_reason() -> None:
    """compression='gzip' is refused (grpclib cannot compress), never accepted and ignored."""
    with pytest.raises(InvalidArgumentError, match="grpclib"):
        Ringo.connect("h", compression="gzip")
    with pytest.raises(InvalidArgumentError, match="unsupported compression"):
        Ringo.connect("h", compression="brotli")  # type: ignore[arg-type]
    assert Ringo.connect("h", compression="none").compression == "none"
    assert Ringo.connect("h").compression == "none"


def test_token_must_be_header_safe() -> None:
    with pytest.raises(InvalidArgumentError):
        Ringo.connect("h", token="two\nlines")
    with pytest.raises(InvalidArgumentError):
        Ringo.connect("h", token="caf\u00e9")
    Ringo.connect("h", token="s3cret")


def test_local_options_are_validated(tmp_path: pathlib.Path) -> None:
    with pytest.raises(InvalidArgumentError, match="boolean"):
        Ringo.local(tmp_path, shared=1)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="unsupported local storage"):
        Ringo.local(tmp_path, storage="mysql")
    with pytest.raises(InvalidArgumentError, match="SQLite only"):
        Ringo.local(tmp_path, storage=PostgresStorage("postgres://x"), shared=True)
    with pytest.raises(InvalidArgumentError, match="startup_timeout"):
        Ringo.local(tmp_path, startup_timeout=0)
    with pytest.raises(InvalidArgumentError):
        Ringo.local("")
    with pytest.raises(InvalidArgumentError):
        PostgresStorage("")
    assert Ringo.local(tmp_path, storage=SQLiteStorage()).is_local
    assert not Ringo.connect("h").is_local


def test_postgres_dsn_is_not_in_repr() -> None:
    assert "hunter2" not in repr(PostgresStorage("postgres://u:hunter2@db/x"))


def test_queue_names_are_validated_and_cached() -> None:
    client = Ringo.connect("h")
    assert client.queue("a") is client.queue("a")
    with pytest.raises(InvalidArgumentError):
        client.queue("")
    with pytest.raises(InvalidArgumentError):
        client.queue("x" * 201)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"task_type": ""}, "task_type is required"),
        ({"task_type": 3}, "task_type must be a string"),
        ({"task_type": "t", "payload": 5}, "payload must be bytes"),
        ({"task_type": "t", "payload": b"x" * (MAX_PAYLOAD_BYTES + 1)}, "payload is"),
        ({"task_type": "t", "unique_key": ""}, "unique_key is required"),
        ({"task_type": "t", "unique_key": "k" * 513}, "512"),
        ({"task_type": "t", "max_attempts": -1}, "max_attempts must be between 0 and"),
        ({"task_type": "t", "max_attempts": True}, "max_attempts must be an integer"),
        ({"task_type": "t", "delay": timedelta(seconds=-1)}, "delay must not be negative"),
        ({"task_type": "t", "not_before": datetime(2030, 1, 1)}, "timezone-aware"),
        (
            {
                "task_type": "t",
                "delay": timedelta(1),
                "not_before": datetime(2030, 1, 1, tzinfo=UTC),
            },
            "at most one",
        ),
        ({"task_type": "t", "priority": 2**31}, "priority"),
        ({"task_type": "t", "retry_backoff": 3}, "RetryBackoff"),
        ({"task_type": "t", "delay": timedelta(days=366)}, "delay must be at most 365 days"),
        (
            {"task_type": "t", "not_before": datetime(9000, 1, 2, tzinfo=UTC)},
            "not_before must be at most 9000-01-01",
        ),
    ],
)
def test_task_spec_validation(kwargs: dict[str, object], match: str) -> None:
    """A malformed spec fails in the SDK with a message naming the field."""
    with pytest.raises(InvalidArgumentError, match=match):
        TaskSpec(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: RetryBackoff(initial=timedelta(days=3_000_000)), "retry_backoff.initial"),
        (lambda: RetryBackoff(maximum=timedelta(days=366)), "retry_backoff.maximum"),
        (lambda: RetryTaskError("x", delay=timedelta(days=366)), "RetryTaskError delay"),
    ],
)
def test_durations_past_the_limit_fail_in_the_sdk(build: Callable[[], object], match: str) -> None:
    """A backoff or retry delay past MAX_DELAY (365 days) fails in the SDK,
    naming the field and the limit, before anything is sent."""
    with pytest.raises(InvalidArgumentError, match=f"{match} must be at most 365 days"):
        build()


def test_task_spec_wire_round_trip() -> None:
    spec = TaskSpec(
        "t",
        payload="héllo",
        unique_key="k",
        max_attempts=3,
        retry_backoff=RetryBackoff(timedelta(seconds=2), timedelta(seconds=10), 3.0),
        delay=timedelta(seconds=5),
        priority=-4,
    )
    assert spec.payload == "héllo".encode()
    wire = spec.to_wire()
    assert (wire.task_type, wire.unique_key, wire.max_attempts, wire.priority) == ("t", "k", 3, -4)
    assert wire.delay == timedelta(seconds=5)
    assert wire.retry_backoff is not None
    assert wire.retry_backoff.multiplier == 3.0
    assert TaskSpec("t").to_wire().unique_key == ""


def test_retry_backoff_validation() -> None:
    with pytest.raises(InvalidArgumentError):
        RetryBackoff(initial=timedelta(seconds=5), maximum=timedelta(seconds=1))
    with pytest.raises(InvalidArgumentError):
        RetryBackoff(multiplier=0.5)


def test_unknown_wire_state_is_unspecified() -> None:
    assert TaskState.from_wire(3) is TaskState.SUCCEEDED
    assert TaskState.from_wire(99) is TaskState.UNSPECIFIED
    assert TaskState.DEAD.is_terminal
    assert not TaskState.LEASED.is_terminal


def test_truncate_utf8_never_splits_a_character() -> None:
    """Error text is cut to MAX_ERROR_BYTES on a character boundary."""
    text = "é" * MAX_ERROR_BYTES  # 2 bytes each
    cut = truncate_utf8(text, MAX_ERROR_BYTES)
    assert len(cut.encode()) == MAX_ERROR_BYTES
    assert truncate_utf8("aé", 2) == "a"
    assert truncate_utf8("abc", 10) == "abc"


def test_batch_result_is_immutable() -> None:
    result = BatchResult(results=(), created_count=0, duplicate_count=0)
    assert len(result) == 0
    with pytest.raises(AttributeError):
        result.created_count = 1  # type: ignore[misc]


@pytest.mark.trio
async def test_claim_and_lease_arguments_are_validated_before_io() -> None:
    """claim/nack/extend_lease validation happens before any network activity
    (this client was never connected)."""
    queue = Ringo.connect("127.0.0.1:1").queue("q")
    for kwargs in (
        {"limit": 0},
        {"limit": 1001},
        {"limit": True},
        {"wait_timeout": timedelta(seconds=-1)},
        {"wait_timeout": timedelta(minutes=5)},
        {"lease_duration": timedelta(seconds=-1)},
        {"lease_duration": 5},
        {"task_types": "email"},
        {"task_types": [""]},
        {"worker_id": ""},
    ):
        with pytest.raises(InvalidArgumentError):
            await queue.claim(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        await queue.enqueue(TaskSpec("t"), task_type="u")
    with pytest.raises(InvalidArgumentError):
        await queue.get_by_id("")
    with pytest.raises(InvalidArgumentError):
        await queue.retry("")
    with pytest.raises(RingoError, match="not started"):
        await queue.get_by_id("x")


def test_local_paths_are_validated_alike(tmp_path: pathlib.Path) -> None:
    """data_dir and daemon_path fail the same way, in the factory, before any I/O."""
    for bad in (5, b"/bin/ringod"):
        with pytest.raises(InvalidArgumentError, match="data_dir must be a path"):
            Ringo.local(bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="daemon_path must be a path"):
            Ringo.local(tmp_path, daemon_path=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="daemon_path is required"):
        Ringo.local(tmp_path, daemon_path="")
    assert Ringo.local(tmp_path, daemon_path=tmp_path / "ringod").is_local

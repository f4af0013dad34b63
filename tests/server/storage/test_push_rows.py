"""`Storage.claim_pushes`: the Work stream's claim, its frames encoded from rows.

The reference is `Storage.claim_pushes`'s default: `claim`, then the generic
encoder (`encode_work_push`) per `LeasedTask`. The engines' native versions
(`_wire.rows.push_rows`) must write the same bytes and lease the same
tasks.
"""

from __future__ import annotations

import itertools
import pathlib
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ringo_trio._proto.ringo.v1 import (
    Lease,
    LeasedTask,
    LeaseRef,
    RetryBackoff,
    Task,
    TaskState,
    WorkResponse,
)
from ringo_trio._wire.codec import decode, encode
from ringo_trio._wire.rows import MAX_DURATION_US, MAX_US, MIN_US, TaskRow
from ringo_trio._wire.rows import push_rows as encode_rows
from ringo_trio._wire.work import encode_work_push
from ringo_trio.server.storage.base import Push, Storage, lease_ttl, ttl_field
from ringo_trio.server.storage.postgres import PostgresEngine
from ringo_trio.server.storage.rows import COLS, from_us, leased, reference_push, to_us
from ringo_trio.server.storage.sqlite import SQLiteEngine
from ringo_trio.server.storage.sqlite import engine as sqlite_engine
from tests._kit.storage import ENGINE_KINDS, LEASE, SyncEngine, open_engine, spec

INT64 = st.integers(-(2**63), 2**63 - 1)
# Instants where seconds/nanos go wrong first: the epoch and just before it
# (negative seconds, positive nanos), a leap second's neighbours, the ends of
# what a Timestamp can hold and just past them (clamped), int64's ends.
EDGE_US = [
    0,
    -1,
    1,
    -999_999,
    -1_000_000,
    -1_000_001,
    999_999,
    1_483_228_799_999_999,
    1_483_228_800_000_000,
    1_483_228_800_000_001,
    MIN_US,
    MIN_US - 1,
    MAX_US,
    MAX_US + 1,
    -(2**63),
    2**63 - 1,
]
INSTANTS = st.one_of(st.sampled_from(EDGE_US), INT64, st.integers(-(10**16), 10**16))
DURATIONS = st.one_of(
    st.sampled_from([0, -1, 1, 999_999, 1_000_000, MAX_DURATION_US, MAX_DURATION_US + 1]),
    INT64,
)
TEXT = st.one_of(st.just(""), st.text(max_size=20), st.sampled_from(["ü", "日本", "\U0001f600"]))
# PostgreSQL's text holds no NUL; no engine receives a lone surrogate (the
# daemon's codec refuses text that is not UTF-8, and Python cannot encode one).
STORED_TEXT = st.one_of(
    st.just(""),
    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=20),
    st.sampled_from(["ü", "日本", "\U0001f600"]),
)
PAYLOADS = st.one_of(
    st.just(b""),
    st.binary(max_size=40),
    st.sampled_from([b"\x00", b"x" * 127, b"x" * 128, b"x" * 70_000]),
)
FLOATS = st.one_of(st.floats(), st.sampled_from([0.0, -0.0, 1.0, 2.0]), st.integers(-3, 3))
UINT32 = st.one_of(st.integers(0, 2**32 - 1), st.sampled_from([0, 1, 127, 128]))


def push_rows(rows: Sequence[Sequence[Any]]) -> list[Push]:
    """The pushes of claimed rows as the engines encode them (rows come as
    `TaskRow`s, `reference_push` their fallback)."""
    return encode_rows([TaskRow._make(r) for r in rows], reference_push)


@st.composite
def rows(draw: st.DrawFn) -> tuple[Any, ...]:
    """A claimed row in `COLS` order, now and then with what only a row
    written by hand holds (a REAL time, an unknown state, a NULL deadline)."""
    odd = draw(st.booleans()) and draw(st.booleans())

    def instant() -> Any:
        if odd and draw(st.booleans()):
            return draw(st.sampled_from([1.5e15, float("nan"), None, 2.0]))
        return draw(INSTANTS)

    progress = draw(st.booleans()) and draw(st.booleans())
    return (
        draw(st.integers(1, 2**62)),
        draw(TEXT),
        draw(st.sampled_from(["q", "ü", ""])),
        draw(st.sampled_from(["t", "", "日本"])),
        draw(PAYLOADS),
        draw(st.one_of(st.none(), TEXT)),
        draw(st.sampled_from([2, 0, 1, 3, 4, 5] + ([2.0, 99] if odd else []))),
        draw(UINT32 if not odd else st.one_of(UINT32, st.just(1.0))),
        draw(UINT32),
        draw(st.integers(-(2**31), 2**31 - 1)),
        draw(DURATIONS) if not odd else instant(),
        draw(DURATIONS),
        draw(st.one_of(st.none(), FLOATS)),
        instant(),
        draw(INSTANTS),
        instant(),
        None if draw(st.booleans()) else instant(),
        draw(st.one_of(st.none(), TEXT)),
        draw(FLOATS) if progress else None,
        draw(FLOATS) if progress else None,
        draw(TEXT) if progress else None,
        draw(INSTANTS) if progress else None,
        draw(st.one_of(st.none(), TEXT)),
        instant(),
        draw(st.one_of(st.none(), TEXT)),
        draw(st.one_of(st.none(), PAYLOADS)) if draw(st.booleans()) else None,
        draw(st.sampled_from(["", "api:tenant-42", "日本"])),
    )


def _reference(row: Sequence[Any]) -> tuple[Any, ...]:
    """What the push of `row` must be, by the generic path alone (not `Push.of`)."""
    try:
        claimed = leased(row)
        frame = encode_work_push(claimed)
    except Exception as exc:
        return ("raised", type(exc))
    lease, task = claimed.lease, claimed.task
    assert lease is not None
    assert task is not None
    size = len(task.payload)
    return (frame, lease.task_id, lease.attempt, lease.lease_token, lease.until, size)


def _fields(push: Push) -> tuple[Any, ...]:
    return (push.frame, push.task_id, push.attempt, push.lease_token, push.until, push.size)


PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(st.lists(rows(), min_size=1, max_size=5))
def test_a_row_pushes_the_bytes_and_lease_of_the_generic_encoder(
    claimed: list[tuple[Any, ...]],
) -> None:
    """Property (same bytes): for any claimed rows — every column, negative
    priorities, huge and empty payloads, unicode, instants around the epoch,
    a leap second and the clamped ends, durations past 10,000 years, NaN
    multipliers, progress, results, REAL times, unknown states, a NULL lease
    deadline — each push is the generic encoder's frame of the LeasedTask
    `rows.leased` builds from the row, with its lease and payload size, and
    a row the reference refuses is refused alike."""
    claimed = claimed + claimed[:2]  # repeats hit the per-call memos
    expected = [_reference(row) for row in claimed]
    failures = [e for e in expected if e[0] == "raised"]
    if failures:
        with pytest.raises(failures[0][1]):
            push_rows(claimed)
        return
    assert [_fields(p) for p in push_rows(claimed)] == expected


@PROPERTY
@given(rows(), INSTANTS)
def test_a_push_sent_with_its_ttl_is_the_generic_encoding_of_the_lease_with_it(
    row: tuple[Any, ...], sent_us: int
) -> None:
    """Property (same bytes, minor 11): a push joined with its ttl as of any
    send time (`Push.frame_with(ttl_field(until, now))`) is the generic
    encoder's frame of the same LeasedTask whose lease carries ``ttl =
    max(until - now, 0)`` (`lease_ttl`); the frame without it
    (`Push.frame`) is the one below minor 11, unchanged."""
    try:
        claimed = leased(row)
        before = encode_work_push(claimed)
    except Exception:
        return  # refused alike: the test above
    [push] = push_rows([row])
    assert claimed.lease is not None
    until = claimed.lease.until
    if until is None:
        return
    now = from_us(sent_us)
    assert push.frame == before
    claimed.lease.ttl = lease_ttl(until, now)
    assert claimed.lease.ttl >= timedelta(0)
    assert push.frame_with(ttl_field(until, now)) == encode_work_push(claimed)


def a_row(**columns: Any) -> TaskRow:
    """A plain claimed row (a task's first attempt, leased for 30 s), with
    `columns` in place of its own."""
    now_us = 1_764_763_200_000_000
    row = TaskRow(
        seq=1,
        id="01KBM4Z6S3C9T7X2Q8W5N0R4YH",
        queue="q",
        task_type="t",
        payload=b"p",
        unique_key="",
        state=int(TaskState.LEASED),
        attempt=1,
        max_attempts=3,
        priority=0,
        backoff_initial_us=1_000_000,
        backoff_max_us=60_000_000,
        backoff_multiplier=2.0,
        created_at=now_us,
        updated_at=now_us,
        available_at=now_us,
        finished_at=None,
        last_error="",
        progress_current=None,
        progress_total=None,
        progress_message=None,
        progress_at=None,
        worker_id="w",
        lease_until=now_us + 30_000_000,
        lease_token="token",
        result=None,
        limit_key="",
    )
    return row._replace(**columns)


def test_fields_whose_length_takes_a_second_byte_push_as_the_generic_encoder_does() -> None:
    """Property (same bytes) at every length where a varint length takes a
    second byte: payloads from 0 to 300 bytes put the payload field, the
    encoded Task and the whole frame each at 127, 128 and 129 bytes in
    turn, lease tokens from 0 to 200 characters the Lease (a one-byte
    length read as `<= 0x80` indexes past the one-byte table, one read as
    `< 0x81` writes 128 in one byte). And none of these plain rows is
    handed to the generic encoder."""
    small = {"id": "a", "created_at": 1, "updated_at": 1, "available_at": 1, "finished_at": 2}
    rows_ = [a_row(**small, payload=b"x" * n) for n in range(301)]
    rows_ += [a_row(**small, lease_token="k" * n) for n in range(201)]
    # Every one of them on the encoder's own path (its fallback raises): a
    # plain row never costs the generic encoder's ~20 µs.
    pushes = encode_rows(rows_, _explode)
    assert [_fields(p) for p in pushes] == [_reference(r) for r in rows_]
    edges = {127, 128, 129}
    assert edges <= {len(p.task or b"") for p in pushes}
    assert edges <= {len(p.lease or b"") for p in pushes}
    assert edges <= {len(encode(leased(r))) for r in rows_}


def test_times_and_durations_clamp_to_what_protobuf_can_hold() -> None:
    """The clamps are protobuf's own bounds, not only the same on both
    paths: a Timestamp holds 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z,
    a Duration up to 315,576,000,000 s (10,000 years). A stored moment or
    duration at a bound is pushed as itself, one past it as the bound."""
    micro = timedelta(microseconds=1)
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    first, last = datetime(1, 1, 1, tzinfo=UTC), datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
    longest = timedelta(seconds=315_576_000_000)
    low, high, most = (first - epoch) // micro, (last - epoch) // micro, longest // micro
    cases = [
        (a_row(created_at=high, backoff_initial_us=most, backoff_max_us=most), last, longest),
        (
            a_row(created_at=high + 1, backoff_initial_us=most + 1, backoff_max_us=2**63 - 1),
            last,
            longest,
        ),
        (a_row(created_at=low, backoff_initial_us=1, backoff_max_us=1), first, micro),
        (
            a_row(created_at=low - 1, backoff_initial_us=-1, backoff_max_us=-(2**63)),
            first,
            timedelta(0),
        ),
    ]
    for row, moment, duration in cases:
        [push] = push_rows([row])
        assert push.frame == _reference(row)[0]
        leased_task = decode(push.frame, WorkResponse).task
        assert leased_task is not None
        assert leased_task.task is not None
        assert leased_task.task.created_at == moment
        backoff = leased_task.task.retry_backoff
        assert backoff is not None
        assert backoff.maximum == duration


def test_a_push_without_a_task_or_a_lease_is_the_generic_encoding() -> None:
    """Property (same bytes) off the claim's path: `Push.of` a LeasedTask
    that lacks its task, its lease or both writes the generic encoder's
    frame, with and without a ttl (joined into the lease, dropped when
    there is none), and counts nothing it does not have: no lease token,
    deadline, attempt or task id without a lease, no payload without a
    task."""
    until = datetime(2026, 12, 3, 12, 0, 30, tzinfo=UTC)
    task = Task(id="a", queue="q", task_type="t", payload=b"x" * 200)
    lease = Lease(task_id="a", attempt=2, lease_token="k", worker_id="w", until=until)
    ttl = timedelta(seconds=30)
    lease_with_ttl = Lease(
        task_id="a", attempt=2, lease_token="k", worker_id="w", until=until, ttl=ttl
    )
    for leased_task, counted in [
        (LeasedTask(task=task), ("", 0, None, None, 200)),
        (LeasedTask(lease=lease), ("a", 2, "k", until, 0)),
        (LeasedTask(), ("", 0, None, None, 0)),
        (LeasedTask(task=task, lease=lease), ("a", 2, "k", until, 200)),
    ]:
        push = Push.of(leased_task)
        assert push.frame == encode_work_push(leased_task)
        assert (push.task_id, push.attempt, push.lease_token, push.until, push.size) == counted
        with_ttl = LeasedTask(
            task=leased_task.task,
            lease=None if leased_task.lease is None else lease_with_ttl,
        )
        assert push.frame_with(ttl_field(until, until - ttl)) == encode_work_push(with_ttl)


# -- on the engines -----------------------------------------------------------------

_queues = itertools.count()


def plant(engine: SyncEngine, task_id: str, columns: dict[str, Any]) -> None:
    """Overwrite columns of one task row behind the engine's back."""
    raw = engine.raw
    names = list(columns)
    if isinstance(raw, SQLiteEngine):
        sets = ", ".join(f"{name} = ?" for name in names)
        raw._conn().execute(f"UPDATE tasks SET {sets} WHERE id = ?", (*columns.values(), task_id))
    else:
        assert isinstance(raw, PostgresEngine)
        sets = ", ".join(f"{name} = ${i}" for i, name in enumerate(names, 1))
        sql = f"UPDATE {raw._sql.tasks} SET {sets} WHERE id = ${len(names) + 1}"
        engine.run(raw._live_pool().execute(sql, *columns.values(), task_id))


def stored_row(engine: SyncEngine, task_id: str) -> Sequence[Any]:
    raw = engine.raw
    if isinstance(raw, SQLiteEngine):
        row: Sequence[Any] = (
            raw._conn().execute(f"SELECT {COLS} FROM tasks WHERE id = ?", (task_id,)).fetchone()
        )
        return row
    assert isinstance(raw, PostgresEngine)
    sql = f"SELECT {COLS} FROM {raw._sql.tasks} WHERE id = $1"
    return engine.run(raw._live_pool().fetchrow(sql, task_id))  # type: ignore[no-any-return]


NOWS = st.one_of(
    st.sampled_from(
        [
            datetime(1970, 1, 1, tzinfo=UTC),
            datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
            datetime(2016, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
            datetime(2026, 12, 3, 12, tzinfo=UTC),
        ]
    ),
    st.datetimes(datetime(1900, 1, 1), datetime(2200, 1, 1), timezones=st.just(UTC)),
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    now=NOWS,
    payload=PAYLOADS,
    unique_key=STORED_TEXT,
    priority=st.integers(-(2**31), 2**31 - 1),
    created=INSTANTS,
    available_before=st.one_of(st.sampled_from([0, 1, 10**6]), st.integers(0, 2**62)),
    finished=st.one_of(st.none(), INSTANTS),
    # SQLite stores a NaN as NULL, refused by NOT NULL (row-level tests cover NaN).
    backoff=st.tuples(DURATIONS, DURATIONS, st.floats(allow_nan=False) | st.just(0.0)),
    last_error=STORED_TEXT,
    progress=st.one_of(st.none(), st.tuples(st.floats(), st.floats(), STORED_TEXT, INSTANTS)),
    attempt=st.integers(0, 10**6),
    max_attempts=UINT32,
)
def test_an_engines_pushes_are_the_generic_encoding_of_its_claimed_rows(
    engine: SyncEngine,
    now: datetime,
    payload: bytes,
    unique_key: str,
    priority: int,
    created: int,
    available_before: int,
    finished: int | None,
    backoff: tuple[int, int, float],
    last_error: str,
    progress: tuple[float, float, str, int] | None,
    attempt: int,
    max_attempts: int,
) -> None:
    """Property (same bytes, on the real engines: SQLite's and asyncpg's own
    row values): a task with any stored values claimed by `claim_pushes` is
    pushed as exactly `encode_work_push` of the LeasedTask the engine's
    `claim` builds from that row (`rows.leased` of the row as stored)."""
    queue = f"push{next(_queues)}"
    [outcome] = engine.enqueue(queue, [spec(payload=payload, unique_key=unique_key)], now)
    task_id = outcome.task.id
    columns: dict[str, Any] = {
        "priority": priority,
        "created_at": created,
        "available_at": max(to_us(now) - available_before, -(2**63)),
        "finished_at": finished,
        "backoff_initial_us": backoff[0],
        "backoff_max_us": backoff[1],
        "backoff_multiplier": backoff[2],
        "last_error": last_error,
        "attempt": attempt,
        "max_attempts": max_attempts,
    }
    if progress is not None:
        for name, value in zip(
            ("progress_current", "progress_total", "progress_message", "progress_at"),
            progress,
            strict=True,
        ):
            columns[name] = value
    plant(engine, task_id, columns)
    [push] = engine.claim_pushes(queue, [], 5, "w-ü", LEASE, now)
    assert _fields(push) == _reference(stored_row(engine, task_id))


def _claimed(pushes: list[Push]) -> list[tuple[LeasedTask, Push]]:
    """Each push's decoded LeasedTask, with the parts that differ between
    two queues (id, queue, lease token) blanked."""
    out = []
    for push in pushes:
        task = decode(push.frame, WorkResponse).task
        assert task is not None
        assert task.task is not None
        assert task.lease is not None
        assert (
            task.lease.task_id,
            task.lease.attempt,
            task.lease.lease_token,
            task.lease.until,
        ) == (
            push.task_id,
            push.attempt,
            push.lease_token,
            push.until,
        )
        assert push.size == len(task.task.payload)
        task.task.id = task.task.queue = task.lease.task_id = task.lease.lease_token = ""
        out.append((task, push))
    return out


@pytest.mark.parametrize("limit", [1, 3, 7, 20])
def test_claim_pushes_leases_what_claim_leases(engine: SyncEngine, limit: int) -> None:
    """Property (same leases): the native `claim_pushes` leases the same
    tasks in the same order (priority, then available_at, then enqueue
    order, across types), with the same attempts, worker and deadline, as
    the reference (`claim` then `encode_work_push`) on an identical queue;
    each push's fields are its frame's lease; the leases are live (an ack
    with a push's ref takes effect), and a lease given up comes back."""
    now = datetime(2026, 12, 3, 12, tzinfo=UTC)
    n = next(_queues)
    queues = (f"native{n}", f"reference{n}")
    specs = [
        spec(
            "ab"[i % 2],
            payload=bytes([i]) * i,
            priority=(i * 7) % 5 - 2,
            delay=timedelta(seconds=i % 3) if i % 4 == 0 else None,
            retry_backoff=RetryBackoff(initial=timedelta(seconds=i)),
        )
        for i in range(12)
    ]
    for queue in queues:
        engine.enqueue(queue, specs, now - timedelta(seconds=1))
    later = now + timedelta(milliseconds=1500)
    native = engine.claim_pushes(queues[0], ["a", "b"], limit, "w1", LEASE, later)
    reference = engine.run(
        Storage.claim_pushes(engine.raw, queues[1], ["a", "b"], limit, "w1", LEASE, later)
    )
    assert 0 < len(native) <= limit
    assert [t for t, _ in _claimed(native)] == [t for t, _ in _claimed(reference)]
    first = native[0]
    assert first.lease_token is not None
    ref = LeaseRef(task_id=first.task_id, attempt=first.attempt, lease_token=first.lease_token)
    assert engine.ack(ref, later).id == first.task_id
    rest = [
        LeaseRef(task_id=p.task_id, attempt=p.attempt, lease_token=p.lease_token)
        for p in native[1:]
    ]
    assert engine.release(rest, later) == len(rest)
    assert engine.claim_pushes(queues[0], [], 0, "w1", LEASE, later) == []


def test_a_failed_sqlite_claim_pushes_leases_nothing(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Property (one transaction, as `claim`): SQLite encodes the pushes
    inside the claim's transaction, so when encoding fails the tasks stay
    PENDING with their attempt unspent, and the next claim gets them."""
    now = datetime(2026, 12, 3, 12, tzinfo=UTC)
    with open_engine(ENGINE_KINDS["sqlite"], tmp_path) as sqlite:
        outcomes = sqlite.enqueue("q", [spec(), spec()], now)
        with monkeypatch.context() as m:
            m.setattr(sqlite_engine, "push_rows", _explode)
            with pytest.raises(RuntimeError, match="injected"):
                sqlite.claim_pushes("q", [], 5, "w", LEASE, now)
        for outcome in outcomes:
            task = sqlite.get("q", task_id=outcome.task.id)
            assert (task.state, task.attempt) == (TaskState.PENDING, 0)
        pushes = sqlite.claim_pushes("q", [], 5, "w", LEASE, now)
        assert [p.task_id for p in pushes] == [o.task.id for o in outcomes]


def _explode(*args: Any) -> Any:
    raise RuntimeError("injected failure after the write")

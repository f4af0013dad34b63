"""Engines for the storage tests: every engine kind (SQLite in a scratch dir, PostgreSQL
in a schema of a shared database) behind a synchronous facade on a private asyncio
loop, and the helpers the storage test modules share (specs, claims, lease refs,
brute-force listings, a full store, a kill -9 child, PostgreSQL notifications).

The fixtures built on these live in tests/server/storage/conftest.py."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import asyncpg  # type: ignore[import-untyped]
from hypothesis.stateful import RuleBasedStateMachine

from ringo_trio._proto.ringo.v1 import LeasedTask, LeaseRef, Task, TaskSpec, TaskState
from ringo_trio.server.clock import ManualClock
from ringo_trio.server.storage.base import (
    Storage,
    TaskFilter,
)
from ringo_trio.server.storage.limits import Rule
from ringo_trio.server.storage.postgres import PostgresEngine
from ringo_trio.server.storage.postgres.pool import SERVER_SETTINGS
from ringo_trio.server.storage.sqlite import SQLiteEngine


@dataclass(frozen=True)
class EngineKind:
    """How to build one engine kind.

    `make(scratch)` must return an engine over the same data every time it is
    called with the same scratch dir (tests reopen). `source(scratch)` is a
    Python expression that builds that engine in another process, after
    `imports` has run (the kill -9 durability test).
    """

    name: str
    make: Callable[[pathlib.Path], Storage]
    source: Callable[[pathlib.Path], str]
    imports: str


def schema_for(scratch: pathlib.Path) -> str:
    """The PostgreSQL schema that stands for a scratch dir."""
    return "t_" + hashlib.sha256(str(scratch).encode()).hexdigest()[:20]


def postgres_kind(dsn: str) -> EngineKind:
    """PostgreSQL engines on database `dsn`, one schema per scratch dir."""
    return EngineKind(
        name="postgres",
        make=lambda scratch: PostgresEngine(dsn, schema=schema_for(scratch)),
        source=lambda scratch: f"PostgresEngine({dsn!r}, schema={schema_for(scratch)!r})",
        imports="from ringo_trio.server.storage.postgres import PostgresEngine",
    )


ENGINE_KINDS: dict[str, EngineKind] = {
    "sqlite": EngineKind(
        name="sqlite",
        make=lambda scratch: SQLiteEngine(scratch / "ringo.db"),
        source=lambda scratch: f"SQLiteEngine(pathlib.Path({str(scratch / 'ringo.db')!r}))",
        imports="from ringo_trio.server.storage.sqlite import SQLiteEngine",
    ),
}


ENGINE_NAMES = ["postgres", "sqlite"]


class SyncEngine:
    """Calls the engine's coroutines to completion on a private asyncio loop."""

    def __init__(self, kind: EngineKind, scratch: pathlib.Path, runner: asyncio.Runner) -> None:
        self.kind = kind
        self.scratch = scratch
        self._runner = runner
        self.raw: Storage = kind.make(scratch)
        self.run(self.raw.open())

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return self._runner.run(coro)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self.raw, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self.run(method(*args, **kwargs))

        return call

    def reopen(self) -> None:
        """Close and open a fresh engine over the same data."""
        self.run(self.raw.close())
        self.raw = self.kind.make(self.scratch)
        self.run(self.raw.open())


@contextlib.contextmanager
def open_engine(kind: EngineKind, scratch: pathlib.Path) -> Iterator[SyncEngine]:
    """An open engine of `kind` on its own loop, closed afterwards."""
    with asyncio.Runner() as runner:
        sync = SyncEngine(kind, scratch, runner)
        try:
            yield sync
        finally:
            sync.run(sync.raw.close())


def assert_within_rate(starts: Sequence[int], rule: Rule) -> None:
    """No window of W µs holds more of `starts` (µs, one key's, in order)
    than ``burst + (W + late credit) / interval``, the late credit being
    ``min(interval / 2, 20 ms)`` — docs/limits.md's bound, written here
    from the docs, not from `storage.limits`."""
    interval = rule.interval_us
    credit = min(interval / 2, 20_000)
    for i, first in enumerate(starts):
        for j in range(i, len(starts)):
            allowed = rule.burst + (starts[j] - first + credit) / interval
            assert j - i + 1 <= allowed + 1e-9, (starts, rule)


class EngineStateMachine(RuleBasedStateMachine):
    """A hypothesis state machine over one fresh engine of `kind` (a scratch
    dir of its own, its own loop) and a manual clock, closed and removed at
    teardown: what the storage models (test_model.py, test_limits_model.py)
    share."""

    def __init__(self, kind: EngineKind) -> None:
        super().__init__()
        self.scratch = pathlib.Path(tempfile.mkdtemp(prefix="ringo-model-"))
        self.runner = asyncio.Runner()
        self.engine = SyncEngine(kind, self.scratch, self.runner)
        self.clock = ManualClock()

    def teardown(self) -> None:
        try:
            self.engine.run(self.engine.raw.close())
        finally:
            self.runner.close()
            shutil.rmtree(self.scratch, ignore_errors=True)

    @property
    def now(self) -> datetime:
        return self.clock.now()


LEASE = timedelta(seconds=30)


def spec(task_type: str = "t", **fields: Any) -> TaskSpec:
    return TaskSpec(task_type=task_type, **fields)


def ref_of(leased: LeasedTask) -> LeaseRef:
    assert leased.lease is not None
    return LeaseRef(
        task_id=leased.lease.task_id,
        attempt=leased.lease.attempt,
        lease_token=leased.lease.lease_token,
    )


def claim_one(
    engine: SyncEngine, now: datetime, queue: str = "q", lease: timedelta = LEASE
) -> LeasedTask:
    leased = engine.claim(queue, [], 1, "w1", lease, now)
    assert len(leased) == 1, leased
    return leased[0]  # type: ignore[no-any-return]


# Runs in a child process: every mutation kind, each awaited to completion
# (committed), then the last task's bytes are printed and the process kills
# itself with SIGKILL -- no close(), no checkpoint, no atexit.
_CHILD = """
import asyncio, os, pathlib, signal, sys
from datetime import UTC, datetime, timedelta
from ringo_trio._proto.ringo.v1 import LeaseRef, TaskSpec
{imports}

def ref(lt):
    return LeaseRef(task_id=lt.lease.task_id, attempt=lt.lease.attempt,
                    lease_token=lt.lease.lease_token)

async def main():
    engine = {source}
    await engine.open()
    now = datetime(2030, 1, 1, tzinfo=UTC)
    tasks = {{}}
    outs = await engine.enqueue(
        "q", [TaskSpec(task_type="t", unique_key=f"k{{i}}", payload=bytes([i]))
              for i in range(7)], now)
    outs += await engine.enqueue("q", [TaskSpec(task_type="t", unique_key="k0")], now)
    assert not outs[-1].created
    leased = await engine.claim("q", [], 6, "w", timedelta(seconds=30), now)
    tasks["acked"] = await engine.ack(ref(leased[0]), now)
    tasks["nacked"] = await engine.nack(ref(leased[1]), "e", timedelta(hours=1), now)
    tasks["rejected"] = await engine.reject(ref(leased[2]), "r", now)
    await engine.extend_lease(ref(leased[3]), timedelta(minutes=9), now)
    await engine.report_progress(ref(leased[3]), 3, 4, "p", now)
    tasks["leased"] = await engine.get("q", task_id=leased[3].task.id)
    await engine.ack(ref(leased[5]), now)
    tasks["retried"] = await engine.retry("q", now, task_id=leased[5].task.id)
    await engine.expire_leases(now + timedelta(seconds=30))
    tasks["expired"] = await engine.get("q", task_id=leased[4].task.id)
    tasks["pending"] = await engine.get("q", unique_key="k6")
    # The last token, so the parent can prove the lease itself survived.
    print("token", leased[3].lease.lease_token)
    for name, task in tasks.items():
        print(name, bytes(task).hex())
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)

asyncio.run(main())
"""


def run_and_kill(kind: EngineKind, engine: SyncEngine) -> dict[str, str]:
    script = _CHILD.format(imports=kind.imports, source=kind.source(engine.scratch))
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    return dict(line.split(" ", 1) for line in proc.stdout.splitlines())


def make_full(engine: SyncEngine, *, pages_left: int = 0, on_task: str | None = None) -> None:
    """No room from now on; with `on_task`, room runs out when a write reaches
    that task: SQLite after `pages_left` more pages, PostgreSQL at an update
    of that row."""
    raw = engine.raw
    if isinstance(raw, SQLiteEngine):
        db = raw._conn()
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        db.execute(f"PRAGMA max_page_count = {pages + pages_left}")
        return
    assert isinstance(raw, PostgresEngine)
    schema = raw._sql.tasks.rpartition(".")[0]
    when = "INSERT OR UPDATE" if on_task is None else "UPDATE"
    row = "" if on_task is None else f"WHEN (NEW.id = '{on_task}')"
    engine.run(
        raw._live_pool().execute(
            f"""
            CREATE FUNCTION {schema}.disk_full() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION 'could not extend file: No space left on device'
                USING ERRCODE = 'disk_full'; END $$;
            CREATE TRIGGER disk_full BEFORE {when} ON {raw._sql.tasks}
                FOR EACH ROW {row} EXECUTE FUNCTION {schema}.disk_full();
            """
        )
    )


def make_room(engine: SyncEngine) -> None:
    raw = engine.raw
    if isinstance(raw, SQLiteEngine):
        raw._conn().execute("PRAGMA max_page_count = 1073741823")
        return
    assert isinstance(raw, PostgresEngine)
    engine.run(raw._live_pool().execute(f"DROP TRIGGER disk_full ON {raw._sql.tasks}"))


PENDING, LEASED, SUCCEEDED, DEAD, CANCELLED = (
    int(TaskState.PENDING),
    int(TaskState.LEASED),
    int(TaskState.SUCCEEDED),
    int(TaskState.DEAD),
    int(TaskState.CANCELLED),
)


def walk(
    engine: SyncEngine,
    queue: str = "q",
    where: TaskFilter | None = None,
    *,
    newest_first: bool = False,
    limit: int = 7,
    between: Any = None,
) -> list[Task]:
    """Every page of a listing, calling `between()` after each page."""
    where = where or TaskFilter()
    seen: list[Task] = []
    after = None
    while True:
        page = engine.list_tasks(queue, where, newest_first=newest_first, after=after, limit=limit)
        assert len(page.tasks) <= limit
        seen += page.tasks
        if page.next_after is None:
            return seen
        after = page.next_after
        if between is not None:
            between()


def brute(engine: SyncEngine, queue: str = "q") -> list[Task]:
    """Every task of the queue, read one by one (the reference)."""
    ids = [t.id for t in walk(engine, queue, limit=1000)]
    return [engine.get(queue, task_id=i) for i in ids]


def counts_of(engine: SyncEngine, queue: str, now: datetime) -> dict[str, dict[int, int]]:
    stats = engine.queue_stats(queue, now, by_type=True)
    return {
        t.task_type: {
            s: n
            for s, n in zip(
                (PENDING, LEASED, SUCCEEDED, DEAD, CANCELLED),
                (t.pending, t.leased, t.succeeded, t.dead, t.cancelled),
                strict=True,
            )
            if n
        }
        for t in stats.by_type
    }


def expected_counts(tasks: list[Task]) -> dict[str, dict[int, int]]:
    out: dict[str, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    for t in tasks:
        out[t.task_type][int(t.state)] += 1
    return {k: dict(v) for k, v in out.items()}


GUARD = 60  # seconds: every test here uses sockets


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run `coro` on a fresh asyncio loop under the socket guard."""

    async def guarded() -> Any:
        async with asyncio.timeout(GUARD):
            return await coro

    return asyncio.run(guarded())


@contextlib.asynccontextmanager
async def engines(dsn: str, schema: str, n: int, **kw: Any) -> AsyncIterator[list[PostgresEngine]]:
    opened = [PostgresEngine(dsn, schema=schema, **kw) for _ in range(n)]
    try:
        for e in opened:
            await e.open()
        yield opened
    finally:
        for e in opened:
            await e.close()


class Notes:
    """What a watch reported, with a way to wait for the next report."""

    def __init__(self) -> None:
        self.seen: list[str | None] = []
        self._changed = asyncio.Event()

    def __call__(self, queue: str | None) -> None:
        self.seen.append(queue)
        self._changed.set()

    async def wait_for(self, queue: str | None, count: int = 1) -> None:
        while self.seen.count(queue) < count:
            self._changed.clear()
            await self._changed.wait()


@contextlib.asynccontextmanager
async def watching(engine: PostgresEngine) -> AsyncIterator[Notes]:
    notes = Notes()
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(engine.watch(notes))
        try:
            await notes.wait_for(None)  # listening
            yield notes
        finally:
            task.cancel()


def wal_header(scratch: pathlib.Path) -> tuple[int, int]:
    """(mxFrame, nBackfill) of the WAL-index header in the -shm file, read
    without a connection (asking through one could checkpoint)."""
    raw = (scratch / "ringo.db-shm").read_bytes()[:100]
    return int.from_bytes(raw[16:20], sys.byteorder), int.from_bytes(raw[96:100], sys.byteorder)


def checkpointed(scratch: pathlib.Path) -> bool:
    logged, backfilled = wal_header(scratch)
    return logged > 0 and backfilled == logged


def undo_limits(schema: str | None = None) -> list[str]:
    """The statements that undo the keyed-limits migration (minor 13), the
    attempt history's (minor 14), the typed claim order's index (schema 15
    on both engines), the unkeyed one (schema 16) and the typed limited ones
    (schema 17): for a test that makes a store look as an older daemon left
    it, whose migrations then run again. `schema`: PostgreSQL's
    (quoted), None for SQLite."""
    s = "" if schema is None else f"{schema}."
    return [
        f"DROP INDEX {s}tasks_pending_type",
        f"DROP INDEX {s}tasks_pending_unkeyed",
        f"DROP INDEX {s}tasks_pending_unkeyed_type",
        f"DROP INDEX {s}tasks_limit_pending_type",
        f"DROP INDEX {s}tasks_limit_pending",
        f"DROP INDEX {s}tasks_limit_leased",
        f"DROP TABLE {s}limit_rules",
        f"DROP TABLE {s}limit_keys",
        f"ALTER TABLE {s}tasks DROP COLUMN limit_key",
        # Minor 14's attempt history.
        f"ALTER TABLE {s}tasks DROP COLUMN leased_at",
        f"ALTER TABLE {s}tasks DROP COLUMN leased_by",
        f"ALTER TABLE {s}tasks DROP COLUMN history",
    ]


def generic_plans(engine: SyncEngine, statements: Mapping[str, tuple[str, str]]) -> dict[str, str]:
    """EXPLAIN of each PostgreSQL statement with its arguments (SQL
    literals), by name: the generic plan a daemon connection opened now
    would run (the engine's connection settings: `force_generic_plan`)."""

    async def explain() -> dict[str, str]:
        conn = await asyncpg.connect(engine.raw.dsn, server_settings=SERVER_SETTINGS)  # type: ignore[attr-defined]
        try:
            plans = {}
            for name, (statement, args) in statements.items():
                await conn.execute(f"PREPARE {name} AS {statement}")
                rows = await conn.fetch(f"EXPLAIN EXECUTE {name} ({args})")
                plans[name] = "\n".join(r[0] for r in rows)
            return plans
        finally:
            await conn.close()

    return engine.run(explain())  # type: ignore[no-any-return]

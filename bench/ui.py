"""Dashboard page times at 1,000,000 tasks, on both engines (``ringod --ui-listen``).

Run: ``python bench/ui.py [--tasks N] [--repeat R] [--engine sqlite|postgres|both]
[--postgres ADMIN_DSN]`` (default 1,000,000 tasks, 30 repeats, both engines).

Fills the store as `bench/operate.py` does (one queue ``big`` of N tasks, 70%
SUCCEEDED, 5% DEAD, 1% LEASED, the rest PENDING, plus 200 queues of 5 tasks),
then runs a daemon in this process with the dashboard on and times each page
end to end from an HTTP client thread on one keep-alive connection (request
sent → whole body read): the overview, a queue's first page, a deep page
(cursor at 90% of the queue), a filtered page (DEAD only), a task's detail (and one of
the 20 % of tasks given three failed attempts in their history), a fragment
poll, and the workers page with 20 Work streams registered. Prints
p50 / p99 / max in milliseconds, and a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import pathlib
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import operate  # the fill and state mix of the inspection bench

from ringo_trio._proto.ringo.v1 import (
    AttemptOutcome,
    GetTaskRequest,
    ListOrder,
    ListTasksRequest,
    TaskState,
)
from ringo_trio.server.daemon import Daemon, DaemonConfig
from ringo_trio.server.rpc.work import WorkStreams
from ringo_trio.server.storage.base import Storage
from ringo_trio.server.storage.postgres import PostgresEngine
from ringo_trio.server.storage.sqlite import SQLiteEngine

PAGES = [
    ("overview (/queues, 100 of 201 queues)", "overview"),
    ("queue, first page (50 tasks)", "first"),
    ("queue, deep page (cursor at 90%)", "deep"),
    ("queue, filtered (DEAD only)", "dead"),
    ("task detail", "detail"),
    ("task detail, 3 attempts in its history", "history"),
    ("queue counts fragment (the 1 s poll)", "fragment"),
    ("workers (20 Work streams)", "workers"),
]


# Every fifth task of the big queue (20 %) gets three ended attempts, each
# with an error as HTTP clients log them: a compact JSON body of ~300
# characters without a space.
_ERROR = json.dumps({"error": {"code": 503, "detail": "x" * 260}}, separators=(",", ":"))
HISTORY = [
    [
        n,
        f"worker-{n}",
        1_700_000_000_000_000 + n * 10**6,
        1_700_000_000_500_000 + n * 10**6,
        int(AttemptOutcome.FAILED),
        _ERROR,
    ]
    for n in (1, 2, 3)
]


def history_sql(table: str, placeholder: str) -> str:
    return (
        f"UPDATE {table} SET history = {placeholder}, leased_by = 'worker-3',"
        f" leased_at = 1700000003000000 WHERE queue = 'big' AND seq % 5 = 0"
    )


class _FakeSession:
    """What the workers page reads of a stream's session."""

    capacity = 64
    credit = 60
    outstanding = 4


class _FakeStream:
    """What the workers page reads of a registered Work stream."""

    def __init__(self, n: int) -> None:
        self._worker_id = f"worker-{n}"
        self._queue = "big"
        self._session = _FakeSession()
        self._host = f"host-{n % 4}"
        self._pid = 1000 + n
        self._since = 0.0
        self.succeeded = 1234 * n
        self.failed = 5 * n


def _client(port: int, paths: dict[str, str], repeat: int) -> dict[str, list[float]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    out: dict[str, list[float]] = {}
    try:
        for key, path in paths.items():
            samples = []
            for i in range(repeat + 1):
                started = time.perf_counter()
                conn.request("GET", path)
                response = conn.getresponse()
                body = response.read()
                elapsed = (time.perf_counter() - started) * 1000
                if response.status != 200:
                    raise RuntimeError(f"{path}: {response.status} {body[:200]!r}")
                if i:  # the first one warms caches
                    samples.append(elapsed)
            out[key] = samples
    finally:
        conn.close()
    return out


async def measure(engine: Storage, tasks: int, repeat: int) -> list[tuple[str, tuple[float, ...]]]:
    config = DaemonConfig(host="127.0.0.1", port=0, ui_listen=("127.0.0.1", 0))
    daemon = Daemon(config, engine)
    stop = asyncio.Event()
    ready = asyncio.Event()
    results: dict[str, list[float]] = {}

    async def drive() -> None:
        await ready.wait()
        dashboard = daemon.dashboard
        assert dashboard is not None
        assert daemon.ui_port is not None
        streams: WorkStreams = daemon.queue_service.work_streams
        streams._live.update(_FakeStream(n) for n in range(20))  # type: ignore[arg-type]
        service = daemon.queue_service
        first = await service.list_tasks(
            ListTasksRequest(
                context=dashboard.context(),
                queue="big",
                order=ListOrder.NEWEST_FIRST,
                page_size=50,
            )
        )
        task_id = first.tasks[0].id
        with_history = ""
        for listed in first.tasks:
            answer = await service.get_task(
                GetTaskRequest(context=dashboard.context(), queue="big", task_id=listed.id)
            )
            if answer.task is not None and len(answer.task.history) == len(HISTORY):
                with_history = listed.id
                break
        assert with_history, "no task of the first page has the filled history"
        # A newest-first cursor 90% of the way down: below seq N/10.
        from ringo_trio.server.rpc.operate import _filters_digest, _task_token
        from ringo_trio.server.storage.base import TaskFilter

        deep_token = _task_token(tasks // 10, _filters_digest("big", TaskFilter(), True))
        paths = {
            "overview": "/queues",
            "first": "/queues/big",
            "deep": f"/queues/big?page_token={deep_token}",
            "dead": f"/queues/big?state={TaskState.DEAD.name}",
            "detail": f"/queues/big/tasks/{task_id}",
            "history": f"/queues/big/tasks/{with_history}",
            "fragment": "/queues/big?fragment=counts",
            "workers": "/workers",
        }
        out: dict[str, list[float]] = {}

        def run() -> None:
            out.update(_client(daemon.ui_port or 0, paths, repeat))

        await asyncio.to_thread(run)
        streams._live.clear()
        results.update(out)
        stop.set()

    async with asyncio.TaskGroup() as tg:
        tg.create_task(drive())
        await daemon.serve(stop, lambda _d: ready.set())
    rows = []
    for name, key in PAGES:
        samples = sorted(results[key])
        p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))]
        figures = (statistics.median(samples), p99, samples[-1])
        print(f"  {name}: p50 {figures[0]:.1f} ms, p99 {figures[1]:.1f} ms", flush=True)
        rows.append((name, figures))
    return rows


async def run_sqlite(tasks: int, repeat: int) -> list[tuple[str, tuple[float, ...]]]:
    with tempfile.TemporaryDirectory(prefix="ringo-ui-") as scratch:
        path = pathlib.Path(scratch) / "ringo.db"
        engine = SQLiteEngine(path)
        await engine.open()
        try:
            await operate.fill(engine, tasks)
            await operate.mix_sqlite(engine)
            db = engine._db
            assert db is not None
            with db:
                db.execute(history_sql("tasks", "?"), (json.dumps(HISTORY),))
        finally:
            await engine.close()
        return await measure(SQLiteEngine(path), tasks, repeat)


async def run_postgres(dsn: str, tasks: int, repeat: int) -> list[tuple[str, tuple[float, ...]]]:
    schema = "bench_ui_" + secrets.token_hex(4)
    engine = PostgresEngine(dsn, schema=schema)
    await engine.open()
    try:
        await operate.fill(engine, tasks)
        await operate.mix_postgres(engine)
        async with engine._conn() as conn:
            await conn.execute(history_sql(engine._sql.tasks, "$1::jsonb"), json.dumps(HISTORY))
        await engine.close()
        return await measure(PostgresEngine(dsn, schema=schema), tasks, repeat)
    finally:
        await engine.open()
        async with engine._conn() as conn:
            await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        await engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--engine", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--postgres", default=operate.DEFAULT_DSN)
    args = parser.parse_args()
    tables: dict[str, Any] = {}
    runs: dict[str, Callable[[], Any]] = {}
    if args.engine in ("sqlite", "both"):
        runs["SQLite"] = lambda: run_sqlite(args.tasks, args.repeat)
    if args.engine in ("postgres", "both"):
        runs["PostgreSQL"] = lambda: run_postgres(args.postgres, args.tasks, args.repeat)
    for name, run in runs.items():
        print(f"{name}:", flush=True)
        tables[name] = asyncio.run(run())
    names = list(tables)
    print()
    print(f"{args.tasks:,} tasks, {args.repeat} requests per page, ms (p50 / p99):")
    print()
    print("| page | " + " | ".join(f"{n} p50 / p99 (ms)" for n in names) + " |")
    print("| --- |" + " --- |" * len(names))
    for i, (page, _) in enumerate(PAGES):
        cells = [f"{t[i][1][0]:.1f} / {t[i][1][1]:.1f}" for t in tables.values()]
        print(f"| {page} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

"""`Ringo.local` on a user-managed PostgreSQL database, end to end.

Real daemon processes on a fresh database per test (`postgres_dsn`); every
test runs under a ``fail_after`` guard and names its property.
"""

from __future__ import annotations

import pathlib
import subprocess
from collections.abc import Iterator

import pytest
import trio

from ringo_trio import PostgresStorage, Ringo, Task, TaskContext, TaskState
from tests._kit.postgres import fresh_database

pytestmark = pytest.mark.trio


@pytest.fixture
def password_dsn() -> Iterator[tuple[str, str]]:
    """A DSN of a fresh database that carries a password (trust auth ignores
    it), and that password: what must never show in the process list."""
    with fresh_database() as dsn:
        password = "s3cret-in-dsn"
        yield dsn.replace("postgresql://postgres@", f"postgresql://postgres:{password}@"), password


def proc_text(pid: int, what: str) -> str:
    return pathlib.Path(f"/proc/{pid}/{what}").read_bytes().replace(b"\0", b" ").decode()


def tables_in(dsn: str, schema: str) -> int:
    out = subprocess.run(
        ["psql", dsn, "-qAtXc", f"SELECT count(*) FROM pg_tables WHERE schemaname = '{schema}'"],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    return int(out)


async def test_local_daemon_stores_in_the_database_and_keeps_the_dsn_off_argv(
    tmp_path: pathlib.Path, password_dsn: tuple[str, str]
) -> None:
    """Properties: `Ringo.local(data_dir, storage=PostgresStorage(dsn,
    schema=...))` runs a private daemon on that database — tasks enqueue,
    a worker runs them, they end SUCCEEDED — with its tables in the given
    schema and nothing in the data dir; the DSN (and its password) reaches
    the daemon through its environment, never its command line, which every
    user of the machine can read; and the tasks outlive the daemon, because
    they live in the database: a second private daemon sees them."""
    dsn, password = password_dsn
    storage = PostgresStorage(dsn, schema="ringo_app")
    assert password not in repr(storage)
    with trio.fail_after(60):
        async with Ringo.local(tmp_path / "d", storage=storage) as client:
            pid = client.daemon_pid
            assert pid is not None
            cmdline = proc_text(pid, "cmdline")
            assert password not in cmdline
            assert "--data-dir" not in cmdline
            assert f"RINGO_POSTGRES_DSN={dsn}" in proc_text(pid, "environ")
            queue = client.queue("emails")
            ids = [(await queue.enqueue(task_type="send")).task.id for _ in range(20)]
            done: list[str] = []
            all_done = trio.Event()

            async def handle(task: Task, ctx: TaskContext) -> None:
                done.append(task.id)
                if len(done) == len(ids):
                    all_done.set()

            worker = queue.worker(handle, concurrency=4)
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                await all_done.wait()
                await worker.close()
            assert sorted(done) == sorted(ids)
        assert tables_in(dsn, "ringo_app") > 0
        assert tables_in(dsn, "public") == 0
        assert list((tmp_path / "d").iterdir()) == []
        async with Ringo.local(tmp_path / "other", storage=storage) as again:
            queue = again.queue("emails")
            for task_id in ids:
                assert (await queue.get_by_id(task_id)).state is TaskState.SUCCEEDED

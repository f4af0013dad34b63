"""Scale-out: several ``ringod`` processes on one PostgreSQL database.

Every test gets a fresh database (`postgres_dsn`), starts real daemon
processes on it (``python -m ringo_trio.server --postgres DSN``, all at once,
so their schema migrations race as they would in a real rollout) and runs an
SDK `Worker` on each, connected with `Ringo.connect`. Each test names the
property a user relies on in its docstring and runs under a ``fail_after``
guard; nothing here asserts on timing.
"""

from __future__ import annotations

import subprocess
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from dataclasses import replace
from datetime import timedelta
from urllib.parse import urlsplit, urlunsplit

import pytest
import trio

from ringo_trio import (
    RetryBackoff,
    Ringo,
    RingoClient,
    Task,
    TaskContext,
    TaskQueue,
    TaskSpec,
    TaskState,
    UnavailableError,
    Worker,
)
from ringo_trio.testing import DaemonProcess
from tests._kit.postgres import ADMIN_DSN, DatabaseProxy, daemons_off_loop, postgres_daemons

pytestmark = pytest.mark.trio

QUEUE = "scaleout"
# Short leases so that work a dead daemon (or a dropped stream) held comes
# back quickly; a tiny backoff so an expired attempt is retried at once.
LEASE = timedelta(seconds=1)
SPEC = TaskSpec(
    "t",
    max_attempts=50,
    retry_backoff=RetryBackoff(
        initial=timedelta(milliseconds=20), maximum=timedelta(milliseconds=100)
    ),
)

Handler = Callable[[Task, TaskContext], Awaitable[None]]


def psql(sql: str) -> str:
    """Run `sql` as the server's admin (never through a daemon)."""
    done = subprocess.run(
        ["psql", ADMIN_DSN, "-v", "ON_ERROR_STOP=1", "-qAtXc", sql],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    )
    return done.stdout


def psql_at(dsn: str, sql: str) -> None:
    """Run `sql` in the daemons' database, behind their backs."""
    subprocess.run(["psql", dsn, "-v", "ON_ERROR_STOP=1", "-qXc", sql], check=True, timeout=30)


def database_of(dsn: str) -> str:
    return urlsplit(dsn).path.lstrip("/")


def drop_connections(dsn: str) -> int:
    """Terminate every server backend of the daemons' database (pool and
    LISTEN connections alike), as a database failover or a network cut would."""
    out = psql(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
        f" WHERE datname = '{database_of(dsn)}' AND pid <> pg_backend_pid()"
    )
    return int(out.strip() or 0)


async def enqueue(queue: TaskQueue, n: int) -> list[str]:
    result = await queue.enqueue_many([SPEC] * n)
    return [r.task.id for r in result.results]


async def wait_succeeded(queue: TaskQueue, ids: Sequence[str]) -> None:
    """Until every task is SUCCEEDED (polled; the caller's fail_after bounds it)."""
    left = set(ids)
    while left:
        for task_id in list(left):
            try:
                task = await queue.get_by_id(task_id)
            except UnavailableError:
                break  # the daemon lost its database for a moment
            if task.state is TaskState.SUCCEEDED:
                left.discard(task_id)
        if left:
            await trio.sleep(0.05)


async def _run_until_closed(worker: Worker, *, task_status: trio.TaskStatus[None]) -> None:
    # A worker whose daemon died gives up after its bounded reconnects: that
    # is how it "just stops", not a test failure.
    with suppress(UnavailableError):
        await worker.run(task_status=task_status)


@asynccontextmanager
async def workers_on(
    clients: Sequence[RingoClient], handle_for: Callable[[int], Handler], concurrency: int = 4
) -> AsyncIterator[list[Worker]]:
    """One registered worker per client (``handle_for(i)`` handles for client i)."""
    workers: list[Worker] = []
    async with trio.open_nursery() as nursery:
        try:
            for i, client in enumerate(clients):
                worker = client.queue(QUEUE).worker(
                    handle_for(i), concurrency=concurrency, lease_duration=LEASE
                )
                workers.append(worker)
                await nursery.start(_run_until_closed, worker)
            yield workers
        finally:
            with trio.CancelScope(shield=True), trio.fail_after(30):
                for worker in workers:
                    await worker.close()


@asynccontextmanager
async def clients_of(daemons: Sequence[DaemonProcess]) -> AsyncIterator[list[RingoClient]]:
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(Ringo.connect(d.endpoint)) for d in daemons]


@pytest.mark.parametrize("count", [2, 3])
async def test_daemons_on_one_database_share_the_work_and_run_each_task_once(
    postgres_dsn: str, count: int
) -> None:
    """Properties: with 2 and 3 daemons on one database (started at once on
    an empty one: concurrent migrations are safe), tasks enqueued through any
    daemon are all SUCCEEDED, every handler ran exactly once per task — no
    daemon pushes a task another daemon already leased — and every daemon
    served work."""
    runs: Counter[str] = Counter()
    served = [0] * count

    def handle_for(i: int) -> Handler:
        async def handle(task: Task, ctx: TaskContext) -> None:
            runs[task.id] += 1
            served[i] += 1
            # Slow enough that no single worker can drain the queue alone.
            await trio.sleep(0.01)

        return handle

    with postgres_daemons(postgres_dsn, count) as daemons, trio.fail_after(60):
        async with clients_of(daemons) as clients, workers_on(clients, handle_for):
            ids = []
            for client in clients:
                ids += await enqueue(client.queue(QUEUE), 80)
            await wait_succeeded(clients[-1].queue(QUEUE), ids)
    assert sorted(runs) == sorted(ids)
    assert set(runs.values()) == {1}, "a task ran more than once"
    assert all(served), f"a daemon served no work: {served}"


async def test_an_enqueue_on_one_daemon_wakes_an_idle_worker_on_another(
    postgres_dsn: str,
) -> None:
    """Property: a task enqueued through daemon A reaches an idle worker on
    daemon B through B's database watch (LISTEN/NOTIFY) — with the safety
    poll and the reaper's backstop pushed out of reach, nothing else could
    wake B, so delivery at all is the proof (a liveness check: fail_after
    bounds it, no latency is asserted)."""
    handled: list[str] = []
    arrived = trio.Event()

    def handle_for(i: int) -> Handler:
        async def handle(task: Task, ctx: TaskContext) -> None:
            handled.append(task.id)
            arrived.set()

        return handle

    slow = ["--safety-poll", "3600"]
    with postgres_daemons(postgres_dsn, 2, slow) as (a, b), trio.fail_after(30):
        async with clients_of([a, b]) as (via_a, via_b), workers_on([via_b], handle_for):
            for _ in range(5):
                arrived = trio.Event()
                # Let B's dispatcher settle into its wait (a claim found
                # nothing; the previous task's ack left no scheduled moment).
                await trio.sleep(0.2)
                [task_id] = await enqueue(via_a.queue(QUEUE), 1)
                await arrived.wait()
                assert handled[-1] == task_id
            await wait_succeeded(via_a.queue(QUEUE), handled)


async def test_sigkill_of_a_daemon_mid_run_loses_nothing(postgres_dsn: str) -> None:
    """Properties: when one of two daemons dies by SIGKILL while its worker
    holds leases, nothing is lost — its leases expire and the surviving
    daemon re-delivers those tasks, so every task ends SUCCEEDED; the
    survivor keeps serving throughout."""
    runs: Counter[str] = Counter()
    on_victim = trio.Event()
    served = [0, 0]

    def handle_for(i: int) -> Handler:
        async def handle(task: Task, ctx: TaskContext) -> None:
            runs[task.id] += 1
            served[i] += 1
            if i == 0 and served[0] >= 20:
                on_victim.set()
            await trio.sleep(0.02)

        return handle

    with postgres_daemons(postgres_dsn, 2) as (victim, survivor), trio.fail_after(60):
        async with clients_of([victim, survivor]) as clients:
            ids = await enqueue(clients[1].queue(QUEUE), 400)
            async with workers_on(clients, handle_for):
                await on_victim.wait()
                victim.kill()
                await wait_succeeded(clients[1].queue(QUEUE), ids)
    assert sorted(runs) == sorted(ids)
    assert served[1] > 0


async def test_daemons_recover_when_their_database_connections_are_dropped(
    postgres_dsn: str,
) -> None:
    """Properties: every server connection of two daemons is terminated
    twice under load (as a failover would); the daemons stay up, reconnect
    (pool and LISTEN), workers reconnect, and every task still ends
    SUCCEEDED. Afterwards an enqueue on A still wakes an idle worker on B
    with the safety poll out of reach: the watch re-established itself."""
    runs: Counter[str] = Counter()
    started = [0]
    # A drop once a quarter and once half of the tasks have started.
    milestones = {100: trio.Event(), 200: trio.Event()}
    late: list[str] = []
    late_arrived = trio.Event()
    phase = ["load"]

    def handle_for(i: int) -> Handler:
        async def handle(task: Task, ctx: TaskContext) -> None:
            runs[task.id] += 1
            started[0] += 1
            if started[0] in milestones:
                milestones[started[0]].set()
            if phase[0] == "late" and i == 1:
                late.append(task.id)
                late_arrived.set()
                return
            await trio.sleep(0.01)

        return handle

    slow = ["--safety-poll", "3600"]
    with postgres_daemons(postgres_dsn, 2, slow) as daemons, trio.fail_after(60):
        async with clients_of(daemons) as clients:
            ids = await enqueue(clients[0].queue(QUEUE), 200)
            ids += await enqueue(clients[1].queue(QUEUE), 200)
            async with workers_on(clients, handle_for):
                for milestone in milestones.values():
                    await milestone.wait()
                    assert drop_connections(postgres_dsn) > 0
                await wait_succeeded(clients[0].queue(QUEUE), ids)
            assert set(ids) <= set(runs)
            assert all(daemon.running for daemon in daemons)
            # Only B's worker from now on: A's client enqueues.
            phase[0] = "late"
            async with workers_on(clients[1:], lambda i: handle_for(1)):
                await trio.sleep(0.2)
                [task_id] = await enqueue(clients[0].queue(QUEUE), 1)
                await late_arrived.wait()
                assert late == [task_id]


async def test_the_safety_poll_delivers_work_no_notification_announced(
    postgres_dsn: str,
) -> None:
    """Property: a task that became claimable in the database without any
    notification (what a lost NOTIFY leaves behind) still reaches an idle
    worker on another daemon, by the safety poll (here 0.2 s; a liveness
    check). The task is enqueued an hour ahead, so the worker's daemon sleeps
    until then; it is made due behind every daemon's back with SQL."""
    arrived = trio.Event()

    def handle_for(i: int) -> Handler:
        async def handle(task: Task, ctx: TaskContext) -> None:
            arrived.set()

        return handle

    with (
        postgres_daemons(postgres_dsn, 2, ["--safety-poll", "0.2"]) as (a, b),
        trio.fail_after(30),
    ):
        async with clients_of([a, b]) as (via_a, via_b), workers_on([via_b], handle_for):
            later = await via_a.queue(QUEUE).enqueue(replace(SPEC, delay=timedelta(hours=1)))
            task_id = later.task.id
            # B has seen the enqueue (a notification) and gone back to sleep.
            await trio.sleep(0.3)
            # The engine's table (public.tasks, times in microseconds).
            psql_at(postgres_dsn, f"UPDATE tasks SET available_at = 0 WHERE id = '{task_id}'")
            await arrived.wait()
            await wait_succeeded(via_b.queue(QUEUE), [task_id])


async def test_a_database_outage_is_unavailable_and_the_daemon_recovers(
    postgres_dsn: str,
) -> None:
    """Properties: while its database cannot be reached (every connection cut,
    new ones refused), a daemon answers calls that need it UNAVAILABLE
    (`UnavailableError`, which a caller can act on; never INTERNAL), stays
    up, and its worker keeps reconnecting instead of giving up; once the
    database is back the daemon recovers by itself (no restart) and every
    task succeeds."""
    target = urlsplit(postgres_dsn)
    proxy = DatabaseProxy(target.hostname or "127.0.0.1", target.port or 5432)
    done: list[str] = []

    def handle_for(i: int) -> Handler:
        async def handle(task: Task, ctx: TaskContext) -> None:
            done.append(task.id)

        return handle

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(proxy.run)
            proxied = urlunsplit(
                target._replace(netloc=f"{target.username}@127.0.0.1:{proxy.port}")
            )
            async with daemons_off_loop(proxied, 1) as (daemon,), clients_of([daemon]) as (client,):
                queue = client.queue(QUEUE)
                ids = await enqueue(queue, 20)
                proxy.down()
                with pytest.raises(UnavailableError):
                    await queue.enqueue(SPEC)
                async with workers_on([client], handle_for):
                    # The worker rides out the outage (its streams end
                    # UNAVAILABLE, it reconnects) ...
                    await trio.sleep(1.0)
                    assert daemon.running
                    assert not done
                    await proxy.up()
                    # ... and works once the database is back.
                    await wait_succeeded(queue, ids)
                ids += await enqueue(queue, 1)
            nursery.cancel_scope.cancel()
    assert set(ids[:-1]) <= set(done)

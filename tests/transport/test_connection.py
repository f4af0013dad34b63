"""Connection behaviour: auth, negotiation, session expiry, recovery.

Against real daemons, except session expiry, which only waits for the TTL and
runs on the in-process daemon in virtual time.
"""

from __future__ import annotations

import pathlib
from datetime import timedelta

import pytest
import trio
import trio.testing

from ringo_trio import (
    NotFoundError,
    Ringo,
    TaskSpec,
    TaskState,
    UnauthenticatedError,
    UnavailableError,
)
from ringo_trio.testing import DaemonProcess, RingoTestEnv, spawn_daemon
from tests._kit.processes import free_port, kill_local_daemon, pid_alive

pytestmark = pytest.mark.trio


async def test_bearer_token(tmp_path: pathlib.Path) -> None:
    """Property: the daemon's --token is satisfied by token=...; a wrong or missing
    token is UnauthenticatedError (and the client leaves nothing running)."""
    with spawn_daemon(tmp_path, token="s3cret") as daemon, trio.fail_after(20):
        async with Ringo.connect(daemon.endpoint, token="s3cret") as client:
            assert (await client.queue("q").enqueue(task_type="t")).created
        with pytest.raises(UnauthenticatedError):
            async with Ringo.connect(daemon.endpoint, token="wrong"):
                pass
        with pytest.raises(UnauthenticatedError):
            async with Ringo.connect(daemon.endpoint):
                pass


async def test_protocol_downgrade(tmp_path: pathlib.Path) -> None:
    """Property: against a daemon serving minor 0 the client negotiates minor 0 and
    every minor-0 operation works."""
    with spawn_daemon(tmp_path, protocol_minor=0) as daemon, trio.fail_after(20):
        async with Ringo.connect(f"grpc://{daemon.endpoint}/") as client:
            assert client.protocol_minor == 0
            queue = client.queue("q")
            await queue.enqueue(task_type="t", unique_key="k")
            [leased] = await queue.claim()
            await leased.ack()
            assert (await queue.get_by_unique_key("k")).state is TaskState.SUCCEEDED


async def test_expired_session_is_renegotiated_transparently(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Property: after the session TTL the next call is rejected by the daemon, the client
    renegotiates and the call succeeds — once, with the new token."""
    # Only the TTL's clock matters here: the in-process daemon's follows trio's.
    with trio.fail_after(20):
        async with RingoTestEnv.start(session_ttl=timedelta(seconds=0.5)) as env:
            client = env.client
            queue = client.queue("q")
            first_token = client._connection.session.token
            await queue.enqueue(task_type="t", unique_key="a")
            await env.sleep(0.8)
            result = await queue.enqueue(task_type="t", unique_key="b")
            assert result.created
            assert client._connection.session.token != first_token
            # The renegotiated mutation ran exactly once.
            batch = await queue.enqueue_many([TaskSpec("t", unique_key=k) for k in "ab"])
            assert batch.duplicate_count == 2


async def test_restarted_daemon_forgets_sessions(daemon: DaemonProcess) -> None:
    """A daemon restarted on the same address rejects the old token; the client
    renegotiates and carries on; data survived the restart."""
    with trio.fail_after(30):
        async with Ringo.connect(daemon.endpoint) as client:
            queue = client.queue("q")
            task = (await queue.enqueue(task_type="t", unique_key="k")).task
            await trio.to_thread.run_sync(daemon.restart)
            assert (await queue.get_by_id(task.id)).unique_key == "k"
            assert (await queue.enqueue(task_type="t", unique_key="k2")).created


async def test_remote_unavailable_mutation_raises_then_recovers(daemon: DaemonProcess) -> None:
    """Property: with the daemon SIGKILLed a mutation raises UnavailableError (after bounded
    recovery) and is not replayed later; once the daemon is back the next call works."""
    with trio.fail_after(40):
        async with Ringo.connect(daemon.endpoint) as client:
            queue = client.queue("q")
            await queue.enqueue(task_type="t", unique_key="before")
            daemon.kill()
            start = trio.current_time()
            with pytest.raises(UnavailableError, match=daemon.endpoint):
                await queue.enqueue(task_type="t", unique_key="lost")
            assert trio.current_time() - start < 10
            await trio.to_thread.run_sync(daemon.start)
            assert (await queue.enqueue(task_type="t", unique_key="after")).created
            with pytest.raises(NotFoundError):
                await queue.get_by_unique_key("lost")
            assert (await queue.get_by_unique_key("before")).unique_key == "before"


async def test_connection_refused_is_unavailable(tmp_path: pathlib.Path) -> None:
    with trio.fail_after(20):
        with pytest.raises(UnavailableError, match="unavailable"):
            async with Ringo.connect(f"127.0.0.1:{free_port()}"):
                pass


async def test_local_kill_mutation_not_replayed_daemon_restarted(tmp_path: pathlib.Path) -> None:
    """Property (local): kill -9 of the daemon mid-run → the in-flight mutation raises
    UnavailableError and is not replayed although the client restarted the daemon inside
    that very call; every acked and enqueued task survived; the next call works."""
    with trio.fail_after(40):
        async with Ringo.local(tmp_path) as client:
            queue = client.queue("q")
            await queue.enqueue_many([TaskSpec("t", unique_key=f"k{i}") for i in range(10)])
            for leased in await queue.claim(4):
                await leased.ack()
            old_pid = kill_local_daemon(client)
            with pytest.raises(UnavailableError):
                await queue.enqueue(task_type="t", unique_key="in-flight")
            # Recovery already happened inside the failed call: a new daemon serves.
            assert client.daemon_pid not in (None, old_pid)
            assert not pid_alive(old_pid)
            with pytest.raises(NotFoundError):
                await queue.get_by_unique_key("in-flight")
            states = [(await queue.get_by_unique_key(f"k{i}")).state for i in range(10)]
            assert states.count(TaskState.SUCCEEDED) == 4
            assert states.count(TaskState.PENDING) == 6
            # Nothing extra appeared: only the 6 pending tasks are claimable.
            assert len(await queue.claim(100)) == 6


async def test_local_get_is_resent_after_restart(tmp_path: pathlib.Path) -> None:
    """Property (local): get_by_id across a daemon crash returns the task transparently."""
    with trio.fail_after(40):
        async with Ringo.local(tmp_path) as client:
            queue = client.queue("q")
            task = (await queue.enqueue(task_type="t")).task
            kill_local_daemon(client)
            assert (await queue.get_by_id(task.id)).id == task.id


async def test_local_concurrent_failures_restart_once(tmp_path: pathlib.Path) -> None:
    """Property: calls failing together at a crash restart the daemon once, not per call."""
    with trio.fail_after(40):
        async with Ringo.local(tmp_path) as client:
            queue = client.queue("q")
            task = (await queue.enqueue(task_type="t")).task
            kill_local_daemon(client)
            await trio.sleep(0.1)
            async with trio.open_nursery() as nursery:
                for _ in range(8):
                    nursery.start_soon(queue.get_by_id, task.id)
            assert client._connection._daemon_restarts == 1


async def test_local_restart_budget_is_three(tmp_path: pathlib.Path) -> None:
    """Property: a crashing daemon is restarted at most 3 times; then calls raise
    UnavailableError quickly and no daemon is started again."""
    with trio.fail_after(60):
        async with Ringo.local(tmp_path) as client:
            queue = client.queue("q")
            task = (await queue.enqueue(task_type="t")).task
            pids = set()
            for _ in range(3):
                pids.add(kill_local_daemon(client))
                assert (await queue.get_by_id(task.id)).id == task.id
            assert len(pids) == 3
            last = kill_local_daemon(client)
            with pytest.raises(UnavailableError):
                await queue.get_by_id(task.id)
            assert client.daemon_pid == last
            assert not pid_alive(last)
            with pytest.raises(UnavailableError):
                await queue.enqueue(task_type="t")
            assert client._connection._daemon_restarts == 3


async def test_local_daemon_survives_only_while_the_client_lives(tmp_path: pathlib.Path) -> None:
    """Leaving `async with` stops the daemon gracefully (lifecycle pipe, exit code 0)."""
    with trio.fail_after(20):
        async with Ringo.local(tmp_path) as client:
            pid = client.daemon_pid
            assert pid is not None
            assert pid_alive(pid)
            daemon = client._connection.daemon
        assert daemon is not None
        assert not pid_alive(pid)
        assert daemon._child is not None
        assert daemon._child.process.returncode == 0


async def test_claim_long_poll_is_cancellable(tmp_path: pathlib.Path) -> None:
    """Cancelling a long-polling claim returns promptly and leaves the client usable."""
    with trio.fail_after(20):
        async with Ringo.local(tmp_path) as client:
            queue = client.queue("q")
            with trio.move_on_after(0.3):
                await queue.claim(wait_timeout=timedelta(seconds=30))
            assert (await queue.enqueue(task_type="t")).created
            assert len(await queue.claim()) == 1


async def test_close_during_a_call_fails_it_without_recovery(tmp_path: pathlib.Path) -> None:
    """aclose() from another task ends an in-flight call at once (UnavailableError), without
    a recovery attempt and without a daemon restart."""
    with trio.fail_after(20):
        async with Ringo.local(tmp_path) as client:
            queue = client.queue("q")

            async def closer() -> None:
                await trio.sleep(0.3)
                await client.aclose()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(closer)
                start = trio.current_time()
                with pytest.raises(UnavailableError):
                    await queue.claim(wait_timeout=timedelta(seconds=30))
                assert trio.current_time() - start < 5
            assert client._connection._daemon_restarts == 0

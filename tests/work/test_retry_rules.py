"""The retry rules of unary calls, pinned down with a scripted transport and a mock clock.

The real-daemon versions of these properties live in test_connection.py; here
every send is counted exactly, which is what catches a replayed mutation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.lowlevel

from ringo_trio import (
    IncompatibleVersionError,
    NotFoundError,
    Ringo,
    RingoClient,
    UnavailableError,
)
from ringo_trio._endpoint import Endpoint
from ringo_trio._proto.ringo.v1 import (
    EnqueueResponse,
    EnqueueResult,
    GetTaskResponse,
    Lease,
    NegotiateResponse,
    Task,
)
from ringo_trio._proto.ringo.v1 import LeasedTask as WireLeased
from ringo_trio._queue.leased import LeasedTask
from ringo_trio._transport.base import SessionRejectedError

pytestmark = pytest.mark.trio

Script = Callable[[str, Any], Any]


class FakeTransport:
    """Answers Negotiate with a fresh token each time; other calls follow ``script``."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.sent: list[tuple[str, str]] = []  # (method, session token)
        self.negotiations = 0
        self.negotiate_error: Exception | None = None
        self.endpoint = Endpoint("fake", 1, False)
        self.closed = False

    async def unary(
        self, method: str, request: Any, response_type: type[Any], *, rpc_timeout: float | None
    ) -> Any:
        await trio.lowlevel.checkpoint()
        name = method.rsplit("/", 1)[1]
        if name == "Negotiate":
            if self.negotiate_error is not None:
                raise self.negotiate_error
            self.negotiations += 1
            return NegotiateResponse(
                protocol_major=1, protocol_minor=6, session_token=f"t{self.negotiations}"
            )
        self.sent.append((name, request.context.session_token))
        return self.script(name, request)

    async def health_check(self, *, rpc_timeout: float) -> bool:
        return True

    async def aclose(self) -> None:
        self.closed = True


async def connected(script: Script) -> tuple[RingoClient, FakeTransport]:
    client = Ringo.connect("fake:1")
    fake = FakeTransport(script)
    client._connection._transport = fake  # type: ignore[assignment]
    await client._connection._negotiate()
    return client, fake


def ok_task(name: str, request: Any) -> Any:
    task = Task(id="1", queue="q", task_type="t")
    if name == "Enqueue":
        return EnqueueResponse(result=EnqueueResult(task=task, created=True))
    return GetTaskResponse(task=task)


def fail_first(error: Exception, times: int = 1) -> Script:
    remaining = [times]

    def script(name: str, request: Any) -> Any:
        if remaining[0] > 0:
            remaining[0] -= 1
            raise error
        return ok_task(name, request)

    return script


async def test_unavailable_mutation_is_not_replayed(autojump_clock: trio.abc.Clock) -> None:
    """Property: an UNAVAILABLE mutation is sent exactly once, raises UnavailableError,
    and the connection is recovered (renegotiated) so the next call works."""
    client, fake = await connected(fail_first(UnavailableError("down")))
    queue = client.queue("q")
    with pytest.raises(UnavailableError):
        await queue.enqueue(task_type="t")
    assert [name for name, _ in fake.sent] == ["Enqueue"]
    assert fake.negotiations == 2  # initial + recovery
    await queue.enqueue(task_type="t")
    assert fake.sent[-1] == ("Enqueue", "t2")


@pytest.mark.parametrize("method", ["retry", "ack"])
async def test_no_mutation_is_replayed(autojump_clock: trio.abc.Clock, method: str) -> None:
    """Property: retry/ack (mutations) are never re-sent after UNAVAILABLE either."""
    client, fake = await connected(fail_first(UnavailableError("down")))
    queue = client.queue("q")
    lease = Lease(task_id="1", attempt=1, lease_token="x")
    leased = LeasedTask(
        client._connection, WireLeased(task=Task(id="1"), lease=lease), received=trio.current_time()
    )
    operation = queue.retry("k") if method == "retry" else leased.ack()
    with pytest.raises(UnavailableError):
        await operation
    assert len(fake.sent) == 1


async def test_get_task_is_resent_after_recovery(autojump_clock: trio.abc.Clock) -> None:
    """Property: GetTask (read-only) is re-sent once after recovery, with the new session."""
    client, fake = await connected(fail_first(UnavailableError("down")))
    task = await client.queue("q").get_by_id("1")
    assert task.id == "1"
    assert fake.sent == [("GetTask", "t1"), ("GetTask", "t2")]


async def test_get_task_is_resent_only_once(autojump_clock: trio.abc.Clock) -> None:
    client, fake = await connected(fail_first(UnavailableError("down"), times=5))
    with pytest.raises(UnavailableError):
        await client.queue("q").get_by_unique_key("k")
    assert len(fake.sent) == 2


async def test_session_rejection_renegotiates_and_retries_once(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Property: a rejected session (OUT_OF_RANGE) is renegotiated and the call retried
    once with the new token — mutations included, since the daemon ran nothing."""
    client, fake = await connected(fail_first(SessionRejectedError("expired")))
    start = trio.current_time()
    result = await client.queue("q").enqueue(task_type="t")
    assert result.created
    assert fake.sent == [("Enqueue", "t1"), ("Enqueue", "t2")]
    # The daemon is evidently up: renegotiation does not wait out a backoff.
    assert trio.current_time() - start < 0.1


async def test_session_rejection_is_not_a_loop(autojump_clock: trio.abc.Clock) -> None:
    """A daemon that rejects every session gets exactly one retry, then the error."""
    client, fake = await connected(fail_first(SessionRejectedError("no"), times=99))
    with pytest.raises(IncompatibleVersionError):
        await client.queue("q").enqueue(task_type="t")
    assert len(fake.sent) == 2


async def test_no_retry_when_the_token_did_not_rotate(autojump_clock: trio.abc.Clock) -> None:
    """If renegotiation fails, the rejected call is not sent again with the same token."""
    client, fake = await connected(fail_first(SessionRejectedError("no")))
    fake.negotiate_error = UnavailableError("down")
    with pytest.raises(IncompatibleVersionError):
        await client.queue("q").enqueue(task_type="t")
    assert len(fake.sent) == 1


async def test_unimplemented_is_not_renegotiated(autojump_clock: trio.abc.Clock) -> None:
    """UNIMPLEMENTED (a newer-minor RPC) is an IncompatibleVersionError without a retry."""
    client, fake = await connected(fail_first(IncompatibleVersionError("unimplemented")))
    with pytest.raises(IncompatibleVersionError):
        await client.queue("q").enqueue(task_type="t")
    assert (len(fake.sent), fake.negotiations) == (1, 1)


async def test_other_errors_pass_through(autojump_clock: trio.abc.Clock) -> None:
    client, fake = await connected(fail_first(NotFoundError("gone")))
    with pytest.raises(NotFoundError):
        await client.queue("q").get_by_id("1")
    assert (len(fake.sent), fake.negotiations) == (1, 1)


async def test_concurrent_failures_recover_once(autojump_clock: trio.abc.Clock) -> None:
    """Property: N calls failing together cause one recovery, not N; every read succeeds
    on its retry and every mutation raises."""
    gate = trio.Event()
    down = [True]

    def script(name: str, request: Any) -> Any:
        if down[0]:
            raise UnavailableError("down")
        return ok_task(name, request)

    client, fake = await connected(script)
    queue = client.queue("q")
    outcomes: list[str] = []

    async def read() -> None:
        await gate.wait()
        await queue.get_by_id("1")
        outcomes.append("read ok")

    async def write() -> None:
        await gate.wait()
        try:
            await queue.enqueue(task_type="t")
        except UnavailableError:
            outcomes.append("write failed")

    async def heal() -> None:
        await gate.wait()
        await trio.sleep(0.1)  # after every call failed, before the first backoff ends
        down[0] = False

    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(read)
            nursery.start_soon(write)
        nursery.start_soon(heal)
        await trio.lowlevel.checkpoint()
        gate.set()
    assert sorted(outcomes) == ["read ok"] * 5 + ["write failed"] * 5
    assert fake.negotiations == 2


async def test_calls_wait_for_a_recovery_in_progress(autojump_clock: trio.abc.Clock) -> None:
    """A call issued while recovery runs waits for it and goes out with the new session."""
    client, fake = await connected(fail_first(UnavailableError("down")))
    queue = client.queue("q")

    async def failing() -> None:
        with pytest.raises(UnavailableError):
            await queue.enqueue(task_type="t")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(failing)
        await trio.sleep(0.05)  # the first call failed and is backing off
        await queue.get_by_id("1")
    assert fake.sent[-1] == ("GetTask", "t2")


async def test_recovery_gives_up_after_three_attempts(autojump_clock: trio.abc.Clock) -> None:
    """Recovery is bounded: 3 attempts, 0.2 + 0.6 + 1.5 s, then the call's own error."""
    client, fake = await connected(fail_first(UnavailableError("down")))
    fake.negotiate_error = UnavailableError("still down")
    start = trio.current_time()
    with pytest.raises(UnavailableError, match="down"):
        await client.queue("q").enqueue(task_type="t")
    assert trio.current_time() - start == pytest.approx(2.3, abs=0.05)


async def test_closed_client_does_not_recover(autojump_clock: trio.abc.Clock) -> None:
    client, fake = await connected(fail_first(UnavailableError("down")))
    client._connection.mark_closed()
    with pytest.raises(Exception, match="closed"):
        await client.queue("q").get_by_id("1")
    assert fake.negotiations == 1

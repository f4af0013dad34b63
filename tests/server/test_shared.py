"""A shared daemon (``--local-token-file``/``--generation``): the local token on
every call, AttachLocal membership, and stopping by itself when nobody uses it.

Raw grpclib clients: of real ``ringod`` processes (the flags, the token on the
command line, process exits), every test under a `fail_after` guard; and, for
membership and lingering, of in-process daemons on virtual time (`tests/_kit/virtual_daemon.py`),
where a linger or attach timeout is timed exactly and costs no real time.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from grpclib.client import Channel
from grpclib.client import Stream as ClientStream
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError

from ringo_trio._contract.versions import MAJOR as PROTOCOL_MAJOR
from ringo_trio._contract.versions import MINOR as PROTOCOL_MINOR
from ringo_trio._proto.grpc.health.v1 import (
    HealthCheckRequest,
    HealthCheckResponseServingStatus,
    HealthStub,
)
from ringo_trio._proto.ringo.v1 import (
    AttachLocalRequest,
    AttachLocalResponse,
    EnqueueRequest,
    NegotiateRequest,
    QueueServiceStub,
    RequestContext,
    TaskSpec,
)
from ringo_trio.server import main as _main
from ringo_trio.server.daemon import Daemon
from ringo_trio.testing import DaemonProcess, spawn_daemon
from tests._kit.grpc_client import expect_status, new_queue, split_endpoint
from tests._kit.virtual_daemon import PROMPT, Served, now, on_virtual_time, quiet, virtual_daemon

pytestmark = pytest.mark.anyio

SECRET = "s3cret-local-token"
GENERATION = "gen-1"
HEADER = "x-ringo-local-token"
ATTACH = "/ringo.v1.QueueService/AttachLocal"
LINGER = 0.5
TEST_TIMEOUT = 15
MODULE = [sys.executable, "-m", "ringo_trio.server"]


def _shared_args(tmp_path: Path, *extra: str) -> list[str]:
    token_file = tmp_path / "local-token"
    token_file.write_text(f"  {SECRET}\n")
    return ["--local-token-file", str(token_file), "--generation", GENERATION, *extra]


@contextlib.contextmanager
def _shared_daemon(tmp_path: Path, *extra: str) -> Iterator[DaemonProcess]:
    with spawn_daemon(tmp_path / "data", extra_args=_shared_args(tmp_path, *extra)) as process:
        yield process


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """A shared daemon that never stops by itself during these tests."""
    tmp_path = tmp_path_factory.mktemp("shared-mode")
    # Many wrong tokens on purpose: answered at once, not throttled.
    with _shared_daemon(
        tmp_path, "--linger", "600", "--attach-timeout", "600", "--auth-failure-delay", "0"
    ) as process:
        yield process
    assert process.process.returncode == 0, process.stderr_text()


@dataclass
class Conn:
    channel: Channel
    metadata: list[tuple[str, str]]
    stub: QueueServiceStub
    health: HealthStub


@asynccontextmanager
async def connect(
    daemon: DaemonProcess | Daemon, *local_tokens: str, bearer: str | None = None
) -> AsyncIterator[Conn]:
    """A channel sending each of `local_tokens` as an x-ringo-local-token value
    (to an in-process `Daemon`: in memory)."""
    if isinstance(daemon, Daemon):
        channel: Channel = daemon.in_memory_channel()
    else:
        channel = Channel(*split_endpoint(daemon.endpoint))
    metadata = [(HEADER, token) for token in local_tokens]
    if bearer is not None:
        metadata.append(("authorization", f"Bearer {bearer}"))
    try:
        yield Conn(
            channel,
            metadata,
            QueueServiceStub(channel, metadata=metadata),
            HealthStub(channel, metadata=metadata),
        )
    finally:
        channel.close()


class Member:
    """One AttachLocal stream (what an SDK process holds while it is a member)."""

    def __init__(self, stream: ClientStream[AttachLocalRequest, AttachLocalResponse]) -> None:
        self.stream = stream

    async def end_status(self) -> tuple[Status, str]:
        """Wait for the server to end the stream; its status and message."""
        try:
            extra = await self.stream.recv_message()
            assert extra is None, f"expected the stream to end, it sent {extra}"
            await self.stream.recv_trailing_metadata()
        except GRPCError as exc:
            return exc.status, exc.message or ""
        return Status.OK, ""

    async def detach(self) -> None:
        await self.stream.cancel()


@asynccontextmanager
async def attach(conn: Conn, generation: str = GENERATION) -> AsyncIterator[Member]:
    """Open AttachLocal, send the request, yield before reading anything."""
    stream = conn.channel.request(
        ATTACH,
        Cardinality.UNARY_STREAM,
        AttachLocalRequest,
        AttachLocalResponse,
        metadata=conn.metadata,
    )
    await stream.__aenter__()
    try:
        await stream.send_message(AttachLocalRequest(generation=generation), end=True)
        yield Member(stream)
    finally:
        with contextlib.suppress(Exception):
            await stream.cancel()
        with contextlib.suppress(Exception):
            await stream.__aexit__(None, None, None)


@asynccontextmanager
async def member(conn: Conn) -> AsyncIterator[Member]:
    """An attached member: its first (and only) message names the generation."""
    async with attach(conn) as m:
        first = await m.stream.recv_message()
        assert first is not None
        assert first.generation == GENERATION
        yield m


async def _serving(conn: Conn) -> bool:
    response = await conn.health.check(HealthCheckRequest())
    return response.status is HealthCheckResponseServingStatus.SERVING


async def _exit_status(daemon: DaemonProcess, within: float) -> int:
    """Wait (without blocking the loop) for the process to exit on its own;
    `subprocess.TimeoutExpired` if it is still running after `within` seconds."""
    return await anyio.to_thread.run_sync(functools.partial(daemon.process.wait, within))


# -- the local token ------------------------------------------------------------


async def test_local_token_is_required_on_every_call_health_included(
    shared: DaemonProcess,
) -> None:
    """Property: in shared mode every RPC — health, Negotiate, Enqueue,
    AttachLocal — without exactly one correct x-ringo-local-token value is
    UNAUTHENTICATED, and with it the same calls work; the secret (whitespace
    stripped from the file) never appears on the command line."""
    assert SECRET not in " ".join(shared.args)
    with anyio.fail_after(TEST_TIMEOUT):
        for tokens in [(), ("wrong",), (SECRET + "x",), (SECRET, SECRET), (f" {SECRET}",)]:
            async with connect(shared, *tokens) as conn:
                fragment = "missing or invalid x-ringo-local-token"
                await expect_status(
                    conn.health.check(HealthCheckRequest()), Status.UNAUTHENTICATED, fragment
                )
                await expect_status(
                    conn.stub.negotiate(NegotiateRequest(protocol_major=PROTOCOL_MAJOR)),
                    Status.UNAUTHENTICATED,
                    fragment,
                )
                await expect_status(
                    conn.stub.enqueue(EnqueueRequest(queue="q", task=TaskSpec(task_type="t"))),
                    Status.UNAUTHENTICATED,
                    fragment,
                )
                async with attach(conn) as m:
                    assert await m.end_status() == (Status.UNAUTHENTICATED, fragment)
        async with connect(shared, SECRET) as conn:
            assert await _serving(conn)
            negotiated = await conn.stub.negotiate(
                NegotiateRequest(protocol_major=PROTOCOL_MAJOR, protocol_minor=PROTOCOL_MINOR)
            )
            context = RequestContext(
                protocol_major=negotiated.protocol_major,
                protocol_minor=negotiated.protocol_minor,
                session_token=negotiated.session_token,
            )
            enqueued = await conn.stub.enqueue(
                EnqueueRequest(context=context, queue=new_queue(), task=TaskSpec(task_type="t"))
            )
            assert enqueued.result is not None
            assert enqueued.result.created


async def test_local_token_and_bearer_token_are_both_required(tmp_path: Path) -> None:
    """Property: --local-token-file combines with --token: each secret alone is
    UNAUTHENTICATED, both together are served."""
    with (
        anyio.fail_after(TEST_TIMEOUT),
        _shared_daemon(tmp_path, "--token", "bearer-secret") as daemon,
    ):
        assert daemon.info["auth"] is True
        async with connect(daemon, SECRET) as conn:
            await expect_status(
                conn.health.check(HealthCheckRequest()), Status.UNAUTHENTICATED, "bearer"
            )
        async with connect(daemon, bearer="bearer-secret") as conn:
            await expect_status(
                conn.health.check(HealthCheckRequest()), Status.UNAUTHENTICATED, HEADER
            )
        async with connect(daemon, SECRET, bearer="bearer-secret") as conn:
            assert await _serving(conn)
            async with member(conn):
                pass


# -- AttachLocal ------------------------------------------------------------------


async def test_attach_returns_the_generation_and_then_stays_silent(
    shared: DaemonProcess,
) -> None:
    """Property: the ready line reports the generation; AttachLocal with it is
    answered at once with exactly that generation, then sends nothing more
    while the daemon keeps serving."""
    assert shared.info["generation"] == GENERATION
    with anyio.fail_after(TEST_TIMEOUT):
        async with connect(shared, SECRET) as conn, member(conn) as m:
            with anyio.move_on_after(0.3) as quiet:
                await m.stream.recv_message()
            assert quiet.cancelled_caught, "the member stream sent or ended early"
            assert await _serving(conn)


async def test_attach_with_another_generation_is_refused(shared: DaemonProcess) -> None:
    """Property: AttachLocal naming any other generation (a stale identity) is
    FAILED_PRECONDITION "generation mismatch" and does not make a member."""
    with anyio.fail_after(TEST_TIMEOUT):
        async with connect(shared, SECRET) as conn:
            for generation in ["gen-0", "", GENERATION + " "]:
                async with attach(conn, generation) as m:
                    status, message = await m.end_status()
                assert status is Status.FAILED_PRECONDITION, (status, message)
                assert "generation mismatch" in message
                assert repr(GENERATION) in message


async def test_a_daemon_that_is_not_shared_refuses_attach(daemon: DaemonProcess) -> None:
    """Property: without --local-token-file the daemon refuses AttachLocal
    (FAILED_PRECONDITION "not a shared daemon"), whatever the generation, and
    needs no local token; its ready line has no generation."""
    assert "generation" not in daemon.info
    with anyio.fail_after(TEST_TIMEOUT):
        async with connect(daemon) as conn:
            assert await _serving(conn)
            for generation in [GENERATION, ""]:
                async with attach(conn, generation) as m:
                    assert await m.end_status() == (
                        Status.FAILED_PRECONDITION,
                        "not a shared daemon",
                    )


# -- membership and lingering ---------------------------------------------------


def _virtual_shared(**config: Any) -> AbstractAsyncContextManager[Served]:
    """An in-process shared daemon on virtual time (`tests/_kit/virtual_daemon.py`)."""
    return virtual_daemon(local_token=SECRET, generation=GENERATION, **config)


@on_virtual_time
async def test_the_daemon_stays_while_a_member_remains_and_lingers_out_after_the_last(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Property: members are counted exactly: with two members, detaching one
    keeps the daemon serving well past the linger; detaching the last stops
    it gracefully exactly `linger` seconds later (virtual time: not before)."""
    with caplog.at_level(logging.INFO, logger="ringo_trio.server"):
        async with (
            _virtual_shared(linger=LINGER) as served,
            connect(served.daemon, SECRET) as conn,
        ):
            async with member(conn) as first, member(conn):
                await first.detach()
                await quiet(3 * LINGER)
                assert await _serving(conn)
                assert not served.serving.done()
                detached = now()
            # The second member detached on leaving the block.
            await served.serving  # stopped by itself, without an error
            lingered = now() - detached
    assert LINGER <= lingered < LINGER + PROMPT, lingered
    assert "no member for 0.5s (--linger): shutting down" in caplog.text


@on_virtual_time
async def test_a_new_member_cancels_the_linger_and_every_drop_to_zero_restarts_it() -> None:
    """Property: an attach during the linger cancels it (the daemon keeps
    serving long after the linger would have ended), and the next drop to
    zero starts a fresh full linger (the daemon stops exactly `linger` after
    it, not before)."""
    linger = 1.0
    async with _virtual_shared(linger=linger) as served:
        async with connect(served.daemon, SECRET) as conn:
            async with member(conn):
                pass
            await quiet(linger * 0.6)
            async with member(conn):
                await quiet(linger * 1.2)
                assert await _serving(conn)
            detached = now()
            await quiet(linger * 0.6)
            assert not served.serving.done(), "the second linger did not start afresh"
            await served.serving  # stopped by itself, without an error
        assert linger <= now() - detached < linger + PROMPT


@on_virtual_time
async def test_a_member_whose_connection_drops_counts_as_detached() -> None:
    """Property: a member whose connection is cut (no RST_STREAM, no GOAWAY:
    its process died) is detached, so the daemon lingers out; another
    member's detach is not needed. (In memory the cut is the transport's
    abort, which reaches the daemon as the same connection_lost a TCP reset
    does.)"""
    async with (
        _virtual_shared(linger=LINGER) as served,
        connect(served.daemon, SECRET) as conn,
        member(conn),
    ):
        await quiet(2 * LINGER)
        assert not served.serving.done()
        protocol: Any = conn.channel._protocol
        protocol.connection._transport.abort()
        cut = now()
        await served.serving  # stopped by itself, without an error
        assert LINGER <= now() - cut < LINGER + PROMPT


@on_virtual_time
async def test_without_any_member_the_daemon_stops_after_the_attach_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Property: a shared daemon nobody attaches to (its starter died) stops
    gracefully exactly --attach-timeout after it is ready — not before, and
    unary calls do not count as membership."""
    attach_timeout = 1.0
    with caplog.at_level(logging.INFO, logger="ringo_trio.server"):
        async with _virtual_shared(attach_timeout=attach_timeout) as served:
            ready = now()
            async with connect(served.daemon, SECRET) as conn:
                assert await _serving(conn)
            await served.serving  # stopped by itself, without an error
            assert attach_timeout <= now() - ready < attach_timeout + PROMPT
    assert "no member attached within 1s (--attach-timeout)" in caplog.text


@on_virtual_time
async def test_shutdown_with_members_is_prompt_and_ends_their_streams_unavailable() -> None:
    """Property: a shutdown (what SIGTERM starts) with members attached stops
    the daemon at once, without waiting for the members (nowhere near
    --shutdown-timeout 10), and every member stream ends with status
    UNAVAILABLE (the members learn it at once, and re-elect)."""
    async with (
        _virtual_shared(shutdown_timeout=10.0) as served,
        connect(served.daemon, SECRET) as conn,
        member(conn) as first,
        member(conn) as second,
    ):
        started = now()
        served.stop.set()
        ends = [await first.end_status(), await second.end_status()]
        await served.serving  # stopped, without an error
        assert now() - started < PROMPT
    for code, message in ends:
        assert code is Status.UNAVAILABLE, (code, message)
        assert "shutting down" in message


@pytest.mark.parametrize(
    ("flag", "detach", "reason"),
    [
        ("--linger", True, "no member for 0.2s (--linger): shutting down"),
        ("--attach-timeout", False, "no member attached within 0.2s (--attach-timeout)"),
    ],
    ids=["linger", "attach-timeout"],
)
async def test_a_shared_ringod_stops_by_itself_after_its_flags_time_exit_0(
    tmp_path: Path, flag: str, detach: bool, reason: str
) -> None:
    """Property: ringod's --linger and --attach-timeout are the timers its
    membership runs (timed exactly on virtual time above), and a shared
    process that stops by itself exits 0: a member that attaches and leaves
    (or none at all) stops it with that flag's reason."""
    timers = ["--linger", "600", "--attach-timeout", "600", flag, "0.2"]  # the last one counts
    with anyio.fail_after(TEST_TIMEOUT), _shared_daemon(tmp_path, *timers) as daemon:
        if detach:
            async with connect(daemon, SECRET) as conn, member(conn):
                pass
        status = await _exit_status(daemon, within=TEST_TIMEOUT - 5)
        assert status == 0, daemon.stderr_text()
        assert reason in daemon.stderr_text()


# -- flags ------------------------------------------------------------------------


def test_shared_mode_flag_misuse_is_a_usage_error(tmp_path: Path) -> None:
    """Property: --local-token-file needs --generation and a readable, non-empty
    file; --generation, --linger and --attach-timeout are refused without it;
    the generation is 1..200 characters, linger >= 0, attach-timeout > 0. Each
    exits 2 with a message naming the flag, and never serves."""
    token = tmp_path / "token"
    token.write_text(SECRET)
    empty = tmp_path / "empty"
    empty.write_text(" \n")
    shared = ["--local-token-file", str(token)]
    cases: list[tuple[list[str], str]] = [
        (shared, "needs --generation"),
        (["--generation", GENERATION], "--generation only applies to a shared daemon"),
        (["--linger", "1"], "--linger only applies to a shared daemon"),
        (["--attach-timeout", "1"], "--attach-timeout only applies to a shared daemon"),
        (["--local-token-file", str(empty), "--generation", "g"], "is empty"),
        (["--local-token-file", str(tmp_path / "missing"), "--generation", "g"], "cannot read"),
        ([*shared, "--generation", ""], "--generation: must not be empty"),
        ([*shared, "--generation", "g" * 201], "over the limit of 200"),
        ([*shared, "--generation", "g", "--linger", "-1"], "--linger"),
        ([*shared, "--generation", "g", "--attach-timeout", "0"], "--attach-timeout"),
    ]
    base = [*MODULE, "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "data")]
    running = [
        subprocess.Popen(
            [*base, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for args, _ in cases
    ]
    try:
        for (args, message), process in zip(cases, running, strict=True):
            stdout, stderr = process.communicate(timeout=TEST_TIMEOUT)
            assert process.returncode == _main.EXIT_USAGE, (args, stderr)
            assert message in stderr, (args, stderr)
            assert stdout == "", args
    finally:
        for process in running:
            if process.poll() is None:
                process.kill()
                process.wait()
    # At the limit it serves.
    with spawn_daemon(
        tmp_path / "ok", extra_args=[*shared, "--generation", "g" * 200, "--linger", "0"]
    ) as daemon:
        assert daemon.info["generation"] == "g" * 200

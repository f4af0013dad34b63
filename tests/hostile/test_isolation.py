"""Another local user against a `Ringo.local` daemon, and token guessing against ringod.

Loopback is reachable by every user of the machine and a data dir is a
directory like any other: these tests play the other user (a caller without
the secret, a reader of the files) and the guesser (wrong bearer tokens as
fast as the daemon answers).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import stat
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import h2.config
import h2.connection
import h2.events
import pytest
import trio

from ringo_trio import Ringo, RingoClient, TaskState
from ringo_trio._endpoint import parse_endpoint
from ringo_trio._errors import UnauthenticatedError
from ringo_trio._proto.ringo.v1 import ClaimRequest, ClaimResponse, RequestContext
from ringo_trio._transport.grpclib import Transport
from ringo_trio.server.flags import TOKEN_ENV
from ringo_trio.server.rpc.throttle import AuthThrottle
from ringo_trio.testing import DaemonProcess, spawn_daemon
from tests._kit.processes import eventually, pid_alive

pytestmark = pytest.mark.trio

_CLAIM = "/ringo.v1.QueueService/Claim"


def _environ(pid: int) -> dict[str, str]:
    raw = pathlib.Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (entry.partition(b"=") for entry in raw.split(b"\0") if entry)
    return {key.decode(): value.decode() for key, _, value in pairs}


def _cmdline(pid: int) -> bytes:
    return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()


@asynccontextmanager
async def _stranger(endpoint: str) -> AsyncIterator[Transport]:
    """A client of `endpoint` holding no secret at all: another local user."""
    async with Transport(parse_endpoint(endpoint)) as transport:
        yield transport


async def _assert_refused(client: RingoClient) -> None:
    """A secret task enqueued by `client` can be neither claimed nor probed by a stranger."""
    queue = client.queue("secret")
    result = await queue.enqueue(task_type="t", payload=b"the payroll")
    assert client.endpoint is not None
    async with _stranger(client.endpoint) as stranger:
        with pytest.raises(UnauthenticatedError):
            await stranger.health_check(rpc_timeout=5)
        with pytest.raises(UnauthenticatedError):
            await stranger.unary(
                _CLAIM,
                ClaimRequest(context=RequestContext(), queue="secret", worker_id="w", limit=10),
                ClaimResponse,
                rpc_timeout=5,
            )
    assert (await queue.get_by_id(result.task.id)).state is TaskState.PENDING


async def _linger_out(pid: int | None) -> None:
    # A shared daemon outlives its last member by its linger: wait, so no
    # daemon outlives the test.
    assert pid is not None
    await eventually(lambda: not pid_alive(pid), within=15)


async def test_a_private_local_daemon_refuses_callers_without_its_secret(
    tmp_path: pathlib.Path,
) -> None:
    """Property: a private `Ringo.local` daemon serves only its own client. Another
    local user reaching its loopback port gets UNAUTHENTICATED on health and on
    Claim (a secret task stays PENDING); the secret is in the daemon's
    environment (owner-only), never on its command line (``ps`` shows it to all)."""
    with trio.fail_after(30):
        async with Ringo.local(tmp_path / "data") as client:
            await _assert_refused(client)
            pid = client.daemon_pid
            assert pid is not None
            secret = _environ(pid)[TOKEN_ENV]
            assert len(secret) >= 32
            assert secret.encode() not in _cmdline(pid)
            # What the design relies on: only the owner reads an environment.
            assert _mode(pathlib.Path(f"/proc/{pid}/environ")) == 0o400


async def test_a_shared_local_daemon_refuses_callers_without_its_secret(
    tmp_path: pathlib.Path,
) -> None:
    """Property: the shared daemon of a data dir (``shared=True``) also refuses a
    caller without its local token, health and Claim alike."""
    with trio.fail_after(30):
        async with Ringo.local(tmp_path / "data", shared=True) as client:
            await _assert_refused(client)
            pid = client.daemon_pid
        await _linger_out(pid)


@pytest.mark.parametrize("shared", [False, True], ids=["private", "shared"])
async def test_an_exported_daemon_token_does_not_lock_a_local_client_out(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, shared: bool
) -> None:
    """Property: a $RINGO_DAEMON_TOKEN in the SDK process's environment (meant
    for some other ringod) never reaches a `Ringo.local` daemon, which would
    then refuse its own client."""
    monkeypatch.setenv(TOKEN_ENV, "meant-for-another-daemon")
    with trio.fail_after(30):
        async with Ringo.local(tmp_path / "data", shared=shared) as client:
            await client.queue("q").enqueue(task_type="t")
            pid = client.daemon_pid
            assert pid is not None
            assert _environ(pid).get(TOKEN_ENV) != "meant-for-another-daemon"
        if shared:
            await _linger_out(pid)


@contextmanager
def _umask(mask: int) -> Iterator[None]:
    # Process-wide: the daemon inherits it at spawn. Restored whatever happens.
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: pathlib.Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def _assert_private_files(client: RingoClient, data_dir: pathlib.Path) -> None:
    await client.queue("secret").enqueue(task_type="t", payload=b"the payroll")
    # Checked while the daemon runs: -wal and -shm exist only then.
    files = {name: data_dir / name for name in ("ringo.db", "ringo.db-wal", "ringo.db-shm")}
    assert all(path.exists() for path in files.values()), sorted(os.listdir(data_dir))
    assert _mode(data_dir) == 0o700
    assert {name: _mode(path) for name, path in files.items()} == dict.fromkeys(files, 0o600)


@pytest.mark.parametrize("shared", [False, True], ids=["private", "shared"])
@pytest.mark.parametrize("mask", [0o000, 0o022], ids=["umask000", "umask022"])
async def test_a_local_data_dir_is_private_whatever_the_umask(
    tmp_path: pathlib.Path, shared: bool, mask: int
) -> None:
    """Property: `Ringo.local` (private or shared) keeps its data dir 0700 and the
    database, its WAL and its shared memory 0600, whatever the umask, so no
    other local user can read a payload from the files."""
    data_dir = tmp_path / "data"
    with trio.fail_after(30):
        with _umask(mask):
            async with Ringo.local(data_dir, shared=shared) as client:
                await _assert_private_files(client, data_dir)
                pid = client.daemon_pid
        if shared:
            await _linger_out(pid)


async def test_a_loose_existing_data_dir_is_tightened(tmp_path: pathlib.Path) -> None:
    """Property: a data dir made world-readable before (an older ringo, an odd
    umask, by hand), holding a world-readable database, is made 0700 and its
    files 0600 when `Ringo.local` opens it."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    data_dir.chmod(0o755)
    for name in ("ringo.db", "ringo.db-wal"):
        (data_dir / name).touch()
        (data_dir / name).chmod(0o644)
    with trio.fail_after(30):
        async with Ringo.local(data_dir) as client:
            await _assert_private_files(client, data_dir)


# -- token guessing ---------------------------------------------------------------

_GUESSER_TOKEN = "right-token"


class _RawH2:
    """A bare HTTP/2 client speaking just enough gRPC to guess tokens: no
    reconnection, so it sees exactly when the daemon closes its connection."""

    def __init__(self, stream: trio.SocketStream, authority: str) -> None:
        self.stream = stream
        self.authority = authority
        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        self.statuses: dict[int, str] = {}
        self.closed = False

    async def start(self) -> None:
        self.h2.initiate_connection()
        await self.stream.send_all(self.h2.data_to_send())

    async def guess(self, token: str) -> int:
        """Send one health check with bearer `token`; its stream id."""
        stream_id = self.h2.get_next_available_stream_id()
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/grpc.health.v1.Health/Check"),
            (":authority", self.authority),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("authorization", f"Bearer {token}"),
        ]
        self.h2.send_headers(stream_id, headers)
        self.h2.send_data(stream_id, b"\0\0\0\0\0", end_stream=True)
        try:
            await self.stream.send_all(self.h2.data_to_send())
        except trio.BrokenResourceError:
            self.closed = True  # the daemon closed the connection meanwhile
        return stream_id

    async def read(self) -> None:
        """Take in one chunk from the daemon; `closed` once it closed the connection."""
        try:
            data = await self.stream.receive_some(65536)
        except trio.BrokenResourceError:
            data = b""
        if not data:
            self.closed = True
            return
        for event in self.h2.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                status = dict(event.headers).get("grpc-status")
                if status is not None:
                    self.statuses[event.stream_id] = status
            elif isinstance(event, h2.events.ConnectionTerminated):
                self.closed = True
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await self.stream.send_all(self.h2.data_to_send())


@asynccontextmanager
async def _guesser(daemon: DaemonProcess) -> AsyncIterator[_RawH2]:
    stream = await trio.open_tcp_stream(daemon.host, daemon.port)
    async with stream:
        client = _RawH2(stream, daemon.endpoint)
        await client.start()
        yield client


@pytest.fixture
def token_daemon(tmp_path: pathlib.Path) -> Iterator[DaemonProcess]:
    # Its own daemon: the throttle remembers the guesses of 127.0.0.1.
    with spawn_daemon(tmp_path / "data", token=_GUESSER_TOKEN) as process:
        yield process


async def test_a_token_guesser_gets_few_answers_per_connection(token_daemon: DaemonProcess) -> None:
    """Property: wrong-token guesses on one connection are answered
    UNAUTHENTICATED, slower and slower, and the daemon closes the connection
    after `AuthThrottle.per_connection` (5) of them: a guesser cannot keep
    one connection busy trying tokens."""
    per_connection = AuthThrottle().per_connection
    with trio.fail_after(20):
        async with _guesser(token_daemon) as guesser:
            for attempt in range(per_connection):
                stream_id = await guesser.guess(f"guess-{attempt}")
                while stream_id not in guesser.statuses and not guesser.closed:
                    await guesser.read()
                assert guesser.statuses.get(stream_id) == "16", (attempt, guesser.statuses)
            with trio.move_on_after(5):
                while not guesser.closed:
                    await guesser.read()
            assert guesser.closed
        # The right token is still served at once.
        async with Transport(parse_endpoint(token_daemon.endpoint)) as transport:
            with pytest.raises(UnauthenticatedError):
                await transport.health_check(rpc_timeout=5)
        client = Ringo.connect(token_daemon.endpoint, token=_GUESSER_TOKEN)
        async with client:
            await client.queue("q").enqueue(task_type="t")


async def test_parallel_token_guesses_are_not_all_answered(token_daemon: DaemonProcess) -> None:
    """Property: wrong-token guesses sent at once on one connection do not get
    an answer each (~5,000 answers/s before): failures from one address are
    answered one at a time and the connection is closed after a few answers;
    a flood (more than `AuthThrottle.max_waiting` waiting) is cut off at once."""
    throttle = AuthThrottle()
    with trio.fail_after(20):
        for burst in (10, throttle.max_waiting + 24):
            async with _guesser(token_daemon) as guesser:
                for attempt in range(burst):
                    if not guesser.closed:
                        await guesser.guess(f"guess-{attempt}")
                with trio.move_on_after(10):
                    while not guesser.closed:
                        await guesser.read()
                assert guesser.closed, burst
                assert set(guesser.statuses.values()) <= {"16"}
                assert len(guesser.statuses) <= throttle.per_connection, burst


async def test_guesses_from_several_connections_of_one_address_wait_in_one_line(
    token_daemon: DaemonProcess,
) -> None:
    """Property: the throttle is keyed by the peer's host, not its
    connection: four connections from 127.0.0.1, one wrong guess each, sent
    at once, are answered one after another with the address's growing
    delays (0.05 + 0.1 + 0.2 + 0.4 s), so the last answer comes at least
    0.75 s after the burst. Keyed by connection (the peer's port), all four
    would be answered after 0.05 s: opening more connections would buy a
    guesser answers."""
    answered: list[float] = []
    with trio.fail_after(20):
        async with contextlib.AsyncExitStack() as stack:
            guessers = [await stack.enter_async_context(_guesser(token_daemon)) for _ in range(4)]
            start = trio.current_time()

            async def guess(guesser: _RawH2, attempt: int) -> None:
                stream_id = await guesser.guess(f"guess-{attempt}")
                while stream_id not in guesser.statuses and not guesser.closed:
                    await guesser.read()
                assert guesser.statuses.get(stream_id) == "16"
                answered.append(trio.current_time() - start)

            async with trio.open_nursery() as nursery:
                for attempt, guesser in enumerate(guessers):
                    nursery.start_soon(guess, guesser, attempt)
    assert len(answered) == 4
    assert max(answered) >= 0.7, answered

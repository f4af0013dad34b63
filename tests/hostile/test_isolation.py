"""Another local user against a `Ringo.local` daemon, and token guessing against ringod.

Loopback is reachable by every user of the machine and a data dir is a
directory like any other: these tests play the other user (a caller without
the secret, a reader of the files) and the guesser (wrong bearer tokens as
fast as the daemon answers).
"""

from __future__ import annotations

import os
import pathlib
import stat
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import pytest
import trio

from ringo_trio import Ringo, RingoClient, TaskState
from ringo_trio._endpoint import parse_endpoint
from ringo_trio._errors import UnauthenticatedError
from ringo_trio._proto.ringo.v1 import ClaimRequest, ClaimResponse, RequestContext
from ringo_trio._transport import Transport
from ringo_trio.server._main import TOKEN_ENV

from ..sdk.conftest import eventually, pid_alive

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

"""The shared local daemon's election: one daemon per data dir, an identity file
that is trusted only when it must be, and no lock or child left behind.

These drive `SharedLocalDaemon` alone against the real ``ringod`` in shared mode;
connecting, the local token and AttachLocal are the client's business and are
tested with it. Nobody attaches here, so each test ends the daemons it elected
(SIGTERM, then waits until they are gone).
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import anyio
import anyio.abc
import pytest
import trio

from ringo_trio import RingoError
from ringo_trio._local import shared as _shared
from ringo_trio._local.shared import SharedLocalDaemon
from tests._kit.processes import eventually, pid_alive

pytestmark = pytest.mark.trio


def shared_dir(data_dir: pathlib.Path) -> pathlib.Path:
    return data_dir / "shared"


def read_identity(data_dir: pathlib.Path) -> dict[str, Any]:
    raw: dict[str, Any] = json.loads((shared_dir(data_dir) / "identity.json").read_text())
    return raw


async def end_daemon(pid: int) -> None:
    """SIGTERM a daemon nobody attached to and wait until it is gone."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    await eventually(lambda: not pid_alive(pid), within=10)


@contextlib.asynccontextmanager
async def elected(data_dir: pathlib.Path, **kwargs: Any) -> AsyncIterator[SharedLocalDaemon]:
    """A started SharedLocalDaemon whose daemon is ended on the way out."""
    async with SharedLocalDaemon(data_dir, **kwargs) as shared:
        await shared.start()
        assert shared.pid is not None
        try:
            yield shared
        finally:
            with anyio.CancelScope(shield=True):
                await end_daemon(shared.pid)


def fake_daemon(tmp_path: pathlib.Path, body: str) -> tuple[pathlib.Path, pathlib.Path]:
    """An executable standing in for the daemon; it records its pid first."""
    pid_file = tmp_path / "fake.pid"
    script = tmp_path / "fake-daemon"
    script.write_text(f"#!/bin/sh\necho $$ > {pid_file}\n{textwrap.dedent(body)}")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, pid_file


def in_proc_table(pid: int) -> bool:
    """True while `pid` has any /proc entry at all, zombie included (not yet reaped)."""
    return os.path.exists(f"/proc/{pid}")


def spawn_short_child() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "pass"])


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def daemons_under(root: pathlib.Path) -> list[int]:
    """Pids of live ringod processes whose data dir is `root` or below it."""
    prefix = str(root).encode()
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        serves = b"ringo_trio.server" in argv and any(a.startswith(prefix) for a in argv)
        if serves and pid_alive(int(entry.name)):
            found.append(int(entry.name))
    return found


@pytest.fixture(autouse=True)
def _end_stray_daemons(tmp_path: pathlib.Path) -> Iterator[None]:
    """Safety net for a failing test: shared daemons outlive their starters by design,
    so one left by a failed assertion would otherwise also fail the next tests."""
    yield
    pids = daemons_under(tmp_path)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while any(pid_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.02)


# -- the identity file --------------------------------------------------------


async def test_identity_is_private_has_the_shape_and_names_the_live_daemon(
    tmp_path: pathlib.Path,
) -> None:
    """Property: the elected daemon is published in identity.json: a regular file of
    ours, mode 0600, in a 0700 dir, exactly {version, endpoint, token, generation, pid}
    with those types, naming the live daemon this object spawned."""
    with trio.fail_after(30):
        async with elected(tmp_path / "d") as shared:
            assert shared.started_here
            assert not shared.is_dead
            path = shared_dir(tmp_path / "d") / "identity.json"
            info = path.lstat()
            assert stat.S_ISREG(info.st_mode)
            assert stat.S_IMODE(info.st_mode) == 0o600
            assert info.st_uid == os.getuid()
            assert stat.S_IMODE(shared_dir(tmp_path / "d").stat().st_mode) == 0o700
            identity = read_identity(tmp_path / "d")
            assert identity == {
                "version": 1,
                "endpoint": shared.endpoint,
                "token": shared.token,
                "generation": shared.generation,
                "pid": shared.pid,
            }
            assert identity["endpoint"].startswith("127.0.0.1:")
            assert len(identity["token"]) == 64
            assert pid_alive(identity["pid"])
            # No temp file of the atomic write is left next to it.
            assert sorted(p.name for p in shared_dir(tmp_path / "d").iterdir()) == [
                "daemon.log",
                "election.lock",
                "identity.json",
                "token",
            ]


async def test_token_file_is_0600_even_when_it_existed_loose(tmp_path: pathlib.Path) -> None:
    """Property: the token file holds the identity's secret with mode 0600, also when
    an older (or hand-made) token file was world-readable before the spawn."""
    data = tmp_path / "d"
    shared_dir(data).mkdir(parents=True, mode=0o700)
    loose = shared_dir(data) / "token"
    loose.write_text("old secret")
    loose.chmod(0o644)
    with trio.fail_after(30):
        async with elected(data) as shared:
            assert stat.S_IMODE(loose.stat().st_mode) == 0o600
            assert loose.read_text() == shared.token


async def test_second_object_adopts_the_elected_daemon(tmp_path: pathlib.Path) -> None:
    """Property: a start() while the elected daemon lives adopts it — same endpoint,
    token, generation and pid, started_here False — and spawns nothing."""
    with trio.fail_after(30):
        async with elected(tmp_path) as first:
            async with SharedLocalDaemon(tmp_path) as second:
                assert await second.start() == first.endpoint
                assert (second.token, second.generation, second.pid) == (
                    first.token,
                    first.generation,
                    first.pid,
                )
                assert not second.started_here
                assert second.distrust_reason is None
            # The spawner asking again adopts its own daemon, still "started here".
            assert await first.start() == first.endpoint
            assert first.started_here


async def test_leaving_async_with_keeps_the_daemon_and_no_zombie_stays(
    tmp_path: pathlib.Path,
) -> None:
    """Property: exiting the spawner's `async with` does not stop the shared daemon
    (other members may use it); once it exits it is reaped, not left a zombie."""
    with trio.fail_after(30):
        async with SharedLocalDaemon(tmp_path) as shared:
            await shared.start()
        pid = shared.pid
        assert pid is not None
        await trio.sleep(0.2)
        assert pid_alive(pid)
        async with SharedLocalDaemon(tmp_path) as again:
            await again.start()
            assert again.pid == pid
            assert not again.started_here
        await end_daemon(pid)
        # Nobody reaps it any more but the next election's prune.
        _shared._prune_orphans()
        assert not in_proc_table(pid)


async def test_spawned_daemon_is_reaped_while_we_live(tmp_path: pathlib.Path) -> None:
    """Property: a daemon this object spawned is waited for as soon as it exits (no
    zombie while the owner lives), and is_dead turns True."""
    with trio.fail_after(30):
        async with SharedLocalDaemon(tmp_path) as shared:
            await shared.start()
            pid = shared.pid
            assert pid is not None
            os.kill(pid, signal.SIGTERM)
            await eventually(lambda: not in_proc_table(pid), within=10)
            assert shared.is_dead
            await shared.stop()
            assert not shared.is_dead  # stopped on purpose is not "dead"


async def test_daemon_that_nobody_attaches_to_ends_by_itself(tmp_path: pathlib.Path) -> None:
    """Property: attach_timeout reaches the daemon: with no member it exits on its own,
    and the next start() elects a new daemon in its place."""
    with trio.fail_after(30):
        async with SharedLocalDaemon(tmp_path, attach_timeout=0.5) as shared:
            await shared.start()
            first = shared.generation
            await eventually(lambda: shared.is_dead, within=10)
            await shared.start()
            assert shared.started_here
            assert shared.generation != first
            assert shared.distrust_reason is not None
            assert "not running" in shared.distrust_reason
            assert shared.pid is not None
            await end_daemon(shared.pid)


# -- several processes --------------------------------------------------------

STARTER = """
import json, sys, trio
from ringo_trio._local.shared import SharedLocalDaemon

async def main():
    async with SharedLocalDaemon(sys.argv[1], attach_timeout=30) as shared:
        print("armed", flush=True)
        sys.stdin.readline()  # every starter is armed: go at once
        endpoint = await shared.start()
        print(json.dumps({
            "endpoint": endpoint,
            "generation": shared.generation,
            "pid": shared.pid,
            "started_here": shared.started_here,
        }), flush=True)

trio.run(main)
"""


class LineReader:
    def __init__(self, process: anyio.abc.Process) -> None:
        assert process.stdout is not None
        self._stream = process.stdout
        self._buffer = b""

    async def line(self) -> bytes:
        while b"\n" not in self._buffer:
            self._buffer += await self._stream.receive()
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line


async def test_six_concurrent_processes_elect_exactly_one_daemon(tmp_path: pathlib.Path) -> None:
    """Property: six processes starting at the same moment on one data dir end up
    with one daemon: exactly one spawned it, the other five adopted its identity."""
    script = tmp_path / "starter.py"
    script.write_text(STARTER)
    data = tmp_path / "d"
    results: list[dict[str, Any]] = []
    with trio.fail_after(60):
        starters = [
            await anyio.open_process([sys.executable, str(script), str(data)], stderr=None)
            for _ in range(6)
        ]
        try:
            readers = [LineReader(p) for p in starters]
            for reader in readers:
                assert await reader.line() == b"armed"
            for process in starters:
                assert process.stdin is not None
                await process.stdin.send(b"go\n")
            for reader in readers:
                results.append(json.loads(await reader.line()))
            for process in starters:
                assert await process.wait() == 0
        finally:
            with anyio.CancelScope(shield=True):
                for process in starters:
                    if process.returncode is None:
                        process.kill()
                    await process.aclose()
                for pid in {r["pid"] for r in results} | set(daemons_under(data)):
                    await end_daemon(pid)
    assert sum(r["started_here"] for r in results) == 1
    assert len({(r["endpoint"], r["generation"], r["pid"]) for r in results}) == 1
    identity = read_identity(data)
    assert (identity["endpoint"], identity["generation"]) == (
        results[0]["endpoint"],
        results[0]["generation"],
    )


# -- identities that must not be trusted --------------------------------------


def _chmod(mode: int) -> Callable[[pathlib.Path], None]:
    return lambda path: path.chmod(mode)


def _edit(change: Callable[[dict[str, Any]], None]) -> Callable[[pathlib.Path], None]:
    def apply(path: pathlib.Path) -> None:
        identity = json.loads(path.read_text())
        change(identity)
        path.write_text(json.dumps(identity))

    return apply


def _symlink(path: pathlib.Path) -> None:
    # The same content, private, but reached through a symlink.
    target = path.with_name("elsewhere.json")
    path.rename(target)
    path.symlink_to(target)


def _replace_text(change: Callable[[str], str]) -> Callable[[pathlib.Path], None]:
    def apply(path: pathlib.Path) -> None:
        path.write_text(change(path.read_text()))

    return apply


def _chown_other(path: pathlib.Path) -> None:
    os.chown(path, 65534, 65534)


# (mutation, what distrust_reason says). The control row proves the copy itself
# is trusted, so each other row fails for its own reason alone.
UNTRUSTED: dict[str, tuple[Callable[[pathlib.Path], None], str | None]] = {
    "control": (lambda path: None, None),
    "mode-0644": (_chmod(0o644), "mode 0644"),
    "mode-0660": (_chmod(0o660), "mode 0660"),
    "mode-0604": (_chmod(0o604), "mode 0604"),
    "symlink": (_symlink, "cannot be opened"),
    "owned-by-other": (_chown_other, "belongs to uid 65534"),
    "bad-json": (_replace_text(lambda text: text[:-5]), "not valid JSON"),
    "not-an-object": (_replace_text(lambda text: "[1]"), "identity shape"),
    "missing-key": (_edit(lambda i: i.pop("token")), "identity shape"),
    "extra-key": (_edit(lambda i: i.update(extra=1)), "identity shape"),
    "pid-as-string": (_edit(lambda i: i.update(pid=str(i["pid"]))), "identity shape"),
    "version-true": (_edit(lambda i: i.update(version=True)), "identity shape"),
    "version-2": (_edit(lambda i: i.update(version=2)), "identity shape"),
    "token-not-str": (_edit(lambda i: i.update(token=None)), "identity shape"),
    "generation-int": (_edit(lambda i: i.update(generation=7)), "identity shape"),
    "endpoint-off-host": (
        _edit(lambda i: i.update(endpoint="10.1.2.3:" + i["endpoint"].split(":")[1])),
        "identity shape",
    ),
    "dead-pid": (_edit(lambda i: i.update(pid=dead_pid())), "not running"),
    "pid-of-another-program": (_edit(lambda i: i.update(pid=os.getpid())), "not running"),
}


@pytest.mark.parametrize("case", list(UNTRUSTED))
async def test_untrusted_identity_is_replaced_by_a_new_daemon(
    tmp_path: pathlib.Path, case: str
) -> None:
    """Property: an identity file is adopted only when it is a private regular file of
    ours, of exactly the expected shape and types, naming a live daemon of that
    generation; any single flaw makes start() spawn a daemon of its own.

    The doctored identity lives in data dir B but points at the live daemon of data
    dir A, so distrusting it can (and must) elect a new daemon on B.
    """
    mutate, reason = UNTRUSTED[case]
    if case == "owned-by-other" and os.getuid() != 0:
        pytest.skip("making a file owned by another uid needs root")
    with trio.fail_after(30):
        async with elected(tmp_path / "a") as a:
            b = tmp_path / "b"
            shared_dir(b).mkdir(parents=True, mode=0o700)
            copy = shared_dir(b) / "identity.json"
            copy.write_text((shared_dir(tmp_path / "a") / "identity.json").read_text())
            copy.chmod(0o600)
            mutate(copy)
            async with SharedLocalDaemon(b) as shared:
                await shared.start()
                try:
                    if reason is None:
                        assert not shared.started_here
                        assert shared.generation == a.generation
                        assert shared.distrust_reason is None
                    else:
                        assert shared.started_here
                        assert shared.generation != a.generation
                        assert shared.pid != a.pid
                        assert shared.distrust_reason is not None
                        assert reason in shared.distrust_reason
                        # The new daemon is the one published now.
                        assert read_identity(b)["generation"] == shared.generation
                finally:
                    if shared.started_here:
                        assert shared.pid is not None
                        await end_daemon(shared.pid)


async def test_invalidated_generation_is_not_adopted_again(tmp_path: pathlib.Path) -> None:
    """Property: after invalidate_current(), no start() in this process adopts that
    generation again, even though its daemon is alive and its file is flawless
    (here: the identity of A's daemon, found in data dir B)."""
    with trio.fail_after(30):
        async with elected(tmp_path / "a") as a:
            b = tmp_path / "b"
            shared_dir(b).mkdir(parents=True, mode=0o700)
            copy = shared_dir(b) / "identity.json"
            copy.write_text((shared_dir(tmp_path / "a") / "identity.json").read_text())
            copy.chmod(0o600)
            async with SharedLocalDaemon(b) as shared:
                await shared.start()
                assert shared.generation == a.generation  # trusted until now
                shared.invalidate_current()
                await shared.start()
                try:
                    assert shared.started_here
                    assert shared.generation != a.generation
                    assert shared.distrust_reason is not None
                    assert "invalidated" in shared.distrust_reason
                finally:
                    assert shared.pid is not None
                    await end_daemon(shared.pid)
            # Process-wide: a fresh object does not adopt it either.
            async with SharedLocalDaemon(tmp_path / "a") as fresh:
                with pytest.raises(RingoError, match="held by another ringod"):
                    await fresh.start()


async def test_invalidated_but_alive_daemon_is_named_as_the_holder(
    tmp_path: pathlib.Path,
) -> None:
    """Property (the decision for the invalidated-but-alive case): re-election does
    not kill a daemon it stopped trusting — other members may be using it. The new
    daemon cannot get the data dir, so start() fails with an error naming the
    holder's pid and why its identity was not adopted; once that daemon is gone,
    start() elects a new one."""
    with trio.fail_after(30):
        async with SharedLocalDaemon(tmp_path) as shared:
            await shared.start()
            old_pid, old_generation = shared.pid, shared.generation
            assert old_pid is not None
            shared.invalidate_current()
            with pytest.raises(RingoError) as info:
                await shared.start()
            message = str(info.value)
            assert f"held by another ringod (pid {old_pid})" in message
            assert f"generation {old_generation} was invalidated" in message
            # The failed election published nothing: the old identity stays.
            assert read_identity(tmp_path)["generation"] == old_generation
            await end_daemon(old_pid)
            await shared.start()
            assert shared.started_here
            assert shared.generation != old_generation
            assert shared.pid is not None
            await end_daemon(shared.pid)


async def test_zombie_counts_as_dead() -> None:
    """Property: a pid whose process exited but was not reaped (a zombie) is dead to
    the identity check; our own live pid is alive, a reaped pid is dead."""
    child = spawn_short_child()
    try:
        with trio.fail_after(10):
            await eventually(lambda: not pid_alive(child.pid))
        assert in_proc_table(child.pid)  # still there: a zombie
        assert not _shared._pid_alive(child.pid)
        assert _shared._pid_alive(os.getpid())
    finally:
        child.wait()
    assert not _shared._pid_alive(child.pid)


# -- the election lock ----------------------------------------------------------


async def test_cancelled_start_releases_the_election_lock(tmp_path: pathlib.Path) -> None:
    """Property: cancelling start() while it holds the election lock (its daemon not
    ready yet) kills that daemon and releases the lock: the next start() elects at once."""
    path, pid_file = fake_daemon(tmp_path, "exec sleep 60\n")
    data = tmp_path / "d"
    with trio.fail_after(30):
        async with SharedLocalDaemon(data, daemon_path=path) as stuck:
            with trio.move_on_after(0.5) as scope:
                await stuck.start()
            assert scope.cancelled_caught
        await eventually(lambda: not pid_alive(int(pid_file.read_text())), within=2)
        assert not (shared_dir(data) / "identity.json").exists()
        # A leaked lock would make this wait startup_timeout + grace, then fail.
        async with elected(data, startup_timeout=5) as shared:
            assert shared.started_here


async def test_waiting_for_the_election_lock_is_bounded_and_cancellable(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Property: while another process holds the election lock, start() waits at most
    startup_timeout + grace and says why, and a cancel during the wait is prompt."""
    monkeypatch.setattr(_shared, "_LOCK_GRACE_SECONDS", 0.0)
    data = tmp_path / "d"
    shared_dir(data).mkdir(parents=True, mode=0o700)
    holder = os.open(shared_dir(data) / "election.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        import fcntl

        fcntl.flock(holder, fcntl.LOCK_EX)
        with trio.fail_after(10):
            async with SharedLocalDaemon(data, startup_timeout=0.5) as shared:
                started = trio.current_time()
                with pytest.raises(RingoError, match="election lock"):
                    await shared.start()
                assert 0.5 <= trio.current_time() - started < 2
                with trio.move_on_after(0.2) as scope:
                    await shared.start()
                assert scope.cancelled_caught
    finally:
        os.close(holder)


# -- daemons that fail to start -------------------------------------------------


async def test_exit_3_names_the_data_dir_holder(tmp_path: pathlib.Path) -> None:
    """Property: a daemon that exits 3 (data dir held) becomes a RingoError naming the
    holder's pid and the log; nothing is published."""
    path, _ = fake_daemon(
        tmp_path,
        "echo 'ringod ERROR: data dir /x is in use by another ringod (pid 4242)' >&2\nexit 3\n",
    )
    with trio.fail_after(20):
        async with SharedLocalDaemon(tmp_path / "d", daemon_path=path) as shared:
            with pytest.raises(RingoError, match=r"held by another ringod \(pid 4242\)"):
                await shared.start()
            assert "in use by another ringod" in shared.stderr_tail
    assert not (shared_dir(tmp_path / "d") / "identity.json").exists()


async def test_private_daemon_on_the_data_dir_is_explained(tmp_path: pathlib.Path) -> None:
    """Property: a private (Ringo.local-style) daemon holding the data dir makes
    start() fail clearly, naming its pid."""
    from ringo_trio.testing import spawn_daemon

    with spawn_daemon(tmp_path) as private, trio.fail_after(30):
        async with SharedLocalDaemon(tmp_path) as shared:
            with pytest.raises(RingoError, match=rf"held by another ringod \(pid {private.pid}\)"):
                await shared.start()


async def test_other_early_exit_carries_the_code_and_log(tmp_path: pathlib.Path) -> None:
    path, _ = fake_daemon(tmp_path, "echo 'ringod: error: no such flag' >&2\nexit 2\n")
    with (
        trio.fail_after(20),
        pytest.raises(RingoError, match=r"exited \(code 2\).*no such flag"),
    ):
        async with SharedLocalDaemon(tmp_path / "d", daemon_path=path) as shared:
            await shared.start()


async def test_ready_line_without_our_generation_is_refused(tmp_path: pathlib.Path) -> None:
    """Property: a daemon whose ready line lacks our generation (no shared mode) is
    killed and not published."""
    path, pid_file = fake_daemon(
        tmp_path, 'echo \'{"endpoint": "127.0.0.1:7233", "pid": 1}\'\nexec sleep 60\n'
    )
    with trio.fail_after(20):
        async with SharedLocalDaemon(tmp_path / "d", daemon_path=path) as shared:
            with pytest.raises(RingoError, match="does not support shared mode"):
                await shared.start()
        await eventually(lambda: not pid_alive(int(pid_file.read_text())), within=2)
    assert not (shared_dir(tmp_path / "d") / "identity.json").exists()


async def test_silent_daemon_times_out_and_is_killed(tmp_path: pathlib.Path) -> None:
    path, pid_file = fake_daemon(tmp_path, "echo 'warming up forever' >&2\nexec sleep 60\n")
    with trio.fail_after(20):
        async with SharedLocalDaemon(
            tmp_path / "d", daemon_path=path, startup_timeout=0.5
        ) as shared:
            with pytest.raises(RingoError, match=r"readiness within 0.5s.*warming up forever"):
                await shared.start()
        await eventually(lambda: not pid_alive(int(pid_file.read_text())), within=2)


async def test_shared_dir_of_another_user_is_refused(tmp_path: pathlib.Path) -> None:
    """Property: a shared/ dir we do not own is never used (another user could swap
    the identity); one of ours that is too open is tightened to 0700."""
    data = tmp_path / "d"
    shared_dir(data).mkdir(parents=True)
    shared_dir(data).chmod(0o755)
    with trio.fail_after(30):
        async with elected(data):
            assert stat.S_IMODE(shared_dir(data).stat().st_mode) == 0o700
        if os.getuid() != 0:
            return  # chown to another uid needs root
        other = tmp_path / "other"
        shared_dir(other).mkdir(parents=True, mode=0o700)
        os.chown(shared_dir(other), 65534, 65534)
        async with SharedLocalDaemon(other) as shared:
            with pytest.raises(RingoError, match="belongs to uid 65534"):
                await shared.start()

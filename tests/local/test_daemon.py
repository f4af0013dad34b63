"""The private local daemon: never leaked, failures explained, stops bounded."""

from __future__ import annotations

import os
import pathlib
import signal
import stat
import sys
import textwrap
from typing import Any

import anyio
import pytest
import trio

from ringo_trio import PostgresStorage, Ringo, RingoError
from ringo_trio._local.process import LocalDaemon
from ringo_trio.testing import spawn_daemon
from tests._kit.processes import eventually, live_daemon_children, pid_alive

pytestmark = pytest.mark.trio


def fake_daemon(tmp_path: pathlib.Path, body: str) -> tuple[pathlib.Path, pathlib.Path]:
    """An executable standing in for the daemon; it records its pid first."""
    pid_file = tmp_path / "fake.pid"
    script = tmp_path / "fake-daemon"
    script.write_text(f"#!/bin/sh\necho $$ > {pid_file}\n{textwrap.dedent(body)}")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, pid_file


async def wait_gone(pid: int, within: float = 5.0) -> None:
    await eventually(lambda: not pid_alive(pid), within)


async def test_sdk_killed_with_sigkill_takes_its_daemon_along(tmp_path: pathlib.Path) -> None:
    """Property: SIGKILL of the SDK process (no cleanup code runs) still ends the daemon:
    its lifecycle pipe reaches EOF when the kernel closes our end."""
    script = tmp_path / "sdk.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys, trio
            from ringo_trio import Ringo

            async def main():
                async with Ringo.local(sys.argv[1]) as client:
                    await client.queue("q").enqueue(task_type="t")
                    print(client.daemon_pid, flush=True)
                    await trio.sleep(60)

            trio.run(main)
            """
        )
    )
    with trio.fail_after(30):
        sdk = await anyio.open_process(
            [sys.executable, str(script), str(tmp_path / "data")], stderr=None
        )
        async with sdk:
            assert sdk.stdout is not None
            line = b""
            while not line.endswith(b"\n"):
                line += await sdk.stdout.receive()
            daemon_pid = int(line)
            assert pid_alive(daemon_pid)
            sdk.send_signal(signal.SIGKILL)
            await sdk.wait()
            await wait_gone(daemon_pid)


async def test_daemon_that_never_gets_ready_is_killed(tmp_path: pathlib.Path) -> None:
    """Property: a daemon silent past startup_timeout is killed; the error carries its stderr."""
    path, pid_file = fake_daemon(tmp_path, "echo 'warming up forever' >&2\nexec sleep 60\n")
    with trio.fail_after(20):
        with pytest.raises(RingoError, match=r"readiness within 1s.*warming up forever"):
            async with Ringo.local(tmp_path / "d", daemon_path=path, startup_timeout=1):
                pass
        await wait_gone(int(pid_file.read_text()), within=1)


async def test_daemon_exiting_at_start_reports_exit_code_and_stderr(tmp_path: pathlib.Path) -> None:
    path, _ = fake_daemon(tmp_path, "echo 'ringod: error: no such flag' >&2\nexit 2\n")
    with trio.fail_after(20), pytest.raises(RingoError, match=r"code 2.*no such flag"):
        async with Ringo.local(tmp_path / "d", daemon_path=path):
            pass


async def test_garbage_instead_of_readiness_line(tmp_path: pathlib.Path) -> None:
    path, pid_file = fake_daemon(tmp_path, "echo 'hello there'\nexec sleep 60\n")
    with trio.fail_after(20):
        with pytest.raises(RingoError, match="instead of its readiness line"):
            async with Ringo.local(tmp_path / "d", daemon_path=path):
                pass
        await wait_gone(int(pid_file.read_text()), within=1)


async def test_missing_daemon_executable(tmp_path: pathlib.Path) -> None:
    with trio.fail_after(20), pytest.raises(RingoError, match="cannot start the local daemon"):
        async with Ringo.local(tmp_path, daemon_path=tmp_path / "nope"):
            pass


async def test_cancelled_start_kills_the_daemon(tmp_path: pathlib.Path) -> None:
    """Property: cancelling `async with Ringo.local(...)` while the daemon starts kills it."""
    path, pid_file = fake_daemon(tmp_path, "exec sleep 60\n")
    with trio.fail_after(20):
        with trio.move_on_after(0.5) as scope:
            async with Ringo.local(tmp_path / "d", daemon_path=path):
                pytest.fail("must not get here")
        assert scope.cancelled_caught
        await wait_gone(int(pid_file.read_text()), within=1)


async def test_unreachable_database_is_surfaced_without_its_password(
    tmp_path: pathlib.Path,
) -> None:
    """Property: a private daemon that cannot reach its PostgreSQL database
    fails the client's start with the daemon's own one-line reason (exit 1),
    and the DSN's password appears nowhere in it."""
    storage = PostgresStorage("postgresql://ringo:hunter2@127.0.0.1:1/ringo")
    with trio.fail_after(20), pytest.raises(RingoError, match=r"exited \(code 1\)") as info:
        async with Ringo.local(tmp_path, storage=storage):
            pass
    assert "hunter2" not in str(info.value)
    assert "Traceback" not in str(info.value)


async def test_the_dsn_reaches_the_daemon_through_its_environment(tmp_path: pathlib.Path) -> None:
    """Property: with PostgresStorage the child daemon gets the DSN in
    RINGO_POSTGRES_DSN and the schema as a flag — never the DSN on its
    command line (the process list) — and no --data-dir."""
    args_file, env_file = tmp_path / "args", tmp_path / "env"
    path, _ = fake_daemon(
        tmp_path, f'echo "$@" > {args_file}\necho "$RINGO_POSTGRES_DSN" > {env_file}\nexit 2\n'
    )
    storage = PostgresStorage("postgresql://ringo:hunter2@db/ringo", schema="app")
    with trio.fail_after(20), pytest.raises(RingoError, match=r"code 2"):
        async with Ringo.local(tmp_path / "d", storage=storage, daemon_path=path):
            pass
    args = (await trio.Path(args_file).read_text()).split()
    assert "hunter2" not in " ".join(args)
    assert "--data-dir" not in args
    assert args[args.index("--postgres-schema") + 1] == "app"
    assert (await trio.Path(env_file).read_text()).strip() == storage.dsn


async def test_locked_data_dir_is_explained(tmp_path: pathlib.Path) -> None:
    with (
        spawn_daemon(tmp_path),
        trio.fail_after(20),
        pytest.raises(RingoError, match=r"exited \(code 3\)"),
    ):
        async with Ringo.local(tmp_path):
            pass


async def test_stop_is_bounded_by_stop_timeout(tmp_path: pathlib.Path) -> None:
    """Property: a daemon that ignores its lifecycle pipe is killed after stop_timeout."""
    # The real daemon, minus --lifecycle-stdin: it will not notice its stdin closing.
    path = tmp_path / "deaf-daemon"
    path.write_text(
        f"#!{sys.executable}\n"
        "import os, sys\n"
        "args = [a for a in sys.argv[1:] if a != '--lifecycle-stdin']\n"
        "os.execv(sys.executable, [sys.executable, '-m', 'ringo_trio.server', *args])\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    with trio.fail_after(20):
        client = Ringo.local(tmp_path / "d", daemon_path=path, stop_timeout=1.0)
        async with client:
            pid = client.daemon_pid
            assert pid is not None
            start = trio.current_time()
        assert 1.0 <= trio.current_time() - start < 5
        assert not pid_alive(pid)


async def test_local_daemon_restart_after_death(tmp_path: pathlib.Path) -> None:
    """LocalDaemon itself: start, observe death, start again on the same data dir."""
    with trio.fail_after(20):
        async with LocalDaemon(tmp_path) as daemon:
            first = await daemon.start()
            pid = daemon.pid
            assert pid is not None
            assert not daemon.is_dead
            with pytest.raises(RingoError, match="already running"):
                await daemon.start()
            os.kill(pid, signal.SIGKILL)
            await wait_gone(pid)
            await eventually(lambda: daemon.is_dead, within=2)
            second = await daemon.start()
            assert daemon.pid != pid
            assert second != first
            await daemon.stop()
            assert not daemon.is_dead  # stopped on purpose is not "dead"


@pytest.mark.parametrize("delay", [0.0, 0.01, 0.03, 0.06, 0.1, 0.15, 0.2, 0.3])
async def test_cancellation_at_any_point_of_start_leaks_nothing(
    tmp_path: pathlib.Path, delay: float
) -> None:
    """Property: wherever a cancel lands during start (spawn, readiness, health, negotiate,
    or the body), no daemon outlives the `async with` (no_leaked_daemons checks)."""
    with trio.fail_after(20):
        with trio.move_on_after(delay):
            async with Ringo.local(tmp_path) as client:
                await client.queue("q").enqueue(task_type="t")
                await trio.sleep_forever()
        assert live_daemon_children() == []


async def test_failed_start_kills_at_once_not_at_exit(tmp_path: pathlib.Path) -> None:
    """Property: a failed or cancelled LocalDaemon.start() kills its child before it
    returns, not later when the owner exits (a restart from the recovery path happens
    deep inside a long-lived client)."""
    path, pid_file = fake_daemon(tmp_path, "exec sleep 60\n")
    with trio.fail_after(20):
        async with LocalDaemon(tmp_path / "d", daemon_path=path, startup_timeout=0.5) as daemon:
            with pytest.raises(RingoError, match="readiness"):
                await daemon.start()
            assert not pid_alive(int(pid_file.read_text()))
            pid_file.unlink()
            with trio.move_on_after(0.3):
                await daemon.start()
            assert not pid_alive(int(pid_file.read_text()))


async def test_unusable_data_dir_is_a_ringo_error(tmp_path: pathlib.Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with trio.fail_after(20), pytest.raises(RingoError, match="cannot create the data dir"):
        async with Ringo.local(blocker / "data"):
            pass


async def test_stop_during_start_leaves_no_daemon(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Property: a stop() that lands while start() is still before its spawn (the client's
    aclose() racing a recovery restart) wins: start() fails and no daemon runs after
    stop() returned — not just after the owner exits."""
    reached, release = trio.Event(), trio.Event()
    real_mkdir = anyio.Path.mkdir

    async def parked_mkdir(self: anyio.Path, *args: Any, **kwargs: Any) -> None:
        reached.set()
        await release.wait()
        await real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(anyio.Path, "mkdir", parked_mkdir)
    with trio.fail_after(20):
        async with LocalDaemon(tmp_path) as daemon:
            outcome: list[object] = []

            async def start() -> None:
                try:
                    outcome.append(await daemon.start())
                except RingoError as error:
                    outcome.append(error)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(start)
                await reached.wait()
                await daemon.stop()
                release.set()
            assert isinstance(outcome[0], RingoError), outcome
            assert live_daemon_children() == []

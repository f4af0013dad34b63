"""The ``ringod`` process: flags, ready line, lock, shutdown paths, event loop."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from grpclib.const import Status

from ringo_trio._contract import versions
from ringo_trio._proto.grpc.health.v1 import (
    HealthCheckRequest,
    HealthCheckResponseServingStatus,
)
from ringo_trio.server import flags
from ringo_trio.server import main as _main
from ringo_trio.testing import DaemonStartError, spawn_daemon
from tests._kit.grpc_client import connect, expect_status, new_queue

pytestmark = pytest.mark.anyio

MODULE = [sys.executable, "-m", "ringo_trio.server"]
TIMEOUT = 30


def _run(*args: str, stdin: int | None = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MODULE, *args], capture_output=True, text=True, timeout=TIMEOUT, stdin=stdin
    )


async def _serving(endpoint: str) -> bool:
    async with connect(endpoint, negotiate=False) as client:
        response = await client.health.check(HealthCheckRequest())
        return response.status is HealthCheckResponseServingStatus.SERVING


def _serving_sync(endpoint: str) -> bool:
    """`_serving` for the tests that drive a raw subprocess synchronously."""

    async def check() -> bool:
        with anyio.fail_after(10):
            return await _serving(endpoint)

    return anyio.run(check, backend="asyncio")


def test_help_documents_every_flag() -> None:
    """Property: --help names every flag, and explains --lifecycle-stdin."""
    result = _run("--help")
    assert result.returncode == 0
    for flag in (
        "--listen",
        "--data-dir",
        "--postgres",
        "--postgres-schema",
        "--postgres-pool-size",
        "--safety-poll",
        "--token",
        "--token-file",
        "--protocol-minor",
        "--session-ttl",
        "--lifecycle-stdin",
        "--log-level",
        "--shutdown-timeout",
        "--loop",
        "--heartbeat-interval",
        "--local-token-file",
        "--generation",
        "--linger",
        "--attach-timeout",
        "--auth-failure-delay",
        "--tls-cert",
        "--tls-key",
        "--tls-client-ca",
    ):
        assert flag in result.stdout
    assert "stdin reaches EOF" in result.stdout
    assert "by hand" in result.stdout
    assert "RINGO_POSTGRES_DSN" in result.stdout
    assert "RINGO_DAEMON_TOKEN" in result.stdout


async def test_token_file_requires_the_token_it_holds(tmp_path: Path) -> None:
    """Property: --token-file works like --token (the secret stays out of the
    process list); an empty or missing file is a usage error."""
    secret = tmp_path / "token"
    secret.write_text("  from-a-file\n")
    with spawn_daemon(tmp_path / "data", extra_args=["--token-file", str(secret)]) as process:
        assert process.info["auth"] is True
        assert "from-a-file" not in " ".join(process.args)
        with anyio.fail_after(10):
            async with connect(process, token="from-a-file") as client:
                await client.enqueue(new_queue())
            async with connect(process, negotiate=False) as anonymous:
                await expect_status(
                    anonymous.health.check(HealthCheckRequest()), Status.UNAUTHENTICATED
                )
    secret.write_text("\n")
    for path in (secret, tmp_path / "missing"):
        result = _run("--token-file", str(path), "--data-dir", str(tmp_path / "d2"))
        assert result.returncode == _main.EXIT_USAGE
        assert "--token-file" in result.stderr


def test_an_unreachable_database_is_a_one_line_startup_error() -> None:
    """Property: a PostgreSQL daemon that cannot reach its database exits 1
    with a one-line reason (no traceback) and prints nothing on stdout; the
    DSN's password appears nowhere in what it says."""
    result = _run(
        "--postgres", "postgresql://ringo:hunter2@127.0.0.1:1/ringo", "--listen", "127.0.0.1:0"
    )
    assert result.returncode == _main.EXIT_FAILURE
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, result.stderr
    assert "hunter2" not in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("args", "environ", "expected"),
    [
        ([], {}, "sqlite:default"),
        ([], {"RINGO_POSTGRES_DSN": "postgresql://env/db"}, "postgres:postgresql://env/db"),
        ([], {"RINGO_POSTGRES_DSN": ""}, "sqlite:default"),
        (["--data-dir", "/d"], {"RINGO_POSTGRES_DSN": "postgresql://env/db"}, "sqlite:/d"),
        (["--postgres", "postgresql://flag/db"], {}, "postgres:postgresql://flag/db"),
        (
            ["--postgres", "postgresql://flag/db"],
            {"RINGO_POSTGRES_DSN": "postgresql://env/db"},
            "postgres:postgresql://flag/db",
        ),
        (["--postgres", "x", "--data-dir", "/d"], {}, "exclude each other"),
        (["--postgres", " "], {}, "non-empty DSN"),
        (["--postgres-schema", "s"], {}, "only applies to PostgreSQL"),
        (["--postgres-pool-size", "3"], {}, "only applies to PostgreSQL"),
        (["--postgres", "x", "--postgres-schema", ""], {}, "1..63 bytes"),
        (["--postgres", "x", "--postgres-schema", "s" * 64], {}, "1..63 bytes"),
    ],
)
def test_storage_selection_prefers_explicit_flags_over_the_environment(
    args: list[str], environ: dict[str, str], expected: str
) -> None:
    """Property: --postgres, then --data-dir, then $RINGO_POSTGRES_DSN, then
    the default data dir: an exported DSN never hijacks a daemon started on a
    data dir, and contradictory storage flags are refused, not ignored."""
    choice = flags.storage_choice(flags.build_parser().parse_args(args), environ)
    if isinstance(choice, str):
        assert expected in choice
    elif choice.postgres_dsn is not None:
        assert expected == f"postgres:{choice.postgres_dsn}"
        assert choice.data_dir is None
    else:
        assert choice.data_dir is not None
        default = expected == "sqlite:default"
        assert choice.data_dir == (flags._default_data_dir() if default else Path("/d"))
    assert "flag/db" not in repr(choice)
    assert "env/db" not in repr(choice)


def test_storage_usage_errors_exit_2_with_nothing_on_stdout(tmp_path: Path) -> None:
    """Property: contradictory storage flags stop the daemon before it touches
    anything (exit 2, the reason on stderr), shared mode included."""
    token = tmp_path / "token"
    token.write_text("t")
    for args, message in [
        (["--postgres", "postgresql://x/y", "--data-dir", str(tmp_path)], "exclude each other"),
        (
            ["--postgres", "x", "--local-token-file", str(token), "--generation", "g"],
            "shared mode",
        ),
    ]:
        result = _run(*args, "--listen", "127.0.0.1:0")
        assert result.returncode == _main.EXIT_USAGE
        assert message in result.stderr
        assert result.stdout == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--protocol-minor", str(versions.MINOR + 1)], "outside the served range"),
        (["--protocol-minor", "-1"], "outside the served range"),
        (["--session-ttl", "0"], "positive number of seconds"),
        (["--session-ttl", "nan"], "positive number of seconds"),
        (["--listen", "7233"], "expected HOST:PORT"),
        (["--listen", "::1:7233"], "brackets"),
        (["--listen", "127.0.0.1:70000"], "outside 0..65535"),
        (["--safety-poll", "-1"], "seconds >= 0"),
        (["--postgres-pool-size", "0"], "outside 1..1000"),
    ],
)
def test_bad_flags_are_usage_errors(args: list[str], message: str) -> None:
    """Property: an invalid flag value exits 2 with a message saying why."""
    result = _run(*args)
    assert result.returncode == _main.EXIT_USAGE
    assert message in result.stderr


def test_ready_line_is_the_only_stdout_and_names_the_real_endpoint(tmp_path: Path) -> None:
    """Property: a serving daemon prints exactly one JSON line on stdout with
    its real bound endpoint (port 0 resolved) and pid; logs go to stderr; the
    data dir is created (nested) and holds the database and the lock."""
    data_dir = tmp_path / "a" / "b" / "data"
    process = subprocess.Popen(
        [*MODULE, "--listen", "127.0.0.1:0", "--data-dir", str(data_dir), "--lifecycle-stdin"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        assert process.stdin is not None
        line = process.stdout.readline()
        info = json.loads(line)
        assert info["pid"] == process.pid
        host, port = info["endpoint"].rsplit(":", 1)
        assert (host, int(port)) == ("127.0.0.1", info["port"])
        assert info["port"] != 0
        assert info["protocol_major"] == versions.MAJOR
        assert info["protocol_minor"] == versions.MINOR
        assert info["data_dir"] == str(data_dir)
        assert _serving_sync(info["endpoint"])
        assert (data_dir / "ringo.db").exists()
        assert (data_dir / "ringod.lock").read_text().strip() == str(process.pid)
        process.stdin.close()
        assert process.wait(timeout=TIMEOUT) == 0
        rest = process.stdout.read()
        assert process.stderr is not None
        stderr = process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()
    assert rest == b"", "stdout carries nothing but the ready line"
    assert b"serving on" in stderr


async def test_explicit_port_is_used(tmp_path: Path) -> None:
    """Property: --listen HOST:PORT binds exactly that port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with spawn_daemon(tmp_path / "data", extra_args=["--listen", f"127.0.0.1:{port}"]) as process:
        assert process.endpoint == f"127.0.0.1:{port}"
        with anyio.fail_after(10):
            assert await _serving(process.endpoint)


def test_address_in_use_fails_with_a_message(tmp_path: Path) -> None:
    """Property: an unbindable address is a clear startup failure (exit 1)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _run("--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp_path / "d"))
    assert result.returncode == _main.EXIT_FAILURE
    assert f"cannot serve on 127.0.0.1:{port}" in result.stderr
    assert result.stdout == ""


def test_data_written_by_a_newer_schema_is_a_clear_startup_error(tmp_path: Path) -> None:
    """Property: a data dir whose schema is newer than this ringod is refused
    at startup with exit 1 and a one-line reason (no traceback), and the
    database is left as it was."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    db_path = data_dir / flags.DB_FILE_NAME
    with sqlite3.connect(db_path) as raw:
        raw.execute("PRAGMA journal_mode = WAL")  # as every ringod database is
        raw.execute("PRAGMA user_version = 9999")
    raw.close()
    before = db_path.read_bytes()
    result = _run("--listen", "127.0.0.1:0", "--data-dir", str(data_dir))
    assert result.returncode == _main.EXIT_FAILURE
    assert "schema version 9999 is newer" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    assert db_path.read_bytes() == before


async def test_second_daemon_on_the_same_data_dir_is_refused(tmp_path: Path) -> None:
    """Property: one daemon per data dir — a second one exits non-zero naming
    the dir and the pid holding it, and the first keeps serving unharmed."""
    data_dir = tmp_path / "data"
    with spawn_daemon(data_dir) as first:
        with anyio.fail_after(10):
            async with connect(first) as client:
                queue = new_queue()
                task = await client.enqueue(queue)
        with pytest.raises(DaemonStartError) as refused:
            spawn_daemon(data_dir)
        assert refused.value.returncode == _main.EXIT_DATA_DIR_LOCKED
        assert str(data_dir) in refused.value.stderr
        assert f"pid {first.pid}" in refused.value.stderr
        with anyio.fail_after(10):
            async with connect(first) as client:
                assert (await client.get(queue, task.id)).id == task.id


async def test_kill_releases_the_lock_and_committed_work_survives(tmp_path: Path) -> None:
    """Property: SIGKILL leaves no stale lock (the next daemon starts on the
    same dir), committed tasks survive, and old session tokens do not."""
    queue = new_queue()
    with spawn_daemon(tmp_path / "data") as process:
        with anyio.fail_after(10):
            async with connect(process) as client:
                task = await client.enqueue(queue, unique_key="durable")
                old_context = client.context
        assert process.kill() == -signal.SIGKILL
        process.restart()
        with anyio.fail_after(10):
            async with connect(process) as client:
                assert (await client.get(queue, task.id)).unique_key == "durable"
                client.context = old_context
                await expect_status(client.get(queue, task.id), Status.OUT_OF_RANGE)


@pytest.mark.parametrize("how", ["stdin-eof", "sigterm", "sigint"])
async def test_graceful_shutdown_paths_exit_zero(tmp_path: Path, how: str) -> None:
    """Property: EOF on the lifecycle pipe, SIGTERM and SIGINT each shut the
    daemon down gracefully with exit status 0."""
    process = spawn_daemon(tmp_path / "data")
    try:
        with anyio.fail_after(10):
            assert await _serving(process.endpoint)
        if how == "stdin-eof":
            returncode = process.stop()
        elif how == "sigterm":
            returncode = process.terminate()
        else:
            returncode = process.interrupt()
    finally:
        process.stop()
    assert returncode == 0, process.stderr_text()
    assert "shutting down" in process.stderr_text()
    assert "Traceback" not in process.stderr_text()


def test_without_lifecycle_flag_a_closed_stdin_does_not_stop_the_daemon(tmp_path: Path) -> None:
    """Property: started by hand (no --lifecycle-stdin, stdin /dev/null) the
    daemon keeps serving; only a signal stops it."""
    process = subprocess.Popen(
        [*MODULE, "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "data")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert process.stdout is not None
        info = json.loads(process.stdout.readline())
        time.sleep(0.5)
        assert process.poll() is None
        assert _serving_sync(info["endpoint"])
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=TIMEOUT) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()  # type: ignore[union-attr]


def test_lifecycle_flag_refuses_a_stdin_that_is_not_a_pipe(tmp_path: Path) -> None:
    """Property: --lifecycle-stdin with stdin /dev/null or a regular file is a
    usage error naming the problem (such a stdin has no meaningful EOF, and
    epoll cannot watch it) instead of a daemon that exits or hangs oddly."""
    result = _run("--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "d"), "--lifecycle-stdin")
    assert result.returncode == _main.EXIT_USAGE
    assert "needs stdin to be a pipe" in result.stderr
    assert "/dev/null" in result.stderr
    regular = tmp_path / "stdin.txt"
    regular.write_text("x")
    with regular.open("rb") as stdin:
        result = _run(
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            str(tmp_path / "d"),
            "--lifecycle-stdin",
            stdin=stdin.fileno(),
        )
    assert result.returncode == _main.EXIT_USAGE
    assert "a regular file" in result.stderr
    assert result.stdout == ""


def test_console_script_and_module_are_the_same_daemon(tmp_path: Path) -> None:
    """Property: the `ringod` console script starts the same daemon as
    `python -m ringo_trio.server`."""
    ringod = shutil.which("ringod", path=os.path.dirname(sys.executable))
    assert ringod is not None, "ringod console script is not installed"
    with spawn_daemon(tmp_path / "data", command=[ringod]) as process:
        assert process.info["version"]
        assert process.args[0] == ringod
    assert process.process.returncode == 0


def test_event_loop_is_uvloop_when_installed(tmp_path: Path) -> None:
    """Property: the daemon runs on uvloop when it is importable, else on the
    stock loop, and says which in its ready line; --loop asyncio forces stock."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        expected = "asyncio"
    else:
        expected = "uvloop"
    with spawn_daemon(tmp_path / "a") as process:
        assert process.info["loop"] == expected
    with spawn_daemon(tmp_path / "b", extra_args=["--loop", "asyncio"]) as process:
        assert process.info["loop"] == "asyncio"


def test_loop_selection_falls_back_without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Property: without uvloop installed, auto picks the stock loop and an
    explicit --loop uvloop is an error rather than a silent fallback."""
    monkeypatch.setitem(sys.modules, "uvloop", None)  # makes `import uvloop` fail
    assert _main.select_loop_factory("auto") == (None, "asyncio")
    with pytest.raises(ImportError):
        _main.select_loop_factory("uvloop")

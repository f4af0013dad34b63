"""Test kit: run a real ``ringod`` as a child process from a test.

    from ringo_trio.testing import spawn_daemon

    def test_something(tmp_path):
        with spawn_daemon(tmp_path / "data") as daemon:
            ...  # connect to daemon.endpoint
            daemon.restart()  # same data dir, new port
        # stdin closed, daemon shut down gracefully (or killed after a timeout)

Everything here is synchronous and blocking (``subprocess`` and
``selectors``, no event loop), so it works from trio, asyncio and plain
tests alike; call it from a fixture or wrap it in a worker thread from async
code. POSIX only, as is the daemon.

The daemon runs as ``python -m ringo_trio.server --listen 127.0.0.1:0
--data-dir DIR --lifecycle-stdin`` with its stdin a pipe held by this
object, so a crashed test run never leaves a daemon behind: the pipe closes
with the test process and the daemon shuts down. Its stderr (the log) goes
to a temporary file, readable with `DaemonProcess.stderr_text`, so a chatty
daemon can never block on a full pipe.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import Any

from .._contract import readiness

__all__ = ["DaemonProcess", "DaemonStartError", "spawn_daemon"]

_STOP_TIMEOUT = 10.0


class DaemonStartError(RuntimeError):
    """The daemon exited or stayed silent instead of announcing its endpoint."""

    def __init__(self, message: str, *, returncode: int | None, stderr: str) -> None:
        super().__init__(f"{message}\n--- ringod stderr ---\n{stderr}".rstrip())
        self.returncode = returncode
        self.stderr = stderr


def _close_pipes(process: subprocess.Popen[bytes]) -> None:
    for stream in (process.stdin, process.stdout):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()


def _wait(process: subprocess.Popen[bytes], timeout: float) -> int:
    """Wait for the exit (SIGKILL after `timeout` seconds), close our pipes;
    the exit status."""
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    _close_pipes(process)
    return process.returncode


def _reap(process: subprocess.Popen[bytes]) -> None:
    # Safety net for a DaemonProcess dropped without close(): never leave an
    # orphan daemon (or a zombie) behind.
    if process.poll() is None:
        process.kill()
    _wait(process, _STOP_TIMEOUT)


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


class DaemonProcess:
    """One ``ringod`` child process (restartable on the same data dir).

    Use `spawn_daemon` to create a started one. Attributes of the running
    daemon: `endpoint` (``"127.0.0.1:PORT"``), `host`, `port`, `pid`,
    `process` (the `subprocess.Popen`) and `info` (the daemon's JSON ready
    line as a dict).
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None,
        *,
        postgres_dsn: str | None = None,
        token: str | None = None,
        protocol_minor: int | None = None,
        session_ttl: float | timedelta | None = None,
        extra_args: Iterable[str] = (),
        env: Mapping[str, str] | None = None,
        startup_timeout: float = 30.0,
        command: Sequence[str] | None = None,
    ) -> None:
        if (data_dir is None) == (postgres_dsn is None):
            raise ValueError("give exactly one of data_dir and postgres_dsn")
        self.data_dir = None if data_dir is None else Path(data_dir)
        self.command = list(command) if command is not None else None
        self.token = token
        self.protocol_minor = protocol_minor
        if isinstance(session_ttl, timedelta):
            session_ttl = session_ttl.total_seconds()
        self.session_ttl = session_ttl
        self.extra_args = tuple(extra_args)
        self.env = dict(env) if env is not None else None
        if postgres_dsn is not None:
            # The environment, not argv: `ps` shows argv to every user.
            self.env = {**(self.env or {}), "RINGO_POSTGRES_DSN": postgres_dsn}
        self.startup_timeout = startup_timeout
        self.info: dict[str, Any] = {}
        self._process: subprocess.Popen[bytes] | None = None
        fd, self._stderr_path = tempfile.mkstemp(prefix="ringod-", suffix=".log")
        os.close(fd)
        weakref.finalize(self, _unlink, self._stderr_path)

    # -- what is running ---------------------------------------------------

    @property
    def args(self) -> list[str]:
        """The command line the daemon is started with."""
        program = self.command or [sys.executable, "-m", "ringo_trio.server"]
        argv = [*program, "--listen", "127.0.0.1:0", "--lifecycle-stdin"]
        if self.data_dir is not None:
            argv += ["--data-dir", str(self.data_dir)]
        if self.token is not None:
            argv += ["--token", self.token]
        if self.protocol_minor is not None:
            argv += ["--protocol-minor", str(self.protocol_minor)]
        if self.session_ttl is not None:
            argv += ["--session-ttl", repr(float(self.session_ttl))]
        return argv + list(self.extra_args)

    @property
    def process(self) -> subprocess.Popen[bytes]:
        if self._process is None:
            raise RuntimeError("the daemon has not been started")
        return self._process

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def endpoint(self) -> str:
        return str(self._ready_value("endpoint"))

    @property
    def host(self) -> str:
        return str(self._ready_value("host"))

    @property
    def port(self) -> int:
        return int(self._ready_value("port"))

    @property
    def pid(self) -> int:
        return self.process.pid

    def _ready_value(self, key: str) -> Any:
        if key not in self.info:
            raise RuntimeError("the daemon is not serving")
        return self.info[key]

    def stderr_text(self) -> str:
        """Everything the daemon (all its restarts) wrote to stderr so far."""
        with open(self._stderr_path, "rb") as log:
            return log.read().decode("utf-8", "replace")

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> None:
        """Start the daemon and wait for its JSON ready line.

        Raises `DaemonStartError` (with the daemon's stderr) if it exits or
        does not announce itself within `startup_timeout` seconds.
        """
        if self.running:
            raise RuntimeError("the daemon is already running")
        self.info = {}
        env = None if self.env is None else {**os.environ, **self.env}
        # O_APPEND: restarts add to one log, and the child's writes never race
        # our reads over a shared file offset.
        stderr_fd = os.open(self._stderr_path, os.O_WRONLY | os.O_APPEND)
        try:
            process = subprocess.Popen(
                self.args,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr_fd,
                env=env,
            )
        finally:
            os.close(stderr_fd)
        self._process = process
        weakref.finalize(self, _reap, process)
        try:
            line = self._read_ready_line(process)
            self.info = readiness.parse_line(line)
        except BaseException:
            _reap(process)
            raise

    def _read_ready_line(self, process: subprocess.Popen[bytes]) -> bytes:
        assert process.stdout is not None
        fd = process.stdout.fileno()
        deadline = time.monotonic() + self.startup_timeout
        buffer = b""
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while b"\n" not in buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise DaemonStartError(
                        f"ringod did not announce its endpoint within {self.startup_timeout:g}s",
                        returncode=process.poll(),
                        stderr=self.stderr_text(),
                    )
                if not selector.select(remaining):
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    returncode = process.wait(timeout=_STOP_TIMEOUT)
                    raise DaemonStartError(
                        f"ringod exited with status {returncode} before it was ready",
                        returncode=returncode,
                        stderr=self.stderr_text(),
                    )
                buffer += chunk
        line, _, _ = buffer.partition(b"\n")
        return line

    def stop(self, timeout: float = _STOP_TIMEOUT) -> int | None:
        """Graceful shutdown through the lifecycle pipe (stdin EOF); SIGKILL if
        the daemon is still running after `timeout` seconds. Returns the exit
        status (None if it was never started)."""
        process = self._process
        if process is None:
            return None
        if process.stdin is not None and not process.stdin.closed:
            with contextlib.suppress(OSError):
                process.stdin.close()
        return _wait(process, timeout)

    close = stop

    def terminate(self, timeout: float = _STOP_TIMEOUT) -> int:
        """SIGTERM, then wait (SIGKILL after `timeout`); the exit status."""
        return self._signal(signal.SIGTERM, timeout)

    def interrupt(self, timeout: float = _STOP_TIMEOUT) -> int:
        """SIGINT (as Ctrl-C would), then wait; the exit status."""
        return self._signal(signal.SIGINT, timeout)

    def kill(self) -> int:
        """SIGKILL: the daemon gets no chance to clean up (crash testing)."""
        return self._signal(signal.SIGKILL, _STOP_TIMEOUT)

    def _signal(self, signum: signal.Signals, timeout: float) -> int:
        process = self.process
        if process.poll() is None:
            process.send_signal(signum)
        return _wait(process, timeout)

    def restart(self) -> None:
        """Stop the daemon (gracefully, if it still runs) and start a new one on
        the same data dir; it listens on a new port, so re-read `endpoint`."""
        if self._process is not None:
            self.stop()
        self.start()

    def __enter__(self) -> DaemonProcess:
        if self._process is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = self.info.get("endpoint", "not serving")
        return f"<DaemonProcess {where} data_dir={str(self.data_dir)!r}>"


def spawn_daemon(
    data_dir: str | os.PathLike[str] | None,
    *,
    postgres_dsn: str | None = None,
    token: str | None = None,
    protocol_minor: int | None = None,
    session_ttl: float | timedelta | None = None,
    extra_args: Iterable[str] = (),
    env: Mapping[str, str] | None = None,
    startup_timeout: float = 30.0,
    command: Sequence[str] | None = None,
) -> DaemonProcess:
    """Start ``ringod`` on `data_dir` (SQLite) or `postgres_dsn` (given to
    the daemon in its environment; pass None as `data_dir`) and return it
    once it serves.

    `token` requires ``authorization: Bearer <token>``; `protocol_minor`
    serves an older minor; `session_ttl` (seconds or timedelta) shortens
    session tokens; `extra_args` are appended to the command line; `env`
    entries are added to this process's environment; `command` replaces
    ``python -m ringo_trio.server`` (e.g. the path of a ``ringod`` script).
    Use the result as a
    context manager, or call `DaemonProcess.stop` yourself.
    """
    daemon = DaemonProcess(
        data_dir,
        postgres_dsn=postgres_dsn,
        token=token,
        protocol_minor=protocol_minor,
        session_ttl=session_ttl,
        extra_args=extra_args,
        env=env,
        startup_timeout=startup_timeout,
        command=command,
    )
    daemon.start()
    return daemon

"""Control of a private local daemon running as a child process.

The daemon is ``python -m ringo_trio.server`` (or ``daemon_path``) listening
on a random loopback port. It announces readiness with one JSON line on
stdout (``{"endpoint": "127.0.0.1:PORT", ...}``). Its stdin is a pipe this
process keeps open for the daemon's whole life: ``--lifecycle-stdin`` makes
the daemon exit when the pipe reaches EOF, which is what happens when we close
it on purpose (graceful stop) and also when this process dies without any
chance to clean up (SIGKILL, OOM): the kernel closes the pipe for us. It runs
in its own session so that a terminal's Ctrl-C reaches only the SDK process,
which then stops the daemon in order.

With PostgreSQL storage the daemon gets the DSN through its environment
(``RINGO_POSTGRES_DSN``), never on its command line, where every user of
the machine could read the password in the process list; it then takes no
``--data-dir`` (the tasks live in the database).

*Isolation from other local users.* Loopback is reachable by every user of
the machine, so a daemon given a ``token`` (`Ringo.local` always passes a
fresh random one) requires it as a bearer token on every call; the secret
travels in the daemon's environment (``RINGO_DAEMON_TOKEN``), which only its
owner can read, never on its command line. The data dir is made private
(0700, an existing looser one tightened) before the daemon starts, whatever
the umask; the daemon itself creates its database files 0600.

`LocalDaemon` is an async context manager owning a task group; each daemon
process it starts has its stdout and stderr drained by tasks in that group
(so a chatty daemon never blocks on a full pipe) and its stderr tail kept for
error messages. Every path that starts a process either hands it to the
context manager or kills it before returning: a failed start (timeout, early
exit, garbage on stdout) and a cancelled start kill the child and wait for
it, so no daemon outlives its owner.
"""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import sys
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from types import TracebackType

import anyio
import anyio.abc

from .._contract import readiness
from .._endpoint import parse_endpoint
from .._errors import RingoError
from .._models import PostgresStorage

__all__ = ["TOKEN_ENV", "LocalDaemon", "make_private_dir"]

# The variables ringod reads a DSN and its bearer token from (server/flags.py,
# POSTGRES_DSN_ENV and TOKEN_ENV), copied: the server package is not imported
# on the SDK side.
_POSTGRES_DSN_ENV = "RINGO_POSTGRES_DSN"
TOKEN_ENV = "RINGO_DAEMON_TOKEN"
_STDERR_TAIL_BYTES = 8 * 1024


@dataclass(eq=False)
class _Child:
    """One daemon process and what its drain tasks learned about it."""

    process: anyio.abc.Process
    stderr_tail: bytearray = field(default_factory=bytearray)
    stderr_closed: anyio.Event = field(default_factory=anyio.Event)
    endpoint: str | None = None

    def tail_text(self) -> str:
        text = self.stderr_tail.decode("utf-8", errors="replace").strip()
        return text or "(no stderr output)"


class LocalDaemon:
    """A private daemon child process; see the module docstring."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        postgres: PostgresStorage | None = None,
        daemon_path: str | os.PathLike[str] | None = None,
        startup_timeout: float = 15.0,
        stop_timeout: float = 10.0,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        token: str | None = None,
    ) -> None:
        self._data_dir = os.fspath(data_dir)
        self._token = token
        self._postgres = postgres
        self._daemon_path = os.fspath(daemon_path) if daemon_path is not None else None
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self._extra_args = tuple(extra_args)
        self._env = env
        self._child: _Child | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._stack: AsyncExitStack | None = None
        self._stopped = False
        self._start_lock = anyio.Lock()

    # -- introspection ------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self._child.process.pid if self._child is not None else None

    @property
    def endpoint(self) -> str | None:
        return self._child.endpoint if self._child is not None else None

    @property
    def is_dead(self) -> bool:
        """True when a daemon was started and has exited without being stopped."""
        child = self._child
        return not self._stopped and child is not None and child.process.returncode is not None

    @property
    def stderr_tail(self) -> str:
        return self._child.tail_text() if self._child is not None else ""

    def command(self) -> list[str]:
        if self._daemon_path is not None:
            argv = [self._daemon_path]
        else:
            argv = [sys.executable, "-m", "ringo_trio.server"]
        argv += ["--listen", "127.0.0.1:0", "--lifecycle-stdin"]
        if self._postgres is None:
            argv += ["--data-dir", self._data_dir]
        else:
            # The DSN itself goes through the environment (`environment`).
            argv += ["--postgres-schema", self._postgres.schema]
        argv += self._extra_args
        return argv

    def environment(self) -> dict[str, str]:
        """The daemon's environment: ours (or ``env``) plus its secrets."""
        env = dict(os.environ if self._env is None else self._env)
        # An inherited token would make the daemon require a secret this
        # client does not send; only ours may reach it.
        env.pop(TOKEN_ENV, None)
        if self._token is not None:
            env[TOKEN_ENV] = self._token
        if self._postgres is not None:
            env[_POSTGRES_DSN_ENV] = self._postgres.dsn
        return env

    # -- lifecycle ----------------------------------------------------------

    async def __aenter__(self) -> LocalDaemon:
        stack = AsyncExitStack()
        self._tg = await stack.enter_async_context(anyio.create_task_group())
        self._stack = stack
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        tg, self._tg = self._tg, None
        stack, self._stack = self._stack, None
        assert tg is not None
        assert stack is not None
        try:
            await self.stop()  # shielded and bounded inside
        finally:
            # Drains end by themselves at EOF; cancelling covers a daemon that
            # left a grandchild holding its pipes open. The exception in
            # flight (if any) is not ours to wrap, so the group exits clean.
            tg.cancel_scope.cancel()
            await stack.aclose()

    async def start(self) -> str:
        """Start (or restart, after it died) the daemon; return its endpoint."""
        async with self._start_lock:
            if self._tg is None:
                raise RingoError("LocalDaemon must be entered with 'async with' before start()")
            if self._child is not None and self._child.process.returncode is None:
                raise RingoError("local daemon is already running")
            # Cleared before the first await so that a stop() landing anywhere
            # in this start is seen below, once the new child is in place.
            self._stopped = False
            if self._child is not None:
                await self._kill(self._child)
            try:
                await anyio.Path(self._data_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError as exc:
                raise RingoError(f"cannot create the data dir {self._data_dir!r}: {exc}") from exc
            # An existing dir keeps its mode through mkdir: tightened here.
            make_private_dir(self._data_dir)
            try:
                process = await anyio.open_process(
                    self.command(),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                    env=self.environment(),
                )
            except OSError as exc:
                raise RingoError(
                    f"cannot start the local daemon {self.command()[0]!r}: {exc}"
                ) from exc
            child = _Child(process)
            self._child = child
            try:
                self._tg.start_soon(self._drain_stderr, child)
                if self._stopped:
                    raise RingoError("local daemon was stopped while it was starting")
                child.endpoint = await self._await_ready(child)
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await self._kill(child)
                raise
            return child.endpoint

    async def stop(self) -> None:
        """Stop the daemon: close its lifecycle pipe, wait stop_timeout, then kill. Idempotent."""
        child = self._child
        self._stopped = True
        if child is None:
            return
        with anyio.CancelScope(shield=True):
            process = child.process
            if process.returncode is None and process.stdin is not None:
                with contextlib.suppress(
                    anyio.BrokenResourceError, anyio.ClosedResourceError, OSError
                ):
                    await process.stdin.aclose()
                with anyio.move_on_after(self.stop_timeout):
                    await process.wait()
            await self._kill(child)

    # -- internals ----------------------------------------------------------

    async def _await_ready(self, child: _Child) -> str:
        process = child.process
        assert process.stdout is not None
        buffer = bytearray()
        with anyio.move_on_after(self.startup_timeout) as scope:
            while b"\n" not in buffer:
                try:
                    chunk = await process.stdout.receive()
                except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                    await self._collect_exit(child)
                    raise RingoError(
                        f"local daemon exited (code {process.returncode}) before it was ready:"
                        f" {child.tail_text()}"
                    ) from None
                buffer += chunk
                if len(buffer) > readiness.LINE_LIMIT:
                    break
        if scope.cancelled_caught:
            await self._kill(child)
            raise RingoError(
                f"local daemon did not report readiness within {self.startup_timeout:g}s:"
                f" {child.tail_text()}"
            )
        line = bytes(buffer).partition(b"\n")[0]
        try:
            endpoint = readiness.parse_line(line)["endpoint"]
            parse_endpoint(endpoint)
        except (readiness.ReadyLineError, RingoError):
            await self._kill(child)
            shown = line[:200].decode("utf-8", errors="replace")
            raise RingoError(
                f"local daemon printed {shown!r} instead of its readiness line: {child.tail_text()}"
            ) from None
        assert self._tg is not None
        self._tg.start_soon(self._drain_stdout, child)
        return str(endpoint)

    async def _collect_exit(self, child: _Child) -> None:
        # The child closed stdout, so it is exiting; its last stderr words are
        # the error message, so let the drain reach EOF (bounded).
        with anyio.CancelScope(shield=True), anyio.move_on_after(2.0):
            await child.process.wait()
            await child.stderr_closed.wait()
        await self._kill(child)

    async def _kill(self, child: _Child) -> None:
        with anyio.CancelScope(shield=True):
            process = child.process
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
            await process.wait()
            with anyio.move_on_after(1.0):
                await child.stderr_closed.wait()
            await process.aclose()

    async def _drain_stderr(self, child: _Child) -> None:
        stream = child.process.stderr
        assert stream is not None
        try:
            async for chunk in stream:
                child.stderr_tail += chunk
                del child.stderr_tail[:-_STDERR_TAIL_BYTES]
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass
        finally:
            child.stderr_closed.set()

    async def _drain_stdout(self, child: _Child) -> None:
        stream = child.process.stdout
        assert stream is not None
        try:
            async for _ in stream:
                pass
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass


def make_private_dir(path: str) -> None:
    """Create `path` (and parents) if missing and leave it mode 0700.

    The mode is set explicitly rather than left to the umask, and an
    existing looser dir is tightened: the database and its WAL hold every
    payload. Plain os calls, inline: a few short syscalls need no thread.
    """
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        info = os.stat(path)
    except OSError as exc:
        raise RingoError(f"cannot create the data dir {path!r}: {exc}") from exc
    if not stat.S_ISDIR(info.st_mode):
        raise RingoError(f"cannot create the data dir {path!r}: not a directory")
    if stat.S_IMODE(info.st_mode) != 0o700:
        try:
            os.chmod(path, 0o700)
        except OSError as exc:
            raise RingoError(f"cannot make the data dir {path!r} private (0700): {exc}") from exc

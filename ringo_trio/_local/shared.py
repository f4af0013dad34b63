"""One local daemon per data dir, shared by every SDK process of the same user.

`SharedLocalDaemon` elects or joins that daemon. Everything lives in
``<data_dir>/shared/`` (mode 0700, owned by us):

``election.lock``
    ``flock``'d by whoever is electing. The kernel drops it when its holder
    dies, so a crashed starter never wedges the next one; the file itself is
    never deleted (unlinking a lock file lets two processes lock two inodes).
``identity.json``
    ``{"version": 1, "endpoint": "127.0.0.1:PORT", "token": HEX,
    "generation": HEX, "pid": N}``, the daemon every member should use.
    Replaced atomically, so a reader sees the old or the new file, never half.
``token``
    The same secret, for the daemon (``--local-token-file``): a secret on a
    command line is readable by every user through ``ps``.
``daemon.log``
    The daemon's stderr, appended. It must outlive the starter, which may
    exit long before the daemon does, so it cannot be a pipe to us.

The data dir itself is made private (0700) too, and the daemon creates its
database files 0600: they hold every payload.

Election, under the lock: adopt the identity if it can be trusted, else
spawn a daemon and publish its identity. The identity is distrusted unless
it is a regular file of ours that nobody else can read or write (the token
inside is the only thing keeping other local users out), has exactly the
expected shape, names a live process (on Linux also: one of ours, whose
command line carries that generation — a recycled pid is not our daemon), and
its generation was not given up by `SharedLocalDaemon.invalidate_current` in
this process. Distrust is cheap to get wrong in one direction only: a wrongly
distrusted live daemon still holds the data dir, so the replacement exits 3
and the caller gets a clear "held by pid N" error rather than a split brain.

The daemon runs in its own session (a Ctrl-C of the starter must not reach a
daemon other processes use) and stays up while members are attached
(``AttachLocal``, done by the client), plus ``--linger``; nobody attaching
within ``--attach-timeout`` ends it too. So leaving ``async with`` never
stops it: it only stops reaping it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import stat
import subprocess
import sys
import uuid
from contextlib import AsyncExitStack
from dataclasses import dataclass
from types import TracebackType

import anyio
import anyio.abc

from .._contract import readiness
from .._errors import InvalidArgumentError, RingoError
from .process import TOKEN_ENV, make_private_dir

__all__ = ["SHARED_DIR_NAME", "SharedLocalDaemon"]

SHARED_DIR_NAME = "shared"
_LOCK_NAME = "election.lock"
_IDENTITY_NAME = "identity.json"
_TOKEN_NAME = "token"
_LOG_NAME = "daemon.log"

_IDENTITY_VERSION = 1
_IDENTITY_KEYS = frozenset({"version", "endpoint", "token", "generation", "pid"})
# Far above a real identity (~200 bytes): a bigger file is not one of ours.
_IDENTITY_MAX_BYTES = 4096
# Exactly what this module writes: a looser match would only admit files we
# did not write. Loopback only, so the token is never sent off the host.
_ENDPOINT_RE = re.compile(r"127\.0\.0\.1:([0-9]{1,5})")
_TOKEN_RE = re.compile(r"[0-9a-f]{64}")
_GENERATION_RE = re.compile(r"[0-9a-f]{32}")

# ringo_trio.server.flags.EXIT_DATA_DIR_LOCKED, copied rather than imported:
# the server package pulls asyncio and grpclib into the SDK side.
_EXIT_DATA_DIR_LOCKED = 3
_HOLDER_PID_RE = re.compile(r"in use by another ringod \(pid (\d+)\)")

_LOG_TAIL_BYTES = 8 * 1024
# daemon.log is appended to by every generation; past this size the next
# spawn moves it to daemon.log.1 so it cannot grow without bound.
_LOG_ROTATE_BYTES = 1024 * 1024
_LOCK_POLL_SECONDS = 0.02
# A holder legitimately keeps the election lock for up to its own
# startup_timeout (waiting for its daemon's ready line); waiters allow that
# plus this much before calling the holder stuck.
_LOCK_GRACE_SECONDS = 5.0
_EXIT_WAIT_SECONDS = 5.0

_HAVE_PROC = os.path.exists("/proc/self/stat")

# Generations some client in this process found unusable. Process-wide, not
# per object: every client of this process would reach the same verdict.
_INVALIDATED: set[str] = set()
# Daemons we spawned and are no longer reaping (their SharedLocalDaemon was
# exited while they kept serving other members). Holding them keeps their
# Popen from warning "still running" when collected; `_prune_orphans` reaps
# the ones that have exited since, so they do not stay zombies for long.
_ORPHANS: set[anyio.abc.Process] = set()


@dataclass(frozen=True, slots=True)
class _Identity:
    endpoint: str
    token: str
    generation: str
    pid: int


class SharedLocalDaemon:
    """The data dir's shared daemon, elected or joined; see the module docstring.

    Used like `ringo_trio._local.process.LocalDaemon`: enter with ``async with``,
    ``await start()`` for the endpoint. The caller connects with metadata
    ``x-ringo-local-token: <token>`` and holds an ``AttachLocal(generation)``
    stream for as long as it uses the daemon; when the elected daemon turns
    out unusable it calls `invalidate_current` and `start` once more.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        daemon_path: str | os.PathLike[str] | None = None,
        startup_timeout: float = 15.0,
        linger: float = 2.0,
        attach_timeout: float = 15.0,
    ) -> None:
        for name, value, minimum_ok in (
            ("startup_timeout", startup_timeout, False),
            ("linger", linger, True),
            ("attach_timeout", attach_timeout, False),
        ):
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise InvalidArgumentError(f"{name} must be a number of seconds")
            if not (value >= 0 if minimum_ok else value > 0) or value == float("inf"):
                kind = "non-negative" if minimum_ok else "positive"
                raise InvalidArgumentError(f"{name} must be a finite, {kind} number of seconds")
        # Absolute, so the daemon (and a later start) mean the same dir
        # whatever the current directory is by then.
        self._data_dir = os.path.abspath(os.fspath(data_dir))
        self._shared_dir = os.path.join(self._data_dir, SHARED_DIR_NAME)
        self._daemon_path = os.fspath(daemon_path) if daemon_path is not None else None
        self.startup_timeout = float(startup_timeout)
        self.linger = float(linger)
        self.attach_timeout = float(attach_timeout)
        self._identity: _Identity | None = None
        self._spawned: set[str] = set()  # generations this object's start() spawned
        self._log_offset = 0  # where the last daemon we spawned starts in daemon.log
        self._distrust_reason: str | None = None
        self._stopped = False
        self._tg: anyio.abc.TaskGroup | None = None
        self._stack: AsyncExitStack | None = None
        self._start_lock = anyio.Lock()

    # -- introspection ------------------------------------------------------

    @property
    def endpoint(self) -> str | None:
        return self._identity.endpoint if self._identity is not None else None

    @property
    def token(self) -> str | None:
        """The secret every call must carry as ``x-ringo-local-token``."""
        return self._identity.token if self._identity is not None else None

    @property
    def generation(self) -> str | None:
        """Names this daemon's lifetime; ``AttachLocal`` must carry it."""
        return self._identity.generation if self._identity is not None else None

    @property
    def pid(self) -> int | None:
        return self._identity.pid if self._identity is not None else None

    @property
    def started_here(self) -> bool:
        """True when this object's `start` spawned the daemon (rather than adopting it)."""
        return self._identity is not None and self._identity.generation in self._spawned

    @property
    def distrust_reason(self) -> str | None:
        """Why the last `start` did not adopt the identity file (None: adopted, or no file)."""
        return self._distrust_reason

    @property
    def is_dead(self) -> bool:
        """True when the daemon in use is no longer a live process (and we did not stop)."""
        identity = self._identity
        return (
            not self._stopped
            and identity is not None
            and not _daemon_alive(identity.pid, identity.generation)
        )

    @property
    def stderr_tail(self) -> str:
        """The end of daemon.log: from our daemon's first line, if we spawned the one in use."""
        start = self._log_offset if self.started_here else 0
        return _read_log_tail(os.path.join(self._shared_dir, _LOG_NAME), start)

    def command(self, generation: str) -> list[str]:
        """The daemon's argv for `generation` (the secret itself is in the token file)."""
        if self._daemon_path is not None:
            argv = [self._daemon_path]
        else:
            argv = [sys.executable, "-m", "ringo_trio.server"]
        return [
            *argv,
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            self._data_dir,
            "--local-token-file",
            os.path.join(self._shared_dir, _TOKEN_NAME),
            "--generation",
            generation,
            "--linger",
            repr(self.linger),
            "--attach-timeout",
            repr(self.attach_timeout),
        ]

    # -- lifecycle ----------------------------------------------------------

    async def __aenter__(self) -> SharedLocalDaemon:
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
        self._stopped = True
        # Only reapers run in the group. Cancelling them leaves the daemons
        # serving the other members; they wait in _ORPHANS to be reaped.
        tg.cancel_scope.cancel()
        await stack.aclose()

    async def start(self) -> str:
        """Adopt the trusted shared daemon, or spawn and publish one; return its endpoint.

        Calling it again re-reads the identity: after `invalidate_current`, or
        when the daemon in use went away and another member elected a new one.
        """
        async with self._start_lock:
            if self._tg is None:
                raise RingoError(
                    "SharedLocalDaemon must be entered with 'async with' before start()"
                )
            self._stopped = False
            _prune_orphans()
            _make_dirs(self._data_dir, self._shared_dir)
            lock_fd = await self._acquire_election_lock()
            try:
                identity, reason = _read_identity(os.path.join(self._shared_dir, _IDENTITY_NAME))
                self._distrust_reason = reason
                if identity is None:
                    identity = await self._spawn(reason)
                self._identity = identity
                return identity.endpoint
            finally:
                # Synchronous, so it runs even when the await above was
                # cancelled; closing the fd drops the flock.
                os.close(lock_fd)

    def invalidate_current(self) -> None:
        """Never adopt the current generation again (in this process); the next
        `start` elects anew."""
        if self._identity is not None:
            _INVALIDATED.add(self._identity.generation)

    async def stop(self) -> None:
        """Mark stopped; idempotent. The daemon stays: membership ends when the
        client closes its AttachLocal stream, and the daemon lingers out by itself."""
        self._stopped = True

    # -- election -----------------------------------------------------------

    async def _acquire_election_lock(self) -> int:
        """The flock'd election lock fd. Polls with LOCK_NB instead of blocking
        in a worker thread, so a cancelled start leaves no thread stuck in flock."""
        path = os.path.join(self._shared_dir, _LOCK_NAME)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise RingoError(f"cannot open the shared-daemon election lock {path}: {exc}") from exc
        try:
            bound = self.startup_timeout + _LOCK_GRACE_SECONDS
            with anyio.move_on_after(bound):
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        return fd
                    except BlockingIOError:
                        await anyio.sleep(_LOCK_POLL_SECONDS)
            raise RingoError(
                f"another process has held the shared-daemon election lock {path} for"
                f" {bound:g}s; it is stuck starting a daemon, or holds the lock by mistake"
            )
        except BaseException:
            os.close(fd)
            raise

    async def _spawn(self, distrust_reason: str | None) -> _Identity:
        """Start a daemon of a new generation and publish its identity. Runs under the lock."""
        assert self._tg is not None
        token = secrets.token_hex(32)
        generation = uuid.uuid4().hex
        _write_token(os.path.join(self._shared_dir, _TOKEN_NAME), token)
        log_path = os.path.join(self._shared_dir, _LOG_NAME)
        log_fd, self._log_offset = _open_log(log_path, generation)
        argv = self.command(generation)
        try:
            process = await anyio.open_process(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log_fd,
                start_new_session=True,
                # Its callers send the local token, not a bearer token: an
                # inherited one would lock every member out.
                env={k: v for k, v in os.environ.items() if k != TOKEN_ENV},
            )
        except OSError as exc:
            raise RingoError(f"cannot start the shared daemon {argv[0]!r}: {exc}") from exc
        finally:
            os.close(log_fd)  # the child has its own copy
        # Registered before anything can fail, so the child is reaped whatever
        # happens next; _reap moves it off _ORPHANS once it has exited.
        _ORPHANS.add(process)
        self._tg.start_soon(_reap, process)
        try:
            ready = await self._await_ready(process, log_path, distrust_reason)
            identity = self._check_ready(ready, process, token, generation, log_path)
            _write_identity(self._shared_dir, identity)
        except BaseException:
            # Not published (identity.json is written last, with no await
            # after it), so nobody else can be using this daemon.
            with anyio.CancelScope(shield=True):
                await _kill(process)
            raise
        self._spawned.add(generation)
        return identity

    async def _await_ready(
        self, process: anyio.abc.Process, log_path: str, distrust_reason: str | None
    ) -> bytes:
        stdout = process.stdout
        assert stdout is not None
        buffer = bytearray()
        try:
            with anyio.move_on_after(self.startup_timeout) as scope:
                while b"\n" not in buffer and len(buffer) <= readiness.LINE_LIMIT:
                    try:
                        buffer += await stdout.receive()
                    except (
                        anyio.EndOfStream,
                        anyio.ClosedResourceError,
                        anyio.BrokenResourceError,
                    ):
                        raise await self._exit_error(process, log_path, distrust_reason) from None
        finally:
            # The ready line is the only thing the daemon prints on stdout.
            with anyio.CancelScope(shield=True):
                await stdout.aclose()
        if scope.cancelled_caught:
            raise RingoError(
                f"shared daemon did not report readiness within {self.startup_timeout:g}s:"
                f" {_read_log_tail(log_path, self._log_offset)}"
            )
        return bytes(buffer).partition(b"\n")[0]

    async def _exit_error(
        self, process: anyio.abc.Process, log_path: str, distrust_reason: str | None
    ) -> RingoError:
        """The error for a daemon that closed stdout before its ready line."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(_EXIT_WAIT_SECONDS):
            await process.wait()
        tail = _read_log_tail(log_path, self._log_offset)
        code = process.returncode
        if code == _EXIT_DATA_DIR_LOCKED:
            match = _HOLDER_PID_RE.search(tail)
            holder = f"pid {match.group(1)}" if match else "another process"
            why = (
                f"; identity.json was not adopted because {distrust_reason}"
                if distrust_reason
                else ""
            )
            return RingoError(
                f"the data dir {self._data_dir} is held by another ringod ({holder}): a private"
                f" Ringo.local daemon, or a shared daemon this process does not trust{why}."
                f" Stop it or use another data dir. Daemon log: {tail}"
            )
        return RingoError(f"shared daemon exited (code {code}) before it was ready: {tail}")

    def _check_ready(
        self,
        line: bytes,
        process: anyio.abc.Process,
        token: str,
        generation: str,
        log_path: str,
    ) -> _Identity:
        shown = line[:200].decode("utf-8", errors="replace")
        try:
            ready = readiness.parse_line(line)
        except readiness.ReadyLineError:
            raise RingoError(
                f"shared daemon printed {shown!r} instead of its readiness line:"
                f" {_read_log_tail(log_path, self._log_offset)}"
            ) from None
        endpoint = ready["endpoint"]
        if not _endpoint_ok(endpoint):
            raise RingoError(f"shared daemon announced {endpoint!r}, not a 127.0.0.1 endpoint")
        if ready.get("generation") != generation:
            raise RingoError(
                f"shared daemon announced generation {ready.get('generation')!r}, expected"
                f" {generation!r}: {self.command(generation)[0]!r} does not support shared mode"
                " (--generation)"
            )
        # The announced pid is the server itself even when daemon_path is a
        # wrapper that forks; it is the one that holds the data dir.
        pid = ready.get("pid")
        if type(pid) is not int or pid <= 0:
            pid = process.pid
        return _Identity(endpoint=endpoint, token=token, generation=generation, pid=pid)


# -- files ------------------------------------------------------------------
#
# Plain os calls on small local files, made inline: each is one short
# syscall, and inline they need no thread a cancellation could strand.


def _make_dirs(data_dir: str, shared_dir: str) -> None:
    make_private_dir(data_dir)
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(shared_dir, 0o700)
        info = os.lstat(shared_dir)
    except OSError as exc:
        raise RingoError(f"cannot create the shared-daemon dir {shared_dir}: {exc}") from exc
    if not stat.S_ISDIR(info.st_mode):
        raise RingoError(f"{shared_dir} is not a directory")
    if info.st_uid != os.getuid():
        raise RingoError(
            f"{shared_dir} belongs to uid {info.st_uid}, not to us (uid {os.getuid()});"
            " refusing to share a daemon through it"
        )
    if stat.S_IMODE(info.st_mode) != 0o700:
        # Ours but loose (made by hand, or an odd umask): tighten it rather than fail.
        try:
            os.chmod(shared_dir, 0o700)
        except OSError as exc:
            raise RingoError(f"cannot make {shared_dir} private (0700): {exc}") from exc


def _read_identity(path: str) -> tuple[_Identity | None, str | None]:
    """(identity, None) when it can be trusted, else (None, why not; None if absent)."""
    # O_NOFOLLOW: a symlink is not "a regular file of ours" even if its target
    # is. O_NONBLOCK: a FIFO planted there must not hang the open.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"{path} cannot be opened ({exc})"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None, f"{path} is not a regular file"
        if info.st_uid != os.getuid():
            return None, f"{path} belongs to uid {info.st_uid}, not to us"
        if info.st_mode & 0o077:
            return None, (
                f"{path} has mode {stat.S_IMODE(info.st_mode):04o}; group/other bits must be clear"
            )
        data = os.read(fd, _IDENTITY_MAX_BYTES + 1)
    except OSError as exc:
        return None, f"{path} cannot be read ({exc})"
    finally:
        os.close(fd)
    if len(data) > _IDENTITY_MAX_BYTES:
        return None, f"{path} is too large to be an identity file"
    try:
        raw = json.loads(data)
    except ValueError:
        return None, f"{path} is not valid JSON"
    identity = _identity_from_json(raw)
    if identity is None:
        return None, f"{path} does not have the identity shape (version {_IDENTITY_VERSION})"
    if identity.generation in _INVALIDATED:
        return None, f"generation {identity.generation} was invalidated by this process"
    if not _daemon_alive(identity.pid, identity.generation):
        return None, f"its daemon (pid {identity.pid}) is not running"
    return identity, None


def _identity_from_json(raw: object) -> _Identity | None:
    if not isinstance(raw, dict) or set(raw) != _IDENTITY_KEYS:
        return None
    version, endpoint, token = raw["version"], raw["endpoint"], raw["token"]
    generation, pid = raw["generation"], raw["pid"]
    # type() rather than isinstance: True is an int to isinstance.
    if type(version) is not int or version != _IDENTITY_VERSION:
        return None
    if type(pid) is not int or pid <= 0:
        return None
    if not (type(endpoint) is str and _endpoint_ok(endpoint)):
        return None
    if not (type(token) is str and _TOKEN_RE.fullmatch(token)):
        return None
    if not (type(generation) is str and _GENERATION_RE.fullmatch(generation)):
        return None
    return _Identity(endpoint=endpoint, token=token, generation=generation, pid=pid)


def _endpoint_ok(endpoint: str) -> bool:
    match = _ENDPOINT_RE.fullmatch(endpoint)
    return match is not None and 0 < int(match.group(1)) <= 65535


def _write_identity(shared_dir: str, identity: _Identity) -> None:
    """Publish `identity` atomically: a private temp file, fsync'd, renamed over."""
    path = os.path.join(shared_dir, _IDENTITY_NAME)
    data = json.dumps(
        {
            "version": _IDENTITY_VERSION,
            "endpoint": identity.endpoint,
            "token": identity.token,
            "generation": identity.generation,
            "pid": identity.pid,
        }
    ).encode()
    temp = os.path.join(shared_dir, f".{_IDENTITY_NAME}.{secrets.token_hex(8)}.tmp")
    try:
        # O_EXCL: never write our token into a file someone else prepared.
        fd = os.open(temp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600)
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise RingoError(f"cannot write the shared-daemon identity {path}: {exc}") from exc


def _write_token(path: str, token: str) -> None:
    try:
        fd = os.open(
            path, os.O_CREAT | os.O_TRUNC | os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600
        )
        try:
            # The creation mode applies to a new file only; an old one (or one
            # made by hand) may be looser. Tightened before the secret goes in.
            os.fchmod(fd, 0o600)
            # No newline: the daemon must not have to guess about whitespace.
            _write_all(fd, token.encode())
        finally:
            os.close(fd)
    except OSError as exc:
        raise RingoError(f"cannot write the shared-daemon token file {path}: {exc}") from exc


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _open_log(path: str, generation: str) -> tuple[int, int]:
    """daemon.log opened for appending (rotated first if large), a header naming
    this generation written; (fd, offset where this generation's lines start)."""
    try:
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path).st_size > _LOG_ROTATE_BYTES:
                os.replace(path, path + ".1")
        fd = os.open(
            path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600
        )
    except OSError as exc:
        raise RingoError(f"cannot open the shared-daemon log {path}: {exc}") from exc
    try:
        _write_all(
            fd, f"--- ringod generation {generation}, started by pid {os.getpid()}\n".encode()
        )
        offset = os.lseek(fd, 0, os.SEEK_END)
    except OSError:
        offset = 0  # the log is a diagnostic: a failed header costs only precision
    return fd, offset


def _read_log_tail(path: str, start: int) -> str:
    try:
        with open(path, "rb") as log:
            size = log.seek(0, os.SEEK_END)
            log.seek(max(start, size - _LOG_TAIL_BYTES) if start <= size else 0)
            data = log.read(_LOG_TAIL_BYTES)
    except OSError:
        return "(no daemon log)"
    text = data.decode("utf-8", errors="replace").strip()
    return text or "(no daemon log output)"


# -- processes ----------------------------------------------------------------


def _pid_alive(pid: int) -> bool:
    """True while `pid` is a live process of ours (a zombie counts as dead)."""
    if _HAVE_PROC:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat_line = f.read()
            owner = os.stat(f"/proc/{pid}").st_uid
        except OSError:
            return False
        # The state letter follows the parenthesised command name, which may
        # itself contain ") ".
        state = stat_line.rpartition(b")")[2].split()[:1]
        return state not in ([b"Z"], [b"X"], []) and owner == os.getuid()
    try:
        os.kill(pid, 0)
    except PermissionError:
        return False  # alive, but another user's: not a daemon we started
    except OSError:
        return False
    return True


def _daemon_alive(pid: int, generation: str) -> bool:
    """`pid` is live and, where /proc tells, runs with ``--generation <generation>``."""
    if not _pid_alive(pid):
        return False
    if _HAVE_PROC:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            return True  # cannot tell; liveness alone decides
        # A recycled pid is some other program: distrusted here rather than
        # found out by a failed connection.
        return generation.encode() in argv
    return True


async def _reap(process: anyio.abc.Process) -> None:
    """Wait for a spawned daemon so it never lingers as a zombie while we live."""
    await process.wait()
    _ORPHANS.discard(process)
    with anyio.CancelScope(shield=True):
        await process.aclose()


async def _kill(process: anyio.abc.Process) -> None:
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
    with anyio.move_on_after(_EXIT_WAIT_SECONDS):
        await process.wait()


def _prune_orphans() -> None:
    # On trio, reading returncode polls (waitpid WNOHANG), reaping an exited child.
    for process in [p for p in _ORPHANS if p.returncode is not None]:
        _ORPHANS.discard(process)

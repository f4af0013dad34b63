"""``ringod`` / ``python -m ringo_trio.server``: the daemon's command line.

Contract with whoever starts the daemon (the SDK's local-daemon control, the
test kit, a human):

* once it serves, exactly one JSON line goes to stdout (`ready_info`) and
  stdout is flushed; everything else — logs, errors — goes to stderr;
* it serves plaintext gRPC, or TLS with ``--tls-cert``/``--tls-key`` (mutual
  TLS with ``--tls-client-ca``); a bearer token comes from ``--token``,
  ``--token-file`` or ``$RINGO_DAEMON_TOKEN``, and wrong ones are throttled
  (``--auth-failure-delay``, `throttle`);
* storage is SQLite in ``--data-dir`` or PostgreSQL (`--postgres` or, kept
  out of the process list, the environment variable ``RINGO_POSTGRES_DSN``;
  see `flags.storage_choice` for which wins);
* it exits 0 after a graceful shutdown (SIGTERM, SIGINT, EOF on stdin
  when started with ``--lifecycle-stdin``, or — a shared daemon, started with
  ``--local-token-file`` — nobody attached for ``--linger`` seconds or within
  ``--attach-timeout`` of the ready line), non-zero when it cannot start:
  `EXIT_FAILURE`, `EXIT_USAGE`, or `EXIT_DATA_DIR_LOCKED` when another
  daemon holds the data dir.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import logging
import os
import re
import signal
import ssl
import stat
import sys
import urllib.parse
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, NoReturn

from ringo_trio._contract import readiness, versions
from ringo_trio._contract.versions import SDK_VERSION

from .daemon import Daemon, DaemonConfig, ListenError, format_endpoint
from .flags import (
    DEFAULT_POSTGRES_SAFETY_POLL,
    EXIT_DATA_DIR_LOCKED,
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    StorageChoice,
    build_parser,
    settle,
    storage_choice,
)
from .lock import DataDirLock, DataDirLocked
from .logs import configure_logging
from .retention import DEFAULT_POSTGRES_RETENTION_BATCH, DEFAULT_RETENTION_BATCH, RetentionPolicy
from .rpc.connections import ConnectionLimits
from .rpc.members import DEFAULT_ATTACH_TIMEOUT, DEFAULT_LINGER
from .storage.base import StorageError

__all__ = [
    "EXIT_DATA_DIR_LOCKED",
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_USAGE",
    "main",
    "ready_info",
    "redact",
    "run",
    "select_loop_factory",
]

log = logging.getLogger("ringo_trio.server")


def select_loop_factory(
    choice: str = "auto",
) -> tuple[Callable[[], asyncio.AbstractEventLoop] | None, str]:
    """(loop factory for `asyncio.Runner`, loop name). uvloop is optional."""
    if choice == "asyncio":
        return None, "asyncio"
    try:
        uvloop: Any = importlib.import_module("uvloop")
    except ImportError:
        if choice == "uvloop":
            raise
        return None, "asyncio"
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory, "uvloop"


def redact(message: str, dsn: str | None) -> str:
    """`message` without the DSN's password, should a driver have quoted it."""
    if not dsn:
        return message
    secrets = [dsn]
    with contextlib.suppress(ValueError):
        password = urllib.parse.urlsplit(dsn).password
        if password:
            secrets.append(password)
    secrets += re.findall(r"password\s*=\s*'?([^'\s]+)", dsn)
    for secret in sorted(set(secrets), key=len, reverse=True):
        message = message.replace(secret, "***")
    return message


def _lifecycle_pipe_problem() -> str | None:
    """Why stdin cannot serve as the lifecycle pipe, or None if it can.

    Only a pipe or socket has an EOF that means "the parent let go": a
    terminal or /dev/null does not, and epoll cannot even watch /dev/null or
    a regular file (the stock loop logs EPERM and never reports EOF; uvloop
    aborts the process).
    """
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (OSError, ValueError, AttributeError) as exc:
        return f"not usable ({exc})"
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        return None
    if stat.S_ISCHR(mode):
        return "a terminal" if sys.stdin.isatty() else "a character device such as /dev/null"
    return "a regular file" if stat.S_ISREG(mode) else "not a pipe"


class _LifecyclePipe(asyncio.Protocol):
    """stdin as a liveness signal: its content is ignored, only EOF matters."""

    def __init__(self, on_close: Callable[[], None]) -> None:
        self._on_close = on_close

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool:
        self._on_close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._on_close()


def ready_info(daemon: Daemon, *, storage: StorageChoice, loop_name: str) -> dict[str, Any]:
    info: dict[str, Any] = {
        "endpoint": daemon.endpoint,
        "host": daemon.config.host,
        "port": daemon.port,
        "pid": os.getpid(),
        "version": SDK_VERSION,
        "protocol_major": versions.MAJOR,
        "protocol_minor": daemon.config.protocol_minor,
        "session_ttl": daemon.config.session_ttl.total_seconds(),
        "auth": daemon.config.token is not None,
        "tls": daemon.config.tls is not None,
        "mutual_tls": (
            daemon.config.tls is not None and daemon.config.tls.verify_mode == ssl.CERT_REQUIRED
        ),
        "loop": loop_name,
    }
    if storage.data_dir is not None:
        info.update(storage="sqlite", data_dir=str(storage.data_dir))
    else:
        # Never the DSN: it may carry a password, and stdout ends up in logs.
        info.update(storage="postgres", postgres_schema=storage.postgres_schema)
    if daemon.config.generation is not None:
        info["generation"] = daemon.config.generation
    if daemon.config.metrics_listen is not None:
        info["metrics"] = format_endpoint(daemon.config.metrics_listen[0], daemon.metrics_port or 0)
    if daemon.config.ui_listen is not None:
        info["ui"] = "http://" + format_endpoint(daemon.config.ui_listen[0], daemon.ui_port or 0)
    return info


async def _amain(args: argparse.Namespace, choice: StorageChoice, loop_name: str) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def request_stop(reason: str) -> None:
        if not stop.is_set():
            log.info("%s: shutting down", reason)
            stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, request_stop, signal.Signals(signum).name)
    pipe: asyncio.BaseTransport | None = None
    try:
        if args.lifecycle_stdin:
            problem = _lifecycle_pipe_problem()
            if problem is not None:
                log.error("--lifecycle-stdin needs stdin to be a pipe or socket; it is %s", problem)
                return EXIT_USAGE
            pipe, _ = await loop.connect_read_pipe(
                lambda: _LifecyclePipe(lambda: request_stop("stdin closed")), sys.stdin
            )
        host, port = args.listen
        config = DaemonConfig(
            host=host,
            port=port,
            protocol_minor=args.protocol_minor,
            session_ttl=timedelta(seconds=args.session_ttl),
            token=args.token,
            shutdown_timeout=args.shutdown_timeout,
            heartbeat_interval=args.heartbeat_interval,
            local_token=args.local_token,
            generation=args.generation,
            linger=DEFAULT_LINGER if args.linger is None else args.linger,
            attach_timeout=(
                DEFAULT_ATTACH_TIMEOUT if args.attach_timeout is None else args.attach_timeout
            ),
            safety_poll=_safety_poll(args.safety_poll, choice),
            auth_failure_delay=args.auth_failure_delay,
            tls=args.ssl,
            metrics_listen=args.metrics_listen,
            ui_listen=args.ui_listen,
            ui_read_only=args.ui_read_only,
            max_waits=args.max_waits,
            wait_recheck=args.wait_recheck,
            connections=ConnectionLimits(
                idle_timeout=args.idle_timeout,
                keepalive_interval=args.keepalive_interval,
                keepalive_timeout=args.keepalive_timeout,
            ),
            retention=RetentionPolicy(
                succeeded=args.retain_succeeded,
                dead=args.retain_dead,
                cancelled=args.retain_cancelled,
                interval=args.retention_interval,
                batch=_retention_batch_for(args.retention_batch, choice),
            ),
        )

        def announce(daemon: Daemon) -> None:
            line = readiness.format_line(ready_info(daemon, storage=choice, loop_name=loop_name))
            sys.stdout.write(line)
            sys.stdout.flush()

        daemon = Daemon(config, choice.open())
        try:
            await daemon.serve(stop, announce)
        except (ListenError, StorageError) as exc:
            # Startup refusals (address in use, a schema newer than this code,
            # an unreachable database): the message says it all, no traceback.
            log.error("%s", redact(str(exc), choice.postgres_dsn))
            return EXIT_FAILURE
        except Exception:
            log.exception("ringod failed")
            return EXIT_FAILURE
        log.info("stopped")
        return EXIT_OK
    finally:
        if pipe is not None:
            pipe.close()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


def _retention_batch_for(batch: int | None, choice: StorageChoice) -> int:
    if batch is not None:
        return batch
    if choice.postgres_dsn is not None:
        return DEFAULT_POSTGRES_RETENTION_BATCH
    return DEFAULT_RETENTION_BATCH


def _safety_poll(seconds: float | None, choice: StorageChoice) -> float | None:
    if seconds is None:
        return DEFAULT_POSTGRES_SAFETY_POLL if choice.postgres_dsn is not None else None
    return seconds or None


def run(argv: Sequence[str] | None = None) -> int:
    """Parse `argv`, serve until told to stop; the process exit status."""
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level, log_format=args.log_format, wire=args.log_wire)
    problem = settle(args, os.environ)
    if problem is not None:
        log.error("%s", problem)
        return EXIT_USAGE
    choice = storage_choice(args, os.environ)
    if isinstance(choice, str):
        log.error("%s", choice)
        return EXIT_USAGE
    try:
        loop_factory, loop_name = select_loop_factory(args.loop)
    except ImportError:
        log.error("--loop uvloop: uvloop is not installed (pip install 'ringo-trio[fast]')")
        return EXIT_USAGE
    data_dir = choice.data_dir
    if data_dir is None:
        # Many daemons share one database: nothing to lock.
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(_amain(args, choice, loop_name))
    try:
        # Private from the start whatever the umask (the SDK also tightens a
        # Ringo.local data dir that exists already; a dir named by hand is
        # the operator's, but the database files in it are made 0600).
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        log.error("cannot create data dir %s: %s", data_dir, exc)
        return EXIT_FAILURE
    lock = DataDirLock(data_dir)
    try:
        lock.acquire()
    except DataDirLocked as exc:
        log.error("%s", exc)
        return EXIT_DATA_DIR_LOCKED
    except OSError as exc:
        log.error("cannot lock data dir %s: %s", data_dir, exc)
        return EXIT_FAILURE
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(_amain(args, choice, loop_name))
    finally:
        lock.release()


def main(argv: Sequence[str] | None = None) -> NoReturn:
    sys.exit(run(argv))

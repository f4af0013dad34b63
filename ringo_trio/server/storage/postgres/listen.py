"""Cross-daemon wake-ups: every mutation that may make a task claimable
(enqueue that created tasks, nack back to PENDING, retry and bulk retry,
release, expiry back to PENDING) calls
``pg_notify(channel, "<engine id> <queue>")`` inside its own transaction, so
the notification is delivered at commit and never for a rolled-back change.
`watch` LISTENs on a dedicated connection and skips the engine's own
notifications. One channel per schema (`ringo:<schema>`), so two
deployments in one database do not wake each other.

Pausing or resuming a queue (`set_queue_paused`) notifies the same channel
as ``"<engine id>:paused <queue>"`` or ``"<engine id>:resumed <queue>"``
(`paused_note`): `watch` hands those to `paused_changed` in order with the
wake-ups, so a daemon has followed a pause before it hears of the tasks
enqueued after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Awaitable, Callable

import asyncpg  # type: ignore[import-untyped]

from ..base import PausedChanged, StorageError, StorageUnavailable
from .pool import CONNECT_TIMEOUT, SERVER_SETTINGS

log = logging.getLogger("ringo_trio.server")

# watch(): reconnect backoff, and how often an idle listener proves its
# connection is alive (a silently dropped TCP connection delivers nothing).
WATCH_RETRY_INITIAL = 0.1
WATCH_RETRY_MAX = 5.0
WATCH_PING = 15.0


# Follow the engine id in the notification of a paused flag's change
# (engine ids are hex, so neither can be part of one).
_PAUSED = ":paused"
_RESUMED = ":resumed"


def paused_note(instance: str, queue: str, paused: bool) -> str:
    """The payload announcing that `queue` was paused or resumed."""
    return f"{instance}{_PAUSED if paused else _RESUMED} {queue}"


def channel(schema: str) -> str:
    """One LISTEN channel per schema; names over 63 bytes (PostgreSQL's
    identifier limit) are hashed."""
    name = f"ringo:{schema}"
    if len(name.encode()) <= 63:
        return name
    return "ringo:" + hashlib.sha256(schema.encode()).hexdigest()[:40]


class Listened(Exception):
    """A listener that had been up lost its connection (the cause)."""


async def watch(
    dsn: str,
    channel: str,
    instance: str,
    notify: Callable[[str | None], None],
    fold: Callable[[], Awaitable[None]],
    paused_changed: PausedChanged | None = None,
    also: tuple[str, Callable[[str], None]] | None = None,
) -> None:
    """LISTEN on `channel` (and on `also`'s channel, telling its callback
    each payload and "" at each connect) until cancelled, telling `notify`
    of every other engine's wake-up and `paused_changed` of every other
    engine's paused flag change (`instance` names this one). After a loss it waits
    `delay` before reconnecting; the delay doubles up to a cap while attempts
    keep failing and starts over once a listener was up."""
    await _keep_listening(
        "storage watch",
        lambda: _listen(dsn, channel, instance, notify, fold, paused_changed, also),
    )


async def _keep_listening(what: str, listen_once: Callable[[], Awaitable[None]]) -> None:
    """Run `listen_once` again and again until cancelled: after a loss it
    waits before reconnecting, the delay doubling up to a cap while attempts
    keep failing and starting over once a listener was up."""
    delay = WATCH_RETRY_INITIAL
    while True:
        try:
            await listen_once()
        except asyncio.CancelledError:
            raise
        except Listened as exc:
            delay = WATCH_RETRY_INITIAL
            log.warning("%s lost its PostgreSQL connection: %s", what, exc.__cause__)
        except Exception as exc:
            log.warning("%s cannot listen on PostgreSQL: %s", what, exc)
        await asyncio.sleep(delay)
        delay = min(delay * 2, WATCH_RETRY_MAX)


async def _listen(
    dsn: str,
    channel: str,
    instance: str,
    notify: Callable[[str | None], None],
    fold: Callable[[], Awaitable[None]],
    paused_changed: PausedChanged | None,
    also: tuple[str, Callable[[str], None]] | None = None,
) -> None:
    """One listening connection's life; raises when it is lost
    (`Listened` once it had been listening)."""
    lost = asyncio.Event()

    def on_note(_conn: object, _pid: int, _channel: str, payload: str) -> None:
        sender, _, queue = payload.partition(" ")
        engine, mark, change = sender.partition(":")
        if engine == instance:
            return
        if not mark:
            notify(queue or None)
        elif paused_changed is not None:
            paused_changed(queue, ":" + change == _PAUSED)

    conn: asyncpg.Connection = await asyncpg.connect(
        dsn, timeout=CONNECT_TIMEOUT, server_settings=SERVER_SETTINGS
    )
    try:
        conn.add_termination_listener(lambda _conn: lost.set())
        await conn.add_listener(channel, on_note)
        if also is not None:
            told = also[1]
            await conn.add_listener(also[0], lambda _c, _p, _ch, payload: told(payload))
            # Whatever was said while nobody listened.
            told("")
        notify(None)
        try:
            while not lost.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(lost.wait(), WATCH_PING)
                # A silently dropped connection delivers nothing: prove
                # it alive now and then.
                if not lost.is_set():
                    await conn.fetchval("SELECT 1", timeout=WATCH_PING)
                    # Housekeeping on the same beat: count deltas must not
                    # pile up while nobody reads stats. A failure here is
                    # the pool's, not the listener's.
                    with contextlib.suppress(StorageError):
                        await fold()
            raise StorageUnavailable("the listening connection closed")
        except Exception as exc:
            raise Listened from exc
    finally:
        # Not awaited: a graceful close can hang on a dead peer.
        conn.terminate()


async def watch_settled(
    dsn: str,
    channel_sql: str,
    notify: Callable[[str | None], None],
    ready: Callable[[], None],
) -> None:
    """LISTEN on the wait channel (named by the SQL expression
    `channel_sql`) until cancelled, telling `notify` every task id notified
    there, `ready` once listening, and `notify(None)` at each (re)connect;
    reconnects as `watch` does. Run only while the daemon has waiters."""
    await _keep_listening("wait listener", lambda: _listen_settled(dsn, channel_sql, notify, ready))


async def _listen_settled(
    dsn: str,
    channel_sql: str,
    notify: Callable[[str | None], None],
    ready: Callable[[], None],
) -> None:
    lost = asyncio.Event()

    def on_note(_conn: object, _pid: int, _channel: str, payload: str) -> None:
        notify(payload)

    conn: asyncpg.Connection = await asyncpg.connect(
        dsn, timeout=CONNECT_TIMEOUT, server_settings=SERVER_SETTINGS
    )
    try:
        conn.add_termination_listener(lambda _conn: lost.set())
        channel = await conn.fetchval(f"SELECT {channel_sql}")
        await conn.add_listener(channel, on_note)
        ready()
        notify(None)
        try:
            while not lost.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(lost.wait(), WATCH_PING)
                if not lost.is_set():
                    await conn.fetchval("SELECT 1", timeout=WATCH_PING)
            raise StorageUnavailable("the listening connection closed")
        except Exception as exc:
            raise Listened from exc
    finally:
        conn.terminate()

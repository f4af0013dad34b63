"""The connections: how the pool is set up, and which failures mean the
server cannot be reached (`StorageUnavailable`).

Connection loss: any connection-level failure (refused, reset, terminated
backend, server shutting down or starting up) is `StorageUnavailable`; the
broken connection leaves the pool and the next call connects afresh, so the
engine recovers by itself once the server is back. Each such failure is
reported to `unavailable_listener`; `ping` (the daemon's reachability probe)
runs ``SELECT 1`` on a connection of its own, outside the pool, so a pool
saturated by work never looks like an unreachable server, and reconnects it
when it was lost.
"""

from __future__ import annotations

import asyncpg  # type: ignore[import-untyped]

from ..base import Storage, StorageUnavailable

CONNECT_TIMEOUT = 10.0
CLOSE_TIMEOUT = 5.0
# Connection-level failures: the server cannot be reached or dropped us.
# Class 08 (connection exception), 57 (operator intervention: admin/crash
# shutdown, cannot connect now), 53300 (too many connections); OSError and
# TimeoutError from connecting.
UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.TooManyConnectionsError,
    asyncpg.exceptions.ConnectionDoesNotExistError,
    # A FATAL that reached an idle connection a moment before its EOF leaves
    # the protocol in an error state; the next use reports it this way.
    asyncpg.exceptions.InternalClientError,
    # "database does not allow connections" / "is being shut down" at connect.
    asyncpg.exceptions.ObjectNotInPrerequisiteStateError,
)


def unreachable(exc: BaseException) -> StorageUnavailable:
    return StorageUnavailable(f"PostgreSQL unavailable: {type(exc).__name__}: {exc}")


def reported(storage: Storage, exc: BaseException) -> StorageUnavailable:
    """`unreachable` for an operation's failure, told to the listener."""
    unavailable = unreachable(exc)
    if storage.unavailable_listener is not None:
        storage.unavailable_listener(unavailable)
    return unavailable


SERVER_SETTINGS = {
    "application_name": "ringod",
    # Small OLTP statements: a JIT compile would cost more than the query.
    "jit": "off",
    "plan_cache_mode": "force_generic_plan",
}


async def keep_session(_conn: asyncpg.Connection) -> None:
    """The pool's reset hook, doing nothing: the default runs a reset query
    on every release (a round trip per call) to undo session state this
    engine never creates. An open transaction is still rolled back by asyncpg
    before this runs."""

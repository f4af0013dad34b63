"""WAL checkpoints off the event loop (see the engine's docstring,
"Checkpoints")."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from typing import Any

# WAL checkpoints (see the module docstring): how often upkeep runs one,
# the loop's automatic one while upkeep runs, and SQLite's default.
CHECKPOINT_INTERVAL = 0.1
BACKSTOP_PAGES = 10_000
AUTO_CHECKPOINT_PAGES = 1000


def _fetch_all(db: sqlite3.Connection, sql: str) -> list[Any]:
    return db.execute(sql).fetchall()


async def off_loop(db: sqlite3.Connection, sql: str) -> None:
    """Run `sql` on `db` in a worker thread. Cancelled, the statement is
    interrupted and awaited: the thread never outlives the call, so the
    caller may close `db` afterwards."""
    done = asyncio.get_running_loop().run_in_executor(None, _fetch_all, db, sql)
    try:
        await asyncio.shield(done)
    except asyncio.CancelledError:
        db.interrupt()
        with contextlib.suppress(sqlite3.Error):
            await done
        raise

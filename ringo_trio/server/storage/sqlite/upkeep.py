"""WAL checkpoints off the event loop (see the engine's docstring,
"Checkpoints").

Checkpoints: SQLite copies the WAL back into the database (and fsyncs
both) inside whichever COMMIT crosses `wal_autocheckpoint` pages: on the
event loop, a stall of 3-14 ms every ~1,600 settled tasks that every stream
waits through (`/tmp` micro-run, 40,000 claim + ack: 31-47 calls over 2 ms,
130-240 ms in all, against 0-3 without). While the daemon serves,
`maintain` does it instead: a PASSIVE checkpoint on a second connection in
a worker thread, `CHECKPOINT_INTERVAL` after the first commit since the
last one. Between commits it waits on an event the commits set, not on a
timer: an idle daemon's upkeep never wakes (a poll woke it ten times a
second, and stepped a daemon on a virtual clock through its days 0.1 s at
a time). PASSIVE never blocks a writer; once it has copied
every frame, the next write starts the WAL over, so the file stays near
what an interval writes. The loop's own automatic checkpoint stays as a
backstop at `BACKSTOP_PAGES` (a thread that cannot keep up, a stuck
disk), and goes back to SQLite's default when upkeep stops (tools and
tests that open the engine alone).
"""

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

"""The PostgreSQL side of paused queues (minor 13): a row per paused queue,
shared by every daemon of the database.

A change and its announcement are one transaction: the notification
(`listen.paused_note`) is delivered at commit, never for a rolled-back
change, and on the channel of the wake-ups, so another daemon follows a
pause before it hears of the tasks enqueued after it. A change that changed
nothing announces nothing. The claim statements never read the table (the
daemon's cache does, `rpc.paused`).
"""

from __future__ import annotations

import asyncpg  # type: ignore[import-untyped]

from . import listen
from .schema import ident


class PausedSql:
    def __init__(self, schema: str, channel: str, instance: str) -> None:
        self._channel = channel
        self._instance = instance
        paused = f"{ident(schema)}.paused_queues"
        self.all = f"SELECT queue FROM {paused}"
        # Which of the queues $1 are paused (stats of one or of a page).
        self.among = f"SELECT queue FROM {paused} WHERE queue = ANY($1::text[])"
        self._pause = f"""
            INSERT INTO {paused} (queue, paused_at) VALUES ($1, $2)
            ON CONFLICT DO NOTHING RETURNING queue
        """
        self._resume = f"DELETE FROM {paused} WHERE queue = $1 RETURNING queue"

    async def set(self, conn: asyncpg.Connection, queue: str, paused: bool, now_us: int) -> bool:
        """Store the flag and announce a change; True when it changed."""
        async with conn.transaction():
            if paused:
                changed = await conn.fetch(self._pause, queue, now_us)
            else:
                changed = await conn.fetch(self._resume, queue)
            if changed:
                note = listen.paused_note(self._instance, queue, paused)
                await conn.execute("SELECT pg_notify($1, $2)", self._channel, note)
        return bool(changed)

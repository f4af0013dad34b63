"""WaitTask across daemons: the statements of `register_waits` and the
batched recheck (the table is schema migration 8; the notifications come
from the statements that end tasks, `sql.Spelling.notify_settled`, and a
deletion trigger, `schema.wait_function`; the listener is
`listen.watch_settled`)."""

from __future__ import annotations

from datetime import timedelta

from .schema import ident, wait_channel

STALE_WAITS = timedelta(minutes=10)
"""A daemon re-sends its registrations every `rpc.waits.REFRESH` seconds
while it waits; older ones are a vanished daemon's (they cost only
notifications nobody hears) and an engine opening clears them."""


class WaitSql:
    def __init__(self, schema: str) -> None:
        waits = f"{ident(schema)}.task_waits"
        self.channel = wait_channel(ident(schema))
        self.task_states = f"SELECT id, state FROM {ident(schema)}.tasks WHERE id = ANY($1::text[])"
        # One statement, so one transaction: withdraw $2, register $1 (a
        # repeat refreshes `since`).
        self.update = f"""
            WITH gone AS (
                DELETE FROM {waits} WHERE task_id = ANY($2::text[]) AND instance = $3
            )
            INSERT INTO {waits} (task_id, instance) SELECT unnest($1::text[]), $3
            ON CONFLICT (task_id, instance) DO UPDATE SET since = now()
        """
        self.stale = f"DELETE FROM {waits} WHERE since < now() - $1::interval"

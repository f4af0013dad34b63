"""What every statement of the engine is spelled with (`Spelling`: its
table, its notifications, the priority walk) and the task-type filter; the
statements themselves live with their concern (`claim`, `settle`,
`operate`, `listing`)."""

from __future__ import annotations

from collections.abc import Sequence

from ..rows import PENDING
from .schema import FINISHED_TERM, ident, literal, wait_channel

# pg_notify refuses payloads of 8000 bytes or more; queue names are far
# shorter (MAX_NAME_BYTES), this only keeps a bad one from failing a write.
MAX_NOTIFY_QUEUE_BYTES = 7000


class Spelling:
    """One engine's names: its schema's tasks table, and its notifications
    (on `channel`, naming the engine `instance`, so `watch` skips its own)."""

    def __init__(self, schema: str, channel: str, instance: str) -> None:
        self.schema = schema
        t = self.tasks = f"{ident(schema)}.tasks"
        self._channel = literal(channel)
        self._sender = literal(instance + " ")
        self._waits = f"{ident(schema)}.task_waits"
        self._wait_channel = wait_channel(ident(schema))
        # The queue's distinct PENDING priorities, highest first, one index
        # seek each (a recursive walk), so far-future tasks are never scanned.
        self.prios = f"""prios(p) AS (
                (SELECT priority FROM {t} WHERE queue = $1 AND state = {PENDING}
                 ORDER BY priority DESC LIMIT 1)
                UNION ALL
                SELECT (SELECT priority FROM {t} WHERE queue = $1 AND state = {PENDING}
                        AND priority < prios.p ORDER BY priority DESC LIMIT 1)
                FROM prios WHERE prios.p IS NOT NULL
            )"""

    def note(self, queue: str) -> str:
        """pg_notify naming `queue` (an SQL expression) and this engine."""
        return (
            f"pg_notify({self._channel}, {self._sender} ||"
            f" CASE WHEN octet_length({queue}) <= {MAX_NOTIFY_QUEUE_BYTES}"
            f" THEN {queue} ELSE '' END)"
        )

    def notify_pending(self, cte: str) -> str:
        """How many distinct queues of `cte` went PENDING, notifying each."""
        return (
            f"(SELECT count(*) FROM (SELECT DISTINCT queue FROM {cte}"
            f" WHERE state = {PENDING}) q, LATERAL {self.note('q.queue')} n)"
        )

    def notify_settled(self, cte: str) -> str:
        """How many tasks of `cte` (its columns ``wid``, ``state``) ended
        while a daemon waits on them (`task_waits`), notifying each id on
        the wait channel. With nobody waiting: one probe of an empty index
        per row, in the statement's own executor (a statement trigger would
        cost a PL/pgSQL call and an SPI query per statement: ~16 µs)."""
        return (
            f"(SELECT count(pg_notify({self._wait_channel}, c.wid)) FROM {cte} c"
            f" WHERE c.{FINISHED_TERM}"
            f" AND EXISTS (SELECT 1 FROM {self._waits} w WHERE w.task_id = c.wid))"
        )


def types_filter(n: int) -> str:
    """The task-type filter on parameter $n: NULL (no types asked) passes all."""
    return f"AND (${n}::text[] IS NULL OR task_type = ANY(${n}::text[]))"


def type_list(task_types: Sequence[str]) -> list[str] | None:
    return list(task_types) if task_types else None

"""What every statement of the engine is spelled with (`Spelling`: its
table, its notifications, the priority walk) and the task-type filter; the
statements themselves live with their concern (`claim`, `settle`,
`operate`, `listing`)."""

from __future__ import annotations

from collections.abc import Sequence

from ..rows import PENDING
from .schema import FINISHED_TERM, PENDING_BY_TYPE, ident, literal, wait_channel

# pg_notify refuses payloads of 8000 bytes or more; queue names are far
# shorter (MAX_NAME_BYTES), this only keeps a bad one from failing a write.
MAX_NOTIFY_QUEUE_BYTES = 7000


class Spelling:
    """One engine's names: its schema's tasks table, and its notifications
    (on `channel`, naming the engine `instance`, so `watch` skips its own)."""

    def __init__(self, schema: str, channel: str, instance: str) -> None:
        self.schema = schema
        self.tasks = f"{ident(schema)}.tasks"
        self._channel = literal(channel)
        self._sender = literal(instance + " ")
        self.task_waits = f"{ident(schema)}.task_waits"
        self._wait_channel = wait_channel(ident(schema))
        self.prios = self.prios_of(f"state = {PENDING}")

    def prios_of(self, pending: str) -> str:
        """`prios(p)`: the distinct priorities of the queue's `pending`
        tasks, highest first, one index seek each (a recursive walk), so
        far-future tasks are never scanned."""
        t = self.tasks
        return f"""prios(p) AS (
                (SELECT priority FROM {t} WHERE queue = $1 AND {pending}
                 ORDER BY priority DESC LIMIT 1)
                UNION ALL
                SELECT (SELECT priority FROM {t} WHERE queue = $1 AND {pending}
                        AND priority < prios.p ORDER BY priority DESC LIMIT 1)
                FROM prios WHERE prios.p IS NOT NULL
            )"""

    def typed_prios(self, n: int, pending: str = PENDING_BY_TYPE) -> str:
        """`prios` of the `pending` tasks of the types $n only, each type
        once in `claimed_types(t)`: the highest priority of any of them,
        then the next lower one, one seek per type each (of
        `tasks_pending_type`; of `tasks_pending_unkeyed_type` for a limited
        claim's unkeyed tasks), so no walk reads a task of another type."""
        t = self.tasks

        def highest(below: str) -> str:
            return f"""(SELECT max(f.priority) FROM claimed_types CROSS JOIN LATERAL (
                    SELECT priority FROM {t} WHERE queue = $1 AND {pending}
                        AND task_type = claimed_types.t{below}
                    ORDER BY priority DESC LIMIT 1) f)"""

        return f"""claimed_types(t) AS (SELECT DISTINCT unnest(${n}::text[])),
            prios(p) AS (
                SELECT {highest("")}
                UNION ALL
                SELECT {highest(" AND priority < prios.p")} FROM prios
                WHERE prios.p IS NOT NULL
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

    def notify_ended(self, row: str = "") -> str:
        """A RETURNING column of a statement that may end tasks: notifies
        the row's id on the wait channel when it ended (SUCCEEDED, DEAD,
        CANCELLED) and a daemon waits on it (`task_waits`). `row` qualifies
        the columns (an UPDATE's alias and a dot). With nobody waiting: one
        probe of an empty index per ended row, in the statement's own
        executor (measured in bench/results.md, "WaitTask"; a subquery over
        the statement's rows, or a statement trigger, cost far more)."""
        return (
            f"CASE WHEN {row}{FINISHED_TERM} AND EXISTS (SELECT 1 FROM {self.task_waits} w"
            f" WHERE w.task_id = {row}id) THEN pg_notify({self._wait_channel}, {row}id) END"
        )


def types_filter(n: int) -> str:
    """The task-type filter on parameter $n: NULL (no types asked) passes all."""
    return f"AND (${n}::text[] IS NULL OR task_type = ANY(${n}::text[]))"


def type_list(task_types: Sequence[str]) -> list[str] | None:
    return list(task_types) if task_types else None

"""Retention: the daemon deletes finished tasks once they are old enough.

Theory of operation
-------------------
A `RetentionPolicy` says how long a finished task is kept after it finished,
per state (``ringod --retain-succeeded 7d --retain-dead 30d
--retain-cancelled 7d``; None keeps that state forever; zero, succeeded
tasks only, has the acks delete them: `RetentionPolicy.delete_at_ack`,
and a pass deletes what they kept an interval later). `Retention.run`
lives in the daemon's task group for the daemon's whole life and makes one
*pass* every `RetentionPolicy.interval` seconds, the first one interval
after the start.

A pass reads the daemon's `Clock` once; for each state with a retention it
deletes, across every queue, the tasks of that state finished before
``now - retention``, `RetentionPolicy.batch` at a time, oldest first, each
batch one short storage transaction (`Storage.delete_finished`), until a
batch comes back short. So a backlog (retention just turned on, or a daemon
that was down for a week) is worked off in one pass, batch after batch,
and a quiet day costs one near-empty index probe per state.

Not stalling the daemon: the SQLite engine runs on the event loop, so a
batch holds the loop for its whole transaction. Between batches the pass
sleeps `RetentionPolicy.pause`, which lets the calls that queued up meanwhile
(health checks, claims, acks) run before the next batch: a call waits at
most one batch, never a whole pass. The batch and the pause were chosen by
measuring health-check latency while purging 100k tasks (bench/retention.py,
figures in docs/operations.md). On PostgreSQL a batch is awaited like any
query and the loop stays free; `FOR UPDATE SKIP LOCKED` in the delete lets
every daemon on a shared database run its own retention without one waiting
on another's rows.

Failures: a pass that fails (database unreachable, disk full, anything) is
logged and given up; the next interval starts over. Nothing here ever ends
the daemon.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from ringo_trio._contract.durations import format_retention
from ringo_trio._contract.limits import MAX_DELETE_BATCH
from ringo_trio._proto.ringo.v1 import TaskState

from .clock import Clock
from .storage.base import Storage, StorageUnavailable

__all__ = [
    "DEFAULT_RETAIN_CANCELLED",
    "DEFAULT_RETAIN_DEAD",
    "DEFAULT_RETAIN_SUCCEEDED",
    "DEFAULT_POSTGRES_RETENTION_BATCH",
    "DEFAULT_RETENTION_BATCH",
    "DEFAULT_RETENTION_INTERVAL",
    "Retention",
    "RetentionPolicy",
]

log = logging.getLogger("ringo_trio.server")

# ringod's defaults (docs/operations.md explains the choice). A succeeded or
# cancelled task is worth a week of "what happened to job X?"; a dead one
# waits for a human to look at it and retry it, so it gets a month.
DEFAULT_RETAIN_SUCCEEDED = timedelta(days=7)
DEFAULT_RETAIN_DEAD = timedelta(days=30)
DEFAULT_RETAIN_CANCELLED = timedelta(days=7)
DEFAULT_RETENTION_INTERVAL = 60.0
# Measured (bench/retention.py, docs/operations.md): on SQLite a batch holds
# the event loop, so it is small; on PostgreSQL the loop stays free and each
# commit costs a WAL flush, so batches are larger.
DEFAULT_RETENTION_BATCH = 200
DEFAULT_POSTGRES_RETENTION_BATCH = 2000
DEFAULT_RETENTION_PAUSE = 0.005


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """How long finished tasks are kept. The default keeps everything: the
    in-process daemons of tests and of `ringo_trio.testing` delete nothing
    unless asked; ``ringod``'s flags default to the ``DEFAULT_RETAIN_*``."""

    succeeded: timedelta | None = None
    dead: timedelta | None = None
    cancelled: timedelta | None = None
    interval: float = DEFAULT_RETENTION_INTERVAL
    """Seconds between passes."""
    batch: int = DEFAULT_RETENTION_BATCH
    """Tasks deleted per storage transaction (the default suits SQLite;
    ``DEFAULT_POSTGRES_RETENTION_BATCH`` PostgreSQL)."""
    pause: float = DEFAULT_RETENTION_PAUSE
    """Seconds between two batches of a pass, for the calls waiting on the loop."""

    def __post_init__(self) -> None:
        for state, keep in self.retained():
            if keep < timedelta(0) or (not keep and state != TaskState.SUCCEEDED):
                raise ValueError(f"the {state.name} retention must be positive (or None)")
        if not self.interval > 0:
            raise ValueError("the retention interval must be positive")
        if not 1 <= self.batch <= MAX_DELETE_BATCH:
            raise ValueError(f"the retention batch must be within 1..{MAX_DELETE_BATCH}")
        if not self.pause >= 0:
            raise ValueError("the pause between retention batches must not be negative")

    @property
    def delete_at_ack(self) -> bool:
        """Succeeded tasks are kept no time (``--retain-succeeded never``):
        the Work stream's acks delete their tasks (`Storage.delete_succeeded`)."""
        return self.succeeded == timedelta(0)

    def retained(self) -> list[tuple[TaskState, timedelta]]:
        """(state, retention) of every state that is not kept forever."""
        kept = (
            (TaskState.SUCCEEDED, self.succeeded),
            (TaskState.DEAD, self.dead),
            (TaskState.CANCELLED, self.cancelled),
        )
        return [(state, keep) for state, keep in kept if keep is not None]

    def describe(self) -> str:
        return (
            f"succeeded {format_retention(self.succeeded)}, dead {format_retention(self.dead)},"
            f" cancelled {format_retention(self.cancelled)}"
        )


class Retention:
    """Deletes the finished tasks a `RetentionPolicy` no longer keeps."""

    def __init__(self, storage: Storage, clock: Clock, policy: RetentionPolicy) -> None:
        self._storage = storage
        self._clock = clock
        self.policy = policy
        # Told after a pass deleted tasks (the daemon rechecks its WaitTask
        # callers' tasks: a deleted one is NOT_FOUND).
        self.deleted_listener: Callable[[], None] | None = None

    async def purge(self) -> dict[TaskState, int]:
        """One pass: how many tasks of each retained state it deleted.
        Storage errors propagate (after the batches that did commit)."""
        now = self._clock.now()
        batch = self.policy.batch
        deleted: dict[TaskState, int] = {}
        for state, keep in self.policy.retained():
            # Kept no time: what the acks left (a task a WaitTask waited on,
            # one acked by the unary call) goes once an interval old, so a
            # waiter woken by its ack has read it by then.
            keep = keep or timedelta(seconds=self.policy.interval)
            deleted[state] = 0
            while True:
                n = await self._storage.delete_finished(None, [int(state)], now - keep, batch)
                deleted[state] += n
                if n < batch:
                    break
                await asyncio.sleep(self.policy.pause)
        return deleted

    async def sweep(self) -> int:
        """`purge`, logged; never raises (but cancellation). How many were deleted."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            deleted = await self.purge()
        except StorageUnavailable as exc:
            # Full is a kind of unavailable: the next pass tries again.
            log.warning(
                "retention pass failed (%s); trying again in %gs", exc, self.policy.interval
            )
            return 0
        except Exception:
            log.exception("retention pass failed; trying again in %gs", self.policy.interval)
            return 0
        total = sum(deleted.values())
        if total and self.deleted_listener is not None:
            self.deleted_listener()
        if total:
            log.info(
                "retention deleted %d finished task(s) in %.2fs: %s",
                total,
                loop.time() - started,
                ", ".join(f"{n} {state.name}" for state, n in deleted.items() if n),
            )
        return total

    async def run(self) -> None:
        """Pass after pass until cancelled; returns at once when nothing is
        ever deleted."""
        if not self.policy.retained():
            return
        log.info("retention: %s, every %gs", self.policy.describe(), self.policy.interval)
        while True:
            # Not at once: a daemon starting up has its clients to take back first.
            await asyncio.sleep(self.policy.interval)
            await self.sweep()

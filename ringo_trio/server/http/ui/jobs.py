"""The dashboard's background jobs: a purge, or a bulk retry, cancel or purge
by the task list's current filter (protocol minor 14), each a run of bounded
batches.

A click may name a million tasks; done in the request, on SQLite (whose
engine runs on the loop) that held the daemon for seconds. A click starts a
`Job` instead: a task of the dashboard's own task group (`Dashboard.serve`,
itself a task of the daemon's group, so a job never outlives the daemon:
shutdown cancels it between two batches) that runs batch after batch, each
one RPC of `batch` tasks (one short transaction), pausing `pause` seconds
between batches so the calls that queued up meanwhile run first -- the
batch and pause of retention, which were measured for this (on SQLite the
pause is at least `SQLITE_PURGE_PAUSE`, app.py). The click waits for the
first batch only (a small job is done by then, and a refused one, a bad
queue name say, is answered with its status), then redirects to the queue's
page with ``?purge=ID``, whose live ``purge`` part shows the count so far
and then the total. One job per queue at a time: a click while one runs
starts nothing and shows the running one. Each job's cutoff is fixed at the
click (finished before it, or enqueued at or before it), so tasks finishing
or arriving during a long job do not keep it going.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from grpclib.exceptions import GRPCError

log = logging.getLogger("ringo_trio.server.http.ui")

# One batch: (tasks it changed, whether more may match).
Batch = Callable[[], Awaitable[tuple[int, bool]]]
# Finished jobs whose outcome a page can still show (by ?purge=ID).
KEPT = 100
# What a page says of each kind: (running, done, the tasks' adjective).
WORDS = {
    "purge": ("Purging", "Deleted", "finished"),
    "retry": ("Retrying", "Retried", "DEAD"),
    "cancel": ("Cancelling", "Cancelled", "active"),
}


@dataclass(eq=False)
class Job:
    """One click's background run, as its page shows it."""

    id: int
    queue: str
    kind: str = "purge"
    count: int = 0
    done: bool = False
    error: str = ""
    refused: GRPCError | None = None
    first_batch: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def words(self) -> tuple[str, str, str]:
        return WORDS[self.kind]


class Jobs:
    """The dashboard's jobs: at most one running per queue, the last `KEPT`
    finished ones remembered for their pages."""

    def __init__(self, pause: float) -> None:
        self._pause = pause
        # Set while `Dashboard.serve` runs: the jobs' task group.
        self.group: asyncio.TaskGroup | None = None
        self._ids = itertools.count(1)
        self._running: dict[str, Job] = {}
        self._jobs: collections.OrderedDict[int, Job] = collections.OrderedDict()

    def running(self, queue: str) -> Job | None:
        return self._running.get(queue)

    def shown(self, queue: str, wanted: str) -> Job | None:
        """The job a queue's page shows: ?purge=ID's, else the running one."""
        if wanted.isdecimal():
            job = self._jobs.get(int(wanted))
            if job is not None and job.queue == queue:
                return job
        return self._running.get(queue)

    async def start(self, queue: str, kind: str, batch: Batch) -> Job:
        """Start a job of `queue` running `batch` until it finds no more (or
        find the one running), and wait for its first batch."""
        running = self._running.get(queue)
        if running is not None:
            return running
        if self.group is None:
            raise RuntimeError("the dashboard is not serving")
        job = Job(next(self._ids), queue, kind)
        self._running[queue] = job
        self._jobs[job.id] = job
        # The oldest finished ones go; running ones stay (one per queue).
        excess = len(self._jobs) - KEPT
        for old in [j for j in self._jobs.values() if j.done][: max(excess, 0)]:
            del self._jobs[old.id]
        self.group.create_task(self._run(job, batch), name=f"ringod ui {kind} {queue!r}")
        await job.first_batch.wait()
        if job.refused is not None:
            raise job.refused
        return job

    async def _run(self, job: Job, batch: Batch) -> None:
        started = time.monotonic()
        try:
            while True:
                changed, more = await batch()
                job.count += changed
                if not more:
                    break
                job.first_batch.set()
                # Between two batches the loop serves what queued up meanwhile
                # (on SQLite a batch holds it).
                await asyncio.sleep(self._pause)
        except GRPCError as exc:
            job.error = exc.message or exc.status.name
            if not job.first_batch.is_set():
                # The click's own answer (a bad queue name: 400).
                job.refused = exc
            else:
                log.warning("dashboard: %s of queue %r stopped: %s", job.kind, job.queue, job.error)
        except Exception:
            # Never into the task group: that would end the dashboard.
            log.exception("dashboard: %s of queue %r failed", job.kind, job.queue)
            job.error = "internal error; see the daemon log"
        finally:
            job.done = True
            del self._running[job.queue]
            job.first_batch.set()
        if job.count:
            log.info(
                "dashboard: %s: %d task(s) of queue %r in %.1fs",
                job.kind,
                job.count,
                job.queue,
                time.monotonic() - started,
            )

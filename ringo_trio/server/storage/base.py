"""The storage interface every engine implements (SQLite, PostgreSQL).

Theory of operation
-------------------
The daemon's service layer validates requests and owns time; an engine owns
durability and the task state machine:

    PENDING(available_at) --claim--> LEASED(attempt+1, fresh token, until, worker)
    LEASED --ack--> SUCCEEDED
    LEASED --nack / lease expiry--> PENDING(now + backoff or override)
                                   | DEAD when attempt == max_attempts
    LEASED --reject--> DEAD
    LEASED --release--> PENDING(attempt-1)   a push the daemon could not deliver,
                                           or a lease a stopping worker hands back
    SUCCEEDED | DEAD | CANCELLED --retry--> PENDING(now), attempt counter kept,
                                max_attempts raised so the task gets one more
                                attempt budget
    PENDING | LEASED --cancel--> CANCELLED   the lease is gone at once: the
                                worker's next settle or renewal is LeaseLost
                                (reason "cancelled")
    SUCCEEDED | DEAD | CANCELLED --delete--> (gone; its unique key is free again)

Rules every engine keeps (the shared storage test suite checks them):

* Every mutation is one transaction: it fully happens or not at all, and a
  committed one survives `kill -9` of the daemon.
* `(queue, unique_key)` dedupes among non-empty keys; a duplicate enqueue
  returns the existing task with `created=False` and changes nothing.
* A `LeaseRef` changes a task only if `(task_id, attempt, lease_token)` is the
  task's *current* lease and the task is LEASED and the lease has not expired
  at `now`; otherwise `LeaseLost` and nothing changes. When the ref's task
  is CANCELLED at the ref's very attempt, that `LeaseLost` says so
  (`cancelled=True`); finding that out costs only the miss path.
* An expired lease is never handed out again for the same attempt: claim
  first returns expired leases to PENDING/DEAD (as `expire_leases` does), then
  leases with a new attempt number and a fresh token.
* Claim order: highest priority first, then earliest available_at, then
  enqueue order.
* A claim that does not return its leases leaves none behind. Cancelled
  while in flight, it either committed nothing or hands back every lease it
  committed (`release`, as of the claim's `now`) before the cancellation
  goes on; the same when its rows fail to become the answer. An engine
  whose claim can suspend after its commit runs it through `handback.guard_claim`;
  one whose claim never suspends (SQLite) has no such moment.
* Several engines may share one store (PostgreSQL: one daemon per host);
  every rule above holds across them, a task is never leased by two at once,
  and `watch` tells each about claimable work the others made.
* An engine whose backend cannot be reached raises `StorageUnavailable` and
  recovers by itself once the backend is back; no reopen is needed. One
  whose backend is a server it connects to (`can_be_unreachable`) answers
  `ping` (one cheap round trip) and tells `unavailable_listener` about every
  operation that failed for want of a connection; the daemon probes with
  both and reports the outcome as its health.
* An engine whose backend has no room to write (disk full) raises
  `StorageFull` — after calling `full_listener` with it — and the failed
  write is rolled back; `probe` tells when there is room again.

Engines take `now` from the caller; they never read a clock themselves.
Rows cross this interface as the generated wire dataclasses (`Task`,
`Lease`, `LeasedTask`) so the service sends them without a copy. The one
exception is the Work stream's claim (`claim_pushes`): its tasks cross as
their push frames, already encoded (`Push`), since building each message
only to encode it was a tenth of the daemon's CPU per task.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import ClassVar

from ringo_trio._contract.limits import MAX_LIMIT_RULES
from ringo_trio._proto.ringo.v1 import (
    Lease,
    LeasedTask,
    LeaseRef,
    QueueStats,
    Schedule,
    Task,
    TaskSpec,
)
from ringo_trio._wire.primitives import seconds_nanos_body as _seconds_nanos_body
from ringo_trio._wire.rows import Push

from .limits import Rule, RuleStatus
from .schedules import FiringReport

__all__ = [
    "Ack",
    "EnqueueOutcome",
    "Nack",
    "Reject",
    "Settlement",
    "FailedPrecondition",
    "LeaseLost",
    "NotFound",
    "PausedChanged",
    "Push",
    "SchemaTooNew",
    "TaskFilter",
    "TaskPage",
    "lease_ttl",
    "stamp_ttl",
    "ttl_field",
    "Storage",
    "StorageError",
    "StorageFull",
    "StorageUnavailable",
    "refuse_rule_over",
    "storage_full",
]


PausedChanged = Callable[[str, bool], None]
"""`Storage.watch`'s report of another process's pause or resume: (queue, paused)."""


class StorageError(Exception):
    """Base of the conditions an engine reports to the service layer."""


class StorageUnavailable(StorageError):
    """The storage backend cannot be reached now (connection lost, server
    down or shutting down); the call may be retried. Whether a mutation that
    failed this way was committed is unknown only when the connection broke
    while the commit was in flight."""


class StorageFull(StorageUnavailable):
    """The backend has no room to write (disk full; SQLite also at its
    ``max_page_count``). The failed write was rolled back: nothing of it was
    committed. A kind of `StorageUnavailable`, so whatever rides out an
    outage (a Work stream ends UNAVAILABLE, the reaper tries again) rides
    this out too; a unary call answers it RESOURCE_EXHAUSTED, since here the
    outcome is known."""


class NotFound(StorageError):
    pass


class LeaseLost(StorageError):
    """The ref is not its task's live lease. `cancelled` is true when the
    lease ended because the task was cancelled (CancelTask), so the worker
    can tell the handler why."""

    def __init__(self, message: str = "", *, cancelled: bool = False) -> None:
        super().__init__(message)
        self.cancelled = cancelled


class FailedPrecondition(StorageError):
    pass


class SchemaTooNew(StorageError):
    """The data was written by a newer schema than this code knows; `open`
    refuses it and leaves it untouched."""


@dataclass(frozen=True, slots=True)
class Ack:
    """One ack of a group commit (`Storage.settle_many`)."""

    ref: LeaseRef
    result: bytes | None = None


@dataclass(frozen=True, slots=True)
class Nack:
    """One nack of a group commit (`Storage.settle_many`)."""

    ref: LeaseRef
    error: str
    retry_delay: timedelta | None = None


@dataclass(frozen=True, slots=True)
class Reject:
    """One reject of a group commit (`Storage.settle_many`)."""

    ref: LeaseRef
    error: str


Settlement = Ack | Nack | Reject


@dataclass(frozen=True, slots=True)
class EnqueueOutcome:
    task: Task
    created: bool


@dataclass(frozen=True, slots=True)
class TaskFilter:
    """Which tasks of a queue ListTasks walks. Empty tuples mean "any"."""

    states: tuple[int, ...] = ()
    """Wire `TaskState` values."""
    task_types: tuple[str, ...] = ()
    unique_key_prefix: str = ""


@dataclass(frozen=True, slots=True)
class TaskPage:
    tasks: list[Task]
    """Without payload and result, last_error cut to MAX_LIST_ERROR_BYTES."""
    next_after: int | None
    """The cursor (enqueue sequence number) to pass as `after` for the next
    page; None on the last page."""
    seqs: list[int]
    """Each task's cursor, in `tasks`' order: a page cut short (to fit a
    reply) goes on after the last task it keeps."""


def lease_ttl(until: datetime, now: datetime) -> timedelta:
    """How long a lease that ends at `until` still runs at `now`, the moment
    the daemon sends it: ``Lease.ttl`` (minor >= 11; docs/protocol.md,
    "Lease time"). Never negative."""
    return max(until - now, _NO_TIME)


def stamp_ttl(lease: Lease | None, now: datetime) -> None:
    """Set `lease`'s ``ttl`` as of `now` (`lease_ttl`), for a reply of
    minor >= 11 sent at `now`; no lease, or one without ``until``, is left
    as it is."""
    if lease is not None and lease.until is not None:
        lease.ttl = lease_ttl(lease.until, now)


def ttl_field(until: datetime, now: datetime) -> bytes:
    """The encoded ``Lease.ttl`` (field 6) of `lease_ttl`, byte for byte the
    generic codec's encoding of that Duration (a push's lease is bytes)."""
    delta = until - now
    us = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    if us <= 0:
        return _ZERO_TTL
    seconds, micros = divmod(us, 1_000_000)
    return b"\x32" + _seconds_nanos_body(seconds, micros * 1000)


_NO_TIME = timedelta(0)
_ZERO_TTL = b"\x32\x00"


class Storage(abc.ABC):
    """One durable task store. Methods are coroutines so that network engines
    fit; an engine must be safe to call from concurrent tasks of one event loop."""

    full_listener: Callable[[StorageFull], None] | None = None
    """Called with every `StorageFull` before the engine raises it (the
    daemon turns its health NOT_SERVING)."""

    can_be_unreachable: ClassVar[bool] = False
    """The backend is a server reached over connections, which can be lost
    (PostgreSQL); only then does the daemon probe it (`ping`). A local file
    (SQLite) is never "unreachable": it fails the operation or not at all."""

    unavailable_listener: Callable[[StorageUnavailable], None] | None = None
    """Called with the `StorageUnavailable` of every operation that failed
    because the backend could not be reached, before it is raised (the
    daemon probes reachability at once)."""

    released_listener: Callable[[str], None] | None = None
    """Called with the queue whenever the engine itself released the leases
    of a claim that did not return them (`handback.guard_claim`): those tasks are
    claimable again and no caller is left to say so (the daemon wakes the
    queue's claimers; `watch` does not hear an engine's own writes)."""

    delete_succeeded: bool = False
    """An ack of a group commit (`settle_many`) deletes its task rather than
    keep it SUCCEEDED (``ringod --retain-succeeded never``), unless a WaitTask
    waits on it. The task leaves as retention would take it: its unique key
    is free, its counts drop, a later WaitTask finds nothing. A waited task,
    or one acked by `ack`, stays SUCCEEDED for retention's next pass."""

    waited: Container[str] = frozenset()
    """The task ids this daemon's WaitTask calls wait on (or did a moment
    ago: `TaskWaits`' re-ask window), which `delete_succeeded` keeps;
    engines with `waits_across_processes` keep those registered by any
    daemon (`register_waits`) too."""

    @abc.abstractmethod
    async def open(self) -> None:
        """Create or migrate the schema; take any exclusive resources."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release everything; idempotent."""

    async def watch(
        self,
        notify: Callable[[str | None], None],
        paused_changed: PausedChanged | None = None,
    ) -> None:
        """Run until cancelled, calling `notify(queue)` whenever ANOTHER
        process may have made a task of `queue` claimable (an enqueue that
        created tasks, a nack back to PENDING, a retry, a release, a lease
        expiry back to PENDING), `paused_changed(queue, paused)` when
        another process paused or resumed `queue` (`set_queue_paused`), in
        commit order with the rest, and
        `notify(None)` each time the listener (re)connects: anything may
        have changed while it was not listening, paused flags included.

        Never raises except cancellation; after losing its connection it
        reconnects with capped backoff. Engines no other process writes
        return at once (this default)."""
        return

    # -- waiting for outcomes (WaitTask, minor 12) --------------------------

    waits_across_processes: ClassVar[bool] = False
    """Other processes settle this store's tasks too (PostgreSQL), so a
    waiting daemon registers its waited ids (`register_waits`) and hears
    their settlements (`watch_settled`)."""

    async def task_states(self, task_ids: Sequence[str]) -> dict[str, int]:
        """The wire `TaskState` of each of these tasks that exists, in one
        query (the daemon's batched recheck of waited tasks); a task that
        does not exist is absent."""
        raise NotImplementedError

    async def register_waits(self, *, add: Sequence[str], remove: Sequence[str]) -> None:
        """(`waits_across_processes` engines) Tell the store this daemon now
        waits on the tasks `add` and no longer on `remove`, in one short
        transaction: settlements of waited tasks, by any process, notify
        `watch_settled`. Engines no other process writes do nothing (this
        default)."""
        return

    async def watch_settled(
        self, notify: Callable[[str | None], None], ready: Callable[[], None]
    ) -> None:
        """Run until cancelled, calling `notify(task_id)` whenever any process
        settled, cancelled or deleted a task registered with `register_waits`
        (by any daemon: the caller ignores ids it does not wait on), `ready()`
        once it listens, and `notify(None)` at each reconnect (anything may
        have changed meanwhile). Never raises but cancellation; reconnects
        with capped backoff. Engines no other process writes call `ready`
        and return (this default)."""
        ready()

    async def maintain(self) -> None:
        """Run until cancelled: the engine's own upkeep that must not run on
        the daemon's event loop (the daemon runs it in its task group while
        it serves). Engines with none return at once (this default)."""
        return

    async def ping(self) -> None:
        """Prove the backend reachable now with one cheap round trip, on a
        connection of its own (a pool busy with work must not make it look
        down); `StorageUnavailable` when it is not. The caller bounds the
        wait. Engines that cannot be unreachable return at once (this
        default)."""
        return

    @abc.abstractmethod
    async def probe(self, now: datetime) -> None:
        """Commit a write that takes new space and leaves no trace (a task
        row of a page or more, deleted again); `StorageFull` while there is
        no room. The daemon calls it to learn that writes work again."""

    # -- submission --------------------------------------------------------

    @abc.abstractmethod
    async def enqueue(
        self, queue: str, specs: Sequence[TaskSpec], now: datetime
    ) -> list[EnqueueOutcome]:
        """Insert a batch atomically, in order; duplicates (also within the
        batch) resolve to the first task with that unique key."""

    @abc.abstractmethod
    async def get(
        self,
        queue: str,
        *,
        task_id: str | None = None,
        unique_key: str | None = None,
        history: bool = False,
    ) -> Task:
        """Exactly one of task_id / unique_key. Raises NotFound. With
        `history`, `Task.history` is filled (`storage.history`)."""

    @abc.abstractmethod
    async def retry(
        self,
        queue: str,
        now: datetime,
        *,
        task_id: str | None = None,
        unique_key: str | None = None,
    ) -> Task:
        """Reactivate a SUCCEEDED, DEAD or CANCELLED task (its result is
        cleared). NotFound; FailedPrecondition for a PENDING or LEASED task."""

    # -- leases ------------------------------------------------------------

    @abc.abstractmethod
    async def claim(
        self,
        queue: str,
        task_types: Sequence[str],
        limit: int,
        worker_id: str,
        lease_duration: timedelta,
        now: datetime,
    ) -> list[LeasedTask]:
        """Lease up to `limit` available tasks (empty task_types = any type).

        Cancelled, or failing after its commit, it leaves no lease behind
        (see the rules above): a caller may treat a claim that did not return
        as one that leased nothing (short of a connection lost mid-commit,
        see `StorageUnavailable`)."""

    async def claim_pushes(
        self,
        queue: str,
        task_types: Sequence[str],
        limit: int,
        worker_id: str,
        lease_duration: timedelta,
        now: datetime,
    ) -> list[Push]:
        """`claim`, each leased task as the Work stream pushes it (`Push`):
        the same tasks, in the same order, with the same leases.

        This default, `claim` then `Push.of` (the generic codec) per task, is the
        reference the engines' native versions (frames encoded straight from
        their rows) are held byte-equal to by the storage tests (call it as
        ``Storage.claim_pushes(engine, ...)``)."""
        leased = await self.claim(queue, task_types, limit, worker_id, lease_duration, now)
        return [Push.of(item) for item in leased]

    @abc.abstractmethod
    async def ack(self, ref: LeaseRef, now: datetime, result: bytes | None = None) -> Task:
        """SUCCEEDED, storing `result` (the handler's return value; None
        stores none)."""

    @abc.abstractmethod
    async def nack(
        self, ref: LeaseRef, error: str, retry_delay: timedelta | None, now: datetime
    ) -> Task:
        """PENDING after the task's backoff (or `retry_delay`), or DEAD when
        the attempt was the last one."""

    @abc.abstractmethod
    async def reject(self, ref: LeaseRef, error: str, now: datetime) -> Task: ...

    async def settle_many(
        self, settlements: Sequence[Settlement], now: datetime
    ) -> list[str | LeaseLost]:
        """Group commit: apply `settlements` in order, as `ack`/`nack`/`reject`
        one by one would, in ONE transaction.

        Element i of the answer is the queue of settlement i's task when it
        took effect (the metrics count by it, and a caller wakes the queues
        its nacks refilled, with no row built per task), or the `LeaseLost`
        that call alone would have raised (`cancelled` included); a lost
        lease changes nothing and does not stop the others. Two settlements
        of one lease in a group: the first wins, the second is LeaseLost, as
        in sequence. Any other error (`StorageUnavailable`, `StorageFull`)
        rolls the whole group back and is raised: none of it happened.

        This default, one by one in one transaction each, is the reference
        semantics the storage tests compare the engines' group commits with
        (call it as ``Storage.settle_many(engine, ...)``); engines override it.
        """
        answers: list[str | LeaseLost] = []
        for item in settlements:
            try:
                match item:
                    case Ack(ref, result):
                        task = await self.ack(ref, now, result)
                    case Nack(ref, error, retry_delay):
                        task = await self.nack(ref, error, retry_delay, now)
                    case Reject(ref, error):
                        task = await self.reject(ref, error, now)
            except LeaseLost as lost:
                answers.append(lost)
            else:
                answers.append(task.queue)
        return answers

    @abc.abstractmethod
    async def extend_lease(self, ref: LeaseRef, extension: timedelta, now: datetime) -> Lease:
        """until = now + extension (absolute reset)."""

    @abc.abstractmethod
    async def report_progress(
        self, ref: LeaseRef, current: float, total: float, message: str, now: datetime
    ) -> None: ...

    @abc.abstractmethod
    async def release(self, refs: Sequence[LeaseRef], now: datetime) -> int:
        """Undo leases nobody worked to an end, in one transaction: pushes the
        daemon could not deliver, and leases a stopping worker hands back
        (the Work stream's ``release``).

        Every ref that is still its task's live lease (as the LeaseRef rule
        above) returns the task to PENDING, claimable now (it keeps its place
        in claim order), with the lease cleared and `attempt` decremented: an
        attempt that never reached a worker is not spent. Any other ref is
        skipped. A later claim mints a fresh token, so the released ref stays
        powerless even though the attempt number is reused. Returns how many
        tasks changed."""

    @abc.abstractmethod
    async def expire_leases(self, now: datetime) -> int:
        """Return every lease with until <= now to PENDING (with backoff) or
        DEAD; the number of tasks changed."""

    # -- observation -------------------------------------------------------

    @abc.abstractmethod
    async def activity(
        self, queue: str, task_types: Sequence[str], *, due_by: datetime | None = None
    ) -> int:
        """PENDING + LEASED tasks of the queue, up to `MAX_ACTIVITY_COUNT`
        (a larger number answers that), read from the exact counts, so it
        costs the same however deep the queue. With `due_by`, a PENDING task
        counts only if its available_at <= due_by (scheduled ones are left
        out; counted on an index, stopping at the cap); LEASED tasks always
        count."""

    @abc.abstractmethod
    async def next_wakeup(
        self, queue: str, task_types: Sequence[str], now: datetime
    ) -> datetime | None:
        """Earliest future moment a claim on this queue could succeed without
        a new enqueue: the soonest scheduled available_at or lease expiry;
        None when nothing is pending or leased."""

    # -- inspection (minor 9) ----------------------------------------------

    @abc.abstractmethod
    async def list_tasks(
        self,
        queue: str,
        where: TaskFilter,
        *,
        newest_first: bool,
        after: int | None,
        limit: int,
    ) -> TaskPage:
        """One page of the queue's tasks matching `where`, in enqueue order
        (or its reverse), starting after the cursor `after`. A stable
        keyset cursor: tasks enqueued or changed meanwhile never make a page
        repeat or skip a task that matched throughout. Indexed: a page costs
        about `limit` index entries, however deep the queue."""

    @abc.abstractmethod
    async def queue_stats(self, queue: str, now: datetime, *, by_type: bool) -> QueueStats:
        """Counts by state (and by task type when `by_type`), the oldest
        due PENDING task's available_at, and whether the queue is paused. A
        queue without tasks answers zeros (not NotFound). Never a scan of
        the queue's tasks."""

    @abc.abstractmethod
    async def list_queues(self, now: datetime, *, after: str, limit: int) -> list[QueueStats]:
        """The queues holding at least one task or paused, by name, names >
        `after`; their stats without `by_type`."""

    # -- pausing queues (minor 13) -------------------------------------------

    async def set_queue_paused(self, queue: str, paused: bool, now: datetime) -> bool:
        """Store `queue`'s paused flag (a queue needs no task to be paused);
        True when that changed it. The flag is all the engine keeps: the
        daemon does not claim for a paused queue (`rpc.paused`), so the
        claim statements never read it. On a store several daemons share,
        the change is announced to the others' `watch` (``paused_changed``)
        in the same transaction. Engines without the feature refuse it."""
        raise FailedPrecondition("this storage engine cannot pause queues")

    async def paused_queues(self) -> frozenset[str]:
        """The names of every paused queue (few: an operator's choice), in
        one query; the daemon's cache is filled from it."""
        return frozenset()

    # -- operations (minor 9) ----------------------------------------------

    @abc.abstractmethod
    async def cancel(
        self,
        queue: str,
        reason: str,
        now: datetime,
        *,
        task_id: str | None = None,
        unique_key: str | None = None,
    ) -> Task:
        """PENDING or LEASED -> CANCELLED (finished_at = now, last_error
        "cancelled: <reason>" or "cancelled" without one, lease and worker_id
        cleared, attempt kept); CANCELLED is returned unchanged. NotFound;
        FailedPrecondition for SUCCEEDED or DEAD."""

    @abc.abstractmethod
    async def retry_dead(
        self,
        queue: str,
        task_types: Sequence[str],
        finished_before: datetime | None,
        limit: int,
        now: datetime,
    ) -> int:
        """Up to `limit` DEAD tasks of `queue` (of `task_types`, empty: any;
        finished before `finished_before`, None: any), oldest finished first,
        back to PENDING as `retry` does for one, in one transaction; how many
        changed. `watch` of other engines hears of it."""

    # -- bulk by filter (minor 14; the walk that picks the ids is bulk.py) --

    @abc.abstractmethod
    async def cancel_ids(
        self, queue: str, task_ids: Sequence[str], reason: str, now: datetime
    ) -> list[tuple[str, str]]:
        """`cancel` for each of `task_ids` of `queue` still PENDING or LEASED,
        in one transaction; (id, limit_key) of each cancelled."""

    @abc.abstractmethod
    async def delete_ids(self, queue: str, task_ids: Sequence[str], states: Sequence[int]) -> int:
        """Delete those of `task_ids` of `queue` in `states` (finished
        ones), in one transaction; how many."""

    # -- purge and retention (minor 9) -------------------------------------

    @abc.abstractmethod
    async def delete_finished(
        self,
        queue: str | None,
        states: Sequence[int],
        finished_before: datetime | None,
        limit: int,
    ) -> int:
        """Delete up to `limit` tasks in `states` (each SUCCEEDED, DEAD or
        CANCELLED) finished before `finished_before` (None: any), of `queue`
        (None: every queue; retention), oldest finished first, in one short
        transaction; how many were deleted. A deleted task's unique key can
        be used again."""

    # -- schedules (minor 13; storage/schedules.py has the firing's story) --

    #: Whether other daemons may share this store (and put schedules the
    #: schedule loop hears of only by looking again).
    shared_store: ClassVar[bool] = False
    #: Tests only: called at each point of a firing's transaction ("read",
    #: "cas", "insert", "commit"); what it raises rolls the firing back.
    schedule_fault: Callable[[str], None] | None = None

    async def put_schedule(
        self, schedule: Schedule, now: datetime, *, max_per_queue: int
    ) -> tuple[Schedule, bool]:
        """Create or replace the schedule (queue, name), its read-only fields
        ignored; (the stored schedule, created). A changed timing (cron,
        every, timezone) or a resume recomputes ``next_fire_at`` from `now`;
        an unchanged one keeps it. `FailedPrecondition` for a new schedule
        of a queue that holds `max_per_queue` already."""
        raise FailedPrecondition("this storage engine keeps no schedules")

    async def list_schedules(self, queue: str | None, limit: int | None = None) -> list[Schedule]:
        """The schedules of `queue` (None: every queue), in (queue, name)
        order; the first `limit` of them (None: all)."""
        return []

    async def delete_schedule(self, queue: str, name: str) -> bool:
        """Whether (queue, name) existed (its tasks stay)."""
        return False

    async def set_schedule_paused(
        self, queue: str, name: str, paused: bool, now: datetime
    ) -> Schedule:
        """Pause (``next_fire_at`` unset) or resume (recomputed from `now`:
        the ticks missed while paused never fire); `NotFound`."""
        raise NotFound(f"schedule {name!r} in queue {queue!r}")

    async def fire_schedules(self, now: datetime, limit: int) -> FiringReport:
        """Fire up to `limit` due schedules, each exactly once per tick
        (storage/schedules.py)."""
        return FiringReport()

    # -- keyed limits (minor 13, storage.limits) ------------------------------

    @abc.abstractmethod
    async def set_limit(self, queue: str, rule: Rule, now: datetime) -> bool:
        """Upsert the rule of (queue, rule.prefix); True when it was new.
        FailedPrecondition when the queue already holds `MAX_LIMIT_RULES`."""

    @abc.abstractmethod
    async def delete_limit(self, queue: str, prefix: str, now: datetime) -> bool: ...

    @abc.abstractmethod
    async def list_limits(
        self, queue: str | None, now: datetime, *, with_keys: bool
    ) -> list[RuleStatus]:
        """In (queue, prefix) order; every queue's when `queue` is None."""

    def limited(self, queue: str) -> bool:
        """Whether `queue` had rules when this engine last read them (no
        query; see `storage.limits` for how stale that may be)."""
        return False


def refuse_rule_over(queue: str, held: int) -> None:
    """FailedPrecondition when `queue`, holding `held` rules, has no room for
    another (`MAX_LIMIT_RULES`): `Storage.set_limit`'s check on both engines."""
    if held >= MAX_LIMIT_RULES:
        raise FailedPrecondition(
            f"queue {queue!r} already has {held} limit rules (at most"
            f" {MAX_LIMIT_RULES}); delete one first"
        )


def storage_full(storage: Storage, cause: BaseException) -> StorageFull:
    """The `StorageFull` an engine raises for `cause` (no room to write),
    `storage`'s listener told."""
    full = StorageFull(f"no room to write: {cause}")
    if storage.full_listener is not None:
        storage.full_listener(full)
    return full

"""Parked WaitTask calls, and what wakes them.

Theory of operation
-------------------
A WaitTask call *parks* on its task id (`TaskWaits.park`): one `_Entry` per
waited id, shared by every call waiting on it, holds the future the next
wake-up resolves (armed before the call reads the task, so a settlement landing
between the read and the wait is never lost — `wakeups.QueueWakeups`'
scheme, keyed by task). A woken call reads its task again; terminal (or
gone), it answers, otherwise it parks again until its own timeout.

What wakes a parked call, cheapest first:

1. **The settlement itself** (`settled`): the service calls it with the ids
   an ack, nack, reject (unary, Work stream, group commit) or CancelTask
   just changed. With nobody parked that is one empty-dict test, so the
   settle hot path pays nothing for this feature; a nack that left its task
   PENDING wakes its waiters for nothing (they read it and park again).
2. **A batched recheck** (`recheck`, and every `recheck_interval` seconds
   while anyone is parked): ONE storage query (`Storage.task_states`) for
   every waited id, waking those that are terminal or gone. Paths that do
   not name their tasks ask for it at once — an expired lease (the reaper),
   a purge or retention pass — and the interval is the safety net for
   whatever no hook sees.
3. **Other daemons** on a shared store (PostgreSQL): `Storage.register_waits`
   tells the store which ids this daemon waits on, the statements that end
   tasks notify those ids (`postgres.sql.Spelling.notify_settled`), and
   `Storage.watch_settled` delivers them here. Both run only while someone
   is parked: registrations go out in batches from `run`, and the listening
   connection is opened for the first waiter and closed `linger` seconds
   after the last, so a daemon nobody waits on holds no extra connection. A
   call reads its task only after its id's registration went out and the
   listener is up (bounded: past `READY_TIMEOUT` the recheck covers it).

Every exit of a parked call (answer, timeout, client gone, cancellation,
shutdown) leaves `park`'s ``with``; the slot counts and the entry are
released there, synchronously, so nothing leaks whatever ended the call. An
entry costs a dict slot, one small object and, while armed, one future;
a parked call adds its `Waiter` (measured: bench/results.md, "WaitTask").

Limits: `max_waits` per daemon and `per_connection` per HTTP/2 connection;
one more is `WaitLimitReached` (RESOURCE_EXHAUSTED), refused before it
costs anything.

The ids waited on are also what a daemon that deletes succeeded tasks at
their ack keeps (`Storage.waited`, ``--retain-succeeded never``). A client
waits in calls of at most a minute and asks again when one ends, so between
two calls nobody is parked on the id; an ack landing in that gap would
delete the result the client is about to ask for. With a `reask_window`,
an id whose last call left stays waited on (``in``, and on a shared store
registered) for that many seconds, bounded by `max_waits` ids (the oldest
forgotten first).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Iterable
from typing import Final

from ringo_trio._contract import limits

from ..storage.base import Storage, StorageError
from ..storage.rows import FINISHED

__all__ = ["TaskWaits", "WaitLimitReached", "Waiter"]

log = logging.getLogger("ringo_trio.server")

DEFAULT_RECHECK_INTERVAL: Final = 2.0
DEFAULT_LINGER: Final = 5.0
# The longest a call waits for its registration and the listener before it
# reads its task anyway (the recheck then covers another daemon's settle).
READY_TIMEOUT: Final = 2.0
# Seconds between re-sending a shared store every waited id: a registration
# older than the engine's staleness bound may be cleared by a daemon starting.
REFRESH: Final = 60.0
# Ids per recheck query: a bounded statement however many calls are parked.
_CHECK_CHUNK = 1000
# How long a daemon deleting succeeded tasks keeps an id waited on after its
# last call left: one park, the longest a client's next ask can queue behind
# its other waits for a slot of its connection (`limits.MAX_TASK_WAIT`).
REASK_WINDOW: Final = limits.MAX_TASK_WAIT.total_seconds()


class WaitLimitReached(Exception):
    """Parking one more call would pass a limit; nothing was parked."""


class _Entry:
    """The parked calls on one task id. Futures, not `asyncio.Event`s: an
    Event allocates its waiters' deque up front, and an entry is kept per
    waited id."""

    __slots__ = ("registered", "waiters", "wake")

    def __init__(self, registered: asyncio.Future[None] | None) -> None:
        # Resolved by the next wake-up; made when a call arms it.
        self.wake: asyncio.Future[None] | None = None
        self.waiters = 0
        # Shared store: resolved once it knows this daemon waits on the id.
        self.registered = registered


class Waiter:
    """One parked call (`TaskWaits.park`); leaving its ``with`` unparks it."""

    __slots__ = ("_connection", "_entry", "_owner", "_task_id")

    def __init__(self, owner: TaskWaits, entry: _Entry, task_id: str, connection: object) -> None:
        self._owner = owner
        self._entry = entry
        self._task_id = task_id
        self._connection = connection

    def __enter__(self) -> Waiter:
        return self

    def __exit__(self, *_exc: object) -> None:
        self._owner._unpark(self._entry, self._task_id, self._connection)

    def arm(self) -> asyncio.Future[None]:
        """What the next wake-up resolves. Call before reading the task."""
        wake = self._entry.wake
        if wake is None:
            wake = self._entry.wake = asyncio.get_running_loop().create_future()
        return wake

    @property
    def closed(self) -> bool:
        return self._owner.closed

    async def ready(self) -> None:
        """Until other daemons' settlements of this id reach this one (or
        `READY_TIMEOUT`): at once on a store no other daemon writes."""
        registered = self._entry.registered
        if registered is None or self._owner.closed:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(READY_TIMEOUT):
                # Shielded: the future is every waiter's of this id.
                await asyncio.shield(registered)
                await self._owner.listening.wait()

    async def wait(self, armed: asyncio.Future[None], seconds: float) -> None:
        """Until `armed` is resolved or `seconds` pass."""
        if armed.done() or seconds <= 0:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                # Shielded: a timeout must not cancel the other waiters' future.
                await asyncio.shield(armed)


class TaskWaits:
    """The daemon's parked WaitTask calls by task id (see the module docstring)."""

    def __init__(
        self,
        storage: Storage,
        *,
        max_waits: int = limits.DEFAULT_MAX_WAITS,
        per_connection: int = limits.MAX_WAITS_PER_CONNECTION,
        recheck_interval: float = DEFAULT_RECHECK_INTERVAL,
        linger: float = DEFAULT_LINGER,
        reask_window: float = 0.0,
    ) -> None:
        if max_waits < 0 or per_connection < 0 or reask_window < 0:
            raise ValueError("wait limits and the re-ask window must not be negative")
        if not recheck_interval > 0:
            raise ValueError("recheck_interval must be positive")
        self._storage = storage
        self.max_waits = max_waits
        self.per_connection = per_connection
        self._recheck_interval = recheck_interval
        self._linger = linger
        self._reask_window = reask_window
        self.shared = storage.waits_across_processes
        self._by_id: dict[str, _Entry] = {}
        # Ids whose last call left, and when (loop time), oldest first, kept
        # `reask_window` seconds: still waited on, their registration kept.
        self._ended: dict[str, float] = {}
        self._by_connection: dict[object, int] = {}
        self.parked = 0
        self.closed = False
        # Set while `run`'s listener hears other daemons' settlements.
        self.listening = asyncio.Event()
        self._busy = asyncio.Event()
        self._kick = asyncio.Event()
        self._recheck_due = False
        # Shared store: ids whose registration is still to be sent / withdrawn.
        self._to_register: set[str] = set()
        self._to_withdraw: set[str] = set()

    # -- parked calls --------------------------------------------------------

    def park(self, task_id: str, connection: object) -> Waiter:
        """A parked call on `task_id` from `connection`, for a ``with``
        block entered at once; `WaitLimitReached` (nothing parked) when a
        limit is reached."""
        if self.parked >= self.max_waits:
            raise WaitLimitReached(
                f"this daemon holds {self.parked} waiting calls, its limit"
                " (ringod --max-waits); retry later"
            )
        on_connection = self._by_connection.get(connection, 0)
        if on_connection >= self.per_connection:
            raise WaitLimitReached(
                f"this connection holds {on_connection} waiting calls, the limit per"
                " connection; retry later or open another connection"
            )
        entry = self._by_id.get(task_id)
        if entry is None:
            self._ended.pop(task_id, None)
            registered = asyncio.get_running_loop().create_future() if self.shared else None
            entry = self._by_id[task_id] = _Entry(registered)
            if self.shared:
                self._to_register.add(task_id)
                self._to_withdraw.discard(task_id)
        entry.waiters += 1
        self._by_connection[connection] = on_connection + 1
        self.parked += 1
        self._busy.set()
        self._kick.set()
        return Waiter(self, entry, task_id, connection)

    def _unpark(self, entry: _Entry, task_id: str, connection: object) -> None:
        self.parked -= 1
        left = self._by_connection[connection] - 1
        if left:
            self._by_connection[connection] = left
        else:
            del self._by_connection[connection]
        entry.waiters -= 1
        if entry.waiters == 0:
            del self._by_id[task_id]
            if self._reask_window > 0:
                # Kept waited on (and registered) until its window passes.
                self._ended[task_id] = asyncio.get_running_loop().time()
                if len(self._ended) > self.max_waits:
                    self._forget(next(iter(self._ended)))
            elif self.shared:
                self._unregister(task_id)
            else:
                return
            self._kick.set()

    def _forget(self, task_id: str) -> None:
        """An ended id's window passed (or it made room): no longer waited on."""
        del self._ended[task_id]
        if self.shared:
            self._unregister(task_id)

    def _unregister(self, task_id: str) -> None:
        """Nobody waits on `task_id` any more: its registration is withdrawn,
        or never sent if it has not gone out yet."""
        if task_id in self._to_register:
            self._to_register.discard(task_id)
        else:
            self._to_withdraw.add(task_id)

    def __contains__(self, task_id: object) -> bool:
        """A parked call waits on `task_id`, or one did less than
        `reask_window` seconds ago (`Storage.waited`)."""
        return task_id in self._by_id or task_id in self._ended

    def connections(self) -> int:
        """Connections holding at least one parked call."""
        return len(self._by_connection)

    def waited_ids(self) -> int:
        return len(self._by_id)

    # -- wake-ups ------------------------------------------------------------

    def settled(self, task_ids: Iterable[str]) -> None:
        """These tasks changed state (settled, cancelled): wake their waiters."""
        if not self._by_id:
            return
        for task_id in task_ids:
            entry = self._by_id.get(task_id)
            if entry is not None:
                _fire(entry)

    def recheck(self) -> None:
        """Tasks changed that no hook names (expired leases, deletions):
        check every waited id now, in one query."""
        if self._by_id:
            self._recheck_due = True
            self._kick.set()

    def close(self) -> None:
        """Shutdown: wake every parked call; each sees `closed` and answers
        the task as it stands."""
        self.closed = True
        # Calls still getting ready read their task now, without waiting for
        # a registration or a listener shutdown may never bring.
        self.listening.set()
        for entry in list(self._by_id.values()):
            if entry.registered is not None and not entry.registered.done():
                entry.registered.set_result(None)
            _fire(entry)

    # -- background ----------------------------------------------------------

    async def run(self) -> None:
        """Recheck, register and listen while calls are parked; run once, in
        a TaskGroup the daemon owns, until cancelled."""
        while True:
            await self._busy.wait()
            async with asyncio.TaskGroup() as tasks:
                listener = tasks.create_task(self._listen(), name="ringod wait listener")
                try:
                    await self._serve()
                finally:
                    listener.cancel()
                    self.listening.clear()

    async def _listen(self) -> None:
        try:
            await self._storage.watch_settled(self._heard, self.listening.set)
        except Exception:
            log.exception("listening for other daemons' settlements failed; relying on rechecks")
        if not self.shared:
            self.listening.set()

    def _heard(self, task_id: str | None) -> None:
        # None: the listener (re)connected; anything may have settled meanwhile.
        if task_id is None:
            self.recheck()
        else:
            self.settled((task_id,))

    async def _serve(self) -> None:
        """Until nobody has been parked for `linger` seconds."""
        loop = asyncio.get_running_loop()
        next_check = loop.time() + self._recheck_interval
        next_refresh = loop.time() + REFRESH
        idle_since: float | None = None
        while True:
            self._kick.clear()
            ended_until = self._forget_ended(loop.time())
            if self.shared:
                if loop.time() >= next_refresh:
                    next_refresh = loop.time() + REFRESH
                    self._to_register.update(self._by_id)
                await self._sync_registrations()
            now = loop.time()
            if self._by_id and (self._recheck_due or now >= next_check):
                self._recheck_due = False
                await self._check_all()
                next_check = loop.time() + self._recheck_interval
            if self._by_id or self._ended:
                idle_since = None
                wake_at = min(next_check, ended_until) if self._by_id else ended_until
            else:
                if idle_since is None:
                    idle_since = now
                if now - idle_since >= self._linger and not self._to_withdraw:
                    self._busy.clear()
                    return
                wake_at = idle_since + self._linger
            if self._kick.is_set():
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(wake_at - loop.time(), 0.0)):
                    await self._kick.wait()

    def _forget_ended(self, now: float) -> float:
        """Forget the ended ids whose window has passed; when the next one's
        passes (infinity: none left)."""
        while self._ended:
            task_id, ended_at = next(iter(self._ended.items()))
            if ended_at + self._reask_window > now:
                return ended_at + self._reask_window
            self._forget(task_id)
        return math.inf

    async def _sync_registrations(self) -> None:
        add, self._to_register = self._to_register, set()
        gone, self._to_withdraw = self._to_withdraw, set()
        if not add and not gone:
            return
        try:
            await self._storage.register_waits(add=sorted(add), remove=sorted(gone))
        except (StorageError, OSError) as exc:
            log.warning("registering waited tasks failed (%s); relying on rechecks", exc)
            # Not retried in a loop: the recheck covers these ids, and a
            # stale registration costs only a notification nobody hears.
        for task_id in add:
            entry = self._by_id.get(task_id)
            registered = None if entry is None else entry.registered
            if registered is not None and not registered.done():
                registered.set_result(None)

    async def _check_all(self) -> None:
        ids = list(self._by_id)
        for start in range(0, len(ids), _CHECK_CHUNK):
            chunk = ids[start : start + _CHECK_CHUNK]
            try:
                states = await self._storage.task_states(chunk)
            except Exception as exc:
                log.warning("rechecking waited tasks failed (%s); trying again later", exc)
                return
            self.settled(
                task_id for task_id in chunk if task_id not in states or states[task_id] in FINISHED
            )


def _fire(entry: _Entry) -> None:
    wake, entry.wake = entry.wake, None
    if wake is not None and not wake.done():
        wake.set_result(None)

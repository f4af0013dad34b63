"""`TaskWaits` on its own (the daemon's parked WaitTask calls), against a
store that records what it is asked, on virtual time.

test_wait.py holds WaitTask end to end through a daemon; this file holds the
bookkeeping under it, whose slips the end-to-end tests cannot see because a
later recheck or `READY_TIMEOUT` covers them: which calls a wake-up reaches,
what a parked call costs in queries, when a shared store hears of a wait and
of its end, and when the listener for other daemons' settlements closes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any, cast

import pytest

from ringo_trio._proto.ringo.v1 import TaskState
from ringo_trio.server.rpc import waits as w
from ringo_trio.server.storage.base import Storage
from tests._kit.virtual_daemon import in_background, now, on_virtual_time, quiet

PENDING, SUCCEEDED = int(TaskState.PENDING), int(TaskState.SUCCEEDED)


class _Store:
    """What `TaskWaits` asks of a store, recorded with the virtual time of
    each call. Shared (PostgreSQL-like): registrations and a listener that
    stays up until cancelled; otherwise the base class's defaults."""

    def __init__(self, *, shared: bool, register_takes: float = 0.0) -> None:
        self.waits_across_processes = shared
        self.states: dict[str, int] = {}
        self.checks: list[tuple[float, list[str]]] = []
        self.registrations: list[tuple[float, list[str], list[str]]] = []
        self.register_takes = register_takes
        # Cleared: registrations wait for it (a registration in flight).
        self.gate = asyncio.Event()
        self.gate.set()
        self.listened: list[list[float | None]] = []  # [opened, closed]
        self.tell: Any = None

    async def task_states(self, task_ids: Sequence[str]) -> dict[str, int]:
        self.checks.append((now(), list(task_ids)))
        return {i: self.states[i] for i in task_ids if i in self.states}

    async def register_waits(self, *, add: Sequence[str], remove: Sequence[str]) -> None:
        self.registrations.append((now(), list(add), list(remove)))
        await asyncio.sleep(self.register_takes)
        await self.gate.wait()

    async def watch_settled(self, notify: Any, ready: Any) -> None:
        if not self.waits_across_processes:
            ready()
            return
        span: list[float | None] = [now(), None]
        self.listened.append(span)
        self.tell = notify
        try:
            ready()
            notify(None)
            await asyncio.Event().wait()
        finally:
            span[1] = now()

    def added(self, task_id: str) -> list[float]:
        return [at for at, add, _ in self.registrations if task_id in add]

    def removed(self, task_id: str) -> list[float]:
        return [at for at, _, remove in self.registrations if task_id in remove]


def _waits(store: _Store, **kw: Any) -> w.TaskWaits:
    return w.TaskWaits(cast(Storage, store), **kw)


def test_limits_and_the_recheck_interval_are_checked_when_made() -> None:
    """Property: a negative wait limit or a recheck interval that is not
    positive is refused at construction (a daemon that would refuse every
    WaitTask, or recheck in a busy loop); a limit of 0 (WaitTask switched
    off) and a short interval are accepted."""
    store = _Store(shared=False)
    for bad in ({"max_waits": -1}, {"per_connection": -1}, {"recheck_interval": 0.0}):
        with pytest.raises(ValueError, match=r"negative|positive"):
            _waits(store, **bad)
    for good in ({"max_waits": 0}, {"per_connection": 0}, {"recheck_interval": 0.5}):
        _waits(store, **good)


@on_virtual_time
async def test_every_call_on_a_task_is_woken_and_the_last_to_leave_forgets_it() -> None:
    """Property: every call parked on a task is woken by its settlement,
    whichever of them left before it; a settlement heard twice before
    anyone re-arms (an ack and a recheck) is harmless; once the last call
    leaves, nothing of the task or its connections is kept (no slot
    leaked)."""
    waits = _waits(_Store(shared=False))
    with waits.park("t", "conn-a") as first:
        with waits.park("t", "conn-b") as second:
            armed = second.arm()
        assert first.arm() is armed  # one future per waited task
        waits.settled(["t"])
        waits.settled(["t"])
        assert armed.done()
        assert waits.waited_ids() == 1
        assert waits.parked == 1
    assert (waits.waited_ids(), waits.connections(), waits.parked) == (0, 0, 0)


@on_virtual_time
async def test_rechecks_come_every_interval_and_wake_the_finished_and_the_gone() -> None:
    """Property: parked calls cost one query per `recheck_interval`, however
    many are parked and whenever they came (parking does not query), plus
    one at once when asked (`recheck`: an expiry, a purge); a recheck wakes
    the calls whose task finished or is gone, and no other."""
    store = _Store(shared=False)
    store.states = {"running": PENDING, "done": SUCCEEDED}
    waits = _waits(store, recheck_interval=2.0)
    async with in_background(waits.run()):
        start = now()
        with (
            waits.park("running", "c") as running,
            waits.park("done", "c") as done,
            waits.park("gone", "c") as gone,
        ):
            armed = {"running": running.arm(), "done": done.arm(), "gone": gone.arm()}
            await quiet(1.5)
            assert store.checks == []
            await quiet(1.0)  # 2.5 s: one recheck, at 2 s
            with waits.park("later", "c"):
                await quiet(1.0)  # 3.5 s
                waits.recheck()
                await quiet(0.0)
            assert [(at - start, sorted(ids)) for at, ids in store.checks] == [
                (2.0, ["done", "gone", "running"]),
                (3.5, ["done", "gone", "later", "running"]),
            ]
            assert {k: f.done() for k, f in armed.items()} == {
                "running": False,
                "done": True,
                "gone": True,
            }


@on_virtual_time
async def test_a_recheck_asks_for_at_most_a_thousand_tasks_at_a_time() -> None:
    """Property: a recheck's statement stays bounded however many calls are
    parked (1,000 ids per query), and every waited id is asked for."""
    store = _Store(shared=False)
    waits = _waits(store, max_waits=3000, per_connection=3000)
    with contextlib.ExitStack() as parked:
        for i in range(2500):
            parked.enter_context(waits.park(f"t{i}", "c"))
        async with in_background(waits.run()):
            waits.recheck()
            await quiet(0.0)
    assert [len(ids) for _, ids in store.checks] == [1000, 1000, 500]
    assert {i for _, ids in store.checks for i in ids} == {f"t{i}" for i in range(2500)}


@on_virtual_time
async def test_a_shared_store_hears_of_a_wait_before_the_call_reads_its_task() -> None:
    """Property (PostgreSQL, several daemons): a parked call reads its task
    only once the store knows this daemon waits on it and the listener is
    up, so another daemon's settlement after the read is heard -- and it
    reads at that moment, not `READY_TIMEOUT` later."""
    store = _Store(shared=True, register_takes=0.5)
    waits = _waits(store)
    async with in_background(waits.run()):
        start = now()
        with waits.park("t", "c") as waiter:
            await waiter.ready()
            assert now() - start == 0.5
            assert store.added("t") == [start]


@on_virtual_time
async def test_a_wait_that_ends_before_its_registration_goes_out_is_never_sent() -> None:
    """Property: a call that leaves before its registration was sent costs
    the shared store nothing: neither the registration nor its withdrawal."""
    store = _Store(shared=True)
    waits = _waits(store)
    async with in_background(waits.run()):
        with waits.park("t", "c"):
            pass
        await quiet()
    assert store.registrations == []


@on_virtual_time
async def test_a_wait_that_ends_while_its_registration_is_in_flight_is_withdrawn() -> None:
    """Property: a call that leaves while its registration is being sent
    gets it withdrawn once that is done (no registration left behind for
    this daemon), and the waits keep serving."""
    store = _Store(shared=True)
    waits = _waits(store, linger=5.0)
    async with in_background(waits.run()):
        store.gate.clear()
        with waits.park("t", "c"):
            await quiet(0.0)
            assert len(store.registrations) == 1
        store.gate.set()
        await quiet()
        assert store.added("t")
        assert store.removed("t")
        with waits.park("u", "c") as waiter:
            await waiter.ready()
        assert store.added("u")


@on_virtual_time
async def test_a_notification_wakes_its_task_at_once_and_a_reconnect_rechecks_all() -> None:
    """Property: another daemon's settlement of a waited task wakes its calls
    at once, without a query; the listener's (re)connect, after which
    anything may have changed unheard, rechecks every waited task at once."""
    store = _Store(shared=True)
    store.states = {"t": PENDING, "u": PENDING}
    waits = _waits(store)
    async with in_background(waits.run()):
        with waits.park("t", "c") as t, waits.park("u", "c") as u:
            await t.ready()
            await u.ready()
            await quiet(0.0)
            checks = len(store.checks)
            armed_t, armed_u = t.arm(), u.arm()
            store.tell("t")
            await quiet(0.0)
            assert armed_t.done()
            assert not armed_u.done()
            assert len(store.checks) == checks
            at = now()
            store.tell(None)
            await quiet(0.0)
            assert store.checks[checks:] == [(at, ["t", "u"])]


@pytest.mark.parametrize("window", [0.0, 60.0])
@on_virtual_time
async def test_the_listener_closes_linger_seconds_after_the_last_wait_ends(window: float) -> None:
    """Property: the connection that hears other daemons' settlements is
    held while calls are parked and for `linger` seconds after the last one
    left (a daemon nobody waits on holds no extra connection), and the last
    withdrawal is sent when that call leaves -- on a daemon deleting
    succeeded tasks, `reask_window` seconds later, both: another daemon's
    deleting ack keeps the task through the gap between a client's calls."""
    store = _Store(shared=True)
    waits = _waits(store, linger=5.0, reask_window=window)
    async with in_background(waits.run()):
        start = now()
        with waits.park("t", "c") as waiter:
            await waiter.ready()
            await quiet(10.0)
        await quiet(window + 4.0)
        assert store.listened == [[start, None]]
        assert store.removed("t") == [start + 10.0 + window]
        await quiet(2.0)
        assert store.listened == [[start, start + 15.0 + window]]
        assert store.added("t") == [start]


@on_virtual_time
async def test_a_long_wait_is_registered_again_every_refresh() -> None:
    """Property: a shared store hears a long wait again every `REFRESH`
    seconds -- a registration that old may be cleared as a vanished daemon's
    by a daemon starting -- and not more often."""
    store = _Store(shared=True)
    waits = _waits(store)
    async with in_background(waits.run()):
        start = now()
        with waits.park("t", "c"):
            await quiet(w.REFRESH * 2.5)
        assert [at - start for at in store.added("t")] == [0.0, w.REFRESH, w.REFRESH * 2]


@on_virtual_time
async def test_shutdown_lets_a_call_waiting_for_its_registration_read_at_once() -> None:
    """Property: at shutdown every parked call answers at once, also one
    still waiting for its registration (which a stopping daemon may never
    send), not `READY_TIMEOUT` later."""
    store = _Store(shared=True)
    waits = _waits(store)
    async with in_background(waits.run()):
        store.gate.clear()
        with waits.park("t", "c") as waiter:
            getting_ready = asyncio.create_task(waiter.ready())
            await quiet(0.5)
            start = now()
            waits.close()
            await getting_ready
            assert now() == start
            assert waiter.closed
        store.gate.set()


@on_virtual_time
async def test_an_id_stays_waited_on_for_the_reask_window_after_its_last_call() -> None:
    """Property (``--retain-succeeded never``): a task whose last call left
    is still waited on -- its ack keeps it -- for `reask_window` seconds
    from when the last call left, a call parked again meanwhile restarting
    the window; then it is forgotten. Without a window (a daemon that keeps
    succeeded tasks), it is forgotten as the call leaves."""
    waits = _waits(_Store(shared=False), reask_window=60.0)
    async with in_background(waits.run()):
        with waits.park("t", "c"):
            pass
        await quiet(30.0)
        assert "t" in waits
        with waits.park("t", "c"):
            await quiet(10.0)
        assert waits.parked == 0
        await quiet(59.0)
        assert "t" in waits
        await quiet(2.0)
        assert "t" not in waits
    plain = _waits(_Store(shared=False))
    with plain.park("t", "c"):
        assert "t" in plain
    assert "t" not in plain


@on_virtual_time
async def test_ended_waits_are_kept_for_at_most_max_waits_ids_oldest_forgotten_first() -> None:
    """Property: the ids kept after their calls left are bounded by
    `max_waits` (a client churning short waits cannot grow the daemon's
    memory); past it the oldest is forgotten at once and, on a shared store,
    withdrawn."""
    store = _Store(shared=True)
    # A window under a second is a window too.
    waits = _waits(store, reask_window=0.5, max_waits=2)
    async with in_background(waits.run()):
        for task_id in ("a", "b", "c"):
            with waits.park(task_id, "c") as waiter:
                await waiter.ready()
            await quiet(0.1)
        assert ["a" in waits, "b" in waits, "c" in waits] == [False, True, True]
        assert store.removed("a")
        assert not store.removed("b")

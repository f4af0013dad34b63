"""Worker: the handlers' side of the Work protocol — its life, its streams, its stop.

Theory of operation
-------------------
All protocol decisions live in `ringo_trio._contract.work.client.WorkSession`; one
stream's frames are moved by `ringo_trio._work._driver.StreamDriver`; one
handler is run and settled by `ringo_trio._work._handlers.Handlers`; this
module opens the streams and decides when to stop. The shape is the one DESIGN.md
§2 asks for — scopes instead of epochs and done-callbacks:

*Stopping is a protocol step.* ``Worker.run`` does its work in a child task
(`_work`) under a **shielded** cancel scope, and itself only waits. Whatever
interrupts that wait — the caller's cancellation, ``task.cancel()``, a
KeyboardInterrupt or SystemExit delivered to it — becomes `_stop_now`: a
drain goes out first (no more pushes), every handler is cancelled and its
``finally`` *releases* its lease (no attempt spent), and the shield's
deadline is pulled in to ``stop_timeout`` from now, so the stop is bounded
however the daemon behaves. ``run`` then re-raises what stopped it, bare.
A KeyboardInterrupt that trio delivers inside a handler or one of our tasks
is caught where it lands (`Handlers.handle`, `_work`), stops the worker the same way
and comes out of ``run`` unwrapped: the SDK adds no exception group.

Inside `_work`, two task groups live as long as the worker:

* the **run group**, holding the on_idle monitor (`ringo_trio._work._idle`),
  the fencing watch and a shared controller's driver (when configured), and
* the **handler group** inside it, holding every handler: one task per
  delivered task, under its own cancel scope, stored by lease key, so
  a lost lease cancels exactly that handler. Under trio the group is trio's
  own nursery and the scope trio's own (`Backend`): anyio's task group
  wraps every child in a task handle, measured at ~8 % of a no-op task's
  worker CPU, and anyio's cancel scope wraps trio's (~4 µs a handler),
  which a handler (it catches all but its cancellation) does not need. Long-lived
  runner tasks per slot were measured twice: a channel hand-off costs about
  what the nursery's spawn does (~3 µs less per task in isolation), and
  with trio's own cancel scope per call instead of anyio's they saved 2 % of
  a no-op task's worker CPU (issue 15, `bench/run.py --baseline HEAD
  --only noop,sleep`, worker CPU ratios 0.98, 0.97, 0.98 in three runs), under the 3 % that
  would pay for a second way to run handlers; so a task per handler stays.

Inside them, the worker opens one **Work session** after another. A session
is one ``open_stream`` block plus one task group holding the driver's timer
and the closer; the driver's reader is the block's body. When a session ends
— stream dropped, protocol broken, daemon restarted — leaving its block
cancels its tasks and `WorkSession.end` turns every lease it held into a
handler cancellation, so nothing of the old session can act on the next one:
a late result has no session to land in, and a handler's settlement is
addressed to the session object it started under (which refuses it once
ended). A replacement session is a new block. No epoch counter exists.

*Slots and zombies.* A handler that swallows cancellation keeps running after
its session ended; it does not block reconnecting, but it keeps its slot: the
next session is told how many such handlers run (its *outside slots*) and
never grants their slots — whatever the daemon echoes at registration —
until each exits (`Handlers.orphan`, `_orphan_exited`). The session owns that arithmetic; the
worker only counts its orphans and reports their exits to the newest
session, from its creation on (`_current`), so that one exiting while the
stream registers is not missed.

*Shared controllers* (``concurrency=AdaptiveConcurrency(...)`` or
``ResourceConcurrency(...)``; `ringo_trio._work._concurrency`). The worker
is attached to the controller's permit pool for its whole life and detached
once the handler group has exited (its `Membership`). `_rebalance` — after every session event
(`StreamDriver.act` calls `_after_act`), before a finished handler's
settlement (so a congestion cut applies before the settlement asks for
credit), and in a task of each session that waits on the pool's broadcast
event — reports what the session has committed (its exact credit mirror)
plus the handlers of ended streams, takes or returns permits, and sizes the
session to them.

*Closing* (`Worker.close`, from any task, any number of times) asks the
worker to stop and waits until it has: stop credit and send ``drain``; wait
up to ``grace_period`` for handlers (they settle on the still-open stream);
cancel the rest (they release their leases: PENDING at once, attempt not
spent); wait up to ``stop_timeout`` for the daemon's answers; end the
session, then the stream. When ``close`` returns, no handler of the worker
runs and no lease is renewed. A push that arrives after the stop began is
handed back unrun.

*Handlers, their results and their settlement*: `ringo_trio._work._handlers`.
*Timeouts and fencing*: `ringo_trio._work._fencing`, a `Fencing` the worker owns.

*Reconnects are bounded*: a session that fails before registering counts as a
failed recovery; three in a row end ``run`` with the last cause. A session
that registered resets the count. Between attempts the client's own recovery
runs (renegotiation; restart of a dead local daemon).
"""

from __future__ import annotations

import math
import os
import secrets
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from .._contract import limits as _limits
from .._contract.versions import Feature, Features
from .._contract.work.client import (
    GRANT_CAP,
    PREFETCH_GRANT_CAP,
    FeatureMissing,
    LeaseKey,
    RemoteProtocolError,
    SessionBroken,
    State,
    VersionMismatch,
    WorkSession,
)
from .._errors import (
    IncompatibleVersionError,
    InvalidArgumentError,
    RingoError,
    UnavailableError,
    WorkerAlreadyRunError,
    require,
)
from .._interrupts import abandon_on_interrupt, forget, protected
from .._models import Task
from .._proto.ringo.v1 import GetQueueActivityRequest, WorkerRegistration, WorkRequest
from .._transport.base import SessionRejectedError
from .._wire.codec import encode
from ._concurrency import AdaptiveConcurrency, ResourceConcurrency, attach
from ._driver import Frame, Inbound, StreamDriver, batch_frames
from ._fencing import Fencing
from ._handlers import Handler, Handlers, Running, Slots, TaskContext, handler_group
from ._idle import IdleMonitor
from ._permits import balance
from ._timeouts import TaskTimeouts

# Where this worker runs, as the daemon's workers page shows it (minor >= 14).
_HOST = socket.gethostname()[: _limits.MAX_NAME_BYTES]

if TYPE_CHECKING:
    from .._connection import Connection, NegotiatedSession

__all__ = [
    "DEFAULT_STOP_TIMEOUT",
    "Worker",
    "check_concurrency",
    "new_worker_id",
]

_MAX_RECOVERY_FAILURES = 3
_COMMAND_TIMEOUT = 30.0
#: Once a worker stops handlers (past the grace period, or at once when
#: cancelled): how long it waits for them to exit and for the daemon to answer
#: their releases before it ends the stream and abandons the rest to expiry.
DEFAULT_STOP_TIMEOUT = timedelta(seconds=5)
_MAX_CONCURRENCY = 2**31 - 1


def _interrupt_text(exc: BaseException) -> str:
    if isinstance(exc, KeyboardInterrupt):
        return "the worker was interrupted (KeyboardInterrupt)"
    if isinstance(exc, SystemExit):
        return "the worker's process is exiting (SystemExit)"
    return "the worker was cancelled"


def _find_interrupt(exc: BaseException) -> BaseException | None:
    """The KeyboardInterrupt or SystemExit in ``exc``, however deeply our own
    task groups nested it."""
    if isinstance(exc, KeyboardInterrupt | SystemExit):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _find_interrupt(inner)
            if found is not None:
                return found
    return None


def new_worker_id() -> str:
    return f"py-{os.getpid()}-{secrets.token_hex(4)}"


def check_concurrency(value: object, *, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError("concurrency must be an integer")
    if not low <= value <= _MAX_CONCURRENCY:
        raise InvalidArgumentError(f"concurrency must be between {low} and 2**31-1")
    return value


class Worker:
    """A credit-controlled worker of one queue. Create it with `TaskQueue.worker`.

    ::

        worker = client.queue("emails").worker(handle, concurrency=64)
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)   # returns once registered
            ...
            await worker.close()              # drain: stop credit, wait grace, cancel the rest
    """

    def __init__(
        self,
        connection: Connection,
        queue_name: str,
        handler: Handler,
        *,
        task_types: Iterable[str],
        concurrency: int | AdaptiveConcurrency | ResourceConcurrency,
        weight: int,
        lease_duration: timedelta,
        grace_period: timedelta,
        on_idle: Callable[[], Any] | None,
        idle_counts_scheduled: bool = True,
        task_timeouts: TaskTimeouts | None = None,
        stop_timeout: timedelta = DEFAULT_STOP_TIMEOUT,
        prefetch: int = 0,
    ) -> None:
        self._connection = connection
        self._queue_name = queue_name
        self._handler = handler
        self._task_types = list(task_types)
        # With a shared controller the pool sizes the worker (`_rebalance`)
        # through its membership, held by its handlers while `run` runs.
        self._controller = None if isinstance(concurrency, int) else concurrency
        self._concurrency = concurrency if isinstance(concurrency, int) else 0
        # Leases held beyond `concurrency`, waiting for a slot (`Handlers.start`).
        self._prefetch = prefetch
        self._weight = weight
        self._lease_duration = lease_duration
        self._grace = grace_period.total_seconds()
        self._stop_timeout = stop_timeout.total_seconds()
        self._on_idle = on_idle
        self._idle_counts_scheduled = idle_counts_scheduled
        self._idle = IdleMonitor(
            connection,
            GetQueueActivityRequest(
                queue=queue_name, task_types=self._task_types, due_only=not idle_counts_scheduled
            ),
            on_idle or _no_idle,
            busy=self._busy,
            failed=self._idle_failed,
        )
        self._worker_id = new_worker_id()
        self._dynamic = self._controller is not None
        self._run_started = False
        self._closing = False
        self._close_requested = anyio.Event()
        self._finished = anyio.Event()
        self._registered = False
        self._registered_or_done = anyio.Event()
        self._shield: anyio.CancelScope | None = None
        # A KeyboardInterrupt/SystemExit that landed in one of our tasks:
        # `run` re-raises it, bare, once everything is handed back.
        self._interrupt: BaseException | None = None
        self._live: StreamDriver | None = None
        # The newest session, from its creation (before its stream registers)
        # to its end: the one told when a handler of an ended stream exits.
        self._current: WorkSession | None = None
        self._fatal: BaseException | None = None
        self._fencing = (
            None
            if task_timeouts is None
            else Fencing(
                task_timeouts,
                describe=f"worker {self._worker_id} of queue {queue_name!r}",
                on_fence=self._fenced,
            )
        )
        self._handlers = Handlers(
            handler,
            queue_name=queue_name,
            worker_id=self._worker_id,
            close_requested=self._close_requested,
            fencing=self._fencing,
            interrupted=self._interrupted,
            rebalance=self._rebalance,
            orphan_exited=self._orphan_exited,
        )

    def __repr__(self) -> str:
        return f"<Worker {self._worker_id} queue={self._queue_name!r}>"

    # -- public ---------------------------------------------------------------

    @property
    def worker_id(self) -> str:
        return self._worker_id

    @property
    def concurrency(self) -> int:
        """How many handlers may run at once: the number given, or — with a
        shared controller — this worker's current share of the controller's
        capacity (0 while it does not run)."""
        if self._controller is not None:
            membership = self._handlers.membership
            return 0 if membership is None else membership.share
        return self._concurrency

    @property
    def weight(self) -> int:
        return self._weight

    @property
    def running(self) -> int:
        """Handlers running now (including ones of an ended stream that ignore
        cancellation, and with ``prefetch`` the tasks waiting for a slot)."""
        return self._handlers.count

    async def set_concurrency(self, concurrency: int) -> None:
        """Change how many handlers may run at once, without cancelling running ones.

        Needs protocol minor >= 2 once the worker runs (`IncompatibleVersionError`).
        Lowering it lets running handlers finish; no new task starts until the
        worker is below the new limit.
        """
        if self._controller is not None:
            raise InvalidArgumentError(
                "this worker's concurrency comes from a shared controller; it cannot be set"
            )
        concurrency = check_concurrency(concurrency, low=0)
        if self._run_started:
            require(
                self._connection.protocol_minor,
                Feature.TARGET_CONCURRENCY,
                "changing concurrency at runtime",
            )
        self._concurrency = concurrency
        self._dynamic = True
        self._handlers.resize(max(concurrency, 1))
        live = self._live
        if live is not None and live.session.state is State.ACTIVE:
            live.act(live.session.set_concurrency(self._credit_limit(), anyio.current_time()))

    @protected
    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Work until `close` is called or ``run`` is cancelled. With
        ``nursery.start`` it returns once registered.

        Cancelling ``run`` (an outer cancel scope, ``task.cancel()`` under
        asyncio, Ctrl-C) is a stop too: it stops taking work, cancels the
        handlers and hands every lease back (``release``: the task is
        PENDING again at once and keeps its attempt) before it returns —
        within ``stop_timeout``, after which whatever is left is abandoned
        to lease expiry. It then re-raises what stopped it, unwrapped:
        the cancellation, `KeyboardInterrupt` or `SystemExit`.

        Raises the last cause after three failed recoveries in a row, and
        `IncompatibleVersionError` before any work when the daemon's minor
        lacks a feature this worker needs. An exception raised by ``on_idle``
        propagates unchanged. `WorkerFencedError` when ``task_timeouts``
        fenced the worker — raised only once every handler has exited,
        however long a stuck one runs on (see docs/timeouts.md).
        `WorkerAlreadyRunError` (a `RuntimeError`) on a second call.
        """
        if self._run_started:
            raise WorkerAlreadyRunError("Worker.run() may be called only once")
        self._run_started = True
        stopped_by: BaseException | None = None
        try:
            # The work runs in a shielded task (`_work`), so that a
            # cancellation of the caller cannot cut the stream its leases go
            # back on; this task only waits, and turns whatever interrupts
            # the wait into a bounded stop.
            async with anyio.create_task_group() as host:
                host.start_soon(self._work)
                try:
                    await self._registered_or_done.wait()
                    if self._registered:
                        task_status.started()
                    await self._finished.wait()
                except BaseException as exc:  # the caller's cancellation, Ctrl-C, SystemExit
                    stopped_by = exc
                    self._stop_now(_interrupt_text(exc))
        finally:
            self._connection.workers.discard(self)
        stopped_by = stopped_by or self._interrupt
        if stopped_by is not None:
            # Bare, as trio and asyncio deliver it: no group of ours around it.
            raise stopped_by
        fence = None if self._fencing is None else self._fencing.fence
        if fence is not None:
            raise fence.error() from self._fatal
        if self._fatal is not None:
            raise self._fatal
        if not self._registered:
            task_status.started()  # closed before it ever registered

    @protected
    async def _work(self) -> None:
        """Everything ``run`` does, shielded from the caller's cancellation;
        `_stop_now` bounds it by ``stop_timeout`` instead."""
        try:
            with anyio.CancelScope(shield=True) as shield:
                self._shield = shield
                if self._close_requested.is_set():
                    return
                await self._work_until_stopped()
        except Exception as exc:
            # `run` raises it, bare (refusals before any work, or a bug of ours).
            self._fatal = self._fatal or exc
        except BaseException as exc:
            interrupt = _find_interrupt(exc)
            if interrupt is None:
                raise
            self._interrupt = self._interrupt or interrupt
        finally:
            if self._shield is not None:
                forget(self._shield)
            self._shield = None
            self._registered_or_done.set()
            self._finished.set()

    async def _work_until_stopped(self) -> None:
        try:
            self._new_session(self._connection.protocol_minor, 0)  # fail fast, before any work
            if self._controller is not None:
                self._handlers.membership = attach(self._controller, self._weight)
            async with anyio.create_task_group() as run_group:
                if self._handlers.membership is not None:
                    run_group.start_soon(self._handlers.membership.drive)
                if self._on_idle is not None:
                    run_group.start_soon(self._idle.run, run_group.cancel_scope)
                if self._fencing is not None:
                    run_group.start_soon(self._fencing.watch)
                async with handler_group() as backend:
                    self._handlers.backend = backend
                    if self._prefetch:
                        self._handlers.slots = Slots(max(self._concurrency, 1))
                    try:
                        await self._serve()
                    except (RingoError, RemoteProtocolError, SessionBroken) as exc:
                        self._fatal = exc
                    finally:
                        self._closing = True
                        self._handlers.cancel_all("the worker stopped")
                run_group.cancel_scope.cancel()
        finally:
            self._handlers.backend = None
            self._handlers.slots = None
            if self._handlers.membership is not None:
                # No handler is left (the handler group has exited): every
                # permit goes back and the other workers' shares grow.
                self._handlers.membership.detach()
                self._handlers.membership = None

    @protected
    def _stop_now(self, why: str) -> None:
        """Stop at once and hand every lease back, within ``stop_timeout``."""
        if self._handlers.stop_reason is not None:
            return
        self._handlers.stop_reason = why
        self._close_requested.set()
        self._handlers.hand_back_waiting()
        live = self._live
        if live is not None and live.session.state is State.ACTIVE:
            # The drain goes out before any handler's release, so the daemon
            # pushes nothing more; the handlers then settle in their `finally`.
            live.send_command(live.session.drain(anyio.current_time()))
        self._handlers.cancel_all(why)
        shield = self._shield
        if shield is not None:
            shield.deadline = min(shield.deadline, anyio.current_time() + self._stop_timeout)
            # A Ctrl-C now means "now": it abandons this bounded stop.
            abandon_on_interrupt(shield)

    def _interrupted(self, exc: BaseException) -> None:
        """A KeyboardInterrupt or SystemExit landed in a handler: `run`
        re-raises it once the stop it starts now is over."""
        self._interrupt = self._interrupt or exc
        self._stop_now(_interrupt_text(exc))

    def _fenced(self) -> None:
        """`Fencing` fenced the worker: it stops taking work at once."""
        live = self._live
        if live is not None and live.session.state is State.ACTIVE:
            # Draining stops the daemon's pushes and the session's credit; a
            # push already on its way is handed back by `Fencing.admit`.
            live.send_command(live.session.drain(anyio.current_time()))
        self._close_requested.set()
        self._handlers.hand_back_waiting()

    async def close(self) -> None:
        """Drain and stop: stop credit, wait ``grace_period``, cancel the rest.

        Idempotent and safe from any task; returns once `run` has finished
        (at once if it never started). The caller's own deadline wins:
        cancelling the caller ends the wait, not the drain, which `run`
        carries on (bounded by the grace period and ``stop_timeout``).
        """
        self.request_close()
        if self._run_started:
            await self._finished.wait()

    @protected
    async def stop(self, *, reason: str = "the worker was stopped") -> None:
        """Stop at once: no grace period — handlers are cancelled and their
        leases released (no attempt spent), ``reason`` the error text they
        go back with. Returns once `run` has finished, or ``stop_timeout``
        after the stop began, whichever comes first (a handler that ignores
        cancellation keeps `run` going, not this call). Idempotent; at once
        if `run` never started or has finished. What `close` turns into
        when its caller runs out of time."""
        if not self._run_started:
            self.request_close()
            return
        self._stop_now(reason)
        with anyio.move_on_after(self._stop_timeout):
            await self._finished.wait()

    def request_close(self) -> None:
        """Start `close` without waiting for it: the drain begins now and
        `run` carries it on. Several workers' drains started this way run
        their grace periods together (`RingoClient.aclose` does); `close`
        then waits for each. Idempotent."""
        self._close_requested.set()
        self._handlers.hand_back_waiting()

    # -- sessions ---------------------------------------------------------------

    def _credit_limit(self) -> int:
        """The leases the session may hold: ``concurrency`` running, plus
        ``prefetch`` waiting for a slot (none while concurrency is 0: a
        paused worker takes no work)."""
        return self._concurrency + self._prefetch if self._concurrency else 0

    def _new_session(self, minor: int, concurrency: int, outside: int = 0) -> WorkSession:
        """A Work session for ``minor``, or `IncompatibleVersionError` when the
        minor lacks a feature this worker needs (the session knows which)."""
        if self._on_idle is not None:
            require(minor, Feature.ACTIVITY, "on_idle")
            if not self._idle_counts_scheduled:
                require(minor, Feature.DUE_ONLY_ACTIVITY, "idle_counts_scheduled=False")
        try:
            return WorkSession(
                concurrency=concurrency,
                minor=minor,
                dynamic_target=self._dynamic,
                command_timeout=_COMMAND_TIMEOUT,
                outside=outside,
                grant_cap=PREFETCH_GRANT_CAP if self._prefetch else GRANT_CAP,
            )
        except FeatureMissing as exc:
            raise IncompatibleVersionError(str(exc)) from None

    async def _serve(self) -> None:
        failures = 0
        registered = False

        def on_registered() -> None:
            nonlocal failures, registered
            registered = True
            failures = 0
            if not self._registered:
                self._registered = True
                self._registered_or_done.set()

        while not self._close_requested.is_set():
            sent = self._connection.session
            registered = False
            try:
                await self._session(sent, on_registered)
            except SessionRejectedError as exc:
                cause: BaseException = exc
                await self._connection.recover(sent, session_rejected=True)
            except IncompatibleVersionError:
                raise
            except (RingoError, RemoteProtocolError, SessionBroken) as exc:
                cause = exc
                if not self._close_requested.is_set():
                    await self._connection.recover(sent, session_rejected=False)
            else:
                return  # closed gracefully
            if self._close_requested.is_set():
                return
            if not registered:
                failures += 1
                if failures >= _MAX_RECOVERY_FAILURES:
                    raise cause

    async def _session(self, sent: NegotiatedSession, on_registered: Callable[[], None]) -> None:
        """One Work stream, from registration to its end."""
        session = self._new_session(
            sent.minor, self._credit_limit(), outside=len(self._handlers.orphans)
        )
        self._current = session
        try:
            await self._run_session(sent, session, on_registered)
        finally:
            self._current = None

    async def _run_session(
        self, sent: NegotiatedSession, session: WorkSession, on_registered: Callable[[], None]
    ) -> None:
        register = session.register()
        registration = WorkerRegistration(
            context=sent.context,
            queue=self._queue_name,
            worker_id=self._worker_id,
            task_types=self._task_types,
            max_concurrency=register.max_concurrency,
            ordered_request_ids=register.ordered_request_ids,
        )
        if Features(sent.minor).has(Feature.WORKER_HOST):
            registration.host = _HOST
            registration.pid = os.getpid()
        if self._lease_duration > timedelta(0):
            registration.lease_duration = self._lease_duration
        async with self._connection.open_stream(
            "Work",
            Frame,
            Inbound,
            send_buffer=math.inf,
            receive_buffer=256,
            coalesce=batch_frames if Features(sent.minor).has(Feature.BATCH_FRAMES) else None,
        ) as channels:
            assert channels.send is not None
            handlers = self._handlers
            owner = _StreamOwner(
                self._start_handler,
                handlers.cancel,
                handlers.task_cancelled,
                self._quiet,
                self._after_act,
            )
            live = StreamDriver(session, channels.send, owner)
            # Not bytes(): betterproto2's imports pydantic.dataclasses on first
            # use, ~30 ms of every worker's start (tests/work/test_startup.py).
            channels.send.send_nowait(Frame(encode(WorkRequest(register=registration)), alone=True))
            first = await live.first_response(channels.receive)
            granted = first.registered
            if granted is None:
                raise RemoteProtocolError("the daemon's first Work frame was not 'registered'")
            lease = granted.lease_duration or _limits.DEFAULT_LEASE
            self._live = live
            try:
                # A controller-attached worker takes its permits now, so the
                # first credit (sent on `registered`) is sized by them.
                self._rebalance()
                try:
                    outputs = session.registered(
                        lease_duration=lease.total_seconds(),
                        max_concurrency=granted.max_concurrency,
                        ordered_request_ids=granted.ordered_request_ids,
                        now=anyio.current_time(),
                    )
                except VersionMismatch as exc:
                    raise IncompatibleVersionError(str(exc)) from None
                live.act(outputs)
                self._idle.armed = True
                self._idle.since = None
                on_registered()
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(live.timer_loop)
                    tasks.start_soon(self._closer, live, tasks.cancel_scope)
                    if self._controller is not None:
                        tasks.start_soon(self._follow_controller)
                    await live.read(channels.receive)
                    tasks.cancel_scope.cancel()
                if not live.settled.is_set():
                    raise UnavailableError("the daemon ended the Work stream")
            finally:
                self._idle.armed = False
                self._live = None
                if session.state is not State.ENDED:
                    # Every lease of this session is lost to its handlers now.
                    live.act(session.end())
                handlers.orphan(live)
                # The stream's unused credit is void: those permits go back.
                self._rebalance()

    @protected
    async def _closer(self, live: StreamDriver, session_scope: anyio.CancelScope) -> None:
        await self._close_requested.wait()
        self._closing = True
        session = live.session
        handlers = self._handlers
        grace = 0.0 if handlers.stop_reason is not None else self._grace
        if session.state is State.ACTIVE:
            drain = session.drain(anyio.current_time())
            with anyio.move_on_after(max(0.1, min(grace or 1.0, _COMMAND_TIMEOUT))):
                await live.command(drain)
        await handlers.all_exited(grace)
        handlers.cancel_all(handlers.stop_reason or "the worker closed past its grace period")
        # Cancelled handlers hand their leases back in their `finally`; wait
        # for the daemon's answers.
        await live.finish(self._stop_timeout)
        session_scope.cancel()

    # -- what a stream asks of its owner (`StreamOwner`) ------------------------

    def _quiet(self) -> bool:
        return self._closing and not self._handlers.running

    def _after_act(self) -> None:
        if self._controller is not None:
            self._rebalance()

    # -- handlers -----------------------------------------------------------------

    def _start_handler(self, live: StreamDriver, key: LeaseKey, task: Task) -> None:
        handlers = self._handlers
        backend = handlers.backend
        assert backend is not None
        context = TaskContext(task, key, self._worker_id, live)
        arrived = 0.0 if self._fencing is None else backend.clock()
        running = Running(backend.scope(), context, arrived)
        if handlers.membership is not None:
            running.ticket = handlers.membership.admit()
        handlers.running[key] = running
        self._idle.since = None
        handlers.start(running)

    def _orphan_exited(self, now: float) -> None:
        """A handler of an ended stream finally exited: its slot is the newest
        session's (none: the next one counts the orphans left)."""
        session = self._current
        if session is None or session.state in (State.ENDED, State.ERROR):
            return  # the next session counts the orphans left
        outputs = session.outside_slot_freed(now)
        if outputs:
            # Credit goes out only once registered, and by then it is live.
            live = self._live
            assert live is not None
            assert live.session is session
            live.act(outputs)

    # -- shared concurrency controllers ------------------------------------------

    def _rebalance(self) -> None:
        """Match this worker's permits to its share and its commitments, and
        its session's concurrency to its permits (ringo_trio._work._concurrency).
        Runs after every session event and on every change of the pool."""
        membership = self._handlers.membership
        if membership is None:
            return
        live = self._live
        outputs = balance(
            membership.sync,
            None if live is None else live.session,
            handlers=self._handlers.count,
            closing=self._close_requested.is_set(),
            now=anyio.current_time(),
        )
        if outputs:
            assert live is not None
            live.act(outputs)

    @protected
    async def _follow_controller(self) -> None:
        """Rebalance whenever the shared pool changed (another worker gave
        permits back, attached or detached; the capacity moved)."""
        membership = self._handlers.membership
        assert membership is not None
        while True:
            changed = membership.changed()
            self._rebalance()
            await changed.wait()

    # -- on_idle (`IdleMonitor`) --------------------------------------------------

    def _busy(self) -> bool:
        return self._closing or bool(self.running)

    def _idle_failed(self, error: BaseException) -> None:
        self._fatal = error


@dataclass(frozen=True, slots=True)
class _StreamOwner:
    """What a stream asks of the worker (`StreamOwner`), bound once a stream."""

    start_handler: Callable[[StreamDriver, LeaseKey, Task], None]
    cancel_handler: Callable[[LeaseKey, str], None]
    task_cancelled: Callable[[LeaseKey], None]
    quiet: Callable[[], bool]
    after_act: Callable[[], None]


def _no_idle() -> None:
    """Without ``on_idle`` the monitor never runs."""

"""The driver of one Work stream: it moves frames, nothing else.

Theory of operation
-------------------
A `StreamDriver` sits between one bidi stream (two memory channels from the
transport) and one sans-IO `WorkSession`. Its reader feeds every frame the
daemon sends into the session, in order (`read`); its timer wakes the session
when a renewal, a local lease deadline or a command timeout is due
(`timer_loop`); `act` carries out what the session answers — frames go into
the send channel (unbounded, so carrying out outputs never awaits and no
cancellation can cut a settlement in half), handlers are started and
cancelled through the owner, waiters of commands are woken. `finish` ends
the stream in order: answers awaited (bounded), session ended, send side
closed. Encoding lives here too: the hot commands written inline
(`ringo_trio._wire.work`), the rare ones by betterproto2.

At minor >= 10 the transport's writer hands every frame queued when it wakes
to `batch_frames`, which joins them into batch frames: handlers that finish
together settle in one message, and nothing waits for a timer. A batch that
arrives is fed to the session at once (`WorkSession.batch`) and what it asks
for carried out in one `act`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

import anyio
import sniffio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .._contract.limits import MAX_WORK_BATCH
from .._contract.work.client import (
    Answered,
    CancelHandler,
    CommandDone,
    CommandError,
    Credit,
    Drain,
    Extend,
    LeaseKey,
    LocalProtocolError,
    Outcome,
    Output,
    Progress,
    Pushed,
    RemoteProtocolError,
    Settle,
    StartHandler,
    State,
    TaskCancelled,
    WorkSession,
)
from .._errors import RingoError, UnavailableError, error_for_code
from .._interrupts import protected
from .._models import Task
from .._proto.ringo.v1 import (
    LeaseRef,
    ReleaseRequest,
    ReportProgressRequest,
    WorkerDrain,
    WorkRequest,
    WorkResponse,
)
from .._wire.codec import encode
from .._wire.work import (
    encode_ack,
    encode_credit,
    encode_extend,
    encode_nack,
    encode_reject,
    encode_work_request_batch,
)
from ._frames import PushedTask, WorkResultFrame, decode_work_response

__all__ = [
    "Frame",
    "Inbound",
    "StreamDriver",
    "StreamOwner",
    "Waiter",
    "batch_frames",
    "command_exception",
    "settle_frame",
]

_REGISTER_TIMEOUT = 30.0
#: Encoded bytes of the commands one batch frame carries (at least one
#: command): far below the daemon's message limit, whatever the results held.
BATCH_FRAME_BYTES = 1024 * 1024
#: The timer never sleeps longer than this, so a command sent while it
#: sleeps is checked against its timeout in time without waking it per send.
_TIMER_MAX_SLEEP = 1.0


class StreamOwner(Protocol):
    """What a stream asks of the worker that owns it."""

    def start_handler(self, live: StreamDriver, key: LeaseKey, task: Task) -> None: ...

    def cancel_handler(self, key: LeaseKey, why: str) -> None: ...

    def task_cancelled(self, key: LeaseKey) -> None:
        """The daemon says an operator cancelled this lease's task."""
        ...

    def quiet(self) -> bool:
        """True once the worker stops and no handler of it runs any more."""
        ...

    def after_act(self) -> None:
        """Called after every batch of session outputs (shared controllers rebalance)."""
        ...


def command_exception(error: CommandError) -> RingoError:
    return error_for_code(error.code, error.message)


@dataclass(eq=False, slots=True)
class Waiter:
    event: anyio.Event = field(default_factory=anyio.Event)
    error: CommandError | None = None


class Frame:
    """A WorkRequest already encoded (grpclib's codec calls ``SerializeToString``).

    The hot commands are written inline (`ringo_trio._wire.work`) at a
    fraction of betterproto2's cost.
    """

    __slots__ = ("alone", "data")

    def __init__(self, data: bytes, *, alone: bool = False) -> None:
        self.data = data
        # Never put in a batch (``register``).
        self.alone = alone

    def SerializeToString(self) -> bytes:
        return self.data


class Inbound:
    """What grpclib decodes each WorkResponse into: pushes and results by the
    fast decoder, anything else (registered, heartbeat) by betterproto2."""

    @staticmethod
    def FromString(
        data: bytes,
    ) -> PushedTask | WorkResultFrame | WorkResponse | list[PushedTask | WorkResultFrame]:
        try:
            frame = decode_work_response(data)
            return frame if frame is not None else WorkResponse.parse(data)
        except (ValueError, EOFError) as exc:
            raise RemoteProtocolError(f"malformed Work frame from the daemon: {exc}") from None


def _error(frame: WorkResultFrame) -> CommandError | None:
    if not frame.error_value:
        return None
    return CommandError(
        frame.error_code or f"CODE_{frame.error_value}", frame.error_message, frame.reason
    )


def batch_frames(frames: list[Frame]) -> list[Frame]:
    """What the writer sends for the frames queued when it woke (minor >=
    10): runs of them joined into batch frames of at most MAX_WORK_BATCH
    commands and BATCH_FRAME_BYTES, in order; a run of one stays itself."""
    out: list[Frame] = []
    run: list[bytes] = []
    size = 0

    def close_run() -> None:
        if len(run) == 1:
            out.append(Frame(run[0]))
        elif run:
            out.append(Frame(encode_work_request_batch(run)))
        run.clear()

    for frame in frames:
        data = frame.data
        if frame.alone:
            close_run()
            out.append(frame)
            continue
        if run and (len(run) >= MAX_WORK_BATCH or size + len(data) > BATCH_FRAME_BYTES):
            close_run()
        if not run:
            size = 0
        run.append(data)
        size += len(data)
    close_run()
    return out


def settle_frame(settle: Settle) -> Frame:
    key = settle.key
    outcome = settle.outcome
    if outcome is Outcome.ACK:
        data = encode_ack(
            settle.request_id, key.task_id, key.attempt, settle.lease_token, settle.result
        )
    elif outcome is Outcome.NACK:
        delay = None if settle.retry_delay is None else timedelta(seconds=settle.retry_delay)
        data = encode_nack(
            settle.request_id, key.task_id, key.attempt, settle.lease_token, settle.error, delay
        )
    elif outcome is Outcome.REJECT:
        data = encode_reject(
            settle.request_id, key.task_id, key.attempt, settle.lease_token, settle.error
        )
    else:
        # Rare (a stopping worker), so the generic codec rather than a hand encoder.
        ref = LeaseRef(task_id=key.task_id, attempt=key.attempt, lease_token=settle.lease_token)
        data = encode(
            WorkRequest(
                request_id=settle.request_id,
                release=ReleaseRequest(lease=ref, reason=settle.error),
            )
        )
    return Frame(data)


class StreamDriver:
    """One open Work stream: its session, its send side, its waiters; the
    reader and the timer that feed the session. It moves frames and carries
    out the session's outputs; what a handler is, and when to stop, is the
    owner's (`StreamOwner`)."""

    def __init__(
        self, session: WorkSession, send: MemoryObjectSendStream[Frame], owner: StreamOwner
    ) -> None:
        self.session = session
        self.send = send
        self.owner = owner
        self.waiters: dict[int, Waiter] = {}
        self.arrived: dict[LeaseKey, Task] = {}
        self.settled = anyio.Event()  # set when close waits and nothing is pending
        self.timer: anyio.CancelScope | None = None
        # The event loop's own clock: under trio, anyio's wrapper costs
        # twice trio's call, and the reader reads it on every frame.
        self.clock: Callable[[], float] = anyio.current_time
        if sniffio.current_async_library() == "trio":
            import trio  # here: an asyncio program never imports trio

            self.clock = trio.current_time

    def act(self, outputs: list[Output]) -> None:
        """Carry out a session's outputs: write frames, start/cancel handlers, wake waiters."""
        send = self.send.send_nowait
        for out in outputs:
            # The per-task outputs first, by exact type: a class pattern is an
            # isinstance check per case tried (the outputs are final classes).
            if type(out) is Settle:
                send(settle_frame(out))
            elif type(out) is StartHandler:
                key = out.key
                self.owner.start_handler(self, key, self.arrived.pop(key))
            elif type(out) is CommandDone:
                waiter = self.waiters.pop(out.request_id, None)
                if waiter is not None:
                    waiter.error = out.error
                    waiter.event.set()
            else:
                self._act_rare(out)
        if not self.session.pending_commands and self.owner.quiet():
            self.settled.set()
        self.owner.after_act()

    def _act_rare(self, out: Output) -> None:
        send = self.send.send_nowait
        match out:
            case Credit(
                request_id=request_id,
                available=available,
                target_concurrency=target,
                grant=grant,
            ):
                send(Frame(encode_credit(request_id, available, target, grant)))
            case CancelHandler(key=key, reason=reason):
                self.owner.cancel_handler(key, reason)
            case TaskCancelled(key=key):
                self.owner.task_cancelled(key)
            case Extend(request_id=request_id, key=key, lease_token=token, extension=extension):
                send(
                    Frame(
                        encode_extend(
                            request_id,
                            key.task_id,
                            key.attempt,
                            token,
                            timedelta(seconds=extension),
                        )
                    )
                )
            case _:  # pragma: no cover - Register/Progress/Drain are sent by their callers
                raise LocalProtocolError(f"unexpected session output {out!r}")

    async def command(self, frame: Progress | Drain) -> CommandError | None:
        """Send a command and wait for its result."""
        waiter = self.send_command(frame)
        await waiter.event.wait()
        return waiter.error

    def send_command(self, frame: Progress | Drain) -> Waiter:
        """Send a command whose result arrives on ``waiter.event``."""
        waiter = self.waiters[frame.request_id] = Waiter()
        if isinstance(frame, Progress):
            request = WorkRequest(
                request_id=frame.request_id,
                progress=ReportProgressRequest(
                    lease=LeaseRef(
                        task_id=frame.key.task_id,
                        attempt=frame.key.attempt,
                        lease_token=frame.lease_token,
                    ),
                    current=frame.current,
                    total=frame.total,
                    message=frame.message,
                ),
            )
        else:
            request = WorkRequest(request_id=frame.request_id, drain=WorkerDrain(begin=True))
        self.send.send_nowait(Frame(encode(request)))
        return waiter

    async def first_response(self, receive: MemoryObjectReceiveStream[Any]) -> WorkResponse:
        with anyio.move_on_after(_REGISTER_TIMEOUT):
            try:
                first = await receive.receive()
                if not isinstance(first, WorkResponse):
                    raise RemoteProtocolError("the daemon's first Work frame was not 'registered'")
                return first
            except anyio.EndOfStream:
                raise UnavailableError(
                    "the daemon closed the Work stream before registering"
                ) from None
        raise UnavailableError(f"no registration reply within {_REGISTER_TIMEOUT:g}s")

    async def read(self, receive: MemoryObjectReceiveStream[Any]) -> None:
        """The one reader of the stream: every frame into the session, in order."""
        live = self
        session = live.session
        act = live.act
        current_time = live.clock
        async for frame in receive:
            kind = type(frame)
            if kind is WorkResultFrame:
                act(session.result(frame.request_id, _error(frame), current_time()))
            elif kind is PushedTask:
                pushed = live._arrived(frame)
                act(
                    session.task_pushed(
                        pushed.key, pushed.lease_token, pushed.lease_remaining, current_time()
                    )
                )
                live._pull_in_timer()
            elif kind is list:
                live._batch(frame)
            elif frame.heartbeat is not None:
                session.heartbeat()
            else:
                raise RemoteProtocolError(f"unexpected Work frame {frame!r}")

    def _arrived(self, frame: PushedTask) -> Pushed:
        """Keep a pushed task for its handler; the push as the session takes it.

        The lease's time is a duration counted from now, the receipt, on the
        loop's monotonic clock: its ttl (minor >= 11), else the registered
        lease duration. Never ``until``: that is the daemon's wall clock, and
        set against this host's it would move every deadline by the skew
        between the two (docs/protocol.md, "Lease time")."""
        key = LeaseKey(frame.task_id, frame.attempt)
        ttl = frame.ttl
        self.arrived[key] = frame.task
        return Pushed(key, frame.lease_token, self.session.lease_duration if ttl is None else ttl)

    def _pull_in_timer(self) -> None:
        # A push may bring an earlier renewal than the timer sleeps towards;
        # otherwise the timer would oversleep a short lease.
        timer = self.timer
        if timer is not None:
            when = self.session.next_deadline()
            if when is not None and when < timer.deadline:
                timer.deadline = when

    def _batch(self, frames: list[PushedTask | WorkResultFrame]) -> None:
        """A batch frame: its elements into the session at once, and what
        they ask for carried out once."""
        items = [
            self._arrived(frame)
            if isinstance(frame, PushedTask)
            else Answered(frame.request_id, _error(frame))
            for frame in frames
        ]
        outputs: list[Output] = []
        try:
            self.session.batch(items, self.clock(), outputs)
        finally:
            # What the elements before a broken one asked for is carried out,
            # as it would have been had they come one by one.
            self.act(outputs)
        self._pull_in_timer()

    @protected
    async def timer_loop(self) -> None:
        """Renewals, local lease deadlines and command timeouts, when due."""
        live = self
        session = live.session
        while True:
            now = anyio.current_time()
            when = session.next_deadline()
            if when is not None and when <= now:
                live.act(session.poll(now))
                continue
            target = now + _TIMER_MAX_SLEEP
            # The reader pulls this deadline in when a push brings an earlier
            # renewal; otherwise the timer would oversleep a short lease.
            with anyio.CancelScope(deadline=target if when is None else min(when, target)) as nap:
                live.timer = nap
                await anyio.sleep_forever()
            live.timer = None

    async def finish(self, answers_within: float) -> None:
        """Wait up to ``answers_within`` seconds for every handler to be done and every
        command answered, then end the session and the send side. The session
        ends first: a handler that returns later finds nothing to settle into
        (its lease is left to expire) instead of a closed stream."""
        self.act([])
        with anyio.move_on_after(answers_within):
            await self.settled.wait()
        self.settled.set()
        if self.session.state is not State.ENDED:
            self.act(self.session.end())
        self.send.close()

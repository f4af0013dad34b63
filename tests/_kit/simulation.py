"""The simulation behind ``tests/contract/test_simulation.py``: both halves of the Work
protocol, a storage engine and the wire between them, in virtual time.

Everything here is deterministic: a `Scenario` (printed in full by
hypothesis when a property fails) and nothing else decides what happens, so
``replay(Scenario(...))`` runs the very same simulation again. The pieces:

* `Storage` — the tasks (PENDING / LEASED / SUCCEEDED / DEAD), leased in
  claim order with a fresh token and the next attempt, settled only through
  a live `LeaseRef` (token and attempt of the current lease, not expired on
  the daemon's clock); a release returns the task PENDING with its attempt
  unspent, an expiry PENDING with it spent (DEAD at the last one). Every
  lease is a `LeaseLog` entry that records how, when and by whom it ended.
* `Daemon` / `DaemonStream` — one `ServerSession` per stream and a
  synchronous driver that does what ``ringo_trio.server.rpc.work._WorkStream``
  does: the reader answers frames in order (settlements of a frame grouped
  into one storage call, from the first credit or drain on under the "send
  lock", so no push lands between a credit and its result), the dispatcher
  claims and pushes as the session sizes it and hands back what it did not
  send; a stream's end returns what `ServerSession.end` says.
* `SimWorker` — one `WorkSession` per stream and a driver that does what
  ``ringo_trio._work._driver`` and ``worker.py`` do: handlers started and
  cancelled as the session says (a `Run` decides how long each works, how it
  ends and how long it ignores a cancellation), `poll` at `next_deadline`,
  handlers of an ended stream kept as orphans whose slots the next stream
  does not register, reconnects, and the stop (drain, grace, cancel, release,
  end).
* `Pipe` — one stream on the wire: FIFO each way with drawn delays, cut at
  any moment with each side noticing at its own time; frames of a stream
  are only ever delivered to that stream's endpoints (HTTP/2 keeps streams
  apart), and nothing is delivered to a side after it saw the stream end.
  A push carries its lease as a duration (``Lease.ttl``: the daemon's
  remaining lease when it wrote the push); the worker arms it on its own
  monotonic clock (offset + rate x true time).

The properties are checked as the simulation runs (`Simulation.check_step`
after every event, and at the moment something happens) and at the end
(`Simulation.check_end`); each failure is a `Violation` naming the property.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ringo_trio._contract import reasons
from ringo_trio._contract.versions import Feature, Features
from ringo_trio._contract.work.client import (
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
    Pushed,
    RemoteProtocolError,
    SessionBroken,
    Settle,
    StartHandler,
    State,
    TaskCancelled,
    WorkSession,
)
from ringo_trio._contract.work.server import (
    Answer,
    Ending,
    LeaseState,
    ServerSession,
    StreamEnd,
    StreamProtocolError,
)
from ringo_trio._contract.work.server import State as DState

# -- the properties --------------------------------------------------------------

NO_TASK_LOST = "no task lost"
ONE_SUCCESS = "never two successes"
CREDIT_FITS = "credit never exceeds free slots"
CREDIT_MIRROR = "the worker's credit mirror is the daemon's credit"
ENDS_ONCE = "every lease ends exactly once"
NO_EXPIRED_ACK = "a lease that expired is never acked"
STOP_SPENDS_NOTHING = "no attempt spent by our own stopping"
NEVER_TAKEN_BACK = "a delivered lease is never taken back"
HEALTHY_LEASES = "a lease on a healthy stream ends as its handler decided"
HALVES_AGREE = "neither half sees the other break the protocol"
SESSION_CHECK = "the daemon's session invariants hold (ServerSession.check)"

PROPERTIES = (
    NO_TASK_LOST,
    ONE_SUCCESS,
    CREDIT_FITS,
    CREDIT_MIRROR,
    ENDS_ONCE,
    NO_EXPIRED_ACK,
    STOP_SPENDS_NOTHING,
    NEVER_TAKEN_BACK,
    HEALTHY_LEASES,
    HALVES_AGREE,
    SESSION_CHECK,
)

#: How long a stopping worker waits for its releases (worker.py's default).
STOP_TIMEOUT = 5.0
#: The SDK's command timeout and registration timeout.
COMMAND_TIMEOUT = 30.0
REGISTER_TIMEOUT = 30.0
PAYLOAD = 100  # bytes of every task's payload
START = 1000.0  # true time (= the daemon's clock) when the simulation starts
MAX_EVENTS = 60_000
# Clock rates are within 1 +- 0.001: the share of a lease by which a worker's
# deadline may outlive the daemon's (see NO_EXPIRED_ACK).
DRIFT = 0.0011


class Violation(AssertionError):
    """A property failed; the message names it and ends with the trace."""

    def __init__(self, prop: str, detail: str, trace: str = "") -> None:
        super().__init__(f"[{prop}] {detail}{trace}")
        self.prop = prop


# -- the scenario ------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One handler run: it works ``duration`` seconds, then ends ``outcome``
    (ack / nack / reject); cancelled, it goes on for ``cancel_lag`` seconds
    (a handler that ignores its cancellation for a while)."""

    duration: float
    outcome: str = "ack"
    cancel_lag: float = 0.0


@dataclass(frozen=True)
class TaskSpec:
    max_attempts: int
    runs: tuple[Run, ...]  # the n-th handler of the task runs runs[n % len]
    due: float = 0.0  # seconds after the start when it can first be claimed


@dataclass(frozen=True)
class WorkerSpec:
    concurrency: int
    clock_offset: float = 0.0  # the worker's monotonic clock: offset + rate * t
    clock_rate: float = 1.0


#: Fault kinds: `Simulation.inject`.
DROP = "drop"  # the worker's stream is cut; each side notices at its own time
CRASH = "crash"  # the daemon dies (all sessions gone, storage survives), restarts
COMMIT_CRASH = "commit_crash"  # the next storage write commits, then the daemon dies
SHUTDOWN = "shutdown"  # the daemon shuts down gracefully, restarts
SLOW = "slow"  # a window of long delays on the worker's stream
OUTAGE = "outage"  # storage unavailable for a while
PAUSE = "pause"  # the worker's process freezes (a blocked event loop); its clock runs on
FAULTS = (DROP, CRASH, COMMIT_CRASH, SHUTDOWN, SLOW, OUTAGE, PAUSE)


@dataclass(frozen=True)
class Fault:
    """``kind`` happens once ``at`` events have run; ``a`` and ``b`` (0..1)
    size it (see `Simulation.inject`)."""

    at: int
    kind: str
    worker: int = 0
    a: float = 0.5
    b: float = 0.5


@dataclass(frozen=True)
class Scenario:
    seed: int  # the wire's delays, storage latencies, notice times
    minor: int
    lease: float
    max_delay: float  # a one-way delay on a healthy stream is at most this
    workers: tuple[WorkerSpec, ...]
    tasks: tuple[TaskSpec, ...]
    faults: tuple[Fault, ...] = ()
    stop_at: int | None = None  # the workers stop after this many events (else when all is done)
    stop_now: bool = False  # stopped as by a cancellation (else `close` with `grace`)
    grace: float = 0.0


# -- storage -----------------------------------------------------------------------

PENDING, LEASED, SUCCEEDED, DEAD = "PENDING", "LEASED", "SUCCEEDED", "DEAD"


class StorageDown(Exception):
    pass


class Crashed(Exception):
    """The daemon died in the middle of what it was doing."""


@dataclass(eq=False)
class LeaseLog:
    """One lease, from its claim to its end (exactly one `ending`)."""

    task_id: str
    attempt: int
    token: str
    stream: int  # the pipe whose daemon stream claimed it
    claimed_at: float
    until: float  # the daemon's expiry, moved by renewals
    pushed_at: float | None = None
    delivered_at: float | None = None
    ending: str | None = None  # acked nacked rejected released returned expired
    ended_at: float | None = None
    spent: bool | None = None  # whether its end spent the attempt
    decided: str | None = None  # the outcome its handler reached by itself
    released_by_stop: bool = False  # the worker's stop sent its release

    def __repr__(self) -> str:
        return (
            f"<lease {self.token} {self.task_id}#{self.attempt} stream {self.stream}"
            f" until {self.until:.3f} pushed {self.pushed_at} delivered {self.delivered_at}"
            f" ended {self.ending} at {self.ended_at} decided {self.decided}>"
        )


@dataclass(eq=False)
class Task:
    id: str
    max_attempts: int
    seq: int
    state: str = PENDING
    attempt: int = 0
    lease: LeaseLog | None = None
    available_at: float = 0.0
    successes: int = 0


class Storage:
    def __init__(self, sim: Simulation, specs: tuple[TaskSpec, ...]) -> None:
        self.sim = sim
        self.tasks = {
            f"task{i}": Task(f"task{i}", spec.max_attempts, i, available_at=START + spec.due)
            for i, spec in enumerate(specs)
        }
        self.log: list[LeaseLog] = []
        self.by_token: dict[str, LeaseLog] = {}
        self._tokens = itertools.count(1)
        self.down_until = -math.inf

    def _up(self, now: float) -> None:
        if now < self.down_until:
            raise StorageDown(f"down until {self.down_until:.3f}")

    def terminal(self) -> bool:
        return all(t.state in (SUCCEEDED, DEAD) for t in self.tasks.values())

    def claim(self, limit: int, now: float, lease: float, stream: int) -> list[LeaseLog]:
        self._up(now)
        self.expire(now)
        due = sorted(
            (t for t in self.tasks.values() if t.state == PENDING and t.available_at <= now),
            key=lambda t: (t.available_at, t.seq),
        )
        claimed = []
        for task in due[:limit]:
            task.attempt += 1
            task.state = LEASED
            log = LeaseLog(
                task.id, task.attempt, f"L{next(self._tokens)}", stream, now, now + lease
            )
            task.lease = log
            self.log.append(log)
            self.by_token[log.token] = log
            claimed.append(log)
        return claimed

    def _live(self, task_id: str, attempt: int, token: str, now: float) -> Task | None:
        """The LeaseRef rule: the task's current lease, and not expired."""
        task = self.tasks.get(task_id)
        if (
            task is None
            or task.state != LEASED
            or task.attempt != attempt
            or task.lease is None
            or task.lease.token != token
            or not task.lease.until > now
        ):
            return None
        return task

    def _end(self, task: Task, how: str, now: float, *, spent: bool) -> None:
        log = task.lease
        assert log is not None
        if log.ending is not None:
            self.sim.violate(ENDS_ONCE, f"{log!r} ends again, {how}")
        if how == "acked" and not now < log.until:
            self.sim.violate(NO_EXPIRED_ACK, f"{log!r} acked at {now:.3f}")
        log.ending, log.ended_at, log.spent = how, now, spent
        task.lease = None

    def _spend(self, task: Task, how: str, now: float) -> None:
        self._end(task, how, now, spent=True)
        if task.attempt >= task.max_attempts:
            task.state = DEAD
        else:
            task.state = PENDING
            task.available_at = now + min(2.0 ** (task.attempt - 1), 300.0)

    def settle_many(self, items: list[Settle], now: float) -> list[bool]:
        """Acks, nacks and rejects in one commit, each as if alone; False is LeaseLost."""
        self._up(now)
        done = []
        for settle in items:
            key = settle.key
            task = self._live(key.task_id, key.attempt, settle.lease_token, now)
            if task is None:
                done.append(False)
                continue
            if settle.outcome is Outcome.ACK:
                self._end(task, "acked", now, spent=True)
                task.state = SUCCEEDED
                task.successes += 1
                if task.successes > 1:
                    self.sim.violate(ONE_SUCCESS, f"{task.id} succeeded twice")
            elif settle.outcome is Outcome.NACK:
                self._spend(task, "nacked", now)
            else:
                self._end(task, "rejected", now, spent=True)
                task.state = DEAD
            done.append(True)
        return done

    def release(self, logs: list[LeaseLog], now: float, how: str) -> int:
        """Storage.release: PENDING at once, the attempt not spent."""
        self._up(now)
        released = 0
        for log in logs:
            task = self._live(log.task_id, log.attempt, log.token, now)
            if task is None:
                continue
            self._end(task, how, now, spent=False)
            task.attempt -= 1
            task.state = PENDING
            released += 1
        return released

    def extend(self, key: LeaseKey, token: str, extension: float, now: float) -> bool:
        self._up(now)
        task = self._live(key.task_id, key.attempt, token, now)
        if task is None:
            return False
        assert task.lease is not None
        task.lease.until = now + extension
        return True

    def expire(self, now: float) -> None:
        for task in self.tasks.values():
            if task.state == LEASED and task.lease is not None and task.lease.until <= now:
                self._spend(task, "expired", now)

    def next_wakeup(self, now: float) -> float | None:
        times = [
            t.available_at
            for t in self.tasks.values()
            if t.state == PENDING and t.available_at > now
        ]
        times += [
            t.lease.until for t in self.tasks.values() if t.state == LEASED and t.lease is not None
        ]
        return min(times) if times else None


# -- the wire ----------------------------------------------------------------------


@dataclass(frozen=True)
class RegisterMsg:
    max_concurrency: int
    ordered: bool
    lease: float


@dataclass(frozen=True)
class Commands:
    commands: tuple[Credit | Settle | Extend | Drain, ...]
    batched: bool


@dataclass(frozen=True)
class RegisteredMsg:
    lease: float
    max_concurrency: int
    ordered: bool


@dataclass(frozen=True)
class ResultMsg:
    request_id: int
    error: CommandError | None


@dataclass(frozen=True)
class PushMsg:
    key: LeaseKey
    token: str
    ttl: float  # Lease.ttl: the daemon's remaining lease when it wrote the push


@dataclass(frozen=True)
class BatchMsg:
    items: tuple[ResultMsg | PushMsg, ...]


@dataclass(frozen=True)
class EndMsg:
    """The worker half-closed (or reset) its side; the daemon ended the call
    with ``status``."""

    status: str = ""


class Pipe:
    """One Work stream on the wire (see the module docstring)."""

    def __init__(self, sim: Simulation, pid: int, worker: SimWorker) -> None:
        self.sim = sim
        self.id = pid
        self.worker = worker
        self.stream: DaemonStream | None = None
        self._last_to_daemon = self._last_to_worker = 0.0
        self.cut_at: float | None = None
        self.worker_open = True  # the worker still reads (and writes) it
        self.daemon_open = True
        self.slow_until = -math.inf
        self.slow_max = {True: 0.0, False: 0.0}  # to the daemon?: the longest delay
        self.troubled_at = math.inf  # the first fault that touched it
        self.arrived: dict[LeaseKey, str] = {}  # pushed, handler not started yet
        self.settles: Counter[LeaseKey] = Counter()
        self.to_worker_in_flight: deque[Any] = deque()
        # What the worker's commands were: credit updates and drains by
        # request id, and the lease each settle or renewal was about.
        self.credits: dict[int, Credit | Drain] = {}
        self.about: dict[int, LeaseKey] = {}
        self.refused: set[LeaseKey] = set()  # answered LEASE_LOST, and the worker read it

    def trouble(self) -> None:
        self.troubled_at = min(self.troubled_at, self.sim.now)

    def _delay(self, to_daemon: bool) -> float:
        rng = self.sim.rng
        if self.sim.now < self.slow_until:
            return rng.uniform(0.0, self.slow_max[to_daemon])
        if rng.random() < 0.3:
            return 0.0
        return rng.uniform(0.0, self.sim.scenario.max_delay)

    def to_daemon(self, msg: Any) -> None:
        if self.cut_at is not None or not self.worker_open:
            return
        when = max(self._last_to_daemon, self.sim.now + self._delay(True))
        self._last_to_daemon = when
        self.sim.at(when, self._deliver_to_daemon, msg)

    def _deliver_to_daemon(self, msg: Any) -> None:
        stream = self.stream
        if self.daemon_open and stream is not None and stream.alive():
            stream.receive(msg)

    def to_worker(self, msg: Any) -> None:
        if self.cut_at is not None or not self.daemon_open:
            return
        when = max(self._last_to_worker, self.sim.now + self._delay(False))
        self._last_to_worker = when
        self.to_worker_in_flight.append(msg)
        self.worker.later(when, self._deliver_to_worker, msg)

    def _deliver_to_worker(self, msg: Any) -> None:
        first = self.to_worker_in_flight.popleft()
        assert first is msg, "the wire reordered a stream's frames"
        if self.worker_open:
            for item in msg.items if type(msg) is BatchMsg else (msg,):
                error = item.error if type(item) is ResultMsg else None
                if (
                    error is not None
                    and error.code == "LEASE_LOST"
                    and item.request_id in self.about
                ):
                    self.refused.add(self.about[item.request_id])
            self.worker.receive(self, msg)

    def mirror_after_flight(self, mirror: int) -> int:
        """The worker's credit mirror once every frame on its way to it has
        arrived (pushes spend it, credit and drain results set it)."""
        for msg in self.to_worker_in_flight:
            for item in msg.items if type(msg) is BatchMsg else (msg,):
                if type(item) is PushMsg:
                    mirror -= 1
                elif type(item) is ResultMsg and item.error is None:
                    command = self.credits.get(item.request_id)
                    if type(command) is Drain:
                        mirror = 0
                    elif type(command) is Credit:
                        grant = command.grant
                        mirror = command.available if grant is None else mirror + grant
        return mirror

    def cut(self, worker_notices: float, daemon_notices: float) -> None:
        """The connection is gone: frames in flight arrive until each side
        notices (a prefix, the stream is FIFO), nothing after."""
        if self.cut_at is not None:
            return
        self.cut_at = self.sim.now
        self.trouble()
        self.worker.later(self.sim.now + worker_notices, self._worker_notices)
        self.sim.at(self.sim.now + daemon_notices, self._daemon_notices)

    def _worker_notices(self) -> None:
        if self.worker_open:
            self.worker.stream_lost(self)

    def _daemon_notices(self) -> None:
        if self.daemon_open:
            self.daemon_open = False
            if self.stream is not None:
                self.stream.end(None)


# -- the daemon ----------------------------------------------------------------------


def _command_name(command: Credit | Settle | Extend | Drain) -> str:
    if type(command) is Settle:
        return command.outcome.value  # ack nack reject release
    if type(command) is Credit:
        return "credit"
    if type(command) is Extend:
        return "extend_lease"
    return "drain"


def _result(answer: Answer) -> ResultMsg:
    error = answer.error
    if error is None:
        return ResultMsg(answer.request_id, None)
    return ResultMsg(
        answer.request_id,
        CommandError(error.code, error.message, error.metadata.get("reason", "")),
    )


class Daemon:
    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.storage = sim.storage
        self.epoch = 0
        self.up = True
        self.closing = False
        self.streams: dict[int, DaemonStream] = {}
        self.crash_on_commit: float | None = None  # armed: the downtime after
        self._wake_at = math.inf

    def accept(self, pipe: Pipe) -> bool:
        """A Work call arrives (False: the daemon is not there)."""
        if not self.up:
            return False
        stream = DaemonStream(self, pipe)
        pipe.stream = stream
        self.streams[pipe.id] = stream
        return True

    def committed(self) -> None:
        """A storage write committed: a crash armed for this moment happens."""
        downtime = self.crash_on_commit
        if downtime is not None:
            self.crash_on_commit = None
            self.sim.trace_event("commit, then the daemon crashes")
            self.crash(downtime)
            raise Crashed

    def crash(self, downtime: float) -> None:
        if not self.up:
            return
        self.up = False
        self.closing = False
        self.epoch += 1
        rng = self.sim.rng
        for stream in list(self.streams.values()):
            stream.ended = True
            # The process is gone: it notices at once, the worker when its
            # transport does (a reset, or keepalive).
            stream.pipe.daemon_open = False
            stream.pipe.cut(rng.choice([0.0, rng.uniform(0, 2), rng.uniform(0, 60)]), 0.0)
        self.streams.clear()
        self.sim.at(self.sim.now + downtime, self.restart, self.epoch)

    def restart(self, epoch: int) -> None:
        if self.epoch == epoch and not self.up:
            self.up = True
            self.closing = False
            self.sim.trace_event("the daemon restarts")

    def shutdown(self, timeout: float, downtime: float) -> None:
        """WorkStreams.shutdown: pushes stop, each stream ends once quiet; what
        is left when the timeout runs out is ended too, then the process exits."""
        if not self.up or self.closing:
            return
        self.closing = True
        for stream in list(self.streams.values()):
            stream.pipe.trouble()
            stream.session.shutdown()
            stream.check()
            stream.kick()
            stream.end_if_quiet()
        self.sim.at(self.sim.now + timeout, self._shutdown_timeout, self.epoch, downtime)

    def _shutdown_timeout(self, epoch: int, downtime: float) -> None:
        if self.epoch != epoch or not self.up:
            return
        for stream in list(self.streams.values()):
            stream.end("UNAVAILABLE")
        self.crash(downtime)

    def notify(self) -> None:
        """Tasks may be claimable: every dispatcher waiting for some claims."""
        for stream in list(self.streams.values()):
            if stream.disp == "wait_wake":
                stream.kick()

    def wake_at(self, when: float) -> None:
        if when < self._wake_at:
            self._wake_at = when
            self.sim.at(when, self._wake, when)

    def _wake(self, when: float) -> None:
        if when == self._wake_at:
            self._wake_at = math.inf
        self.notify()


class DaemonStream:
    """One Work call: a `ServerSession` and the synchronous driver of it."""

    def __init__(self, daemon: Daemon, pipe: Pipe) -> None:
        self.daemon = daemon
        self.sim = daemon.sim
        self.storage = daemon.storage
        self.pipe = pipe
        self.epoch = daemon.epoch
        self.session = ServerSession()
        if daemon.closing:
            self.session.shutdown()
        self.registered = False
        self.lease = 0.0
        self.inbox: deque[Any] = deque()
        self.busy = False
        self.disp = "off"  # off idle claiming pushing wait_credit wait_wake done
        self.batch: list[LeaseLog] = []  # claimed, not yet pushed
        self.ended = False
        self.claimed = 0
        self.mine: dict[str, LeaseLog] = {}

    def alive(self) -> bool:
        return not self.ended and self.daemon.epoch == self.epoch

    def at(self, when: float, fn: Callable[..., None], *args: Any) -> None:
        self.sim.at(when, self._guarded, fn, args)

    def _guarded(self, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        if not self.alive():
            return
        try:
            fn(*args)
        except Crashed:
            return
        except StreamProtocolError as exc:
            self.sim.violate(HALVES_AGREE, f"the daemon's session refused its driver: {exc!r}")
        if self.alive():
            self.check()

    def check(self) -> None:
        try:
            self.session.check()
        except AssertionError as exc:
            self.sim.violate(SESSION_CHECK, f"stream {self.pipe.id}: {exc!r}")

    def latency(self) -> float:
        return self.sim.rng.uniform(0.0, self.sim.scenario.max_delay / 2)

    def send(self, msg: Any) -> None:
        self.pipe.to_worker(msg)

    # -- reader ------------------------------------------------------------------

    def receive(self, msg: Any) -> None:
        self.inbox.append(msg)
        if not self.busy:
            self.at(self.sim.now, self._next)

    def _next(self) -> None:
        while self.inbox and not self.busy and self.alive():
            msg = self.inbox.popleft()
            if type(msg) is EndMsg:
                self.end(None)  # the worker half-closed (or reset): the call ends
                return
            if not self.registered:
                self._register(msg)
                continue
            self._frame(msg)

    def _register(self, msg: RegisterMsg) -> None:
        session = self.session
        session.begin_frame()
        try:
            registered = session.register(
                minor=self.sim.scenario.minor,
                ordered_request_ids=msg.ordered,
                max_concurrency=msg.max_concurrency,
                lease_duration=msg.lease,
            )
        except StreamEnd as exc:
            self.end(exc.status)
            return
        self.registered = True
        self.lease = registered.lease_duration
        self.send(
            RegisteredMsg(
                registered.lease_duration,
                registered.max_concurrency,
                registered.ordered_request_ids,
            )
        )
        session.end_frame()
        self.disp = "idle"
        self.kick()
        self.end_if_quiet()

    def _frame(self, msg: Commands) -> None:
        self.session.begin_frame()
        self.busy = True
        commands = msg.commands
        # From the first credit or drain on, the commands run under the send
        # lock with the write of their answers (`_WorkStream._answer`).
        cut = next((i for i, c in enumerate(commands) if type(c) in (Credit, Drain)), len(commands))
        self.at(self.sim.now + self.latency(), self._unlocked, msg, cut)

    def _unlocked(self, msg: Commands, cut: int) -> None:
        answers = self._run(msg.commands[:cut])
        if cut == len(msg.commands):
            self._answer(msg, answers)
        else:
            # Pushes may take the send lock first.
            self.at(self.sim.now + self.latency() / 2, self._locked, msg, cut, answers)

    def _locked(self, msg: Commands, cut: int, answers: list[ResultMsg]) -> None:
        self._answer(msg, answers + self._run(msg.commands[cut:]))

    def _answer(self, msg: Commands, answers: list[ResultMsg]) -> None:
        stats = self.sim.stats
        for answer in answers:
            if answer.error is not None:
                stats[f"answered {answer.error.code} {answer.error.reason}".strip()] += 1
        self.send(BatchMsg(tuple(answers)) if msg.batched else answers[0])
        session = self.session
        session.end_frame()
        self.busy = False
        if session.ending is not None:
            self.end(session.ending.status)
            return
        self.end_if_quiet()
        if self.inbox and self.alive():
            self.at(self.sim.now, self._next)

    def _run(self, commands: tuple[Any, ...]) -> list[ResultMsg]:
        session = self.session
        answers: list[ResultMsg | None] = []
        group: list[tuple[int, Settle]] = []
        for command in commands:
            name = _command_name(command)
            settles = name in ("ack", "nack", "reject")
            if group and not settles:
                self._settle_together(group, answers)
                group = []
            answers.append(None)
            index = len(answers) - 1
            refused = session.admit(
                command.request_id,
                name,
                has_result=type(command) is Settle and command.result is not None,
            )
            if refused is not None:
                answers[index] = _result(refused)
                continue
            if settles:
                group.append((index, command))
                continue
            answers[index] = self._command(name, command)
        if group:
            self._settle_together(group, answers)
        assert all(a is not None for a in answers)
        return answers  # type: ignore[return-value]

    def _settle_together(self, group: list[tuple[int, Settle]], answers: list[Any]) -> None:
        session = self.session
        for _, settle in group:
            session.settling(settle.lease_token)
        try:
            done = self.storage.settle_many([s for _, s in group], self.sim.now)
        except StorageDown as exc:
            for index, settle in group:
                session.settled(settle.lease_token, None)
                answers[index] = _result(session.storage_down(settle.request_id, str(exc)))
            return
        self.daemon.committed()
        for (index, settle), ok in zip(group, done, strict=True):
            if ok:
                session.settled(settle.lease_token, Ending.SETTLED)
                answers[index] = ResultMsg(settle.request_id, None)
            else:
                answers[index] = _result(
                    session.lost(settle.request_id, settle.lease_token, cancelled=False, message="")
                )
        self._notify()

    def _command(self, name: str, command: Any) -> ResultMsg:
        session = self.session
        now = self.sim.now
        if name == "credit":
            answer = session.credit_update(
                command.request_id,
                available=command.available,
                target=command.target_concurrency,
                grant=command.grant,
            )
            if answer.error is None and session.credit:
                self.kick()
            if (
                command.grant is not None
                and answer.error is not None
                and answer.error.metadata.get("reason") == reasons.CREDIT_CAPACITY
            ):
                # A grant is computed against every slot the worker counts
                # as taken: one the daemon cannot hold was never free.
                self.sim.violate(CREDIT_FITS, f"stream {self.pipe.id}: grant refused: {answer}")
            return _result(answer)
        if name == "drain":
            answer = session.drain(command.request_id, begin=True)
            self.kick()
            return _result(answer)
        if name == "extend_lease":
            try:
                renewed = self.storage.extend(
                    command.key, command.lease_token, command.extension, now
                )
            except StorageDown as exc:
                return _result(session.storage_down(command.request_id, str(exc)))
            if renewed:
                self.daemon.committed()
                return ResultMsg(command.request_id, None)
            return _result(
                session.lost(command.request_id, command.lease_token, cancelled=False, message="")
            )
        assert name == "release"
        session.settling(command.lease_token)
        log = self.storage.by_token.get(command.lease_token)
        try:
            released = 0 if log is None else self.storage.release([log], now, "released")
        except StorageDown as exc:
            session.settled(command.lease_token, None)
            return _result(session.storage_down(command.request_id, str(exc)))
        if not released:
            return _result(
                session.lost(command.request_id, command.lease_token, cancelled=False, message="")
            )
        self.daemon.committed()
        session.settled(command.lease_token, Ending.SETTLED)
        self._notify()
        return ResultMsg(command.request_id, None)

    def _notify(self) -> None:
        self.daemon.notify()
        wake = self.storage.next_wakeup(self.sim.now)
        if wake is not None:
            self.daemon.wake_at(wake + 0.002)

    # -- dispatcher ----------------------------------------------------------------

    def kick(self) -> None:
        if self.disp in ("idle", "wait_credit", "wait_wake"):
            self.disp = "idle"
            self.at(self.sim.now, self._dispatch)

    def _dispatch(self) -> None:
        if self.disp != "idle":
            return
        session = self.session
        limit = session.claim_size()
        if not limit:
            self.disp = "done" if session.state is not DState.OPEN else "wait_credit"
            return
        self.disp = "claiming"
        self.at(self.sim.now + self.latency(), self._claim, limit)

    def _claim(self, limit: int) -> None:
        try:
            claimed = self.storage.claim(limit, self.sim.now, self.lease, self.pipe.id)
        except StorageDown:
            self.end("UNAVAILABLE")  # `_end(StorageUnavailable)`
            return
        if claimed:
            self.daemon.committed()
        if not claimed:
            self.disp = "wait_wake"
            wake = self.storage.next_wakeup(self.sim.now)
            if wake is not None:
                self.daemon.wake_at(wake + 0.002)
            return
        self.claimed += len(claimed)
        for log in claimed:
            self.mine[log.token] = log
        back = self.session.claimed([(log.token, log.until, PAYLOAD) for log in claimed])
        self.batch = [log for log in claimed if log.token not in back]
        self._return(back)
        self.disp = "pushing"
        self.at(self.sim.now, self._push)

    def _push(self) -> None:
        session = self.session
        now = self.sim.now
        count, stale = session.next_pushes(now, [PAYLOAD + 60] * len(self.batch))
        if count:
            sent, self.batch = self.batch[:count], self.batch[count:]
            pushes = tuple(
                PushMsg(LeaseKey(log.task_id, log.attempt), log.token, log.until - now)
                for log in sent
            )
            self.send(pushes[0] if count == 1 else BatchMsg(pushes))
            session.pushed(count)
            self.sim.stats["pushed"] += count
            for log in sent:
                log.pushed_at = now
            if self.batch and not stale:
                self.at(now, self._push)
                return
        self._return(session.unsent())
        self.batch = []
        self.disp = "idle"
        self.end_if_quiet()
        if self.alive():
            self.at(now, self._dispatch)

    def _return(self, tokens: list[str]) -> None:
        """Hand back leases this stream claimed and never sent (attempt unspent)."""
        if not tokens:
            return
        logs = [self.mine[token] for token in tokens]
        self.sim.stats["returned unsent"] += len(logs)
        for log in logs:
            if log.pushed_at is not None:
                self.sim.violate(NEVER_TAKEN_BACK, f"the daemon hands back {log!r}")
        try:
            self.storage.release(logs, self.sim.now, "returned")
        except StorageDown:
            return  # they expire
        self._notify()

    # -- the end ---------------------------------------------------------------------

    def end_if_quiet(self) -> None:
        if self.alive() and self.session.quiet:
            self.end("UNAVAILABLE")

    def end(self, status: str | None) -> None:
        """The call ends: unsent leases go back, the rest is left to expire;
        with a status, the worker reads it after every frame before it."""
        if self.ended:
            return
        self.ended = True
        session = self.session
        self._return(session.unsent())  # the dispatcher's `finally`
        self.batch = []
        self._return(session.end())
        if sum(session.ended.values()) + len(session.leases) != self.claimed or session.leases:
            self.sim.violate(
                ENDS_ONCE,
                f"stream {self.pipe.id} claimed {self.claimed} leases, its session ended"
                f" {dict(session.ended)} and holds {len(session.leases)}",
            )
        if status is not None:
            self.send(EndMsg(status))
        self.pipe.daemon_open = False
        self.daemon.streams.pop(self.pipe.id, None)


# -- the worker ------------------------------------------------------------------------


@dataclass(eq=False)
class Handler:
    hid: int
    key: LeaseKey
    pipe: Pipe
    session: WorkSession
    log: LeaseLog
    run: Run
    natural_end: float
    exit_at: float
    outcome: Outcome
    unrun: bool = False
    cancelled: bool = False
    version: int = 0


_OUTCOMES = {"ack": Outcome.ACK, "nack": Outcome.NACK, "reject": Outcome.REJECT}


class SimWorker:
    """A worker process: one stream after another (see the module docstring)."""

    def __init__(self, sim: Simulation, index: int, spec: WorkerSpec) -> None:
        self.sim = sim
        self.index = index
        self.concurrency = spec.concurrency
        self.offset = spec.clock_offset
        self.rate = spec.clock_rate
        self.session: WorkSession | None = None
        self.pipe: Pipe | None = None
        self.handlers: dict[int, Handler] = {}
        self.orphans: set[int] = set()
        self.close_requested = False
        self.stop_now = False
        self.grace = 0.0
        self.stop_began = math.inf
        self.closing = False  # `_closer` is past its drain: `_quiet` may hold
        self.closer = ""  # "" drain grace finish: where the closer is
        self.drain_id = 0
        self.finished = False
        self._timer: object | None = None
        self._timer_at = math.inf
        self.paused_until = -math.inf
        self._deferred: deque[tuple[Callable[..., None], tuple[Any, ...]]] = deque()
        self._resuming = False
        self._closer_wait: object | None = None

    def __repr__(self) -> str:
        return f"<worker {self.index}>"

    def clock(self) -> float:
        return self.offset + self.rate * self.sim.now

    def later(self, when: float, fn: Callable[..., None], *args: Any) -> None:
        """Something the worker's event loop does at ``when`` — once it runs
        again, if it is paused then (in the order it was due)."""
        self.sim.at(when, self._run, fn, args)

    def _run(self, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        if self.sim.now < self.paused_until or self._deferred:
            # Frozen: what falls due waits, in order, for the loop to run again.
            self._deferred.append((fn, args))
            if not self._resuming:
                self._resuming = True
                self.sim.at(self.paused_until, self._resume)
            return
        self._call(fn, args)

    def _resume(self) -> None:
        while self._deferred:
            if self.sim.now < self.paused_until:
                self.sim.at(self.paused_until, self._resume)
                return
            self._call(*self._deferred.popleft())
        self._resuming = False

    def _call(self, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        # After a freeze, what was due runs in the order it fell due: a
        # handler may finish before the timer sees a deadline that passed
        # meanwhile (`WorkSession.settle` checks the deadline itself).
        fn(*args)

    def _true_time(self, when: float) -> float:
        t = (when - self.offset) / self.rate
        while self.offset + self.rate * t < when:
            t = math.nextafter(t, math.inf)
        return t

    def running_here(self) -> int:
        return sum(1 for h in self.handlers.values() if h.pipe is self.pipe)

    # -- streams -------------------------------------------------------------------

    def connect(self) -> None:
        if self.close_requested or self.session is not None:
            self._maybe_done()
            return
        sim = self.sim
        pipe = sim.new_pipe(self)
        if not sim.daemon.accept(pipe):
            self.later(sim.now + sim.rng.uniform(0.2, 2.0), self.connect)
            return
        # worker.py: the session counts the orphans' slots as taken (outside
        # slots) and says what to register.
        session = WorkSession(
            concurrency=self.concurrency,
            minor=sim.scenario.minor,
            dynamic_target=False,
            command_timeout=COMMAND_TIMEOUT,
            outside=len(self.orphans),
        )
        register = session.register()
        self.session, self.pipe = session, pipe
        sim.trace_event(f"{self} opens stream {pipe.id}, {len(self.orphans)} orphan(s)")
        pipe.to_daemon(
            RegisterMsg(register.max_concurrency, register.ordered_request_ids, sim.scenario.lease)
        )
        self.later(sim.now + REGISTER_TIMEOUT, self._register_timeout, pipe)

    def _register_timeout(self, pipe: Pipe) -> None:
        session = self.session
        if pipe is self.pipe and session is not None and session.state is State.REGISTERING:
            self.abort()

    def receive(self, pipe: Pipe, msg: Any) -> None:
        session = self.session
        if pipe is not self.pipe or session is None:
            self.sim.violate(HALVES_AGREE, f"{self} got a frame of stream {pipe.id}: {msg!r}")
            return
        now = self.clock()
        kind = type(msg)
        try:
            if kind is ResultMsg:
                self.act(session, pipe, session.result(msg.request_id, msg.error, now))
            elif kind is PushMsg:
                self._arrived(pipe, msg)
                self.act(session, pipe, session.task_pushed(msg.key, msg.token, msg.ttl, now))
            elif kind is BatchMsg:
                items: list[Pushed | Answered] = []
                for item in msg.items:
                    if type(item) is PushMsg:
                        self._arrived(pipe, item)
                        items.append(Pushed(item.key, item.token, item.ttl))
                    else:
                        items.append(Answered(item.request_id, item.error))
                out: list[Output] = []
                try:
                    session.batch(items, now, out)
                finally:
                    self.act(session, pipe, out)
            elif kind is RegisteredMsg:
                self.act(
                    session,
                    pipe,
                    session.registered(
                        lease_duration=msg.lease,
                        max_concurrency=msg.max_concurrency,
                        ordered_request_ids=msg.ordered,
                        now=now,
                    ),
                )
                if self.close_requested:
                    self._start_closer()
            elif kind is EndMsg:
                self.sim.trace_event(f"{self} reads the end of stream {pipe.id}: {msg.status}")
                self.stream_lost(pipe)
                return
        except SessionBroken as exc:
            self.sim.trace_event(f"{self}: session broken: {exc}")
            self.sim.stats["session broken"] += 1
            self.abort()
            return
        except (RemoteProtocolError, LocalProtocolError) as exc:
            self.sim.violate(HALVES_AGREE, f"{self} on stream {pipe.id}: {exc!r}")
        self.rearm()

    def _arrived(self, pipe: Pipe, push: PushMsg) -> None:
        pipe.arrived[push.key] = push.token
        log = self.sim.storage.by_token[push.token]
        log.delivered_at = self.sim.now

    def abort(self) -> None:
        """The worker gives up on its stream (a reset the daemon sees after
        what was already sent)."""
        pipe = self.pipe
        if pipe is None:
            return
        pipe.trouble()
        pipe.to_daemon(EndMsg("reset"))
        self.stream_lost(pipe)

    def stream_lost(self, pipe: Pipe) -> None:
        """The stream is over for this worker: its session ends (every lease
        lost to its handler), running handlers become orphans."""
        pipe.worker_open = False
        if pipe is not self.pipe:
            return
        self.sim.stats["stream lost"] += 1
        session = self.session
        assert session is not None
        self.session = self.pipe = None
        self._timer = None
        self._closer_wait = None
        if self.closer:
            self.closer = "done"
        if session.state is not State.ENDED:
            self.act(session, pipe, session.end())
        for handler in self.handlers.values():
            if handler.pipe is pipe:
                self.orphans.add(handler.hid)
                self.sim.stats["orphan"] += 1
        if self.close_requested:
            # `_work_until_stopped`: every handler left is cancelled.
            for handler in list(self.handlers.values()):
                self._cancel(handler)
            self._maybe_done()
        else:
            self.later(self.sim.now + self.sim.rng.uniform(0.05, 1.0), self.connect)

    # -- carrying out what the session says ----------------------------------------

    def act(self, session: WorkSession, pipe: Pipe, outputs: list[Output]) -> None:
        frames: list[Credit | Settle | Extend | Drain] = []
        for out in outputs:
            kind = type(out)
            if kind in (Settle, Credit, Extend, Drain):
                frames.append(out)  # type: ignore[arg-type]
                if kind is Settle:
                    self._settling(pipe, out)  # type: ignore[arg-type]
            elif kind is StartHandler:
                self._start(session, pipe, out.key)  # type: ignore[union-attr]
            elif kind is CancelHandler:
                for handler in list(self.handlers.values()):
                    if handler.pipe is pipe and handler.key == out.key:  # type: ignore[union-attr]
                        self._cancel(handler)
            elif kind is CommandDone:
                if out.request_id == self.drain_id and pipe is self.pipe:  # type: ignore[union-attr]
                    self.drain_id = 0
                    if self.closer == "drain":
                        self._closer_grace()
            else:
                assert kind is TaskCancelled
        if frames:
            self._send(pipe, frames)
        if self.closer == "finish" and session is self.session:
            self._maybe_finish()

    def _send(self, pipe: Pipe, frames: list[Any]) -> None:
        stats = self.sim.stats
        for frame in frames:
            kind = type(frame)
            if kind is Credit or kind is Drain:
                pipe.credits[frame.request_id] = frame
            else:
                pipe.about[frame.request_id] = frame.key
            if kind is Credit:
                if frame.grant is not None:
                    stats["grant"] += 1
                else:
                    stats["credit" if frame.target_concurrency is None else "resize"] += 1
            elif kind is Settle:
                stats[f"send {frame.outcome.value}"] += 1
            else:
                stats[f"send {kind.__name__.lower()}"] += 1
        if Features(self.sim.scenario.minor).has(Feature.BATCH_FRAMES):
            pipe.to_daemon(Commands(tuple(frames), batched=len(frames) > 1))
        else:
            for frame in frames:
                pipe.to_daemon(Commands((frame,), batched=False))

    def _settling(self, pipe: Pipe, settle: Settle) -> None:
        pipe.settles[settle.key] += 1
        if pipe.settles[settle.key] > 1:
            self.sim.violate(ENDS_ONCE, f"{self} settles {settle.key} twice on stream {pipe.id}")
        if settle.outcome is Outcome.ACK and settle.key in pipe.refused:
            self.sim.violate(
                NO_EXPIRED_ACK, f"{self} acks {settle.key} after the daemon answered LEASE_LOST"
            )
        if settle.outcome is Outcome.ACK:
            # The session still held the lease: the daemon's may have run out
            # only by the push's own transit and the clocks' drift.
            log = self.sim.storage.by_token[settle.lease_token]
            assert log.delivered_at is not None
            assert log.pushed_at is not None
            slack = (log.delivered_at - log.pushed_at) + DRIFT * self.sim.scenario.lease + 1e-6
            if self.sim.now > log.until + slack:
                self.sim.violate(
                    NO_EXPIRED_ACK,
                    f"{self} acks {log!r} at {self.sim.now:.3f}, believing it held",
                )

    def rearm(self) -> None:
        session = self.session
        if session is None or session.state in (State.ENDED, State.ERROR):
            return
        when = session.next_deadline()
        if when is None:
            self._timer = None
            return
        at = max(self._true_time(when), self.sim.now)
        if self._timer is not None and at == self._timer_at:
            return
        token = self._timer = object()
        self._timer_at = at
        self.later(at, self._tick, token)

    def _tick(self, token: object | None) -> None:
        session, pipe = self.session, self.pipe
        if token is not self._timer or session is None or pipe is None:
            return
        now = self.clock()
        when = session.next_deadline()
        if when is not None and when <= now:
            try:
                self.act(session, pipe, session.poll(now))
            except SessionBroken as exc:
                self.sim.trace_event(f"{self}: session broken: {exc}")
                self.abort()
                return
            except (RemoteProtocolError, LocalProtocolError) as exc:
                self.sim.violate(HALVES_AGREE, f"{self} polling: {exc!r}")
        self.rearm()

    # -- handlers ------------------------------------------------------------------

    def _start(self, session: WorkSession, pipe: Pipe, key: LeaseKey) -> None:
        sim = self.sim
        token = pipe.arrived.pop(key)
        log = sim.storage.by_token[token]
        run = sim.next_run(key.task_id)
        now = sim.now
        handler = Handler(
            next(sim.hids),
            key,
            pipe,
            session,
            log,
            run,
            natural_end=now + run.duration,
            exit_at=now + run.duration,
            outcome=_OUTCOMES[run.outcome],
        )
        if self.close_requested:
            # Pushed before the daemon saw the drain: handed back unrun.
            handler.unrun = True
            self.sim.stats["handed back unrun"] += 1
            handler.exit_at = now
            handler.outcome = Outcome.RELEASE
        self.handlers[handler.hid] = handler
        self.later(handler.exit_at, self._exit, handler, handler.version)

    def _cancel(self, handler: Handler) -> None:
        if handler.cancelled or handler.unrun:
            return
        handler.cancelled = True
        self.sim.stats["cancelled"] += 1
        if handler.run.cancel_lag:
            self.sim.stats["cancelled, ignoring it"] += 1
        stops = self.sim.now + handler.run.cancel_lag
        if stops < handler.natural_end:
            handler.exit_at = stops
            handler.outcome = Outcome.RELEASE  # it did not finish
            handler.version += 1
            self.later(stops, self._exit, handler, handler.version)

    def _exit(self, handler: Handler, version: int) -> None:
        if version != handler.version or handler.hid not in self.handlers:
            return
        del self.handlers[handler.hid]
        orphan = handler.hid in self.orphans
        self.orphans.discard(handler.hid)
        now = self.clock()
        if handler.outcome is not Outcome.RELEASE:
            handler.log.decided = handler.run.outcome
        if orphan:
            self._orphan_exited(now)
        session, pipe = handler.session, handler.pipe
        try:
            if session.holds(handler.key) and session.state in (State.ACTIVE, State.DRAINING):
                if handler.outcome is Outcome.RELEASE:
                    handler.log.released_by_stop = True
                result = b"done" if handler.outcome is Outcome.ACK else None
                self.act(
                    session,
                    pipe,
                    session.settle(handler.key, handler.outcome, now, error="", result=result),
                )
            elif session.state is not State.ERROR:
                self.act(session, pipe, session.handler_exited(handler.key, now))
        except SessionBroken:
            if session is self.session:
                self.abort()
        except (RemoteProtocolError, LocalProtocolError) as exc:
            self.sim.violate(HALVES_AGREE, f"{self} settling {handler.key}: {exc!r}")
        if self.closer == "grace" and not self.running_here():
            self._closer_cancel()
        self.rearm()
        self._maybe_done()

    def _orphan_exited(self, now: float) -> None:
        """worker.py: an orphan's slot goes to the newest session, from its
        creation on (none, or ended: the next one counts the orphans left)."""
        session, pipe = self.session, self.pipe
        if session is None or pipe is None or session.state in (State.ENDED, State.ERROR):
            return
        try:
            outputs = session.outside_slot_freed(now)
        except (RemoteProtocolError, LocalProtocolError) as exc:
            self.sim.violate(HALVES_AGREE, f"{self} freeing an outside slot: {exc!r}")
        self.act(session, pipe, outputs)

    # -- stopping ------------------------------------------------------------------

    def stop(self, now: bool, grace: float) -> None:
        if self.close_requested:
            return
        sim = self.sim
        sim.trace_event(f"{self} stops ({'at once' if now else f'grace {grace:g}'})")
        self.close_requested = True
        self.stop_began = sim.now
        self.stop_now = now
        self.grace = 0.0 if now else grace
        session, pipe = self.session, self.pipe
        if now:
            # `_stop_now`: the drain goes out before any release, every
            # handler is cancelled, and the whole stop is bounded.
            if session is not None and pipe is not None and session.state is State.ACTIVE:
                drain = session.drain(self.clock())
                self.drain_id = drain.request_id
                self._send(pipe, [drain])
            for handler in list(self.handlers.values()):
                self._cancel(handler)
            self.later(sim.now + STOP_TIMEOUT, self._stop_deadline)
        if session is None:
            for handler in list(self.handlers.values()):
                self._cancel(handler)
            self._maybe_done()
        elif session.state in (State.ACTIVE, State.DRAINING):
            self._start_closer()
        self.rearm()

    def _stop_deadline(self) -> None:
        if self.session is not None:
            self.sim.trace_event(f"{self}: stop_timeout, the stream is cancelled")
            self.abort()

    def _start_closer(self) -> None:
        """`Worker._closer`: drain, wait for the grace period, cancel the
        rest, wait for their releases (bounded), end the stream."""
        session, pipe = self.session, self.pipe
        if self.closer or session is None or pipe is None:
            return
        self.closing = True
        self.closer = "drain"
        if session.state is State.ACTIVE:
            drain = session.drain(self.clock())
            self.drain_id = drain.request_id
            self._send(pipe, [drain])
            wait = object()
            self._closer_wait = wait
            self.later(
                self.sim.now + max(0.1, min(self.grace or 1.0, COMMAND_TIMEOUT)),
                self._closer_timeout,
                wait,
                "drain",
            )
            return
        if self.drain_id:
            # `_stop_now` sent it: the closer does not wait for it.
            self.drain_id = 0
        self._closer_grace()

    def _closer_timeout(self, wait: object, stage: str) -> None:
        if wait is not self._closer_wait or self.closer != stage:
            return
        if stage == "drain":
            self._closer_grace()
        elif stage == "grace":
            self._closer_cancel()
        else:
            self._finish()

    def _closer_grace(self) -> None:
        self.closer = "grace"
        if self.running_here() and self.grace > 0:
            wait = object()
            self._closer_wait = wait
            self.later(self.sim.now + self.grace, self._closer_timeout, wait, "grace")
            return
        self._closer_cancel()

    def _closer_cancel(self) -> None:
        if self.closer != "grace":
            return
        for handler in list(self.handlers.values()):
            self._cancel(handler)
        self.closer = "finish"
        wait = object()
        self._closer_wait = wait
        self.later(self.sim.now + STOP_TIMEOUT, self._closer_timeout, wait, "finish")
        self._maybe_finish()

    def _maybe_finish(self) -> None:
        session = self.session
        if (
            self.closer == "finish"
            and session is not None
            and not session.pending_commands
            and not self.running_here()
        ):
            self._finish()

    def _finish(self) -> None:
        """`StreamDriver.finish`: the session ends, the send side closes."""
        session, pipe = self.session, self.pipe
        if session is None or pipe is None:
            return
        self.closer = "done"
        if session.state is not State.ENDED:
            self.act(session, pipe, session.end())
        pipe.to_daemon(EndMsg())
        self.stream_lost(pipe)

    def _maybe_done(self) -> None:
        if (
            self.close_requested
            and self.session is None
            and not self.handlers
            and not self.finished
        ):
            self.finished = True
            self.sim.trace_event(f"{self} has stopped")


# -- the simulation --------------------------------------------------------------------


class Simulation:
    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.rng = random.Random(scenario.seed)
        self.now = START
        self._queue: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = itertools.count()
        self.events = 0
        self.trace: deque[str] = deque(maxlen=120)
        self.stats: Counter[str] = Counter()  # what happened (coverage, not properties)
        self.storage = Storage(self, scenario.tasks)
        self.daemon = Daemon(self)
        self.pipes: list[Pipe] = []
        self.hids = itertools.count(1)
        self._runs: Counter[str] = Counter()
        self.workers = [SimWorker(self, i, spec) for i, spec in enumerate(scenario.workers)]
        self.stopping = False
        self.recovering = False
        self.quiet_since = START  # when the last fault's effects were over
        self.liveness_bound = self._liveness_bound()

    # -- plumbing ----------------------------------------------------------------------

    def at(self, when: float, fn: Callable[..., None], *args: Any) -> None:
        heapq.heappush(self._queue, (max(when, self.now), next(self._seq), fn, args))

    def new_pipe(self, worker: SimWorker) -> Pipe:
        pipe = Pipe(self, len(self.pipes), worker)
        self.pipes.append(pipe)
        return pipe

    def next_run(self, task_id: str) -> Run:
        if self.recovering:
            return Run(0.5)
        spec = self.scenario.tasks[self.storage.tasks[task_id].seq]
        run = spec.runs[self._runs[task_id] % len(spec.runs)]
        self._runs[task_id] += 1
        return run

    def trace_event(self, what: str) -> None:
        self.trace.append(f"{self.now - START:10.4f} #{self.events} {what}")

    def violate(self, prop: str, detail: str) -> None:
        trace = "\n".join(self.trace)
        raise Violation(prop, detail, f"\n--- the last events (t - {START:g}) ---\n{trace}")

    def _liveness_bound(self) -> float:
        """Virtual seconds within which every task must be done once the last
        fault is over: each attempt serially, at its longest."""
        lease = self.scenario.lease
        total = 600.0 + max(spec.due for spec in self.scenario.tasks)
        for spec in self.scenario.tasks:
            longest = max(run.duration + run.cancel_lag for run in spec.runs)
            total += spec.max_attempts * (longest + 2 * lease + 60.0)
        return total

    # -- running -----------------------------------------------------------------------

    def run(self) -> Simulation:
        scenario = self.scenario
        faults = sorted(scenario.faults, key=lambda f: f.at)
        for worker in self.workers:
            self.at(self.now + self.rng.uniform(0, 0.5), worker.connect)
        next_fault = 0
        while True:
            if not self._queue:
                if not self.stopping and not self.storage.terminal():
                    self.violate(NO_TASK_LOST, "nothing is left to happen, yet tasks are not done")
                if not self.storage.terminal() and not self.recovering:
                    self._recover()
                    continue
                break
            when, _, fn, args = heapq.heappop(self._queue)
            self.now = when
            fn(*args)
            self.events += 1
            while next_fault < len(faults) and faults[next_fault].at <= self.events:
                if not self.recovering:
                    self.inject(faults[next_fault])
                next_fault += 1
            if not self.stopping and (
                self.storage.terminal()
                or (
                    scenario.stop_at is not None
                    and self.events >= scenario.stop_at
                    and not self.recovering
                )
            ):
                self._stop()
            self.check_step()
            if self.events > MAX_EVENTS:
                self.violate(NO_TASK_LOST, f"still running after {MAX_EVENTS} events")
            if not self.stopping and self.now > self.quiet_since + self.liveness_bound:
                self.violate(
                    NO_TASK_LOST,
                    f"tasks not done {self.liveness_bound:g}s after the last fault: "
                    + ", ".join(f"{t.id} {t.state}" for t in self.storage.tasks.values()),
                )
        self.check_end()
        return self

    def _stop(self) -> None:
        self.stopping = True
        now = self.scenario.stop_now and not self.recovering
        for worker in self.workers:
            worker.later(self.now, worker.stop, now, self.scenario.grace)

    def _recover(self) -> None:
        """The workers stopped before every task was done: everything they
        held has run out; a healthy worker finishes the rest."""
        self.trace_event("recovery: a healthy worker takes over")
        self._sweep()
        self.recovering = True
        self.stopping = False
        self.quiet_since = self.now
        self.daemon.crash_on_commit = None
        self.storage.down_until = -math.inf
        if not self.daemon.up:
            self.daemon.up = True
            self.daemon.epoch += 1
        worker = SimWorker(self, len(self.workers), WorkerSpec(4))
        self.workers.append(worker)
        self.at(self.now, worker.connect)

    def _sweep(self) -> None:
        """Let every lease run out."""
        untils = [t.lease.until for t in self.storage.tasks.values() if t.lease is not None]
        if untils:
            self.now = max(self.now, max(untils) + 1.0)
        self.storage.expire(self.now)

    def inject(self, fault: Fault) -> None:
        lease = self.scenario.lease
        daemon = self.daemon
        worker = self.workers[fault.worker % len(self.workers)]
        self.trace_event(f"FAULT {fault}")
        self.stats[f"fault {fault.kind}"] += 1
        end = self.now
        if fault.kind == DROP:
            if worker.pipe is not None:
                # Each side notices on its own: at once, soon, or by keepalive.
                worker.pipe.cut(fault.a**3 * 60.0, fault.b**3 * 60.0)
                end = self.now + 60.0
        elif fault.kind == CRASH:
            downtime = fault.a * 30.0
            daemon.crash(downtime)
            end = self.now + downtime + 60.0
        elif fault.kind == COMMIT_CRASH:
            daemon.crash_on_commit = fault.a * 30.0
            end = self.now + 600.0
        elif fault.kind == SHUTDOWN:
            timeout, downtime = fault.a * 30.0, fault.b * 10.0
            daemon.shutdown(timeout, downtime)
            end = self.now + timeout + downtime + 60.0
        elif fault.kind == SLOW:
            pipe = worker.pipe
            if pipe is not None:
                pipe.trouble()
                pipe.slow_until = self.now + fault.a * 2 * lease
                # Each way its own: a renewal may arrive in time and its
                # answer too late, or the other way round.
                for way in (True, False):
                    pipe.slow_max[way] = fault.b * lease * self.rng.choice([0.1, 0.4, 1.0])
                end = pipe.slow_until + lease
        elif fault.kind == PAUSE:
            if worker.pipe is not None:
                worker.pipe.trouble()
            worker.paused_until = max(worker.paused_until, self.now + fault.a * 2 * lease)
            end = worker.paused_until + lease
        elif fault.kind == OUTAGE:
            for pipe in self.pipes:
                if pipe.stream is not None and pipe.stream.alive():
                    pipe.trouble()
            self.storage.down_until = self.now + fault.a * 10.0
            end = self.storage.down_until + 60.0
        else:
            raise ValueError(fault.kind)
        self.quiet_since = max(self.quiet_since, end)

    # -- properties ----------------------------------------------------------------------

    def check_step(self) -> None:
        """After every event: no worker runs more handlers than its
        concurrency, and what the daemon may still push to a live stream fits
        the slots its worker has free."""
        for worker in self.workers:
            running = len(worker.handlers)
            if running > worker.concurrency:
                self.violate(
                    CREDIT_FITS,
                    f"{worker} runs {running} handlers, concurrency {worker.concurrency}",
                )
            pipe = worker.pipe
            if pipe is None or not pipe.worker_open:
                continue
            stream = pipe.stream
            if stream is None or not stream.alive() or not stream.registered:
                continue
            session = stream.session
            held = session.leases
            outside = sum(
                1
                for h in worker.handlers.values()
                if (lease := held.get(h.log.token)) is None or lease.state is LeaseState.CLAIMED
            )
            client = worker.session
            if (
                session.state in (DState.OPEN, DState.DRAINED)
                and pipe.cut_at is None  # after a cut, answers are lost
                and client is not None
                and client.state in (State.ACTIVE, State.DRAINING)
                and pipe.mirror_after_flight(client.credit_mirror) != session.credit
            ):
                self.violate(
                    CREDIT_MIRROR,
                    f"stream {pipe.id}: the daemon's credit is {session.credit}, the worker's"
                    f" mirror {client.credit_mirror}, and"
                    f" {pipe.mirror_after_flight(client.credit_mirror)} once what is on the"
                    " wire has arrived",
                )
            if session.outstanding + session.credit + outside > worker.concurrency:
                self.violate(
                    CREDIT_FITS,
                    f"stream {pipe.id}: the daemon has {session.outstanding} outstanding and"
                    f" {session.credit} credit, {worker} runs {outside} other handler(s),"
                    f" concurrency {worker.concurrency}",
                )

    def check_end(self) -> None:
        storage = self.storage
        for log in storage.log:
            self.stats[f"lease {log.ending}"] += 1
        self.stats["events"] += self.events
        for task in storage.tasks.values():
            if task.state not in (SUCCEEDED, DEAD):
                self.violate(NO_TASK_LOST, f"{task.id} ends {task.state}")
        acked = Counter(log.task_id for log in storage.log if log.ending == "acked")
        for task_id, count in acked.items():
            if count > 1:
                self.violate(ONE_SUCCESS, f"{task_id} was acked {count} times")
        following: dict[str, LeaseLog] = {}
        for log in reversed(storage.log):
            after = following.get(log.task_id)
            following[log.task_id] = log
            if log.ending is None:
                self.violate(ENDS_ONCE, f"{log!r} never ended")
            if log.ending == "acked" and not log.ended_at < log.until:  # type: ignore[operator]
                self.violate(NO_EXPIRED_ACK, f"{log!r}")
            if log.ending in ("released", "returned") and (
                log.spent or (after is not None and after.attempt != log.attempt)
            ):
                self.violate(STOP_SPENDS_NOTHING, f"{log!r} spent its attempt (next: {after!r})")
            if log.released_by_stop and (
                log.ending not in ("released", "expired")
                or (log.ending == "expired" and self.pipes[log.stream].troubled_at > log.until)
            ):
                # Only a fault may keep its release from storage in time.
                self.violate(STOP_SPENDS_NOTHING, f"the stop gave back {log!r}")
            self._check_healthy(log)

    def _check_healthy(self, log: LeaseLog) -> None:
        """A lease pushed on a stream no fault touched, before its worker
        began to stop, ends as its handler decided: renewals kept it alive,
        nothing gave it up or handed it back on the way."""
        if log.pushed_at is None:
            return
        pipe = self.pipes[log.stream]
        ended = min(log.ended_at, log.until)  # type: ignore[type-var]
        if pipe.troubled_at <= ended or pipe.worker.stop_began <= ended:
            return
        wanted = {"ack": "acked", "nack": "nacked", "reject": "rejected", None: "?"}[log.decided]
        if log.ending != wanted:
            self.violate(
                HEALTHY_LEASES,
                f"{log!r} on healthy stream {pipe.id} ended {log.ending}, its handler"
                f" decided {log.decided}",
            )


def replay(scenario: Scenario) -> Simulation:
    """Run one scenario (what hypothesis printed) and check every property."""
    return Simulation(scenario).run()

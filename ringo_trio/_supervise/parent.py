"""`Supervisor`: N worker processes, replaced when fenced, stuck or dead.

Theory of operation
-------------------
Python cannot kill a thread or a coroutine: a handler that blocks the event
loop or ignores cancellation can only be stopped by ending its process. The
supervisor therefore runs each worker in a process of its own (``python -m
ringo_trio._cli worker ...``) and replaces processes, never tasks.

`Supervisor.run` owns one task group holding one *slot* task per process.
A slot starts its child, watches it until it exits, then asks the sans-IO
`RestartLedger` how long to wait before starting the next one — or learns
that the restart budget is spent, which ends the whole supervisor with
`SupervisorError` after draining the other processes. While a child runs,
the slot holds a second task group with three tasks:

* the **reader** of the child's report pipe (`ringo_trio._supervise.child`
  describes the messages): a ``fenced`` report gets the child SIGKILLed at
  once, since its worker took no new work and a handler in it will not stop;
* the **stall guard**: a child that sends nothing for `heartbeat timeout
  <Supervisor>` (a stopped process, or an interpreter stuck where even the
  child's own watchdog thread cannot run) is SIGKILLed too;
* the **drainer**, which waits for `Supervisor.close` (or a fatal error),
  sends the child SIGTERM — the worker drains within its grace period — and
  SIGKILLs it if it has not exited within the drain bound.

Each child is a session leader (its own process group), so a Ctrl-C at the
terminal reaches only the supervisor, which forwards one SIGTERM; a kill
goes to the whole group, so subprocesses a stuck handler started go with it.
Whatever way a slot ends — drained, failed, or cancelled with the
supervisor — its ``finally`` (shielded) SIGKILLs the group and reaps the
child, so no worker process outlives `Supervisor.run`. Should the supervisor
itself be SIGKILLed, the children see their report pipe break and drain.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta

import anyio
import anyio.abc

from .._client import TOKEN_ENV
from .._contract import limits as _limits
from .._errors import InvalidArgumentError, RingoError
from .._work._timeouts import TaskTimeouts
from .child import ENV_FD, EXIT_FENCED, stall_threshold

__all__ = [
    "TOKEN_ENV",
    "RestartLedger",
    "RestartPolicy",
    "SupervisedProcess",
    "Supervisor",
    "SupervisorError",
]

_log = logging.getLogger("ringo_trio.supervise")


#: Status of a worker process that could not start (bad options, a handler
#: that cannot be imported): restarting cannot help.
_EXIT_USAGE = 2
#: Added to grace period + cancel grace before a draining child is SIGKILLed:
#: closing the stream and the client after the handlers are done.
_DRAIN_MARGIN = 10.0
#: How long a new child may take to send its first report (interpreter
#: start, imports) before the stall guard gives up on it.
_STARTUP_TIMEOUT = 30.0
_MAX_LINE = 64 * 1024
_HANDLER_RE = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


class SupervisorError(RingoError):
    """The supervisor gave up: its restart budget is spent, or a worker process
    cannot start at all. The other processes were drained first."""


# -- restart policy (sans-IO) ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """When a supervisor replaces a worker process, and when it gives up.

    A slot's *n*-th consecutive restart waits ``initial_delay * 2**(n-1)``,
    at most ``max_delay``; a process that ran for ``healthy_after`` resets
    its slot to ``initial_delay``. At most ``max_restarts`` restarts (over
    all slots) may happen within any ``window``; one more is refused and
    the supervisor stops with `SupervisorError`.
    """

    initial_delay: timedelta = timedelta(seconds=0.5)
    max_delay: timedelta = timedelta(seconds=30)
    healthy_after: timedelta = timedelta(seconds=10)
    max_restarts: int = 10
    window: timedelta = timedelta(seconds=60)

    def __post_init__(self) -> None:
        for name in ("initial_delay", "max_delay", "healthy_after", "window"):
            value = getattr(self, name)
            if not isinstance(value, timedelta) or value <= timedelta(0):
                raise InvalidArgumentError(f"RestartPolicy.{name} must be a positive timedelta")
        if self.max_delay < self.initial_delay:
            raise InvalidArgumentError("RestartPolicy.max_delay must be >= initial_delay")
        restarts = self.max_restarts
        if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < 0:
            raise InvalidArgumentError("RestartPolicy.max_restarts must be an integer >= 0")


class RestartLedger:
    """The restart decisions of a `RestartPolicy`, with time passed in (seconds)."""

    def __init__(self, policy: RestartPolicy) -> None:
        self._initial = policy.initial_delay.total_seconds()
        self._max = policy.max_delay.total_seconds()
        self._healthy_after = policy.healthy_after.total_seconds()
        self._budget = policy.max_restarts
        self._window = policy.window.total_seconds()
        self._delays: dict[int, float] = {}
        self._granted: collections.deque[float] = collections.deque()

    def child_exited(self, slot: int, *, started: float, now: float) -> float | None:
        """A child of ``slot`` that started at ``started`` exited at ``now``: the
        seconds to wait before starting its replacement, or None when the
        budget is spent (nothing is recorded then)."""
        if now - started >= self._healthy_after:
            self._delays.pop(slot, None)
        granted = self._granted
        # A restart granted at t counts while now - t < window.
        while granted and now - granted[0] >= self._window:
            granted.popleft()
        if len(granted) >= self._budget:
            return None
        granted.append(now)
        delay = self._delays.get(slot)
        delay = self._initial if delay is None else min(self._max, delay * 2)
        self._delays[slot] = delay
        return delay


# -- the supervisor ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SupervisedProcess:
    """A worker process a `Supervisor` runs right now."""

    slot: int
    pid: int
    #: The worker's id once it registered with the daemon, else None.
    worker_id: str | None


class _Child:
    """One running worker process and what the slot knows about it."""

    def __init__(self, slot: int, process: anyio.abc.Process, read_fd: int, now: float) -> None:
        self.slot = slot
        self.process = process
        self.read_fd = read_fd
        self.started = now
        self.last_report = now
        self.reported = False
        self.worker_id: str | None = None
        #: Why we SIGKILLed it; None while we have not.
        self.killed: str | None = None
        self.exited = anyio.Event()

    @property
    def name(self) -> str:
        return f"process #{self.slot} (pid {self.process.pid})"

    def signal_group(self, signum: int) -> None:
        # Only while unreaped: a reaped child's pid (its group id) may be reused.
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signum)

    def kill(self, why: str, detail: str = "") -> None:
        """SIGKILL its group, once; ``why`` names the cause in later messages."""
        if self.killed is not None or self.process.returncode is not None:
            return
        self.killed = why
        _log.warning("%s %s%s; killing it", self.name, why, detail)
        self.signal_group(signal.SIGKILL)

    def describe_exit(self) -> str:
        code = self.process.returncode
        if self.killed is not None:
            return f"was killed ({self.killed})"
        if code == EXIT_FENCED:
            return f"exited fenced (status {EXIT_FENCED})"
        if code is not None and code < 0:
            try:
                return f"died of {signal.Signals(-code).name}"
            except ValueError:
                return f"died of signal {-code}"
        return f"exited with status {code}"


@dataclass
class _Run:
    #: One for the run, shared by its slots: the budget is global.
    ledger: RestartLedger
    draining: anyio.Event = field(default_factory=anyio.Event)
    #: Every slot's process was ready once, or the run is draining already.
    started: anyio.Event = field(default_factory=anyio.Event)
    done: anyio.Event = field(default_factory=anyio.Event)
    ready_slots: set[int] = field(default_factory=set)
    fatal: SupervisorError | None = None

    def drain(self) -> None:
        self.draining.set()
        self.started.set()


class Supervisor:
    """Runs ``processes`` worker processes of ``handler`` on ``queue`` and keeps them running.

    ``handler`` is ``"module:function"``, imported by each worker process
    (from the current directory too). Workers connect to ``endpoint`` (with
    ``token``, and ``tls_ca``/``tls_cert``/``tls_key`` as in
    ``Ringo.connect``), or share the one local daemon of ``data_dir``
    (``Ringo.local(data_dir, shared=True)``). ``concurrency``,
    ``task_types``, ``lease_duration``, ``grace_period`` and
    ``task_timeouts`` configure every worker as in ``queue.worker(...)``.

    A process is replaced when its worker is fenced (a handler ignored
    cancellation past ``task_timeouts.cancel_grace``), when its event loop
    was blocked for ``stall_timeout`` (default: `stall_threshold`), when it
    sent no heartbeat for ``stall_timeout + max(1 s, stall_timeout / 2)``,
    or when it exited; restarts follow ``restarts`` (`RestartPolicy`).

    ``await task_group.start(supervisor.run)`` returns once every process
    has registered its worker (or the supervisor is stopping already).
    ``run()`` returns once `close` drained every process; it raises
    `SupervisorError` when the restart budget is spent or a process cannot
    start (status 2). Cancelling ``run()`` SIGKILLs every process.
    """

    def __init__(
        self,
        handler: str,
        *,
        queue: str,
        processes: int = 1,
        endpoint: str | None = None,
        token: str | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        concurrency: int = 1,
        task_types: Iterable[str] | None = None,
        lease_duration: timedelta = _limits.DEFAULT_LEASE,
        grace_period: timedelta = timedelta(seconds=30),
        task_timeouts: TaskTimeouts | None = None,
        stall_timeout: timedelta | None = None,
        restarts: RestartPolicy | None = None,
        tls_ca: str | os.PathLike[str] | None = None,
        tls_cert: str | os.PathLike[str] | None = None,
        tls_key: str | os.PathLike[str] | None = None,
    ) -> None:
        if not isinstance(handler, str) or not _HANDLER_RE.fullmatch(handler):
            raise InvalidArgumentError(f"handler {handler!r} must look like module:function")
        if not isinstance(queue, str) or not queue:
            raise InvalidArgumentError("queue must be a non-empty string")
        for name, number in (("processes", processes), ("concurrency", concurrency)):
            if isinstance(number, bool) or not isinstance(number, int) or number < 1:
                raise InvalidArgumentError(f"{name} must be a positive integer")
        if (endpoint is None) == (data_dir is None):
            raise InvalidArgumentError("give exactly one of endpoint and data_dir")
        if token is not None and endpoint is None:
            raise InvalidArgumentError("token needs endpoint")
        tls = {"--tls-ca": tls_ca, "--tls-cert": tls_cert, "--tls-key": tls_key}
        if endpoint is None and any(path is not None for path in tls.values()):
            raise InvalidArgumentError("tls_ca, tls_cert and tls_key need endpoint")
        for name, value in (("lease_duration", lease_duration), ("grace_period", grace_period)):
            if not isinstance(value, timedelta) or value < timedelta(0):
                raise InvalidArgumentError(f"{name} must be a non-negative timedelta")
        if task_timeouts is not None and not isinstance(task_timeouts, TaskTimeouts):
            raise InvalidArgumentError("task_timeouts must be a TaskTimeouts")
        if stall_timeout is not None and (
            not isinstance(stall_timeout, timedelta) or stall_timeout <= timedelta(0)
        ):
            raise InvalidArgumentError("stall_timeout must be a positive timedelta")
        self._handler = handler
        self._queue = queue
        self._processes = processes
        self._endpoint = endpoint
        self._token = token
        # Absolute: the workers may start in another directory.
        self._tls = {
            flag: os.path.abspath(os.fspath(path)) for flag, path in tls.items() if path is not None
        }
        self._data_dir = None if data_dir is None else os.path.abspath(os.fspath(data_dir))
        self._concurrency = concurrency
        self._task_types = tuple(task_types or ())
        self._lease_duration = lease_duration
        self._grace_period = grace_period
        self._task_timeouts = task_timeouts
        self._stall = stall_threshold(task_timeouts, lease_duration, stall_timeout)
        self._restarts = restarts if restarts is not None else RestartPolicy()
        if not isinstance(self._restarts, RestartPolicy):
            raise InvalidArgumentError("restarts must be a RestartPolicy")
        stall = self._stall.total_seconds()
        self.heartbeat_timeout = stall + max(1.0, stall / 2)
        cancel_grace = task_timeouts.cancel_grace if task_timeouts is not None else timedelta(0)
        self.drain_timeout = (grace_period + cancel_grace).total_seconds() + _DRAIN_MARGIN
        self._children: dict[int, _Child] = {}
        self._run: _Run | None = None
        self._close_requested = False

    def __repr__(self) -> str:
        return f"<Supervisor {self._handler} queue={self._queue!r} processes={self._processes}>"

    @property
    def children(self) -> tuple[SupervisedProcess, ...]:
        """The worker processes running right now, by slot."""
        return tuple(
            SupervisedProcess(slot, child.process.pid, child.worker_id)
            for slot, child in sorted(self._children.items())
            if child.process.returncode is None
        )

    def worker_argv(self) -> list[str]:
        """The command line of one worker process."""
        argv = [sys.executable, "-m", "ringo_trio._cli", "worker", self._handler]
        argv += ["--queue", self._queue, "--concurrency", str(self._concurrency)]
        if self._endpoint is not None:
            argv += ["--endpoint", self._endpoint]
            for flag, path in self._tls.items():
                argv += [flag, path]
        else:
            assert self._data_dir is not None
            argv += ["--data-dir", self._data_dir, "--shared"]
        for task_type in self._task_types:
            argv += ["--task-type", task_type]
        argv += ["--lease-duration", _seconds(self._lease_duration)]
        argv += ["--grace-period", _seconds(self._grace_period)]
        timeouts = self._task_timeouts
        if timeouts is not None:
            if timeouts.start_to_close is not None:
                argv += ["--start-to-close", _seconds(timeouts.start_to_close)]
            if timeouts.no_start is not None:
                argv += ["--no-start", _seconds(timeouts.no_start)]
            argv += ["--cancel-grace", _seconds(timeouts.cancel_grace)]
            if timeouts.heartbeat is not None:
                argv += ["--heartbeat-timeout", _seconds(timeouts.heartbeat)]
        argv += ["--stall-timeout", _seconds(self._stall)]
        return argv

    def _environment(self, report_fd: int) -> dict[str, str]:
        env = {**os.environ, ENV_FD: str(report_fd)}
        env.pop(TOKEN_ENV, None)
        if self._token is not None:
            # Not on the command line, which every local user can read.
            env[TOKEN_ENV] = self._token
        return env

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Start the processes and keep them running until `close` (see the class)."""
        if self._run is not None:
            raise RuntimeError("Supervisor.run can be called only once")
        run = self._run = _Run(RestartLedger(self._restarts))
        if self._close_requested:
            run.drain()
        _log.info(
            "supervising %d worker process(es) of %s on queue %r (stall threshold %g s)",
            self._processes,
            self._handler,
            self._queue,
            self._stall.total_seconds(),
        )
        try:
            async with anyio.create_task_group() as group:
                for slot in range(self._processes):
                    group.start_soon(self._slot, run, slot)
                await run.started.wait()
                task_status.started()
        finally:
            run.done.set()
        if run.fatal is not None:
            raise run.fatal

    async def close(self) -> None:
        """Drain every process (SIGTERM; SIGKILL after the drain bound) and
        wait until `run` has returned. Safe from any task, any number of times."""
        self._close_requested = True
        run = self._run
        if run is None:
            return
        run.drain()
        await run.done.wait()

    # -- slots ------------------------------------------------------------------

    def _give_up(self, run: _Run, message: str) -> None:
        if run.fatal is None:
            _log.error("%s; draining the other processes", message)
            run.fatal = SupervisorError(message)
        run.drain()

    async def _slot(self, run: _Run, slot: int) -> None:
        while not run.draining.is_set():
            child = await self._run_child(run, slot)
            if run.draining.is_set():
                return
            code = child.process.returncode
            if child.killed is None and code == _EXIT_USAGE:
                self._give_up(
                    run,
                    f"{child.name} exited with status {_EXIT_USAGE} (bad options or a handler"
                    " that cannot be imported; see its message above); not restarting",
                )
                return
            delay = run.ledger.child_exited(slot, started=child.started, now=anyio.current_time())
            if delay is None:
                policy = self._restarts
                self._give_up(
                    run,
                    f"restart budget exhausted: {child.name} {child.describe_exit()} after"
                    f" {policy.max_restarts} restart(s) within"
                    f" {policy.window.total_seconds():g} s",
                )
                return
            _log.warning("%s %s; restarting in %g s", child.name, child.describe_exit(), delay)
            with anyio.move_on_after(delay):
                await run.draining.wait()

    async def _run_child(self, run: _Run, slot: int) -> _Child:
        read_fd, write_fd = os.pipe()
        try:
            os.set_blocking(read_fd, False)
            try:
                process = await anyio.open_process(
                    self.worker_argv(),
                    stdin=subprocess.DEVNULL,
                    stdout=None,
                    stderr=None,
                    env=self._environment(write_fd),
                    pass_fds=(write_fd,),
                    start_new_session=True,
                )
            finally:
                # Ours must go, or the pipe never reports EOF when the child exits.
                os.close(write_fd)
            child = _Child(slot, process, read_fd, anyio.current_time())
            self._children[slot] = child
            try:
                async with anyio.create_task_group() as group:
                    group.start_soon(self._read_reports, run, child)
                    group.start_soon(self._guard, child)
                    group.start_soon(self._drain, run, child)
                    await process.wait()
                    # Kill leftovers of its group before anything else runs
                    # (its id stays reserved only while the group lives).
                    _kill_group_leftovers(process.pid)
                    child.exited.set()
                    group.cancel_scope.cancel()
            finally:
                with anyio.CancelScope(shield=True):
                    child.signal_group(signal.SIGKILL)
                    await process.aclose()
                    self._children.pop(slot, None)
        finally:
            os.close(read_fd)
        return child

    async def _read_reports(self, run: _Run, child: _Child) -> None:
        buffer = b""
        while True:
            await anyio.wait_readable(child.read_fd)
            try:
                chunk = os.read(child.read_fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                return  # every writer is gone: the child exited
            child.last_report = anyio.current_time()
            child.reported = True
            *lines, buffer = (buffer + chunk).split(b"\n")
            if len(buffer) > _MAX_LINE:
                buffer = b""  # not one of our messages; drop it
            for line in lines:
                self._on_report(run, child, line)

    def _on_report(self, run: _Run, child: _Child, line: bytes) -> None:
        try:
            message = json.loads(line)
        except ValueError:
            return
        if not isinstance(message, dict):
            return
        kind = message.get("kind")
        if kind == "ready":
            child.worker_id = str(message.get("worker_id"))
            _log.info("%s ready: worker %s", child.name, child.worker_id)
            run.ready_slots.add(child.slot)
            if len(run.ready_slots) == self._processes:
                run.started.set()
        elif kind == "fenced":
            child.kill("fenced", f": {message.get('reason')}")

    async def _guard(self, child: _Child) -> None:
        while True:
            limit = self.heartbeat_timeout if child.reported else _STARTUP_TIMEOUT
            silent = anyio.current_time() - child.last_report
            if silent >= limit:
                what = "heartbeat" if child.reported else "report since it started"
                child.kill(
                    f"sent no {what} for {silent:.1f} s",
                    " (stopped, or stuck where no Python code runs)",
                )
                return
            # Re-evaluated at least every heartbeat timeout: the first report
            # switches from the startup limit to the (shorter) heartbeat one.
            await anyio.sleep(min(limit - silent, self.heartbeat_timeout))

    async def _drain(self, run: _Run, child: _Child) -> None:
        await run.draining.wait()
        if child.process.returncode is None:
            child.process.send_signal(signal.SIGTERM)
        with anyio.move_on_after(self.drain_timeout):
            await child.exited.wait()
            return
        child.kill(f"did not drain within {self.drain_timeout:g} s")


def _kill_group_leftovers(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _seconds(value: timedelta) -> str:
    return repr(value.total_seconds())

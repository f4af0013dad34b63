"""The ``ringo`` command line.

``ringo demo``
    The README's main job, end to end on the embedded default: a private
    daemon on SQLite, N tasks enqueued with ``enqueue_many``, ONE credit
    controlled `Worker` working them off (injected sleeps and failures), a
    live progress bar, then a summary table checked against the daemon.

``ringo worker module:function --queue Q``
    Run a handler as a worker of one queue, against a daemon (``--endpoint``)
    or the data dir's shared local daemon (``--data-dir``, which every other
    ``ringo`` command on that dir attaches to; ``--private``: a daemon of its
    own that holds the dir alone), until SIGINT or SIGTERM; the first signal drains gracefully
    (`Worker.close`), a second one stops at once. Started by a supervisor it
    also runs the loop watchdog (`ringo_trio._supervise.child`).

``ringo supervise module:function --queue Q --processes N``
    Run N ``ringo worker`` processes under a `Supervisor` (docs/supervision.md)
    until SIGINT or SIGTERM, which drain them all; a second one kills them.

Exit codes: 0 success, 1 failure (a demo task unaccounted for, the daemon
gone, a supervisor's restart budget spent), 2 usage (bad flags, a handler
that cannot be imported), 75 a worker fenced (a handler would not stop),
130 a second Ctrl-C, 141 (`EXIT_BROKEN_PIPE`, as if killed by SIGPIPE) the
reader of stdout gone (``| head``), quietly.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import sys
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, ExitStack
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import trio

from .._client import Ringo
from .._errors import (
    InvalidArgumentError,
    RingoError,
    WorkerFencedError,
)
from .._supervise.child import (
    EXIT_FENCED,
    report_ready,
    stall_threshold,
    supervised,
    watch_event_loop,
)
from .._supervise.parent import TOKEN_ENV, RestartPolicy, Supervisor
from .._tasks.registry import TaskRegistry
from .._work._gc import tune_gc
from .._work._handlers import Handler
from .._work._timeouts import TaskTimeouts
from . import demo as _demo
from . import limits as _limits
from . import ops as _ops
from . import schedules as _schedules
from .load import UsageError, load_object
from .ops import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from .table import reader_gone

#: The defaults `ringo supervise` shows and starts from.
_RESTARTS = RestartPolicy()


def _run_demo(args: argparse.Namespace) -> int:
    problems = []
    if args.tasks < 1:
        problems.append("--tasks must be >= 1")
    if args.concurrency < 1:
        problems.append("--concurrency must be >= 1")
    if not 1 <= args.batch <= 1000:
        problems.append("--batch must be between 1 and 1000")
    if not 0.0 <= args.failure_rate <= 1.0:
        problems.append("--failure-rate must be in [0, 1]")
    if not args.sleep >= 0.0:
        problems.append("--sleep must be >= 0")
    if not 1 <= args.max_attempts <= 1000:
        problems.append("--max-attempts must be between 1 and 1000")
    if problems:
        print(f"ringo demo: {'; '.join(problems)}", file=sys.stderr)
        return EXIT_USAGE
    # The bar goes where a person watches: the terminal on stdout, else stderr
    # (so that a redirected stdout holds just the report).
    bar_out = sys.stdout if sys.stdout.isatty() else sys.stderr
    with ExitStack() as stack:
        data_dir = args.data_dir
        if data_dir is None:
            data_dir = stack.enter_context(
                tempfile.TemporaryDirectory(prefix="ringo-demo-", ignore_cleanup_errors=True)
            )
        tune_gc()
        return _trio_main("ringo demo", _demo.demo, args, data_dir, sys.stdout, bar_out)


# -- ringo worker -------------------------------------------------------------


def load_handler(spec: str) -> Handler | TaskRegistry:
    """Import ``module:function`` or ``module:registry`` (a `TaskRegistry`);
    `UsageError` if it fails."""
    try:
        target = load_object(spec)
    except ModuleNotFoundError as exc:
        raise UsageError(f"cannot import module {exc.name!r}: {exc}") from None
    if isinstance(target, TaskRegistry):
        return target
    if not callable(target):
        raise UsageError(f"{spec} is a {type(target).__name__}, not a callable or a TaskRegistry")
    handler: Handler = target
    return handler


def _line(text: str, *, err: bool = False) -> None:
    """One line to stdout (or stderr) in one write: the worker processes of
    a supervisor share its output, and two writes per line (print under
    PYTHONUNBUFFERED) would interleave theirs."""
    stream = sys.stderr if err else sys.stdout
    stream.write(text + "\n")
    stream.flush()


class _StderrLines(logging.Handler):
    """The SDK's handler outcomes (`ringo_trio` loggers) as whole lines on
    stderr: a retry the handler asked for is INFO, not a failure; a crash
    comes with its traceback."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception:
            self.handleError(record)
            return
        _line(text, err=True)


def _log_handler_outcomes() -> None:
    handler = _StderrLines()
    handler.setFormatter(logging.Formatter("ringo worker: %(levelname)s %(message)s"))
    logger = logging.getLogger("ringo_trio")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)


@dataclass
class _WorkerState:
    stop: Callable[[], None] | None = None  # set once registered: starts the drain
    forced: bool = False


def _drain_or_stop(state: _WorkerState, scope: trio.CancelScope, why: str, grace: float) -> None:
    """The first request drains (once registered); before registration, or a
    second time, stop at once."""
    if state.stop is None:
        # Not registered yet (or a second signal): nothing to drain, stop now.
        state.forced = True
        _line(f"ringo worker: {why}, stopping now", err=True)
        scope.cancel()
        return
    _line(
        f"ringo worker: {why}, draining (grace period {grace:g} s; send it again to stop at once)",
        err=True,
    )
    stop, state.stop = state.stop, None
    stop()


async def _watch_signals(
    signals: Any, state: _WorkerState, scope: trio.CancelScope, grace: float
) -> None:
    async for signum in signals:
        _drain_or_stop(state, scope, signal.Signals(signum).name, grace)
        if state.forced:
            return


def _task_timeouts(args: argparse.Namespace) -> TaskTimeouts | None:
    """`TaskTimeouts` from --start-to-close / --no-start / --cancel-grace /
    --heartbeat-timeout; None if none given."""
    names = ("start_to_close", "no_start", "cancel_grace", "heartbeat_timeout")
    if all(getattr(args, name) is None for name in names):
        return None
    given: dict[str, Any] = {
        name: timedelta(seconds=value)
        for name, value in (
            ("start_to_close", args.start_to_close),
            ("no_start", args.no_start),
            ("cancel_grace", args.cancel_grace),
            ("heartbeat", args.heartbeat_timeout),
        )
        if value is not None
    }
    return TaskTimeouts(**given)


def _stall(args: argparse.Namespace, timeouts: TaskTimeouts | None) -> timedelta:
    explicit = None if args.stall_timeout is None else timedelta(seconds=args.stall_timeout)
    return stall_threshold(timeouts, timedelta(seconds=args.lease_duration), explicit)


async def _worker_main(args: argparse.Namespace, handler: Handler | TaskRegistry) -> int:
    _log_handler_outcomes()
    state = _WorkerState()
    grace = float(args.grace_period)
    timeouts = _task_timeouts(args)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as outer:
            outer.start_soon(_watch_signals, signals, state, outer.cancel_scope, grace)
            async with AsyncExitStack() as stack:
                if supervised():
                    # Heartbeats to the supervisor, and the thread that fences
                    # a blocked event loop; a vanished supervisor drains us.
                    await stack.enter_async_context(
                        watch_event_loop(
                            _stall(args, timeouts),
                            on_supervisor_lost=lambda: _drain_or_stop(
                                state, outer.cancel_scope, "supervisor gone", grace
                            ),
                        )
                    )
                client = (
                    _ops.connect(args)
                    if args.endpoint is not None
                    else Ringo.local(args.data_dir, shared=not args.private)
                )
                async with client:
                    options: dict[str, Any] = dict(
                        concurrency=args.concurrency,
                        prefetch=args.prefetch,
                        lease_duration=timedelta(seconds=args.lease_duration),
                        grace_period=timedelta(seconds=grace),
                        stop_timeout=timedelta(seconds=args.stop_timeout),
                        task_timeouts=timeouts,
                    )
                    if isinstance(handler, TaskRegistry):
                        # Its tasks' schedules stored before it takes work.
                        await handler.apply_schedules(client, queue=args.queue)
                        worker = handler.worker(client, queue=args.queue, **options)
                    else:
                        worker = client.queue(args.queue).worker(
                            handler, task_types=args.task_type or None, **options
                        )
                    async with trio.open_nursery() as nursery:
                        await nursery.start(worker.run)
                        _line(
                            f"ringo worker: registered {worker.worker_id} on queue {args.queue!r}"
                            f" at {client.endpoint} (concurrency {args.concurrency})"
                        )
                        report_ready(worker.worker_id)
                        state.stop = lambda: nursery.start_soon(worker.close)
                    # worker.run returned: closed by a signal (drained), or failed.
                    state.stop = None
            outer.cancel_scope.cancel()
    if state.forced:
        return EXIT_INTERRUPTED
    _line("ringo worker: drained, bye", err=True)
    return EXIT_OK


def _positive(args: argparse.Namespace, *names: str) -> list[str]:
    """Problems with options that, when given, must be positive numbers of seconds."""
    problems = []
    for name in names:
        value = getattr(args, name)
        if value is not None and not (0 < value < math.inf):
            problems.append(f"--{name.replace('_', '-')} must be > 0")
    return problems


def _worker_problems(args: argparse.Namespace) -> list[str]:
    """Problems with the options `ringo worker` and `ringo supervise` share."""
    problems = []
    if (args.endpoint is None) == (args.data_dir is None):
        problems.append("give exactly one of --endpoint and --data-dir")
    if args.token is not None and args.endpoint is None:
        problems.append("--token needs --endpoint")
    problems += _ops.tls_problems(args)
    if args.concurrency < 1:
        problems.append("--concurrency must be >= 1")
    if not args.lease_duration > 0:
        problems.append("--lease-duration must be > 0")
    if not args.grace_period >= 0:
        problems.append("--grace-period must be >= 0")
    problems += _positive(args, "stop_timeout") if hasattr(args, "stop_timeout") else []
    problems += _positive(
        args, "start_to_close", "no_start", "cancel_grace", "heartbeat_timeout", "stall_timeout"
    )
    return problems


def _run_worker(args: argparse.Namespace) -> int:
    problems = _worker_problems(args)
    if args.shared and args.data_dir is None:
        problems.append("--shared needs --data-dir")
    if args.private and args.data_dir is None:
        problems.append("--private needs --data-dir")
    if args.prefetch < 0:
        problems.append("--prefetch must be >= 0")
    if problems:
        _line(f"ringo worker: {'; '.join(problems)}", err=True)
        return EXIT_USAGE
    try:
        handler = load_handler(args.handler)
        if isinstance(handler, TaskRegistry):
            if args.task_type:
                raise UsageError("--task-type does not apply to a TaskRegistry (it runs its tasks)")
            if not handler.on_queue(args.queue):
                raise UsageError(f"{args.handler} has no task on queue {args.queue!r}")
    except UsageError as exc:
        _line(f"ringo worker: {exc}", err=True)
        return EXIT_USAGE
    tune_gc()  # this process is the worker's: ringo_trio/_work/_gc.py
    return _trio_main("ringo worker", _worker_main, args, handler)


# -- ringo supervise ----------------------------------------------------------


async def _supervise_main(args: argparse.Namespace, supervisor: Supervisor) -> int:
    forced = False
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def watch_signals() -> None:
                nonlocal forced
                draining = False
                async for signum in signals:
                    name = signal.Signals(signum).name
                    if draining:
                        _line(
                            f"ringo supervise: {name} again, killing the worker processes", err=True
                        )
                        forced = True
                        nursery.cancel_scope.cancel()
                        return
                    draining = True
                    _line(
                        f"ringo supervise: {name}, draining the worker processes (send it"
                        " again to kill them at once)",
                        err=True,
                    )
                    nursery.start_soon(supervisor.close)

            nursery.start_soon(watch_signals)
            await supervisor.run()
            nursery.cancel_scope.cancel()
    if forced:
        return EXIT_INTERRUPTED
    _line("ringo supervise: drained, bye", err=True)
    return EXIT_OK


def _run_supervise(args: argparse.Namespace) -> int:
    problems = _worker_problems(args)
    if args.processes < 1:
        problems.append("--processes must be >= 1")
    if args.restart_budget < 0:
        problems.append("--restart-budget must be >= 0")
    problems += _positive(args, "restart_window")
    supervisor = None
    if not problems:
        try:
            supervisor = Supervisor(
                args.handler,
                queue=args.queue,
                processes=args.processes,
                endpoint=args.endpoint,
                token=args.token or (os.environ.get(TOKEN_ENV) if args.endpoint else None),
                tls_ca=args.tls_ca,
                tls_cert=args.tls_cert,
                tls_key=args.tls_key,
                data_dir=args.data_dir,
                concurrency=args.concurrency,
                task_types=args.task_type,
                lease_duration=timedelta(seconds=args.lease_duration),
                grace_period=timedelta(seconds=args.grace_period),
                task_timeouts=_task_timeouts(args),
                stall_timeout=(
                    None if args.stall_timeout is None else timedelta(seconds=args.stall_timeout)
                ),
                restarts=RestartPolicy(
                    max_restarts=args.restart_budget,
                    window=timedelta(seconds=args.restart_window),
                ),
            )
        except InvalidArgumentError as exc:
            problems.append(str(exc))
    if problems or supervisor is None:
        _line(f"ringo supervise: {'; '.join(problems)}", err=True)
        return EXIT_USAGE
    log = logging.getLogger("ringo_trio.supervise")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("ringo supervise: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    return _trio_main("ringo supervise", _supervise_main, args, supervisor)


# -- running ------------------------------------------------------------------


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


def _trio_main(prog: str, fn: Callable[..., Awaitable[int]], *args: Any) -> int:
    """`trio.run`, with expected failures (also inside exception groups) as one line."""
    # The demo's progress bar may have left the cursor mid-line.
    nl = "\n" if prog == "ringo demo" else ""
    try:
        return trio.run(fn, *args)
    except BaseException as error:
        leaves = _leaves(error)
        if any(isinstance(leaf, KeyboardInterrupt) for leaf in leaves):
            _line(f"{nl}{prog}: interrupted", err=True)
            return EXIT_INTERRUPTED
        if any(isinstance(leaf, BrokenPipeError) for leaf in leaves):
            raise BrokenPipeError from error  # `main` leaves quietly
        fenced = [leaf for leaf in leaves if isinstance(leaf, WorkerFencedError)]
        if fenced:
            _line(f"{prog}: {type(fenced[0]).__name__}: {fenced[0]}", err=True)
            return EXIT_FENCED
        if all(isinstance(leaf, RingoError | OSError) for leaf in leaves):
            for leaf in leaves:
                _line(f"{nl}{prog}: {type(leaf).__name__}: {leaf}", err=True)
            return EXIT_FAILURE
        raise


# -- parsing ------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ringo", description="Ringo task queue tools")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser(
        "demo",
        help="enqueue and work off tasks on a private SQLite daemon, then summarize",
        description="Start a private daemon on SQLite, enqueue tasks, work them off with one"
        " worker while showing a progress bar, and print a summary checked against the daemon.",
    )
    demo.add_argument("-n", "--tasks", type=int, default=10_000, help="tasks to run (10000)")
    demo.add_argument(
        "-c", "--concurrency", type=int, default=64, help="handlers running at once (64)"
    )
    demo.add_argument(
        "--batch", type=int, default=1000, help="tasks per enqueue_many call, at most 1000 (1000)"
    )
    demo.add_argument(
        "--failure-rate",
        type=float,
        default=0.05,
        help="probability that an attempt fails and is retried at once (0.05)",
    )
    demo.add_argument("--sleep", type=float, default=0.0, help="seconds each handler sleeps (0)")
    demo.add_argument(
        "--max-attempts", type=int, default=3, help="attempts per task before it is DEAD (3)"
    )
    demo.add_argument("--queue", default="demo", help="queue name (demo)")
    demo.add_argument("--data-dir", default=None, help="data dir (default: a fresh temp dir)")

    worker = commands.add_parser(
        "worker",
        help="run module:function or module:registry as a worker of a queue until Ctrl-C",
        description="Run a handler `async def handle(task, ctx)`, or every task of a"
        " TaskRegistry on the queue, as a worker. The first SIGINT"
        " or SIGTERM drains (no new tasks; running handlers get the grace period), a second"
        " one stops at once.",
    )
    _worker_options(worker)
    worker.add_argument(
        "--prefetch",
        type=int,
        default=0,
        help="leased tasks held beyond --concurrency, waiting for a slot (0); pays for many"
        " short tasks",
    )
    worker.add_argument(
        "--stop-timeout",
        type=float,
        default=5.0,
        help="seconds a stopping worker waits for cancelled handlers to exit and their"
        " leases to be released (5)",
    )
    # Shared is the default with --data-dir: `ringo queues --data-dir D` and
    # the other commands attach to the data dir's shared daemon, and a private
    # one would hold D alone ("held by another ringod"), so the README's
    # `ringo worker ... --data-dir D` then `ringo queues --data-dir D` failed.
    sharing = worker.add_mutually_exclusive_group()
    sharing.add_argument(
        "--shared",
        action="store_true",
        help="with --data-dir: the default (the data dir's one daemon, shared with the other"
        " ringo commands and processes on it); kept for old scripts",
    )
    sharing.add_argument(
        "--private",
        action="store_true",
        help="with --data-dir: a daemon of this worker's own, holding the data dir alone"
        " (other ringo commands on it are refused while it runs)",
    )

    supervise = commands.add_parser(
        "supervise",
        help="run N worker processes of module:function, replacing fenced or dead ones",
        description="Run --processes worker processes (`ringo worker` each) and keep them"
        " running: a process whose handler ignored cancellation, blocked the event loop or"
        " stopped heartbeating is killed and replaced, and so is one that died, with"
        " exponential backoff (0.5 s doubling to 30 s) within a restart budget. SIGINT or"
        " SIGTERM drains every process; a second one kills them. With --data-dir the"
        " processes share the data dir's one local daemon.",
    )
    _worker_options(supervise)
    supervise.add_argument(
        "-p", "--processes", type=int, default=1, help="worker processes to run (1)"
    )
    supervise.add_argument(
        "--restart-budget",
        type=int,
        default=_RESTARTS.max_restarts,
        help=f"restarts allowed within --restart-window; one more stops the supervisor"
        f" with status 1 ({_RESTARTS.max_restarts})",
    )
    supervise.add_argument(
        "--restart-window",
        type=float,
        default=_RESTARTS.window.total_seconds(),
        help=f"seconds the restart budget counts over ({_RESTARTS.window.total_seconds():g})",
    )
    _ops.add_commands(commands)
    _schedules.add_commands(commands)
    _limits.add_commands(commands)
    return parser


def _worker_options(parser: argparse.ArgumentParser) -> None:
    """The options of one worker, shared by `ringo worker` and `ringo supervise`."""
    parser.add_argument(
        "handler",
        help="the handler, as module:function, or a TaskRegistry, as module:registry"
        " (module may be in .)",
    )
    parser.add_argument("-q", "--queue", required=True, help="queue to work on")
    parser.add_argument("--endpoint", default=None, help="daemon to connect to (host:port or URL)")
    parser.add_argument(
        "--data-dir",
        default=None,
        help="use the data dir's shared local daemon (started if none runs)",
    )
    parser.add_argument(
        "--token",
        default=None,
        help=f"bearer token for --endpoint (default: ${TOKEN_ENV}, which, unlike a flag,"
        " other users cannot read through ps)",
    )
    _ops.tls_options(parser)
    parser.add_argument(
        "-c", "--concurrency", type=int, default=1, help="handlers running at once (1)"
    )
    parser.add_argument(
        "--task-type",
        action="append",
        default=[],
        help="only these task types (repeatable; default all)",
    )
    parser.add_argument(
        "--lease-duration", type=float, default=60.0, help="lease duration, seconds (60)"
    )
    parser.add_argument(
        "--grace-period",
        type=float,
        default=30.0,
        help="seconds running handlers get to finish on shutdown (30)",
    )
    parser.add_argument(
        "--start-to-close",
        type=float,
        default=None,
        help="seconds one handler call may run before it is cancelled (no limit)",
    )
    parser.add_argument(
        "--no-start",
        type=float,
        default=None,
        help="seconds a delivered task may wait for its handler to start (no limit)",
    )
    parser.add_argument(
        "--cancel-grace",
        type=float,
        default=None,
        help="seconds a cancelled handler may take to exit before the worker is fenced (10)",
    )
    parser.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=None,
        help="seconds a handler may go without ctx.mark_progress / report_progress before it"
        " is cancelled (no limit)",
    )
    parser.add_argument(
        "--stall-timeout",
        type=float,
        default=None,
        help="under a supervisor: seconds the event loop may be blocked before the process"
        " is replaced (default: the lease duration, or start-to-close + cancel-grace when"
        " that is smaller)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    try:
        status = _main(argv)
        # Buffered output meets a closed pipe here at the latest.
        sys.stdout.flush()
    except BrokenPipeError:
        # `ringo tasks list Q | head`: the reader has what it wanted.
        return reader_gone()
    return status


def _main(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "demo":
        return _run_demo(args)
    if args.command == "worker":
        return _run_worker(args)
    if args.command == "supervise":
        return _run_supervise(args)
    if args.command in _ops.OPS_COMMANDS:
        return _trio_main(f"ringo {args.command}", args.ops_run, args)
    return EXIT_USAGE  # pragma: no cover - argparse requires a command

"""The operator commands of `ringo`: queues, tasks (list, show, retry, cancel,
purge), enqueue, schedules (list, put, rm, pause, resume) and limits (list, set,
rm), against ``--endpoint`` or ``--data-dir``.

Every command prints a human table by default and one JSON document with
``--json`` (for scripts); a task or queue that does not exist is one line on
stderr and exit status 1. docs/operations.md is the reference.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime, timedelta
from typing import Any

from .._client import Ringo, RingoClient
from .._contract.durations import parse_duration
from .._contract.limits import MAX_LIST_PAGE, MAX_PAYLOAD_BYTES
from .._errors import InvalidArgumentError
from .._models import QueueStats, Task, TaskSpec, TaskState
from .._supervise.parent import TOKEN_ENV
from .._tasks.registry import TaskCall
from .history import history_document, history_table
from .load import UsageError, load_object
from .table import TASK_COLUMNS, progress_text, task_row, when

#: Exit statuses of every ``ringo`` command (``ringo_trio._cli.main`` lists them).
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

__all__ = ["add_commands", "OPS_COMMANDS", "when"]

OPS_COMMANDS = frozenset({"queues", "tasks", "enqueue", "schedules", "limits"})

_FINISHED = [TaskState.SUCCEEDED, TaskState.DEAD, TaskState.CANCELLED]
_ACTIVE = [TaskState.PENDING, TaskState.LEASED]


# -- output -------------------------------------------------------------------


def print_json(document: Any) -> None:
    json.dump(document, sys.stdout, indent=2, sort_keys=True, default=str)
    sys.stdout.write("\n")


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """A plain aligned table; numbers right-aligned, text left-aligned."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    numeric = [
        all(isinstance(r[i], int | float) for r in rows) and bool(rows) for i in range(len(headers))
    ]
    for n, row in enumerate(cells):
        line = "  ".join(
            cell.rjust(widths[i]) if numeric[i] else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        )
        sys.stdout.write(line.rstrip() + "\n")
        if n == 0:
            sys.stdout.write("  ".join("-" * w for w in widths) + "\n")


# -- connecting ---------------------------------------------------------------


def _connection_options(
    parser: argparse.ArgumentParser, *, json_flag: bool = True, required: bool = True
) -> None:
    where = parser.add_mutually_exclusive_group(required=required)
    where.add_argument("--endpoint", default=None, help="daemon to talk to (host:port or URL)")
    where.add_argument(
        "--data-dir", default=None, help="the data dir of a local daemon (shared; started if none)"
    )
    parser.add_argument(
        "--token", default=None, help=f"bearer token for --endpoint (default: ${TOKEN_ENV})"
    )
    tls_options(parser)
    if json_flag:
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def tls_options(parser: argparse.ArgumentParser) -> None:
    """--tls-ca/--tls-cert/--tls-key, for every command that takes --endpoint."""
    tls = parser.add_argument_group("TLS (with --endpoint; any of them turns TLS on)")
    tls.add_argument(
        "--tls-ca", default=None, help="PEM bundle of the CA(s) to trust (default: the system's)"
    )
    tls.add_argument(
        "--tls-cert", default=None, help="client certificate (PEM), for ringod --tls-client-ca"
    )
    tls.add_argument("--tls-key", default=None, help="the key of --tls-cert, if not in its file")


def tls_problems(args: argparse.Namespace) -> list[str]:
    if args.endpoint is None and (args.tls_ca or args.tls_cert or args.tls_key):
        return ["--tls-ca, --tls-cert and --tls-key need --endpoint"]
    return []


def connect(args: argparse.Namespace) -> RingoClient:
    """The client of `--endpoint` the options describe (token, TLS)."""
    return Ringo.connect(
        args.endpoint,
        token=args.token or os.environ.get(TOKEN_ENV),
        tls_ca=args.tls_ca,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
    )


def open_client(args: argparse.Namespace) -> AbstractAsyncContextManager[RingoClient]:
    if args.endpoint is not None:
        return connect(args)
    return Ringo.local(args.data_dir, shared=True)


# -- commands -----------------------------------------------------------------
# Each takes the parsed arguments and returns the exit status.


async def _queues(args: argparse.Namespace) -> int:
    if args.endpoint is None and args.data_dir is None:
        # As argparse says it (and exits) for every other command.
        print(
            "ringo queues: error: one of the arguments --endpoint --data-dir is required",
            file=sys.stderr,
        )
        return EXIT_USAGE
    async with open_client(args) as client:
        found = await client.queues()
    if args.json:
        print_json([stats_document(q) for q in found])
        return 0
    print_table(
        [
            "queue",
            "pending",
            "leased",
            "succeeded",
            "dead",
            "cancelled",
            "oldest pending",
            "paused",
        ],
        [
            [
                q.queue,
                q.pending,
                q.leased,
                q.succeeded,
                q.dead,
                q.cancelled,
                _age(q),
                _yes(q.paused),
            ]
            for q in found
        ],
    )
    return 0


async def _queues_pause(args: argparse.Namespace) -> int:
    return await _set_paused(args, True)


async def _queues_resume(args: argparse.Namespace) -> int:
    return await _set_paused(args, False)


async def _set_paused(args: argparse.Namespace, paused: bool) -> int:
    async with open_client(args) as client:
        queue = client.queue(args.queue)
        changed = await (queue.pause() if paused else queue.resume())
    if args.json:
        print_json({"queue": args.queue, "paused": paused, "changed": changed})
        return 0
    state = "paused" if paused else "resumed"
    print(f"queue {args.queue!r} {state}" if changed else f"queue {args.queue!r} already {state}")
    return 0


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


async def _tasks_list(args: argparse.Namespace) -> int:
    limit = None if args.all else args.limit
    if limit is not None and limit < 1:
        raise InvalidArgumentError("--limit must be >= 1 (or --all)")
    tasks: list[Task] = []
    more = False
    async with open_client(args) as client:
        listing = client.queue(args.queue).list(
            states=[TaskState(s) for s in dict.fromkeys(args.state)],
            task_types=args.type,
            unique_key_prefix=args.key_prefix,
            newest_first=args.newest_first,
            # One past the limit: whether more match is worth a line.
            page_size=MAX_LIST_PAGE if limit is None else min(limit + 1, MAX_LIST_PAGE),
        )
        async for task in listing:
            if limit is not None and len(tasks) == limit:
                more = True
                break
            tasks.append(task)
    if args.json:
        print_json([task_document(t) for t in tasks])
    else:
        print_table(TASK_COLUMNS, [task_row(t) for t in tasks])
    if more:
        # On stderr, so that a script's stdout (and --json) holds only tasks;
        # a silent cut at the default 100 read as "that is all of them".
        sys.stdout.flush()
        sys.stderr.write(
            f"ringo tasks list: showed the first {limit} tasks; more match"
            " (--limit N for more, --all for every one)\n"
        )
    return 0


async def _tasks_show(args: argparse.Namespace) -> int:
    async with open_client(args) as client:
        queue = client.queue(args.queue)
        if args.key is not None:
            task = await queue.get_by_unique_key(args.key)
        else:
            task = await queue.get_by_id(args.task_id)
    document = task_document(task)
    document["payload"] = preview(task.payload)
    document["result"] = None if task.result is None else preview(task.result)
    document["history"] = history_document(task)
    if args.json:
        print_json(document)
        return 0
    lines = [
        ("id", task.id),
        ("queue", task.queue),
        ("type", task.task_type),
        ("state", task.state.value),
        ("unique key", task.unique_key or ""),
        ("attempts", f"{task.attempt} of {task.max_attempts}"),
        ("priority", task.priority),
        ("created", when(task.created_at)),
        ("available", when(task.available_at)),
        ("finished", when(task.finished_at)),
        ("worker", task.worker_id or ""),
        ("lease until", when(task.lease_until)),
        (
            "progress",
            progress_text(task.progress),
        ),
        ("last error", task.last_error or ""),
        ("payload", _shown(document["payload"])),
        ("result", "" if task.result is None else _shown(document["result"])),
    ]
    width = max(len(label) for label, _ in lines) + 1
    for label, value in lines:
        # Continuation lines (a multi-line error or payload) stay indented.
        text = str(value).replace("\n", "\n" + " " * (width + 1))
        sys.stdout.write(f"{label + ':':<{width}} {text}".rstrip() + "\n")
    if task.history:
        sys.stdout.write("\nattempts (oldest first):\n")
        print_table(*history_table(task))
    return 0


# -- task and stats documents ---------------------------------------------------

PREVIEW_BYTES = 4096
"""`tasks show` prints at most this much of a payload or result."""


def preview(data: bytes) -> dict[str, Any]:
    """A bounded, printable view of bytes: text when the shown part is
    printable UTF-8, else hex."""
    shown = data[:PREVIEW_BYTES]
    document: dict[str, Any] = {"bytes": len(data), "truncated": len(data) > len(shown)}
    text: str | None
    try:
        text = shown.decode("utf-8")
    except UnicodeDecodeError as exc:
        text = None
        # A character the preview cut in two is still text.
        if document["truncated"] and len(shown) - exc.start < 4:
            text = shown[: exc.start].decode("utf-8")
    if text is not None and all(c.isprintable() or c in "\n\t\r" for c in text):
        document["text"] = text
    else:
        document["hex"] = shown.hex()
    return document


def _shown(document: dict[str, Any]) -> str:
    more = f" ... ({document['bytes']} bytes)" if document["truncated"] else ""
    if "text" in document:
        return f"{document['text']}{more}" if document["bytes"] else "(empty)"
    return f"hex {document['hex']}{more}"


def task_document(task: Task) -> dict[str, Any]:
    """A task as JSON (times ISO 8601); without payload and result, which
    callers add as they see fit (`preview`)."""
    progress = None
    if task.progress is not None:
        progress = {
            "current": task.progress.current,
            "total": task.progress.total,
            "message": task.progress.message,
            "updated_at": iso(task.progress.updated_at),
        }
    return {
        "id": task.id,
        "queue": task.queue,
        "task_type": task.task_type,
        "state": task.state.value,
        "unique_key": task.unique_key,
        "attempt": task.attempt,
        "max_attempts": task.max_attempts,
        "priority": task.priority,
        "created_at": iso(task.created_at),
        "updated_at": iso(task.updated_at),
        "available_at": iso(task.available_at),
        "finished_at": iso(task.finished_at),
        "last_error": task.last_error,
        "progress": progress,
        "worker_id": task.worker_id,
        "lease_until": iso(task.lease_until),
        "limit_key": task.limit_key,
    }


def stats_document(stats: QueueStats) -> dict[str, Any]:
    age = stats.oldest_pending_age
    return {
        "queue": stats.queue,
        "pending": stats.pending,
        "leased": stats.leased,
        "succeeded": stats.succeeded,
        "dead": stats.dead,
        "cancelled": stats.cancelled,
        "oldest_pending_at": iso(stats.oldest_pending_at),
        "oldest_pending_age_seconds": None if age is None else age.total_seconds(),
        "as_of": iso(stats.as_of),
        "paused": stats.paused,
    }


def iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def _age(stats: QueueStats) -> str:
    """The oldest due task's wait, in its two largest units (``2h05m``)."""
    age = stats.oldest_pending_age
    if age is None:
        return "-"
    seconds = int(age.total_seconds())
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{seconds:02d}s"
    return f"{seconds}s"


def print_task_outcome(args: argparse.Namespace, task: Task) -> None:
    """The task retry or cancel changed: `tasks list`'s row (its --json is the
    whole `task_document`)."""
    if args.json:
        print_json(task_document(task))
    else:
        print_table(TASK_COLUMNS, [task_row(task)])


async def _tasks_retry(args: argparse.Namespace) -> int:
    if (args.type or args.key_prefix) and not args.all_dead:
        raise InvalidArgumentError(
            "--type and --key-prefix filter --all-dead; a single task is named exactly"
        )
    async with open_client(args) as client:
        queue = client.queue(args.queue)
        if args.all_dead:
            retried = await queue.retry_many(
                task_types=args.type or None, unique_key_prefix=args.key_prefix
            )
        elif args.key is not None:
            task = await queue.retry(args.key)
        else:
            task = await queue.retry_by_id(args.task_id)
    if not args.all_dead:
        print_task_outcome(args, task)
    elif args.json:
        print_json({"queue": args.queue, "retried": retried})
    else:
        sys.stdout.write(f"retried {retried} DEAD task(s) of queue {args.queue!r}\n")
    return 0


async def _tasks_cancel(args: argparse.Namespace) -> int:
    if (args.type or args.key_prefix or args.state) and not args.all_active:
        raise InvalidArgumentError(
            "--state, --type and --key-prefix filter --all-active; a single task is named exactly"
        )
    if args.all_active:
        async with open_client(args) as client:
            cancelled = await client.queue(args.queue).cancel_many(
                states=[TaskState(s) for s in dict.fromkeys(args.state)] or _ACTIVE,
                task_types=args.type or None,
                unique_key_prefix=args.key_prefix,
                reason=args.reason,
            )
        if args.json:
            print_json({"queue": args.queue, "cancelled": cancelled})
        else:
            sys.stdout.write(f"cancelled {cancelled} task(s) of queue {args.queue!r}\n")
        return 0
    async with open_client(args) as client:
        queue = client.queue(args.queue)
        if args.key is not None:
            task = await queue.cancel(args.key, reason=args.reason)
        else:
            task = await queue.cancel_by_id(args.task_id, reason=args.reason)
    print_task_outcome(args, task)
    return 0


def read_payload(source: str) -> bytes:
    """--payload: text as UTF-8, ``@FILE`` a file's bytes, ``-`` stdin; read
    only up to one byte past the limit, so a huge input costs no memory."""
    if source == "-":
        data = sys.stdin.buffer.read(MAX_PAYLOAD_BYTES + 1)
        where = "stdin"
    elif source.startswith("@"):
        with open(source[1:], "rb") as file:
            data = file.read(MAX_PAYLOAD_BYTES + 1)
        where = source[1:]
    else:
        return source.encode("utf-8")
    if len(data) > MAX_PAYLOAD_BYTES:
        raise InvalidArgumentError(
            f"payload from {where} exceeds the {MAX_PAYLOAD_BYTES}-byte limit (MAX_PAYLOAD_BYTES)"
        )
    return data


def _typed_spec(args: argparse.Namespace, arguments_json: str) -> TaskSpec:
    """``--json ARGUMENTS``: the arguments of a typed task (docs/tasks.md).

    When TASK names an importable task function (``module:qualname``), the
    arguments are checked and encoded as its registry does; when its module
    cannot be imported here (an operator's machine without the app), the
    JSON object goes as it is and the worker validates it.
    """
    try:
        arguments = json.loads(arguments_json)
    except ValueError as exc:
        raise InvalidArgumentError(f"--json is not JSON: {exc}") from None
    if not isinstance(arguments, dict):
        raise InvalidArgumentError("--json must be a JSON object of the task's arguments")
    try:
        target = load_object(args.task_type, what="task")
    except ModuleNotFoundError:
        target = None
    except UsageError as exc:
        raise InvalidArgumentError(str(exc)) from None
    if target is None:
        return TaskSpec(
            task_type=args.task_type,
            payload=json.dumps(arguments, separators=(",", ":")).encode(),
            unique_key=args.key,
            max_attempts=args.max_attempts,
            delay=args.delay,
            priority=args.priority or 0,
            limit_key=args.limit_key,
        )
    if not isinstance(target, TaskCall):
        raise InvalidArgumentError(f"{args.task_type} is not a task (a @registry.task function)")
    call = target.configure(
        queue=args.queue,
        unique_key=args.key,
        delay=args.delay,
        priority=args.priority,
        max_attempts=args.max_attempts,
    )
    spec = call.spec(**arguments)
    return spec if args.limit_key is None else dataclasses.replace(spec, limit_key=args.limit_key)


async def _enqueue(args: argparse.Namespace) -> int:
    typed = isinstance(args.json, str)
    if typed:
        if args.payload:
            raise InvalidArgumentError("give --payload or --json ARGUMENTS, not both")
        spec = _typed_spec(args, args.json)
    else:
        spec = TaskSpec(
            task_type=args.task_type,
            payload=read_payload(args.payload),
            unique_key=args.key,
            max_attempts=args.max_attempts,
            delay=args.delay,
            priority=args.priority or 0,
            limit_key=args.limit_key,
        )
    async with open_client(args) as client:
        result = await client.queue(args.queue).enqueue(spec)
    if args.json is True:
        print_json({**task_document(result.task), "created": result.created})
    else:
        how = "created" if result.created else "duplicate (the existing task)"
        sys.stdout.write(f"{result.task.id} {how}\n")
    return 0


async def _tasks_purge(args: argparse.Namespace) -> int:
    states = [TaskState(state) for state in args.state] or _FINISHED
    async with open_client(args) as client:
        deleted = await client.queue(args.queue).purge(
            states=states,
            older_than=args.older_than,
            task_types=args.type or None,
            unique_key_prefix=args.key_prefix,
        )
    if args.json:
        print_json({"queue": args.queue, "deleted": deleted})
    else:
        sys.stdout.write(f"deleted {deleted} finished task(s) from queue {args.queue}\n")
    return 0


# -- parsing ------------------------------------------------------------------


def duration(text: str) -> timedelta:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def command(
    parser: argparse.ArgumentParser,
    run: Callable[[argparse.Namespace], Awaitable[int]],
    *,
    json_flag: bool = True,
    required: bool = True,
) -> None:
    _connection_options(parser, json_flag=json_flag, required=required)
    parser.set_defaults(ops_run=run)


def _lookup(parser: argparse.ArgumentParser, *, every: tuple[str, str] | None = None) -> None:
    """QUEUE then the task's id or --key, or (`every`: flag, help) a flag
    that names every matching task instead."""
    parser.add_argument("queue")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("task_id", nargs="?", default=None, help="the task's id")
    target.add_argument("--key", default=None, help="the task's unique key")
    if every is not None:
        target.add_argument(every[0], action="store_true", help=every[1])


def add_commands(commands: Any) -> None:
    """Add the operator commands to `ringo`'s subparsers."""
    queues = commands.add_parser(
        "queues", help="list queues with their task counts by state and oldest pending age"
    )
    # Its subcommands take the connection options themselves: a required
    # choice here would be asked of `ringo queues pause Q --endpoint E` too,
    # so `_queues` asks for it (`ringo queues` alone lists, as it always did).
    command(queues, _queues, required=False)
    queue_verbs = queues.add_subparsers(dest="queues_command")
    pause = queue_verbs.add_parser(
        "pause", help="stop pushing and handing out a queue's tasks (enqueues go on)"
    )
    pause.add_argument("queue")
    command(pause, _queues_pause)
    resume = queue_verbs.add_parser("resume", help="push a paused queue's tasks again")
    resume.add_argument("queue")
    command(resume, _queues_resume)

    tasks = commands.add_parser("tasks", help="list, show, retry, cancel or purge tasks")
    verbs = tasks.add_subparsers(dest="tasks_command", required=True)

    listing = verbs.add_parser("list", help="a queue's tasks, oldest first")
    listing.add_argument("queue")
    listing.add_argument(
        "--state",
        action="append",
        default=[],
        choices=["pending", "leased", "succeeded", "dead", "cancelled"],
        help="only tasks in this state (repeatable)",
    )
    listing.add_argument("--type", action="append", default=[], help="only this task type")
    listing.add_argument("--key-prefix", default="", help="only unique keys with this prefix")
    listing.add_argument("--newest-first", action="store_true")
    how_many = listing.add_mutually_exclusive_group()
    how_many.add_argument(
        "--limit",
        type=int,
        default=100,
        help="tasks to print (100); when more match, a line on stderr says so",
    )
    how_many.add_argument("--all", action="store_true", help="every matching task")
    command(listing, _tasks_list)

    show = verbs.add_parser("show", help="one task in full (payload preview, result, ...)")
    _lookup(show)
    command(show, _tasks_show)

    retry = verbs.add_parser(
        "retry", help="reactivate a finished task, or every DEAD one with --all-dead"
    )
    retry.add_argument("queue")
    target = retry.add_mutually_exclusive_group(required=True)
    target.add_argument("task_id", nargs="?", default=None)
    target.add_argument("--key", default=None)
    target.add_argument("--all-dead", action="store_true", help="every DEAD task of the queue")
    retry.add_argument("--type", action="append", default=[], help="with --all-dead: this type")
    retry.add_argument(
        "--key-prefix", default="", help="with --all-dead: only unique keys with this prefix"
    )
    command(retry, _tasks_retry)

    cancel = verbs.add_parser(
        "cancel", help="cancel a PENDING or LEASED task, or every one with --all-active"
    )
    _lookup(cancel, every=("--all-active", "every PENDING and LEASED task that matches"))
    cancel.add_argument("--reason", default="", help="stored as the task's last error")
    cancel.add_argument(
        "--state",
        action="append",
        default=[],
        choices=["pending", "leased"],
        help="with --all-active: only this state (repeatable; default both)",
    )
    cancel.add_argument("--type", action="append", default=[], help="with --all-active: this type")
    cancel.add_argument(
        "--key-prefix", default="", help="with --all-active: only unique keys with this prefix"
    )
    command(cancel, _tasks_cancel)

    purge = verbs.add_parser("purge", help="delete finished tasks")
    purge.add_argument("queue")
    purge.add_argument(
        "--state",
        action="append",
        default=[],
        choices=["succeeded", "dead", "cancelled"],
        help="only this finished state (repeatable; default all three)",
    )
    purge.add_argument(
        "--older-than",
        type=duration,
        default=None,
        help="only tasks finished longer ago, e.g. 7d, 12h, 30m",
    )
    purge.add_argument("--type", action="append", default=[], help="only this task type")
    purge.add_argument("--key-prefix", default="", help="only unique keys with this prefix")
    command(purge, _tasks_purge)

    enqueue = commands.add_parser(
        "enqueue",
        help="enqueue one task",
        description="Enqueue one task: raw (TASK_TYPE and --payload) or typed (TASK is a"
        " task function's name, module:qualname, and --json '{...}' its arguments).",
    )
    enqueue.add_argument("queue")
    enqueue.add_argument("task_type", metavar="TASK_TYPE")
    enqueue.add_argument(
        "--payload", default="", help="the payload: text, @FILE for a file's bytes, - for stdin"
    )
    enqueue.add_argument(
        "--json",
        nargs="?",
        const=True,
        default=False,
        metavar="ARGUMENTS",
        help="with a JSON object: the typed task's arguments; alone: print the task as JSON",
    )
    enqueue.add_argument("--key", default=None, help="unique key (dedupe)")
    enqueue.add_argument(
        "--delay", type=duration, default=None, help="run after this long, e.g. 5m, 2h"
    )
    enqueue.add_argument("--priority", type=int, default=None)
    enqueue.add_argument(
        "--max-attempts",
        type=int,
        default=None,
        help="attempts before DEAD (0 or unset: the default, 5)",
    )
    enqueue.add_argument(
        "--limit-key", default=None, help="the key the queue's limit rules apply to"
    )
    command(enqueue, _enqueue, json_flag=False)

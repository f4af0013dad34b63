"""``ringo schedules list|put|rm|pause|resume``: the daemon's schedules
(docs/schedules.md), against ``--endpoint`` or ``--data-dir``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from .._contract.cron import CronError, parse_cron, zone
from .._errors import InvalidArgumentError
from .._models import Schedule
from .ops import (
    EXIT_FAILURE,
    command,
    duration,
    iso,
    open_client,
    preview,
    print_json,
    print_table,
    read_payload,
    when,
)

__all__ = ["add_commands", "schedule_document", "timing_text"]


def schedule_document(schedule: Schedule) -> dict[str, Any]:
    return {
        "queue": schedule.queue,
        "name": schedule.name,
        "task_type": schedule.task_type,
        "cron": schedule.cron,
        "every_seconds": None if schedule.every is None else schedule.every.total_seconds(),
        "timezone": schedule.timezone,
        "payload": preview(schedule.payload),
        "misfire": schedule.misfire,
        "catch_up": schedule.catch_up,
        "paused": schedule.paused,
        "priority": schedule.priority,
        "max_attempts": schedule.max_attempts,
        "next_fire_at": iso(schedule.next_fire_at),
        "last_fired_at": iso(schedule.last_fired_at),
        "last_task_id": schedule.last_task_id,
        "fired": schedule.fired,
        "skipped": schedule.skipped,
        "created_at": iso(schedule.created_at),
        "updated_at": iso(schedule.updated_at),
    }


def timing_text(schedule: Schedule) -> str:
    """``*/5 * * * * (Europe/Paris)`` or ``every 5m``."""
    if schedule.cron is not None:
        return f"{schedule.cron} ({schedule.timezone})"
    assert schedule.every is not None
    return f"every {_span(schedule.every)}"


def _span(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


def _print_schedules(args: argparse.Namespace, schedules: Sequence[Schedule]) -> None:
    if args.json:
        print_json([schedule_document(s) for s in schedules])
        return
    print_table(
        [
            "queue",
            "name",
            "type",
            "timing",
            "next fire",
            "last fired",
            "paused",
            "fired",
            "skipped",
        ],
        [
            [
                s.queue,
                s.name,
                s.task_type,
                timing_text(s),
                when(s.next_fire_at),
                when(s.last_fired_at),
                "yes" if s.paused else "",
                s.fired,
                s.skipped,
            ]
            for s in schedules
        ],
    )


async def _schedules_list(args: argparse.Namespace) -> int:
    async with open_client(args) as client:
        if args.queue is None:
            found = await client.schedules()
        else:
            found = await client.queue(args.queue).schedules()
    _print_schedules(args, found)
    return 0


async def _schedules_put(args: argparse.Namespace) -> int:
    # Checked before connecting (no local daemon started for a typo); the
    # SDK checks again, as does the daemon.
    try:
        tz = zone(args.timezone)
    except ValueError as exc:
        raise InvalidArgumentError(f"--timezone: {exc}") from None
    if args.cron is not None:
        try:
            parse_cron(args.cron, tz)
        except CronError as exc:
            raise InvalidArgumentError(f"--cron: {exc}") from None
    payload = read_payload(args.payload)
    async with open_client(args) as client:
        schedule = await client.queue(args.queue).put_schedule(
            args.name,
            args.task_type,
            cron=args.cron,
            every=args.every,
            payload=payload,
            timezone=args.timezone,
            misfire=args.misfire,
            catch_up=args.catch_up,
            paused=args.paused,
            priority=args.priority,
            max_attempts=args.max_attempts,
        )
    _print_schedules(args, [schedule])
    return 0


async def _schedules_rm(args: argparse.Namespace) -> int:
    async with open_client(args) as client:
        deleted = await client.queue(args.queue).delete_schedule(args.name)
    if args.json:
        print_json({"queue": args.queue, "name": args.name, "deleted": deleted})
    elif deleted:
        sys.stdout.write(f"deleted schedule {args.name!r} of queue {args.queue!r}\n")
    if not deleted:
        sys.stderr.write(f"no schedule {args.name!r} in queue {args.queue!r}\n")
        return EXIT_FAILURE
    return 0


async def _schedules_pause(args: argparse.Namespace) -> int:
    async with open_client(args) as client:
        queue = client.queue(args.queue)
        if args.schedules_command == "pause":
            schedule = await queue.pause_schedule(args.name)
        else:
            schedule = await queue.resume_schedule(args.name)
    _print_schedules(args, [schedule])
    return 0


def add_commands(commands: Any) -> None:
    schedules = commands.add_parser(
        "schedules", help="list, put, rm, pause or resume the daemon's schedules"
    )
    verbs = schedules.add_subparsers(dest="schedules_command", required=True)

    listing = verbs.add_parser("list", help="the schedules of QUEUE, or of every queue")
    listing.add_argument("queue", nargs="?", default=None)
    command(listing, _schedules_list)

    put = verbs.add_parser(
        "put",
        help="create or replace a schedule",
        description="Create or replace the schedule NAME of QUEUE: each tick of --cron (in"
        " --timezone) or of --every enqueues one task of TASK_TYPE (docs/schedules.md).",
    )
    put.add_argument("queue")
    put.add_argument("name")
    put.add_argument("task_type", metavar="TASK_TYPE")
    timing = put.add_mutually_exclusive_group(required=True)
    timing.add_argument(
        "--cron", default=None, help="5 fields (or 6, seconds first), e.g. '*/5 * * * *'"
    )
    timing.add_argument("--every", type=duration, default=None, help="e.g. 30s, 5m, 1h")
    put.add_argument("--timezone", default="UTC", help="IANA zone --cron is read in (UTC)")
    put.add_argument(
        "--payload", default="", help="the payload: text, @FILE for a file's bytes, - for stdin"
    )
    put.add_argument(
        "--misfire",
        choices=["skip", "catch_up"],
        default="skip",
        help="ticks missed while no daemon ran: skip them, or catch up the latest --catch-up",
    )
    put.add_argument("--catch-up", type=int, default=1, help="missed ticks fired at most (1)")
    put.add_argument("--paused", action="store_true", help="store it paused")
    put.add_argument("--priority", type=int, default=0)
    put.add_argument(
        "--max-attempts", type=int, default=None, help="per task (0 or unset: the default, 5)"
    )
    command(put, _schedules_put)

    rm = verbs.add_parser("rm", help="delete a schedule (the tasks it made stay)")
    rm.add_argument("queue")
    rm.add_argument("name")
    command(rm, _schedules_rm)

    for verb, text in (
        ("pause", "stop a schedule's ticks"),
        ("resume", "tick again from now (ticks due while paused never fire)"),
    ):
        parser = verbs.add_parser(verb, help=text)
        parser.add_argument("queue")
        parser.add_argument("name")
        command(parser, _schedules_pause)

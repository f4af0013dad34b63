"""``ringo limits list|set|rm``: keyed rate and concurrency limits
(docs/limits.md), against ``--endpoint`` or ``--data-dir``."""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta
from typing import Any

from .._contract.durations import format_duration
from .._models import LimitRule, LimitStatus
from .ops import (
    EXIT_FAILURE,
    EXIT_OK,
    command,
    duration,
    iso,
    open_client,
    print_json,
    print_table,
    when,
)

__all__ = ["add_commands", "limit_document"]


async def _limits_list(args: argparse.Namespace) -> int:
    async with open_client(args) as client:
        if args.queue is not None:
            found = await client.queue(args.queue).limits(with_keys=args.keys)
        else:
            found = await client.limits(with_keys=args.keys)
    if args.json:
        print_json([limit_document(status) for status in found])
        return 0
    print_table(
        ["queue", "prefix", "rate", "burst", "concurrency"],
        [
            [s.queue, repr(s.rule.prefix), _rate(s.rule), s.rule.burst, s.rule.concurrency or "-"]
            for s in found
        ],
    )
    if args.keys:
        rows = [
            [s.queue, k.key, k.waiting, k.leased, when(k.next_start_at) or "now"]
            for s in found
            for k in s.keys
        ]
        sys.stdout.write("\n")
        print_table(["queue", "key", "waiting", "leased", "next start"], rows)
    return 0


def _rate(rule: LimitRule) -> str:
    if rule.rate is None:
        return "-"
    return f"{rule.rate:g}/{format_duration(rule.per)}"


def limit_document(status: LimitStatus) -> dict[str, Any]:
    rule = status.rule
    return {
        "queue": status.queue,
        "prefix": rule.prefix,
        "rate": rule.rate,
        "per_seconds": rule.per.total_seconds(),
        "burst": rule.burst,
        "concurrency": rule.concurrency,
        "keys": [
            {
                "key": k.key,
                "waiting": k.waiting,
                "leased": k.leased,
                "next_start_at": iso(k.next_start_at),
            }
            for k in status.keys
        ],
    }


async def _limits_set(args: argparse.Namespace) -> int:
    async with open_client(args) as client:
        rule = await client.queue(args.queue).set_limit(
            args.prefix,
            rate=args.rate,
            per=args.per,
            burst=args.burst,
            concurrency=args.concurrency,
        )
    if args.json:
        print_json(limit_document(LimitStatus(args.queue, rule)))
    else:
        what = [f"rate {_rate(rule)} burst {rule.burst}"] if rule.rate is not None else []
        if rule.concurrency is not None:
            what.append(f"concurrency {rule.concurrency}")
        sys.stdout.write(f"queue {args.queue} prefix {rule.prefix!r}: {', '.join(what)}\n")
    return 0


async def _limits_rm(args: argparse.Namespace) -> int:
    async with open_client(args) as client:
        deleted = await client.queue(args.queue).delete_limit(args.prefix)
    if args.json:
        print_json({"queue": args.queue, "prefix": args.prefix, "deleted": deleted})
    elif deleted:
        sys.stdout.write(f"deleted the rule of prefix {args.prefix!r} of queue {args.queue}\n")
    else:
        sys.stderr.write(f"queue {args.queue} has no rule of prefix {args.prefix!r}\n")
    return EXIT_OK if deleted else EXIT_FAILURE


def add_commands(commands: Any) -> None:
    limit = commands.add_parser(
        "limits", help="list, set or remove keyed rate and concurrency limits (docs/limits.md)"
    )
    limit_verbs = limit.add_subparsers(dest="limits_command", required=True)
    listing = limit_verbs.add_parser("list", help="the rules of a queue (or of every queue)")
    listing.add_argument("queue", nargs="?", default=None)
    listing.add_argument(
        "--keys", action="store_true", help="also each key with tasks waiting or leased"
    )
    command(listing, _limits_list)
    setting = limit_verbs.add_parser(
        "set", help="create or replace the rule of the keys starting with PREFIX"
    )
    setting.add_argument("queue")
    setting.add_argument("prefix", help="the keys it applies to ('' for every key)")
    setting.add_argument("--rate", type=float, default=None, help="starts per --per, per key")
    setting.add_argument(
        "--per", type=duration, default=timedelta(seconds=1), help="the rate's period (1s)"
    )
    setting.add_argument("--burst", type=int, default=1, help="starts at once (1)")
    setting.add_argument("--concurrency", type=int, default=None, help="leased tasks per key")
    command(setting, _limits_set)
    removing = limit_verbs.add_parser("rm", help="delete the rule of PREFIX")
    removing.add_argument("queue")
    removing.add_argument("prefix")
    command(removing, _limits_rm)

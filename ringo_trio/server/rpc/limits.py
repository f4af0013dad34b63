"""The keyed-limit RPCs (protocol minor 13, docs/limits.md): SetLimit,
ListLimits, DeleteLimit. `QueueService` admits each call (session, minor
13) and hands it here with the daemon's `now`; enforcement is the claim
path's (`storage.limits`)."""

from __future__ import annotations

from datetime import datetime, timedelta

from ringo_trio._contract import limits
from ringo_trio._proto.ringo.v1 import (
    DeleteLimitRequest,
    DeleteLimitResponse,
    LimitKeyState,
    LimitRule,
    LimitStatus,
    ListLimitsRequest,
    ListLimitsResponse,
    SetLimitRequest,
    SetLimitResponse,
)

from ..storage.base import Storage
from ..storage.limits import Rule
from ..storage.rows import from_us
from . import validate as v
from .reply_bounds import fitting
from .wakeups import QueueWakeups

__all__ = ["Limits", "wire_rule"]


def wire_rule(rule: Rule) -> LimitRule:
    return LimitRule(
        prefix=rule.prefix,
        rate=rule.rate,
        per=timedelta(microseconds=rule.per_us),
        burst=rule.burst,
        concurrency=rule.concurrency,
    )


class Limits:
    def __init__(self, storage: Storage, wakeups: QueueWakeups) -> None:
        self._storage = storage
        self._wakeups = wakeups

    async def set_limit(self, message: SetLimitRequest, now: datetime) -> SetLimitResponse:
        queue = v.name(message.queue, "queue")
        rule = v.limit_rule(message.rule, "rule")
        created = await self._storage.set_limit(queue, rule, now)
        # A looser rule may let waiting tasks start now.
        self._wakeups.notify(queue)
        return SetLimitResponse(rule=wire_rule(rule), created=created)

    async def list_limits(self, message: ListLimitsRequest, now: datetime) -> ListLimitsResponse:
        queue = v.name(message.queue, "queue") if message.queue else None
        found = await self._storage.list_limits(queue, now, with_keys=message.with_keys)
        statuses = [
            LimitStatus(
                queue=status.queue,
                rule=wire_rule(status.rule),
                keys=[
                    LimitKeyState(
                        key=k.key,
                        waiting=k.waiting,
                        leased=k.leased,
                        next_start_at=None if k.next_start_us is None else from_us(k.next_start_us),
                    )
                    for k in status.keys[: limits.MAX_LIMIT_KEYS_LISTED]
                ],
            )
            for status in found
        ]
        # Within MAX_REPLY_BYTES: the longest prefix of the rules that fits
        # (every queue's rules with their keys could be more; one queue's
        # fit: MAX_LIMIT_RULES x MAX_LIMIT_KEYS_LISTED keys is ~2 MiB).
        fit = fitting([len(bytes(status)) for status in statuses])
        return ListLimitsResponse(limits=statuses[:fit])

    async def delete_limit(self, message: DeleteLimitRequest, now: datetime) -> DeleteLimitResponse:
        queue = v.name(message.queue, "queue")
        prefix = message.prefix
        v.limit_prefix(prefix, "prefix")
        deleted = await self._storage.delete_limit(queue, prefix, now)
        self._wakeups.notify(queue)
        return DeleteLimitResponse(deleted=deleted)

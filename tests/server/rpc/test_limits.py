"""SetLimit / ListLimits / DeleteLimit (minor 13) at the RPC boundary.

An in-process SQLite daemon on virtual time (`tests/_kit/virtual_daemon.py`);
enforcement itself is storage's (tests/server/storage/test_limits.py) and the
SDK's end to end (tests/queue/test_limits.py).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from grpclib.const import Status

from ringo_trio._contract import limits
from ringo_trio._contract.versions import FEATURES, Feature
from ringo_trio._proto.ringo.v1 import (
    DeleteLimitRequest,
    LimitRule,
    ListLimitsRequest,
    ListLimitsResponse,
    SetLimitRequest,
    SetLimitResponse,
)
from tests._kit.grpc_client import Client, connect, expect_status, new_queue
from tests._kit.virtual_daemon import on_virtual_time, virtual_daemon

LIMITS_MINOR = FEATURES[Feature.LIMITS]


async def _set(client: Client, queue: str, **rule: Any) -> SetLimitResponse:
    rule.setdefault("prefix", "k:")
    return await client.stub.set_limit(
        SetLimitRequest(context=client.context, queue=queue, rule=LimitRule(**rule))
    )


async def _list(client: Client, queue: str = "", *, with_keys: bool = False) -> ListLimitsResponse:
    return await client.stub.list_limits(
        ListLimitsRequest(context=client.context, queue=queue, with_keys=with_keys)
    )


BAD_RULES: list[tuple[dict[str, Any], str]] = [
    ({}, "rule"),  # neither a rate nor a concurrency
    ({"rate": -1.0}, "rule.rate"),
    ({"rate": float("nan")}, "rule.rate"),
    ({"rate": float("inf")}, "rule.rate"),
    ({"rate": limits.MAX_LIMIT_RATE * 2}, "rule.rate"),
    ({"rate": 1.0, "per": timedelta(seconds=-1)}, "rule.per"),
    ({"rate": 1.0, "per": limits.MAX_LIMIT_PER * 2}, "rule.per"),
    ({"rate": 1.0, "burst": limits.MAX_LIMIT_BURST + 1}, "rule.burst"),
    ({"concurrency": limits.MAX_LIMIT_CONCURRENCY + 1}, "rule.concurrency"),
    ({"concurrency": 1, "prefix": "x" * (limits.MAX_LIMIT_KEY_BYTES + 1)}, "rule.prefix"),
]


@pytest.mark.parametrize(("rule", "field"), BAD_RULES, ids=[f for _, f in BAD_RULES])
@on_virtual_time
async def test_a_bad_rule_is_invalid_argument_naming_its_field(
    rule: dict[str, Any], field: str
) -> None:
    """Property: every out-of-bounds rule is INVALID_ARGUMENT naming the
    field, stores nothing, and the daemon keeps serving."""
    queue = new_queue()
    async with virtual_daemon() as served, connect(served.daemon) as client:
        await expect_status(_set(client, queue, **rule), Status.INVALID_ARGUMENT, field)
        assert (await _list(client, queue)).limits == []
        assert (await _set(client, queue, concurrency=1)).created


@on_virtual_time
async def test_bad_keys_queues_and_prefixes_are_refused() -> None:
    """Property: a too-long limit_key on Enqueue, an empty queue on
    SetLimit and a too-long prefix on DeleteLimit are INVALID_ARGUMENT
    naming the field."""
    queue = new_queue()
    async with virtual_daemon() as served, connect(served.daemon) as client:
        await expect_status(
            client.enqueue(queue, limit_key="x" * (limits.MAX_LIMIT_KEY_BYTES + 1)),
            Status.INVALID_ARGUMENT,
            "task.limit_key",
        )
        await expect_status(_set(client, "", concurrency=1), Status.INVALID_ARGUMENT, "queue")
        await expect_status(
            client.stub.delete_limit(
                DeleteLimitRequest(
                    context=client.context,
                    queue=queue,
                    prefix="x" * (limits.MAX_LIMIT_KEY_BYTES + 1),
                )
            ),
            Status.INVALID_ARGUMENT,
            "prefix",
        )


@on_virtual_time
async def test_a_session_below_minor_13_is_refused() -> None:
    """Property: SetLimit, ListLimits and DeleteLimit on a session of minor
    12 are UNIMPLEMENTED naming minor 13, and change nothing."""
    queue = new_queue()
    async with (
        virtual_daemon() as served,
        connect(served.daemon) as client,
        connect(served.daemon, minor=LIMITS_MINOR - 1) as old,
    ):
        await expect_status(_set(old, queue, concurrency=1), Status.UNIMPLEMENTED, "minor 13")
        await expect_status(_list(old, queue), Status.UNIMPLEMENTED, "minor 13")
        await expect_status(
            old.stub.delete_limit(DeleteLimitRequest(context=old.context, queue=queue, prefix="")),
            Status.UNIMPLEMENTED,
            "minor 13",
        )
        assert (await _list(client, queue)).limits == []


@on_virtual_time
async def test_set_replaces_list_reports_keys_and_delete_removes() -> None:
    """Property: SetLimit creates then replaces (created False) the rule of
    one prefix; ListLimits lists every queue's rules in (queue, prefix)
    order and, with_keys, each key's waiting and leased tasks and its next
    start; DeleteLimit answers whether there was a rule."""
    q1, q2 = sorted((new_queue(), new_queue()))
    async with virtual_daemon() as served, connect(served.daemon) as client:
        assert (await _set(client, q1, prefix="a:", rate=1.0)).created
        again = await _set(client, q1, prefix="a:", rate=2.0, burst=1)
        assert not again.created
        assert again.rule is not None
        assert again.rule.rate == 2.0
        await _set(client, q2, prefix="", concurrency=1)
        for _ in range(3):
            await client.enqueue(q1, limit_key="a:x")
        await client.enqueue(q1, limit_key="a:y")
        await client.claim(q1, 10)
        everything = await _list(client)
        mine = [(s.queue, s.rule.prefix) for s in everything.limits if s.queue in (q1, q2)]
        assert mine == [(q1, "a:"), (q2, "")]
        assert all(not s.keys for s in everything.limits)
        [status] = (await _list(client, q1, with_keys=True)).limits
        keys = {k.key: (k.waiting, k.leased, k.next_start_at is not None) for k in status.keys}
        # One start per key at burst 1: x has 2 waiting and is rate-held.
        assert keys == {"a:x": (2, 1, True), "a:y": (0, 1, True)}
        assert [k.key for k in status.keys] == ["a:x", "a:y"]  # the most waiting first
        deleted = await client.stub.delete_limit(
            DeleteLimitRequest(context=client.context, queue=q1, prefix="a:")
        )
        assert deleted.deleted
        again_deleted = await client.stub.delete_limit(
            DeleteLimitRequest(context=client.context, queue=q1, prefix="a:")
        )
        assert not again_deleted.deleted
        assert (await _list(client, q1)).limits == []

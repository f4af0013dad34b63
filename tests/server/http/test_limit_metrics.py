"""``ringo_limit_waiting_tasks``: due tasks a limit rule holds back, read from
storage at scrape time (a real ``ringod`` on each engine, a real GET)."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ringo_trio._proto.ringo.v1 import LimitRule, SetLimitRequest
from ringo_trio.testing import DaemonProcess, spawn_daemon
from tests._kit.grpc_client import connect, new_queue
from tests._kit.postgres import fresh_database

pytestmark = pytest.mark.anyio

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@contextmanager
def metrics_daemon(engine: str, tmp_path: Path) -> Iterator[DaemonProcess]:
    args = ["--metrics-listen", "127.0.0.1:0"]
    if engine == "sqlite":
        with spawn_daemon(tmp_path / "data", extra_args=args) as process:
            yield process
    else:
        with fresh_database() as dsn, spawn_daemon(None, postgres_dsn=dsn, extra_args=args) as p:
            yield p


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        body: bytes = response.read()
        return body


async def scrape(process: DaemonProcess) -> Samples:
    body = await anyio.to_thread.run_sync(_get, f"http://{process.info['metrics']}/metrics")
    samples: Samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def held(samples: Samples, queue: str, prefix: str) -> float | None:
    return samples.get(
        ("ringo_limit_waiting_tasks", frozenset({"queue": queue, "prefix": prefix}.items()))
    )


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
async def test_the_gauge_counts_what_each_rule_holds_back(engine: str, tmp_path: Path) -> None:
    """Property: per (queue, prefix), the gauge is the due PENDING tasks of
    the rule's keys that may not start now — behind a full concurrency or
    a rate not yet allowing a start — and not a key's tasks that could
    start, nor unkeyed tasks; a rule with nothing held reads 0."""
    queue = new_queue("lim")
    with anyio.fail_after(60), metrics_daemon(engine, tmp_path) as process:
        async with connect(process) as client:
            for prefix, rule in (
                ("c:", LimitRule(prefix="c:", concurrency=1)),
                ("r:", LimitRule(prefix="r:", rate=1.0, burst=1)),
                ("idle:", LimitRule(prefix="idle:", concurrency=5)),
            ):
                assert prefix == rule.prefix
                await client.stub.set_limit(
                    SetLimitRequest(context=client.context, queue=queue, rule=rule)
                )
            for key, n in (("c:a", 3), ("r:b", 4), ("idle:x", 2)):
                for _ in range(n):
                    await client.enqueue(queue, limit_key=key)
            await client.enqueue(queue)
            # c:a leases 1 (2 held), r:b starts 1 (3 held by the rate),
            # idle:x starts both (nothing held), the unkeyed one starts.
            leased = await client.claim(queue, 20)
            assert len(leased) == 5
            await client.enqueue(queue, limit_key="idle:x")  # may start now
            samples = await scrape(process)
    assert held(samples, queue, "c:") == 2
    assert held(samples, queue, "r:") == 3
    assert held(samples, queue, "idle:") == 0

"""The dashboard's limits page (/limits, /queues/Q/limits) over real HTTP:
an in-process daemon with a real engine, a stdlib client in a worker thread."""

from __future__ import annotations

import http.client
import re
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import pytest

from ringo_trio._proto.ringo.v1 import TaskSpec
from ringo_trio.server.daemon import Daemon
from ringo_trio.server.storage.base import Storage
from ringo_trio.server.storage.limits import Rule
from ringo_trio.server.storage.postgres import PostgresEngine
from ringo_trio.server.storage.sqlite import SQLiteEngine
from tests._kit.grpc_client import new_queue, serving
from tests._kit.postgres import fresh_database

pytestmark = pytest.mark.anyio

XSS = "<img src=x onerror=alert(1)>"


@pytest.fixture(params=["sqlite", "postgres"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Storage]:
    if request.param == "sqlite":
        yield SQLiteEngine(tmp_path / "ringo.db")
        return
    with fresh_database("ringo_ui_limits") as dsn:
        yield PostgresEngine(dsn)


def dashboard(storage: Storage) -> AbstractAsyncContextManager[Daemon]:
    return serving(storage, ui_listen=("127.0.0.1", 0))


async def get(daemon: Daemon, path: str) -> tuple[int, str]:
    def fetch() -> tuple[int, str]:
        conn = http.client.HTTPConnection(f"127.0.0.1:{daemon.ui_port}", timeout=10)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            return response.status, response.read().decode()
        finally:
            conn.close()

    return await anyio.to_thread.run_sync(fetch)


def row(page: str, attribute: str, value: str) -> str:
    match = re.search(rf'<tr [^>]*{attribute}="{re.escape(value)}".*?</tr>', page, re.S)
    assert match is not None, f"no row {attribute}={value!r}"
    return match.group(0)


async def test_the_limits_page_shows_rules_and_the_keys_they_hold(engine: Storage) -> None:
    """Property: /queues/Q/limits lists Q's rules (rate, burst,
    concurrency) and, per rule, only the keys it holds back now (waiting,
    leased, next start), keys that may start and other queues' rules left
    out; /limits lists every queue's rules; the queue page links to it; a
    key's text is escaped."""
    queue, other = new_queue("ui"), new_queue("ui")
    with anyio.fail_after(30):
        async with dashboard(engine) as daemon:
            now = datetime.now(UTC)
            second = 1_000_000
            await engine.set_limit(queue, Rule("c:", 0.0, second, 1, 1), now)
            await engine.set_limit(queue, Rule("r:", 1.0, 60 * second, 1, 0), now)
            await engine.set_limit(other, Rule("", 0.0, second, 1, 2), now)
            for key, n in ((f"c:{XSS}", 3), ("r:b", 2), ("c:free", 1)):
                await engine.enqueue(queue, [TaskSpec(task_type="t", limit_key=key)] * n, now)
            leased = await engine.claim(queue, [], 10, "w", timedelta(minutes=5), now)
            assert len(leased) == 3  # one of c:<xss>, one of r:b, c:free's
            status, page = await get(daemon, f"/queues/{queue}/limits")
            assert status == 200, page
            assert "1/1m" in row(page, "data-limit-prefix", "r:")
            assert other not in page
            held = row(page, "data-limit-key", f"c:{XSS}".replace("<", "&lt;").replace(">", "&gt;"))
            assert '<td class="waiting">2</td>' in held
            assert '<td class="leased">1</td>' in held
            assert '<td class="next">now</td>' in held  # held by concurrency, not rate
            rate_held = row(page, "data-limit-key", "r:b")
            assert '<td class="waiting">1</td>' in rate_held
            assert "in " in rate_held
            assert 'data-limit-key="c:free"' not in page
            assert XSS not in page
            status, everything = await get(daemon, "/limits")
            assert status == 200
            assert other in everything
            assert queue in everything
            _, queue_page = await get(daemon, f"/queues/{queue}")
            assert f'href="/queues/{queue}/limits"' in queue_page

"""``ringod --ui-listen``: the dashboard over real HTTP (docs/dashboard.md).

The daemon runs in-process on the test's loop with a real engine (SQLite, and
PostgreSQL where storage is involved); a plain stdlib HTTP client talks to it
from a worker thread, one connection per request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import html
import http.client
import logging
import re
import socket
import subprocess
import sys
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import anyio
import pytest

from ringo_trio._proto.ringo.v1 import (
    AckRequest,
    CreditUpdate,
    DeleteTasksRequest,
    DeleteTasksResponse,
    Schedule,
    TaskSpec,
    TaskState,
)
from ringo_trio.server.daemon import Daemon
from ringo_trio.server.http.server import HttpLimits, Request, Response, serve_http
from ringo_trio.server.http.ui import Activity, instrument_activity
from ringo_trio.server.http.ui import app as app_module
from ringo_trio.server.http.ui.app import TASKS_PAGE, UI_HTTP
from ringo_trio.server.main import EXIT_FAILURE
from ringo_trio.server.retention import RetentionPolicy
from ringo_trio.server.storage.base import Ack, LeaseLost, Nack, Reject, Storage
from ringo_trio.server.storage.postgres import PostgresEngine
from ringo_trio.server.storage.sqlite import SQLiteEngine
from ringo_trio.testing import spawn_daemon
from tests._kit.grpc_client import connect, new_queue, open_work, ref, serving
from tests._kit.postgres import fresh_database

pytestmark = pytest.mark.anyio

TOKEN = "s3cret-token"
XSS = "<img src=x onerror=alert(1)>"
SCRIPT = b"<script>alert(1)</script>"


@pytest.fixture(scope="module")
def pg_database() -> Iterator[str]:
    with fresh_database("ringo_ui") as dsn:
        yield dsn


@contextmanager
def make_engine(kind: str, tmp_path: Path, dsn: str | None) -> Iterator[Storage]:
    if kind == "sqlite":
        yield SQLiteEngine(tmp_path / "ringo.db")
    else:
        assert dsn is not None
        yield PostgresEngine(dsn, schema="ui_" + tmp_path.name.lower()[-40:].replace("-", "_"))


@pytest.fixture(params=["sqlite", "postgres"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Storage]:
    dsn = request.getfixturevalue("pg_database") if request.param == "postgres" else None
    with make_engine(request.param, tmp_path, dsn) as storage:
        yield storage


@pytest.fixture
def sqlite(tmp_path: Path) -> Storage:
    return SQLiteEngine(tmp_path / "ringo.db")


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: str
    cookies: list[str] = field(default_factory=list)


class UI:
    """The dashboard of a serving daemon, seen by an HTTP client."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.host = f"127.0.0.1:{daemon.ui_port}"
        self.cookie = ""

    def _fetch(self, method: str, path: str, headers: dict[str, str], body: bytes | None) -> Reply:
        conn = http.client.HTTPConnection(self.host, timeout=10)
        try:
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            return Reply(
                response.status,
                {k.lower(): v for k, v in response.getheaders()},
                response.read().decode(),
                response.headers.get_all("Set-Cookie") or [],
            )
        finally:
            conn.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        form: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        bearer: str | None = None,
        cookie: bool = True,
    ) -> Reply:
        sent = dict(headers or {})
        if bearer is not None:
            sent["Authorization"] = f"Bearer {bearer}"
        if cookie and self.cookie:
            sent["Cookie"] = f"ringo_session={self.cookie}"
        body = None
        if form is not None:
            body = urllib.parse.urlencode(form, doseq=True).encode()
            sent["Content-Type"] = "application/x-www-form-urlencoded"
        reply = await anyio.to_thread.run_sync(self._fetch, method, path, sent, body)
        for set_cookie in reply.cookies:
            name, _, rest = set_cookie.partition("=")
            if name == "ringo_session":
                self.cookie = rest.split(";", 1)[0]
        return reply

    async def get(self, path: str, **kw: Any) -> Reply:
        return await self.request("GET", path, **kw)

    async def post(self, path: str, form: dict[str, Any], **kw: Any) -> Reply:
        return await self.request("POST", path, form=form, **kw)

    async def login(self) -> None:
        reply = await self.post("/login", {"token": TOKEN})
        assert reply.status == 303, reply
        assert self.cookie

    async def csrf(self, path: str) -> str:
        page = await self.get(path)
        assert page.status == 200, page
        [value] = set(re.findall(r'name="_csrf" value="([^"]*)"', page.body))
        return value


@asynccontextmanager
async def dashboard(storage: Storage, **config: Any) -> AsyncIterator[UI]:
    config.setdefault("ui_listen", ("127.0.0.1", 0))
    async with serving(storage, **config) as daemon:
        yield UI(daemon)


class Elements(HTMLParser):
    """Every start tag with its attributes, and the text inside each element id'd."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, {k: v or "" for k, v in attrs}))

    def find(self, tag: str, **attrs: str) -> list[dict[str, str]]:
        wanted = {k.rstrip("_").replace("_", "-"): v for k, v in attrs.items()}
        return [
            a
            for t, a in self.tags
            if t == tag and all(a.get(k) == v or (v == "*" and k in a) for k, v in wanted.items())
        ]


def text_of(body: str, element_id: str) -> str:
    match = re.search(rf'id="{element_id}"[^>]*>(.*?)</', body, re.S)
    assert match is not None, f"no #{element_id}"
    return html.unescape(match.group(1))


async def seed(storage: Storage, queue: str, count: int, **spec: Any) -> list[str]:
    spec.setdefault("task_type", "t")
    outcomes = await storage.enqueue(queue, [TaskSpec(**spec)] * count, datetime.now(UTC))
    return [o.task.id for o in outcomes]


async def dead(storage: Storage, queue: str) -> str:
    """A DEAD task of `queue` (rejected on its first attempt)."""
    [task_id] = await seed(storage, queue, 1, max_attempts=1)
    now = datetime.now(UTC)
    [leased] = await storage.claim(queue, [], 1, "w", timedelta(minutes=1), now)
    await storage.reject(ref(leased), "it broke", now)
    return task_id


# -- pages ---------------------------------------------------------------------


async def test_every_page_renders_the_selectors_the_browser_tests_use(engine: Storage) -> None:
    """Property: every route answers 200 with the contract's selectors (nav,
    main h1, tables with data-* rows, forms, fragments) and the security
    headers."""
    with anyio.fail_after(60):
        async with dashboard(engine) as ui:
            queue = new_queue("ui")
            dead_id = await dead(engine, queue)
            ids = await seed(engine, queue, 3, payload=b'{"a": [1, 2]}')
            assert (await ui.get("/")).headers["location"] == "/queues"
            for path in ("/queues", f"/queues/{queue}", f"/queues/{queue}/tasks/{ids[0]}"):
                page = await ui.get(path)
                assert page.status == 200, page
                found = Elements(page.body)
                assert found.find("a", href="/queues")
                assert found.find("a", href="/workers")
                assert "<main>" in page.body
                assert "<h1>" in page.body
                assert "script-src 'self'" in page.headers["content-security-policy"]
                assert page.headers["x-content-type-options"] == "nosniff"
                assert page.headers["referrer-policy"] == "same-origin"
            found = Elements((await ui.get("/queues")).body)
            [_row] = found.find("tr", data_queue=queue)
            assert found.find("table", id="queues")
            assert found.find("svg", class_="sparkline")
            body = (await ui.get("/queues")).body
            row_html = body[body.index(f'data-queue="{queue}"') :].split("</tr>", 1)[0]
            assert '<td data-state="PENDING" class="count">3</td>' in row_html
            assert '<td data-state="DEAD" class="count">1</td>' in row_html
            assert 'class="oldest-pending"' in row_html
            page = (await ui.get(f"/queues/{queue}")).body
            found = Elements(page)
            assert found.find("form", id="filters")
            assert found.find("select", name="state")
            assert found.find("input", name="type")
            assert found.find("input", name="key_prefix")
            assert {r["data-task-id"] for r in found.find("tr", data_task_id="*")} == {
                *ids,
                dead_id,
            }
            assert found.find("form", id="purge")
            assert found.find("input", name="_csrf")
            assert text_of(page, "queue-name") == queue
            detail = (await ui.get(f"/queues/{queue}/tasks/{ids[0]}?view=json")).body
            assert text_of(detail, "task-state") == "PENDING"
            assert '"a": [\n    1,' in text_of(detail, "payload")
            found = Elements(detail)
            assert {a["data-view"] for a in found.find("a", data_view="*")} == {
                "text",
                "json",
                "hex",
            }
            assert found.find("progress", id="progress")
            assert found.find("form", id="cancel")
            assert not found.find("form", id="retry")
            hexed = (await ui.get(f"/queues/{queue}/tasks/{ids[0]}?view=hex")).body
            assert text_of(hexed, "payload").startswith("00000000  7b 22 61 22")
            dead_page = (await ui.get(f"/queues/{queue}/tasks/{dead_id}")).body
            assert text_of(dead_page, "last-error") == "it broke"
            assert Elements(dead_page).find("form", id="retry")
            workers = await ui.get("/workers")
            assert workers.status == 200
            assert Elements(workers.body).find("table", id="workers")
            for path, name in (
                ("/queues", "queues"),
                (f"/queues/{queue}", "counts"),
                (f"/queues/{queue}/tasks/{ids[0]}", "task"),
                ("/workers", "workers"),
            ):
                fragment = await ui.get(f"{path}?fragment={name}")
                assert fragment.status == 200, (path, name)
                assert "<html" not in fragment.body, (path, name)
            assert (
                'data-count-state="PENDING">3<'
                in (await ui.get(f"/queues/{queue}?fragment=counts")).body
            )
            assert (await ui.get("/queues?fragment=nope")).status == 404
            for name in ("ui.js", "ui.css"):
                static = await ui.get(f"/static/{name}")
                assert static.status == 200
                assert static.body
            assert (await ui.get("/nowhere")).status == 404
            assert (await ui.get(f"/queues/{queue}/tasks/nope")).status == 404


async def test_workers_page_lists_live_work_streams(sqlite: Storage) -> None:
    """Property: /workers shows each registered Work stream with its queue,
    concurrency, credit and leases held, and forgets it when it ends."""
    with anyio.fail_after(30):
        async with dashboard(sqlite) as ui, connect(f"127.0.0.1:{ui.daemon.port}") as client:
            queue = new_queue("ui")
            await seed(sqlite, queue, 2)
            async with open_work(client) as work:
                await work.register(queue, worker_id=f"w-{XSS}", max_concurrency=7)
                await work.call(credit=CreditUpdate(available=5))
                leased = await work.wait_tasks(2)
                assert (await work.call(ack=AckRequest(lease=ref(leased[0])))).error is None
                page = (await ui.get("/workers")).body
                [_row] = Elements(page).find("tr", data_worker_id=f"w-{XSS}")
                cells = page[page.index("data-worker-id") :].split("</tr>", 1)[0]
                assert '<td class="concurrency">7</td>' in cells
                assert '<td class="credit">3</td>' in cells
                assert '<td class="leases">1</td>' in cells
                assert XSS not in page
                # Half-close and read the status: the daemon has forgotten
                # the stream before it sends its status.
                await work.stream.end()
                await work.end_status()
            page = (await ui.get("/workers")).body
            assert not Elements(page).find("tr", data_worker_id="*")
            # The ack shows in the queue's sparkline.
            queues = (await ui.get("/queues")).body
            assert "1 succeeded, 0 failed in the last hour" in queues


async def test_schedules_page_shows_each_stored_schedule(engine: Storage) -> None:
    """Property: /schedules lists every stored schedule (queue, name, task
    type, cron + zone or every, next fire, last fired linked to the task it
    made, paused, fired and skipped counts), /queues/Q/schedules only Q's;
    the overview and the queue page link to them; what clients named is
    escaped."""
    with anyio.fail_after(60):
        qa, qb = new_queue("ui-sa"), new_queue("ui-sb")
        now = datetime.now(UTC)
        # Stored and fired before the daemon starts, an hour apart, so its
        # own schedule loop changes nothing while the pages are read: the
        # three hourly ticks due at `now` are one on time (fired) and two
        # missed (skipped).
        await engine.open()
        await engine.put_schedule(
            Schedule(name="hourly", queue=qa, task_type=XSS, every=timedelta(hours=1), catch_up=1),
            now - timedelta(hours=3, seconds=1),
            max_per_queue=10,
        )
        await engine.put_schedule(
            Schedule(name="nightly", queue=qb, task_type="report", cron="30 2 * * *",
                     timezone="Europe/Paris", paused=True, catch_up=1),
            now,
            max_per_queue=10,
        )  # fmt: skip
        report = await engine.fire_schedules(now, 100)
        [made] = report.created
        async with dashboard(engine) as ui:
            page = await ui.get("/schedules")
            assert page.status == 200, page
            elements = Elements(page.body)
            assert elements.find("a", href="/schedules")
            [_a] = elements.find("tr", data_schedule=f"{qa}/hourly")
            [_b] = elements.find("tr", data_schedule=f"{qb}/nightly")
            row_a = page.body[page.body.index(f'data-schedule="{qa}/hourly"') :].split("</tr>")[0]
            assert '<td class="timing">every 1h</td>' in row_a
            assert '<td class="fired count">1</td>' in row_a
            assert '<td class="skipped count">2</td>' in row_a
            assert '<td class="paused"></td>' in row_a
            assert f'href="/queues/{qa}/tasks/{made.id}"' in row_a
            assert "(in 59m" in row_a
            row_b = page.body[page.body.index(f'data-schedule="{qb}/nightly"') :].split("</tr>")[0]
            assert "30 2 * * * (Europe/Paris)" in row_b
            assert '<td class="paused">paused</td>' in row_b
            assert '<td class="last-fired">never</td>' in row_b
            assert XSS not in page.body
            assert html.escape(XSS) in page.body
            task = await ui.get(f"/queues/{qa}/tasks/{made.id}")
            assert task.status == 200
            one = Elements((await ui.get(f"/queues/{qb}/schedules")).body)
            assert [r["data-schedule"] for r in one.find("tr", data_schedule="*")] == [
                f"{qb}/nightly"
            ]
            overview = Elements((await ui.get("/queues")).body)
            assert overview.find("a", id="schedules-link", href="/schedules")
            queue_page = Elements((await ui.get(f"/queues/{qa}")).body)
            assert queue_page.find("a", id="schedules-link", href=f"/queues/{qa}/schedules")
            empty = await ui.get(f"/queues/{new_queue('ui-none')}/schedules")
            assert empty.status == 200
            assert "No schedule in this queue." in empty.body


# -- authentication and CSRF ---------------------------------------------------


async def test_a_token_guards_every_page_and_the_cookie_is_a_signed_session(
    sqlite: Storage,
) -> None:
    """Property: with a token, a page without credentials redirects to the
    login form (a fragment or POST is 401), a wrong bearer is 401, the right
    bearer or the login cookie opens it; the cookie is HttpOnly,
    SameSite=Strict and never contains the token; a tampered cookie opens
    nothing; a wrong login is 401 and throttled by the gate's throttle."""
    with anyio.fail_after(60):
        async with dashboard(sqlite, token=TOKEN, auth_failure_delay=0.0) as ui:
            reply = await ui.get("/queues")
            assert (reply.status, reply.headers["location"]) == (303, "/login")
            assert (await ui.get("/queues?fragment=queues")).status == 401
            assert (await ui.get("/workers", bearer="wrong")).status == 401
            assert (await ui.get("/workers", bearer=TOKEN)).status == 200
            assert (await ui.post("/queues/q/purge", {})).status == 401
            assert (await ui.get("/login")).status == 200
            wrong = await ui.post("/login", {"token": "nope"})
            assert wrong.status == 401
            assert "wrong token" in wrong.body
            assert not ui.cookie
            reply = await ui.post("/login", {"token": TOKEN})
            [set_cookie] = reply.cookies
            assert "HttpOnly" in set_cookie
            assert "SameSite=Strict" in set_cookie
            assert TOKEN not in set_cookie
            assert (await ui.get("/queues")).status == 200
            good = ui.cookie
            ui.cookie = good[:-2] + ("AA" if not good.endswith("AA") else "BB")
            assert (await ui.get("/queues")).status == 303
            ui.cookie = good
            logout = await ui.post("/logout", {})
            assert "Max-Age=0" in logout.cookies[0]


async def test_wrong_tokens_wait_in_the_gates_throttle(sqlite: Storage) -> None:
    """Property: a wrong login is not answered before the throttle's delay:
    while it waits, the gate's throttle counts it for the address."""
    with anyio.fail_after(30):
        async with dashboard(sqlite, token=TOKEN, auth_failure_delay=20.0) as ui:
            throttle = ui.daemon.gate.throttle
            result: list[Reply] = []

            async def guess() -> None:
                result.append(await ui.post("/login", {"token": "guess"}))

            async with anyio.create_task_group() as tg:
                tg.start_soon(guess)
                # The throttle has no event to wait on; the guess is in a thread.
                while throttle.waiting("127.0.0.1") == 0:  # noqa: ASYNC110
                    await anyio.sleep(0.01)
                assert not result
            assert result[0].status == 401
            assert throttle.waiting("127.0.0.1") == 0


async def test_actions_need_the_sessions_csrf_token_and_same_origin(engine: Storage) -> None:
    """Property: a cookie-authenticated POST without the session's CSRF token,
    with another session's token, or from another Origin is 403 and changes
    nothing (a task's retry, the bulk actions, pause); with the right token
    it acts."""
    with anyio.fail_after(60):
        async with dashboard(engine, token=TOKEN) as ui:
            queue = new_queue("ui")
            task_id = await dead(engine, queue)
            path = f"/queues/{queue}/tasks/{task_id}"
            await ui.login()
            csrf = await ui.csrf(path)
            other = UI(ui.daemon)
            await other.login()
            foreign = await other.csrf(path)
            assert foreign != csrf
            for form, headers in (
                ({}, {}),
                ({"_csrf": "x" * len(csrf)}, {}),
                ({"_csrf": foreign}, {}),
                ({"_csrf": csrf}, {"Origin": "http://evil.example"}),
            ):
                reply = await ui.post(f"{path}/retry", form, headers=headers)
                assert reply.status == 403, (form, headers)
                for action in ("bulk/retry", "bulk/cancel", "bulk/purge", "pause"):
                    reply = await ui.post(f"/queues/{queue}/{action}", form, headers=headers)
                    assert reply.status == 403, (action, form, headers)
                assert (await engine.get(queue, task_id=task_id)).state == TaskState.DEAD
                assert await engine.paused_queues() == frozenset()
            reply = await ui.post(f"{path}/retry", {"_csrf": csrf}, headers={"Origin": ""})
            assert reply.status == 403
            reply = await ui.post(
                f"{path}/retry", {"_csrf": csrf}, headers={"Origin": f"http://{ui.host}"}
            )
            assert (reply.status, reply.headers["location"]) == (303, path)
            assert (await engine.get(queue, task_id=task_id)).state == TaskState.PENDING


async def test_on_loopback_only_loopback_host_names_are_answered(sqlite: Storage) -> None:
    """Property: a dashboard listening on loopback answers 421 to a request
    naming another host (a DNS-rebinding page's), whatever its credentials,
    and serves 127.0.0.1, localhost and [::1] names."""
    with anyio.fail_after(30):
        async with dashboard(sqlite) as ui:
            for host in ("evil.example", f"evil.example:{ui.daemon.ui_port}", "10.0.0.1"):
                reply = await ui.get("/queues", headers={"Host": host})
                assert reply.status == 421, host
            for host in (ui.host, f"localhost:{ui.daemon.ui_port}", "[::1]:1", "127.0.0.1"):
                assert (await ui.get("/queues", headers={"Host": host})).status == 200, host


async def test_read_only_renders_no_action_and_refuses_every_post(sqlite: Storage) -> None:
    """Property: --ui-read-only renders no action form (no Pause either) and
    answers every action POST 403 (even with a valid CSRF token) without
    changing storage."""
    with anyio.fail_after(30):
        async with dashboard(sqlite, ui_read_only=True) as ui:
            queue = new_queue("ui")
            task_id = await dead(sqlite, queue)
            path = f"/queues/{queue}/tasks/{task_id}"
            page = await ui.get(path)
            assert not Elements(page.body).find("form", id="retry")
            assert not Elements((await ui.get(f"/queues/{queue}")).body).find("form", id="purge")
            csrf = ui.daemon.dashboard.sessions.csrf(  # type: ignore[union-attr]
                ui.daemon.dashboard.sessions.session(ui.cookie)  # type: ignore[union-attr,arg-type]
            )
            listing = Elements((await ui.get(f"/queues/{queue}")).body)
            assert not listing.find("form", id="pause")
            assert not listing.find("div", id="bulk")
            for action in (
                f"{path}/retry",
                f"{path}/cancel",
                f"/queues/{queue}/purge",
                f"/queues/{queue}/pause",
                f"/queues/{queue}/bulk/retry",
                f"/queues/{queue}/bulk/cancel",
                f"/queues/{queue}/bulk/purge",
            ):
                assert (await ui.post(action, {"_csrf": csrf})).status == 403
            assert (await sqlite.get(queue, task_id=task_id)).state == TaskState.DEAD
            assert await sqlite.paused_queues() == frozenset()


# -- escaping ------------------------------------------------------------------


async def test_user_supplied_text_is_rendered_escaped(engine: Storage) -> None:
    """Property: a payload of <script>, a task type, unique key, error and
    queue name holding an <img onerror> appear only escaped, on every page."""
    with anyio.fail_after(60):
        async with dashboard(engine) as ui:
            queue = f"q{XSS}"
            [task_id] = await seed(engine, queue, 1, payload=SCRIPT, task_type=XSS, unique_key=XSS)
            now = datetime.now(UTC)
            [leased] = await engine.claim(queue, [], 1, "w", timedelta(minutes=1), now)
            await engine.nack(ref(leased), XSS, timedelta(hours=1), now)
            q = urllib.parse.quote(queue, safe="")
            for path in (
                "/queues",
                f"/queues/{q}",
                f"/queues/{q}/tasks/{task_id}",
                f"/queues/{q}/tasks/{task_id}?view=json",
                f"/queues/{q}/tasks/{task_id}?view=hex",
                f"/queues/{q}?type={urllib.parse.quote(XSS)}&key_prefix=%3Cimg",
            ):
                page = await ui.get(path)
                assert page.status == 200, (path, page.body)
                assert XSS not in page.body, path
                assert "<script>alert" not in page.body, path
                assert "&lt;img" in page.body, path
            detail = (await ui.get(f"/queues/{q}/tasks/{task_id}")).body
            assert text_of(detail, "payload") == SCRIPT.decode()
            assert text_of(detail, "task-type") == XSS
            assert text_of(detail, "last-error") == XSS
            page = await ui.get(f"/queues/{q}")
            assert Elements(page.body).find("tr", data_task_id=task_id)


# -- actions and paging --------------------------------------------------------


async def test_actions_change_storage(engine: Storage) -> None:
    """Property: retry makes a DEAD task PENDING, cancel makes a PENDING task
    CANCELLED with the reason, purge deletes the finished tasks older than
    asked; actions that do not apply answer 409 and change nothing."""
    with anyio.fail_after(60):
        async with dashboard(engine) as ui:
            queue = new_queue("ui")
            dead_id = await dead(engine, queue)
            [pending_id] = await seed(engine, queue, 1)
            base = f"/queues/{queue}/tasks"
            csrf = await ui.csrf(f"{base}/{dead_id}")
            assert (await ui.post(f"{base}/{dead_id}/retry", {"_csrf": csrf})).status == 303
            assert (await engine.get(queue, task_id=dead_id)).state == TaskState.PENDING
            assert (await ui.post(f"{base}/{dead_id}/retry", {"_csrf": csrf})).status == 409
            cancel = {"_csrf": csrf, "reason": "not needed"}
            assert (await ui.post(f"{base}/{pending_id}/cancel", cancel)).status == 303
            task = await engine.get(queue, task_id=pending_id)
            assert task.state == TaskState.CANCELLED
            assert "not needed" in task.last_error
            purge = {"_csrf": csrf, "state": ["CANCELLED"], "older_than": "1h"}
            reply = await ui.post(f"/queues/{queue}/purge", purge)
            # A purge of one batch is done when the click is answered.
            page = await ui.get(reply.headers["location"])
            assert text_of(page.body, "purged") == "Deleted 0 finished task(s)."
            purge["older_than"] = ""
            reply = await ui.post(f"/queues/{queue}/purge", purge)
            page = await ui.get(reply.headers["location"])
            assert page.status == 200
            assert text_of(page.body, "purged") == "Deleted 1 finished task(s)."
            assert (await ui.get(f"{base}/{pending_id}")).status == 404
            bad = await ui.post(f"/queues/{queue}/purge", {"_csrf": csrf, "state": "PENDING"})
            assert bad.status == 400


async def finished_tasks(storage: Storage, queue: str, count: int) -> None:
    now = datetime.now(UTC)
    for task_id in await seed(storage, queue, count):
        await storage.cancel(queue, "done with it", now, task_id=task_id)


class GatedDeletes:
    """The daemon's DeleteTasks as the dashboard calls it: counted, and every
    batch after the first held until `gate` is set."""

    def __init__(self, daemon: Daemon) -> None:
        self._delete = daemon.queue_service.delete_tasks
        self.limits: list[int] = []
        self.gate = asyncio.Event()
        self.cancelled = False

    async def __call__(self, request: DeleteTasksRequest) -> DeleteTasksResponse:
        self.limits.append(request.limit)
        try:
            if len(self.limits) > 1:
                await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return await self._delete(request)

    async def second_batch(self) -> None:
        """Until the second batch has started (and waits at the gate)."""
        while len(self.limits) < 2:  # noqa: ASYNC110
            await asyncio.sleep(0.005)
        assert self.limits == [self.limits[0]] * 2


async def test_a_purge_runs_in_background_batches_and_the_page_shows_progress(
    engine: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Property: a purge click deletes in batches of the retention batch size,
    one DeleteTasks call each, in the background: the click is answered
    after the first batch while the rest is still to do, pages are served
    meanwhile, and the queue's page (and its live `purge` part) shows the
    count so far, then the total. A second click while it runs starts no
    second purge (no extra batch) and shows the running one. What it
    deletes is unchanged: the finished tasks, not the active ones."""
    policy = RetentionPolicy(batch=3, pause=0)
    with anyio.fail_after(60):
        async with dashboard(engine, retention=policy) as ui:
            deletes = GatedDeletes(ui.daemon)
            monkeypatch.setattr(ui.daemon.queue_service, "delete_tasks", deletes)
            queue = new_queue("ui")
            await finished_tasks(engine, queue, 10)
            [pending] = await seed(engine, queue, 1)
            csrf = await ui.csrf(f"/queues/{queue}")
            reply = await ui.post(f"/queues/{queue}/purge", {"_csrf": csrf})
            assert reply.status == 303
            location = reply.headers["location"]
            assert re.fullmatch(rf"/queues/{queue}\?purge=\d+", location), location
            # The first batch is done; the second (after the pause) waits at the gate.
            assert deletes.limits[0] == 3
            await deletes.second_batch()
            progress = "Purging: 3 finished task(s) deleted so far."
            assert text_of((await ui.get(location)).body, "purging") == progress
            assert text_of((await ui.get(f"/queues/{queue}")).body, "purging") == progress
            again = await ui.post(f"/queues/{queue}/purge", {"_csrf": csrf})
            assert again.headers["location"] == location
            assert deletes.limits == [3, 3]
            fragment = await ui.get(f"{location}&fragment=purge")
            assert text_of(fragment.body, "purging") == progress
            deletes.gate.set()
            while "purged" not in (fragment := await ui.get(f"{location}&fragment=purge")).body:  # noqa: ASYNC110
                await anyio.sleep(0.01)
            assert text_of(fragment.body, "purged") == "Deleted 10 finished task(s)."
            # 3 + 3 + 3 + 1: the short batch ends it.
            assert deletes.limits == [3, 3, 3, 3]
            assert (await engine.get(queue, task_id=pending)).state == TaskState.PENDING
            stats = await engine.queue_stats(queue, datetime.now(UTC), by_type=False)
            assert (stats.cancelled, stats.pending) == (0, 1)
            # Done, the queue's page no longer shows it unless asked by id.
            assert 'id="purge-status"' not in (await ui.get(f"/queues/{queue}")).body
            bad = await ui.post(f"/queues/{'x' * 300}/purge", {"_csrf": csrf})
            assert bad.status == 400


async def test_a_running_purge_is_cancelled_when_the_daemon_stops(
    sqlite: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Property: a purge belongs to the daemon: stopping the daemon cancels
    it between two batches (it does not outlive serve(), nor keep it
    waiting), and what its batches deleted stays deleted."""
    policy = RetentionPolicy(batch=2, pause=0)
    with anyio.fail_after(30):
        async with dashboard(sqlite, retention=policy) as ui:
            deletes = GatedDeletes(ui.daemon)
            monkeypatch.setattr(ui.daemon.queue_service, "delete_tasks", deletes)
            queue = new_queue("ui")
            await finished_tasks(sqlite, queue, 5)
            csrf = await ui.csrf(f"/queues/{queue}")
            reply = await ui.post(f"/queues/{queue}/purge", {"_csrf": csrf})
            assert text_of((await ui.get(reply.headers["location"])).body, "purging")
            await deletes.second_batch()
            assert not deletes.cancelled
        # dashboard() returned: the daemon stopped, with the purge gated.
        assert deletes.cancelled
    await sqlite.open()
    try:
        stats = await sqlite.queue_stats(queue, datetime.now(UTC), by_type=False)
        assert stats.cancelled == 3
    finally:
        await sqlite.close()


async def test_a_retry_from_the_dashboard_wakes_an_idle_worker(engine: Storage) -> None:
    """Property: retry goes through the RPC's code path, wake-up included: an
    idle Work stream of the queue is pushed the retried task at once (it has
    nothing scheduled to wake it otherwise)."""
    with anyio.fail_after(30):
        async with dashboard(engine) as ui, connect(f"127.0.0.1:{ui.daemon.port}") as client:
            queue = new_queue("ui")
            task_id = await dead(engine, queue)
            csrf = await ui.csrf(f"/queues/{queue}/tasks/{task_id}")
            async with open_work(client) as work:
                await work.register(queue)
                await work.call(credit=CreditUpdate(available=1))
                retry = f"/queues/{queue}/tasks/{task_id}/retry"
                assert (await ui.post(retry, {"_csrf": csrf})).status == 303
                [pushed] = await work.wait_tasks(1)
                assert pushed.task is not None
                assert pushed.task.id == task_id


async def test_pause_and_resume_from_the_queue_page(engine: Storage) -> None:
    """Property: the queue page's Pause form pauses the queue (stored; the
    page and the overview then say "paused" and offer Resume, CSRF needed
    like every action); Resume goes through the RPC's code path, so an idle
    Work stream of the queue is pushed its waiting task at once."""
    with anyio.fail_after(30):
        async with dashboard(engine) as ui, connect(f"127.0.0.1:{ui.daemon.port}") as client:
            queue = new_queue("ui")
            page = Elements((await ui.get(f"/queues/{queue}")).body)
            assert page.find("form", id="pause")
            assert not page.find("span", id="paused")
            csrf = await ui.csrf(f"/queues/{queue}")
            assert (await ui.post(f"/queues/{queue}/pause", {})).status == 403
            assert (await ui.post(f"/queues/{queue}/pause", {"_csrf": csrf})).status == 303
            assert await engine.paused_queues() == {queue}
            body = (await ui.get(f"/queues/{queue}")).body
            assert text_of(body, "paused") == "paused"
            assert f'action="/queues/{queue}/resume"' in body
            overview = (await ui.get("/queues")).body
            assert Elements(overview).find("tr", data_queue=queue)
            assert '<span class="badge">paused</span>' in overview
            async with open_work(client) as work:
                await work.register(queue)
                await work.call(credit=CreditUpdate(available=1))
                task = await client.enqueue(queue)
                assert (await ui.post(f"/queues/{queue}/resume", {"_csrf": csrf})).status == 303
                [pushed] = await work.wait_tasks(1)
                assert pushed.task is not None
                assert pushed.task.id == task.id
            assert await engine.paused_queues() == frozenset()


async def test_paging_walks_every_task_once_with_filters(engine: Storage) -> None:
    """Property: following a#next-page from the first page lists every task of
    the queue exactly once; filters (state, type, key prefix) narrow the
    list and survive paging."""
    with anyio.fail_after(60):
        async with dashboard(engine) as ui:
            queue = new_queue("ui")
            ids = set(await seed(engine, queue, TASKS_PAGE * 2 + 5))
            typed = set()
            for i in range(TASKS_PAGE + 3):
                typed |= set(await seed(engine, queue, 1, task_type="other", unique_key=f"k{i}"))
            seen: list[str] = []
            path: str | None = f"/queues/{queue}"
            while path is not None and len(seen) <= 2 * len(ids | typed):
                found = Elements((await ui.get(path)).body)
                seen += [r["data-task-id"] for r in found.find("tr", data_task_id="*")]
                links = found.find("a", id="next-page")
                path = html.unescape(links[0]["href"]) if links else None
            assert len(seen) == len(set(seen)) == len(ids | typed)
            assert set(seen) == ids | typed
            seen = []
            path = f"/queues/{queue}?type=other&state=PENDING"
            while path is not None and len(seen) <= 2 * len(typed):
                found = Elements((await ui.get(path)).body)
                seen += [r["data-task-id"] for r in found.find("tr", data_task_id="*")]
                links = found.find("a", id="next-page")
                path = html.unescape(links[0]["href"]) if links else None
                assert path is None or "type=other" in path
            assert set(seen) == typed
            found = Elements((await ui.get(f"/queues/{queue}?key_prefix=k1")).body)
            assert len(found.find("tr", data_task_id="*")) == 1 + 10
            assert (await ui.get(f"/queues/{queue}?state=NOPE")).status == 400
            assert (await ui.get(f"/queues/{queue}?page_token=garbage")).status == 400


# -- limits --------------------------------------------------------------------


async def test_oversized_requests_and_too_many_connections_are_refused(sqlite: Storage) -> None:
    """Property: a request head over the cap is 431, a body over the cap 413,
    a connection past max_connections_per_address from one address is 503
    and closed while another address is still served; the dashboard serves
    normally afterwards."""
    with anyio.fail_after(60):
        async with dashboard(sqlite) as ui:
            host, port = "127.0.0.1", ui.daemon.ui_port
            assert port is not None

            def raw(data: bytes) -> bytes:
                with socket.create_connection((host, port), timeout=10) as sock:
                    with suppress(ConnectionResetError):
                        sock.sendall(data)
                    chunks = []
                    while chunk := sock.recv(65536):
                        chunks.append(chunk)
                    return b"".join(chunks)

            head = b"GET /queues HTTP/1.1\r\nHost: x\r\nX-Fill: " + b"a" * 20_000 + b"\r\n\r\n"
            assert (await anyio.to_thread.run_sync(raw, head)).startswith(b"HTTP/1.1 431")
            body = b"a" * (UI_HTTP.max_body_bytes + 1)
            post = (
                b"POST /login HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body
            )
            assert (await anyio.to_thread.run_sync(raw, post)).startswith(b"HTTP/1.1 413")
            assert UI_HTTP.max_connections_per_address is not None
            assert UI_HTTP.max_connections_per_address < UI_HTTP.max_connections
            held = [
                await anyio.to_thread.run_sync(socket.create_connection, (host, port))
                for _ in range(UI_HTTP.max_connections_per_address)
            ]
            try:
                # The server accepts in order: once a held one is being
                # served, the next from the same address is over its cap.
                extra = await anyio.to_thread.run_sync(raw, b"")
                assert extra.startswith(b"HTTP/1.1 503"), extra
                assert b"from your address" in extra
                other = await anyio.to_thread.run_sync(
                    functools.partial(fetch_from, "127.0.0.2", ui.host, "/queues")
                )
                assert other == 200
            finally:
                for sock in held:
                    sock.close()
            for _ in range(50):
                reply = await ui.get("/queues")
                if reply.status == 200:
                    break
            assert reply.status == 200


def fetch_from(source: str, host: str, path: str) -> int:
    """The status of GET `path` sent from the loopback address `source`."""
    conn = http.client.HTTPConnection(host, timeout=10, source_address=(source, 0))
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


async def test_a_bug_in_a_page_is_a_500_and_the_dashboard_goes_on(
    sqlite: Storage, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Property: an unexpected exception in a page answers that request 500
    (with the security headers) and is logged; other requests are served."""

    def broken(*_: Any) -> None:
        raise RuntimeError("template on fire")

    with anyio.fail_after(30):
        async with dashboard(sqlite) as ui:
            assert ui.daemon.dashboard is not None
            monkeypatch.setattr(ui.daemon.dashboard, "_workers", broken)
            reply = await ui.get("/workers")
            assert reply.status == 500
            assert "frame-ancestors 'none'" in reply.headers["content-security-policy"]
            assert (await ui.get("/queues")).status == 200
    assert any("template on fire" in str(r.exc_info) for r in caplog.records if r.exc_info)


def raw_request(host: str, data: bytes) -> bytes:
    """Send `data` to the dashboard at `host` and read until it closes."""
    address, _, port = host.rpartition(":")
    with socket.create_connection((address, int(port)), timeout=10) as sock:
        with suppress(ConnectionResetError):
            sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


@pytest.mark.parametrize(
    "cookie",
    [
        pytest.param(b"ringo_session=caf\xc3\xa9", id="non-ascii"),
        pytest.param(b"ringo_session=a.9999999999.caf\xc3\xa9", id="non-ascii-signature"),
        pytest.param(b"ringo_session=\xff\xfe", id="not-utf8"),
        pytest.param(b"ringo_session=a\x01b", id="control"),
        pytest.param(b'ringo_session="a b"', id="space"),
        pytest.param(b"ringo_session=a\\b", id="backslash"),
        pytest.param(b"ringo_session=a,b", id="comma"),
    ],
)
async def test_a_malformed_session_cookie_is_a_400_and_logs_nothing(
    sqlite: Storage, cookie: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """Property: a session cookie whose bytes are not cookie text (one
    non-ASCII byte, say) answers 400, not 500, and logs no error; another
    service's cookie holding the same bytes is ignored, so the session
    beside it still opens the dashboard."""
    with anyio.fail_after(30):
        async with dashboard(sqlite, token=TOKEN) as ui:
            head = b"GET /queues HTTP/1.1\r\nHost: %s\r\nCookie: %s\r\nConnection: close\r\n\r\n"
            answer = await anyio.to_thread.run_sync(
                raw_request, ui.host, head % (ui.host.encode(), cookie)
            )
            assert answer.startswith(b"HTTP/1.1 400"), answer
            await ui.login()
            if b"\xff" not in cookie and b"\x01" not in cookie:
                foreign = cookie.replace(b"ringo_session", b"other_app")
                both = foreign + b"; ringo_session=" + ui.cookie.encode()
                answer = await anyio.to_thread.run_sync(
                    raw_request, ui.host, head % (ui.host.encode(), both)
                )
                assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_malformed_request_bytes_are_a_400_from_the_dashboard(sqlite: Storage) -> None:
    """Property: a dashboard request with a broken percent escape (path or
    query), a non-UTF-8 header, or a form body no browser makes (login and
    actions alike) is answered 400, never 500 or a wrong-token 401."""
    with anyio.fail_after(60):
        async with dashboard(sqlite, token=TOKEN, auth_failure_delay=0.0) as ui:
            await ui.login()
            host = ui.host.encode()
            cookie = b"Cookie: ringo_session=" + ui.cookie.encode()
            for head in (
                b"GET /queues/%zz HTTP/1.1\r\nHost: " + host + b"\r\n" + cookie + b"\r\n\r\n",
                b"GET /queues/%ff HTTP/1.1\r\nHost: " + host + b"\r\n" + cookie + b"\r\n\r\n",
                b"GET /queues?page_token=%f HTTP/1.1\r\nHost: " + host + b"\r\n\r\n",
                b"GET /queues HTTP/1.1\r\nHost: " + host + b"\r\nUser-Agent: \xe9\r\n\r\n",
                b"POST /login HTTP/1.1\r\nHost: " + host + b"\r\nContent-Length: 9\r\n\r\n"
                b"token=%ff",
                b"POST /queues/q/purge HTTP/1.1\r\nHost: " + host + b"\r\n" + cookie + b"\r\n"
                b"Content-Length: 2\r\n\r\n\xff\xfe",
            ):
                answer = await anyio.to_thread.run_sync(raw_request, ui.host, head)
                assert answer.startswith(b"HTTP/1.1 400"), (head, answer[:200])


async def test_a_payload_with_a_lone_surrogate_renders_in_every_view(engine: Storage) -> None:
    """Property: a payload whose JSON holds a lone surrogate escape (and one
    whose bytes are an encoded surrogate) renders 200 in the text, JSON and
    hex views, the surrogate shown as its escape."""
    with anyio.fail_after(60):
        async with dashboard(engine) as ui:
            queue = new_queue("ui")
            [escaped] = await seed(engine, queue, 1, payload=b'{"a": "\\udcff"}')
            [encoded] = await seed(engine, queue, 1, payload=b'{"a": "\xed\xb3\xbf"}')
            for task_id in (escaped, encoded):
                for view in ("text", "json", "hex"):
                    page = await ui.get(f"/queues/{queue}/tasks/{task_id}?view={view}")
                    assert page.status == 200, (task_id, view, page.body[:200])
            page = await ui.get(f"/queues/{queue}/tasks/{escaped}?view=json")
            assert '"a": "\\udcff"' in text_of(page.body, "payload")


async def test_a_failing_page_logs_one_traceback_per_client(
    sqlite: Storage, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Property: a page failing on every request answers 500 every time, but
    its client gets at most one traceback logged per interval; another
    client address gets its own."""

    def broken(*_: Any) -> None:
        raise RuntimeError("template on fire")

    with anyio.fail_after(60):
        async with dashboard(sqlite) as ui:
            assert ui.daemon.dashboard is not None
            monkeypatch.setattr(ui.daemon.dashboard, "_workers", broken)
            for _ in range(10):
                assert (await ui.get("/workers")).status == 500
            other = functools.partial(fetch_from, "127.0.0.2", ui.host, "/workers")
            assert await anyio.to_thread.run_sync(other) == 500
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert len(tracebacks) == 2
    assert all("template on fire" in str(r.exc_info) for r in tracebacks)


async def test_parallel_wrong_logins_are_all_answered_401(
    sqlite: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Property: 24 wrong logins sent at once from one address (more than the
    throttle lets wait in its line) are all answered 401, none dropped or
    left waiting one behind the other; the throttle forgets none of them."""
    # One address may hold more connections than the line holds waiters.
    limits = dataclasses.replace(UI_HTTP, max_connections=64, max_connections_per_address=32)
    monkeypatch.setattr(app_module, "UI_HTTP", limits)
    parallel = 24
    with anyio.fail_after(60):
        async with dashboard(sqlite, token=TOKEN, auth_failure_delay=1.0) as ui:
            assert parallel > ui.daemon.gate.throttle.max_waiting
            statuses: list[int] = []

            async def guess() -> None:
                reply = await UI(ui.daemon).post("/login", {"token": "guess"})
                statuses.append(reply.status)

            async with anyio.create_task_group() as tg:
                for _ in range(parallel):
                    tg.start_soon(guess)
            assert statuses == [401] * parallel
            assert ui.daemon.gate.throttle.waiting("127.0.0.1") == 0


async def test_keep_alive_serves_requests_one_after_another(sqlite: Storage) -> None:
    """Property: one connection serves several requests in turn (HTTP/1.1
    keep-alive), and an error answer closes it."""
    with anyio.fail_after(30):
        async with dashboard(sqlite) as ui:

            def session() -> list[tuple[int, bool]]:
                conn = http.client.HTTPConnection(ui.host, timeout=10)
                try:
                    conn.connect()
                    sock = conn.sock
                    out = []
                    for path in ("/queues", "/workers", "/static/ui.css", "/nowhere"):
                        conn.request("GET", path)
                        response = conn.getresponse()
                        response.read()
                        # http.client drops its socket when the server closes.
                        out.append((response.status, conn.sock is sock))
                    return out
                finally:
                    conn.close()

            answers = await anyio.to_thread.run_sync(session)
            assert answers == [(200, True), (200, True), (200, True), (404, False)]


def test_ringod_serves_the_dashboard_and_reports_its_url(tmp_path: Path) -> None:
    """Property: ``ringod --ui-listen HOST:0`` reports the bound URL as "ui" in
    its ready line and serves it (read-only refuses actions); an address
    that cannot be bound is a startup failure naming it."""
    args = ["--ui-listen", "127.0.0.1:0", "--ui-read-only"]
    with spawn_daemon(tmp_path / "d", token=TOKEN, extra_args=args) as process:
        url = process.info["ui"]
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", url), url
        host = url.removeprefix("http://")
        conn = http.client.HTTPConnection(host, timeout=10)
        try:
            conn.request("GET", "/queues", headers={"Authorization": f"Bearer {TOKEN}"})
            assert conn.getresponse().status == 200
        finally:
            conn.close()
        conn = http.client.HTTPConnection(host, timeout=10)
        try:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            conn.request("POST", "/queues/q/purge", body=b"", headers=headers)
            assert conn.getresponse().status == 403
        finally:
            conn.close()
        taken = int(url.rpartition(":")[2])
        result = subprocess.run(
            [
                *(sys.executable, "-m", "ringo_trio.server"),
                *("--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "other")),
                *("--ui-listen", f"127.0.0.1:{taken}"),
            ],
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
        )
        assert result.returncode == EXIT_FAILURE
        assert f"cannot serve the dashboard on 127.0.0.1:{taken}" in result.stderr
    assert process.process.returncode == 0, process.stderr_text()


async def test_slow_clients_get_408_and_idle_connections_are_closed() -> None:
    """Property: a request not whole within read_timeout of its first byte is
    answered 408 and closed; a keep-alive connection idle that long is
    closed without an answer."""
    limits = HttpLimits(read_timeout=0.3)

    async def ok(request: Request) -> Response:
        return Response(200, b"ok")

    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]

    def slow() -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # never the blank line
            return sock.recv(65536)

    def idle() -> tuple[bytes, bytes]:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            first = sock.recv(65536)
            return first, sock.recv(65536)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(serve_http, listener, ok, limits, name="test"))
            assert (await anyio.to_thread.run_sync(slow)).startswith(b"HTTP/1.1 408")
            first, then = await anyio.to_thread.run_sync(idle)
            assert first.startswith(b"HTTP/1.1 200")
            assert then == b""
            tg.cancel_scope.cancel()


# -- sparkline data ------------------------------------------------------------


async def test_the_sparkline_counts_each_settlement_once(tmp_path: Path) -> None:
    """Property: acks count as succeeded and nacks/rejects as failed, each
    exactly once, whether they come one by one or in a group commit (counted
    by the queue its answer names); a lost lease counts nothing."""
    engine = SQLiteEngine(tmp_path / "ringo.db")
    activity = Activity()
    instrument_activity(engine, activity)
    await engine.open()
    try:
        now = datetime.now(UTC)
        await engine.enqueue("q", [TaskSpec(task_type="t")] * 5, now)
        leased = await engine.claim("q", [], 5, "w", timedelta(minutes=1), now)
        refs = [ref(item) for item in leased]
        await engine.ack(refs[0], now)
        outcomes = await engine.settle_many(
            [Ack(refs[1]), Nack(refs[2], "x"), Reject(refs[3], "y"), Ack(refs[0])], now
        )
        assert outcomes[:3] == ["q", "q", "q"]
        assert isinstance(outcomes[3], LeaseLost)
        await engine.nack(refs[4], "z", None, now)
        ok, failed = activity.series("q")
        assert (sum(ok), sum(failed)) == (2, 3)
    finally:
        await engine.close()


def test_activity_keeps_one_hour_per_minute_and_a_bounded_number_of_queues() -> None:
    """Property: the series hold per-minute counts of the last 60 minutes,
    oldest first; older minutes fall off; queues past the cap are not kept."""
    activity = Activity(max_queues=2)
    t0 = 1_000_000 * 60.0
    activity.record("a", succeeded=True, now=t0)
    activity.record("a", succeeded=True, now=t0 + 1)
    activity.record("a", succeeded=False, now=t0 + 61)
    ok, failed = activity.series("a", now=t0 + 61)
    assert ok[-2:] == [2, 0]
    assert failed[-2:] == [0, 1]
    assert sum(ok) == 2
    assert len(ok) == 60
    ok, failed = activity.series("a", now=t0 + 60 * 60)
    assert (ok[0], sum(ok), sum(failed)) == (0, 0, 1)
    ok, failed = activity.series("a", now=t0 + 60 * 200)
    assert sum(ok) + sum(failed) == 0
    activity.record("b", succeeded=True, now=t0)
    activity.record("c", succeeded=True, now=t0)
    assert sum(activity.series("c", now=t0)[0]) == 0

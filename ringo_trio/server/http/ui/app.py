"""The dashboard's routes (``ringod --ui-listen``; docs/dashboard.md).

Theory of operation
-------------------
`Dashboard.handle` is the h11 `http.server`'s handler. Each request passes,
in order:

1. **static** files (``/static/ui.js``, ``ui.css``; public, cached);
2. **login/logout**, which need no session;
3. **authentication** (`auth.Sessions`): an ``Authorization: Bearer`` header,
   or the signed session cookie; a daemon without a token lets everyone in.
   A wrong token, by header or by the login form, is answered 401 after the
   delay the daemon's `AuthThrottle` (the gRPC gate's own) gives it, so an
   address guessing over gRPC and over HTTP is counted once. Unlike the
   gate's, the dashboard's wrong tokens wait side by side rather than one
   after another: each holds its own connection while it waits, and the
   per-address connection cap (`UI_HTTP`) bounds how many an address has,
   so parallel wrong logins are all answered within the throttle's cap,
   none dropped;
4. for a POST: **read-only** refusal, then **CSRF**: a cookie session must
   send its CSRF token (``_csrf``) and, when the browser sends an
   ``Origin``, the dashboard's own origin; a bearer header is exempt (a
   browser never adds one by itself);
5. the **route**.

Malformed input is the client's: bytes the HTTP layer refuses (`http.server`),
a session cookie that is not cookie text (`auth.cookie_value`), a form
body no browser makes, all answer 400. Any other exception answers 500,
and `ErrorLog` keeps one client from filling the log with tracebacks.

Reads and actions go through `QueueService`'s own RPC methods, with a
session the dashboard negotiates for itself, so validation, storage calls,
metrics, wake-ups and PostgreSQL notifications are exactly the RPCs'; their
`GRPCError` becomes an HTTP status. Pages are Jinja2 templates with
autoescape on; a page's live part is the template block named by
``?fragment=``, which ``ui.js`` polls.

**Purges and bulk actions run in the background** (jobs.py).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import time
import urllib.parse
from pathlib import Path
from typing import Any

import jinja2
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from ringo_trio._contract import limits, versions
from ringo_trio._contract.durations import parse_duration
from ringo_trio._proto.ringo.v1 import (
    CancelTaskRequest,
    CancelTasksRequest,
    DeleteTasksRequest,
    GetQueueStatsRequest,
    GetTaskRequest,
    ListLimitsRequest,
    ListOrder,
    ListQueuesRequest,
    ListSchedulesRequest,
    ListTasksRequest,
    RequestContext,
    RetryTaskRequest,
    RetryTasksRequest,
    SetQueuePausedRequest,
    TaskState,
)

from ...clock import Clock
from ...retention import DEFAULT_RETENTION_BATCH, DEFAULT_RETENTION_PAUSE
from ...rpc.service import QueueService
from ...rpc.sessions import SessionTable
from ...rpc.throttle import AuthThrottle
from ..server import (
    BadRequest,
    DropConnection,
    ErrorLog,
    HttpLimits,
    Request,
    Response,
    serve_http,
    unquote_strict,
)
from . import views
from .activity import Activity
from .auth import COOKIE, SESSION_SECONDS, Sessions, cookie_value
from .jobs import Batch, Job, Jobs

__all__ = ["SQLITE_PURGE_PAUSE", "TASKS_PAGE", "UI_HTTP", "Dashboard"]

log = logging.getLogger("ringo_trio.server.ui")

TASKS_PAGE = 50
# A browser opens up to 6 connections per origin: one address's cap fits a
# browser and a script, and leaves the rest to other addresses when one
# opens many slow connections (docs/dashboard.md, "Limits"; behind a
# reverse proxy everyone shares the proxy's address).
UI_HTTP = HttpLimits(
    max_connections=32,
    max_connections_per_address=8,
    max_head_bytes=16 * 1024,
    max_body_bytes=16 * 1024,
    head_timeout=5.0,
    read_timeout=10.0,
    write_timeout=10.0,
)
QUEUES_PAGE = limits.DEFAULT_LIST_PAGE
# The pause between two purge batches on SQLite (the daemon passes it): at
# retention's 5 ms, batches of 200 commit ~80 times a second and the WAL
# checkpoint thread never finds the WAL idle to start it over, so every
# ~0.5 s the loop's own backstop checkpoint held it 80-150 ms (purging a
# 1,000,000-task store: batch p99 98 ms). With 50 ms the checkpoints keep up
# (batch p99 11 ms, max 18) and 1,000,000 tasks take ~5 minutes.
SQLITE_PURGE_PAUSE = 0.05
_STATES = views.STATES

_FINISHED = ("SUCCEEDED", "DEAD", "CANCELLED")
_HERE = Path(__file__).parent
_STATIC_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}

SECURITY_HEADERS = [
    (
        "Content-Security-Policy",
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
        " frame-ancestors 'none'",
    ),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "same-origin"),
]

_HTTP_STATUS = {
    Status.INVALID_ARGUMENT: 400,
    Status.OUT_OF_RANGE: 400,
    Status.NOT_FOUND: 404,
    Status.FAILED_PRECONDITION: 409,
    Status.RESOURCE_EXHAUSTED: 507,
    Status.UNAVAILABLE: 503,
}


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _quote(text: str) -> str:
    return urllib.parse.quote(text, safe="")


class Dashboard:
    def __init__(
        self,
        *,
        service: QueueService,
        rpc_sessions: SessionTable,
        clock: Clock,
        activity: Activity,
        throttle: AuthThrottle,
        token: str | None,
        read_only: bool = False,
        listen_host: str = "",
        purge_batch: int = DEFAULT_RETENTION_BATCH,
        purge_pause: float = DEFAULT_RETENTION_PAUSE,
    ) -> None:
        self._service = service
        self._rpc_sessions = rpc_sessions
        self._rpc_token = ""
        self._clock = clock
        self._activity = activity
        self._throttle = throttle
        self.sessions = Sessions(token)
        self.errors = ErrorLog(log)
        self.read_only = read_only
        # Served on loopback, the dashboard answers only requests naming a
        # loopback host: a web page whose own name an attacker re-points at
        # 127.0.0.1 (DNS rebinding) would otherwise be same-origin with it.
        self._loopback = _loopback_name(listen_host)
        self.templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(_HERE / "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.templates.filters["q"] = _quote
        self._static = {
            path.name: path.read_bytes()
            for path in (_HERE / "static").iterdir()
            if path.suffix in _STATIC_TYPES
        }
        self._purge_batch = purge_batch
        self.jobs = Jobs(purge_pause)

    async def serve(self, sock: socket.socket) -> None:
        """Serve the dashboard on the listening `sock` until cancelled, with
        the purges it starts; closes `sock`. Cancelled, it cancels them."""
        async with asyncio.TaskGroup() as jobs:
            self.jobs.group = jobs
            try:
                await serve_http(sock, self.handle, UI_HTTP, name="ui")
            finally:
                self.jobs.group = None

    # -- the pipeline ----------------------------------------------------------

    async def handle(self, request: Request) -> Response:
        try:
            response = await self._handle(request)
        except DropConnection:
            raise
        except BadRequest as exc:
            response = Response(400, f"{exc}\n".encode())
        except Exception:
            # A bug costs its request a 500, never the connection unanswered;
            # its traceback is rationed per client address.
            self.errors.exception(
                request.peer[0], "dashboard: %s %s failed", request.method, request.path
            )
            response = Response(500, b"internal error; see the daemon log\n")
        response.headers.extend(SECURITY_HEADERS)
        return response

    async def _handle(self, request: Request) -> Response:
        if self._loopback and not _loopback_host(request.headers.get("host", "")):
            return Response(421, b"this dashboard answers to a loopback address only\n")
        # `http.server` checked the whole path decodes, so every segment does.
        parts = [unquote_strict(p) for p in request.raw_path.split("/")[1:]]
        if parts[:1] == ["static"] and request.method == "GET":
            return self._static_file(parts[1:])
        if parts == ["login"]:
            return await self._login(request)
        if parts == ["logout"] and request.method == "POST":
            return self._logout(request)
        try:
            sid, by_bearer, new_cookie = await self._authenticate(request)
        except _Unauthenticated as exc:
            return Response(401, b"wrong token\n", close=exc.close)
        if sid is None and not by_bearer:
            if request.method == "GET" and not request.arg("fragment"):
                return _redirect("/login")
            return Response(401, b"log in first\n")
        view = _View(self, request, sid)
        try:
            if request.method == "POST":
                self._check_post(request, sid, by_bearer)
                response = await self._action(view, parts)
            elif request.method == "GET":
                response = await self._page(view, parts)
            else:
                response = Response(405, b"GET or POST\n", headers=[("Allow", "GET, POST")])
        except _Refused as exc:
            response = view.error(exc.status, str(exc))
        except GRPCError as exc:
            response = view.error(_HTTP_STATUS.get(exc.status, 500), exc.message or "failed")
        if new_cookie is not None:
            response.headers.append(("Set-Cookie", _cookie(new_cookie)))
        return response

    async def _authenticate(self, request: Request) -> tuple[str | None, bool, str | None]:
        """(session id, authenticated by a bearer header, cookie to set)."""
        bearer = self.sessions.bearer(request.headers.get("authorization"))
        if bearer is False:
            await self._wrong_token(request)
        if bearer:
            return None, True, None
        sid = self.sessions.session(cookie_value(request.headers.get("cookie")))
        if sid is not None or not self.sessions.open:
            return sid, False, None
        # An open dashboard: a session for the CSRF token of its forms.
        sid, cookie = self.sessions.new()
        return sid, False, cookie

    async def _wrong_token(self, request: Request) -> None:
        """Wait as long as the throttle says, then raise `_Unauthenticated`."""
        host, port = request.peer
        verdict = self._throttle.failed(host, port, time.monotonic())
        if verdict.drop:
            # The address's line is full (gRPC guesses count too): this one
            # waits the longest delay, uncounted, and its answer closes. It
            # is not dropped at once, which would tell a wrong token from a
            # right one without any wait; its connection is its bound.
            await asyncio.sleep(self._throttle.cap)
            raise _Unauthenticated(close=True)
        # Not in the address's line (`verdict.turn`): see the module docstring.
        try:
            await asyncio.sleep(verdict.delay)
        finally:
            self._throttle.answered(verdict)
        raise _Unauthenticated(close=verdict.close)

    def _check_post(self, request: Request, sid: str | None, by_bearer: bool) -> None:
        if self.read_only:
            raise _Refused(403, "the dashboard is read-only (ringod --ui-read-only)")
        if by_bearer:
            return
        origin = request.headers.get("origin")
        if origin is not None and origin != f"http://{request.headers.get('host', '')}":
            raise _Refused(403, "cross-origin request refused")
        presented = request.form().get("_csrf", [""])[0]
        if sid is None or not self.sessions.csrf_matches(sid, presented):
            raise _Refused(403, "missing or wrong CSRF token; reload the page")

    # -- login -----------------------------------------------------------------

    async def _login(self, request: Request) -> Response:
        view = _View(self, request, None)
        if request.method == "GET":
            return view.render("login.html", error="")
        if request.method != "POST":
            return Response(405, b"GET or POST\n", headers=[("Allow", "GET, POST")])
        origin = request.headers.get("origin")
        if origin is not None and origin != f"http://{request.headers.get('host', '')}":
            return view.error(403, "cross-origin request refused")
        token = request.form().get("token", [""])[0]
        if not self.sessions.token_matches(token):
            try:
                await self._wrong_token(request)
            except _Unauthenticated as exc:
                response = view.render("login.html", status=401, error="wrong token")
                response.close = exc.close
                return response
        _, cookie = self.sessions.new()
        response = _redirect("/queues")
        response.headers.append(("Set-Cookie", _cookie(cookie)))
        return response

    def _logout(self, request: Request) -> Response:
        origin = request.headers.get("origin")
        if origin is not None and origin != f"http://{request.headers.get('host', '')}":
            return Response(403, b"cross-origin request refused\n")
        response = _redirect("/login")
        response.headers.append(("Set-Cookie", _cookie("", max_age=0)))
        return response

    def _static_file(self, parts: list[str]) -> Response:
        name = parts[0] if len(parts) == 1 else ""
        body = self._static.get(name)
        if body is None:
            return Response(404, b"not found\n")
        content_type = _STATIC_TYPES[Path(name).suffix]
        return Response(200, body, content_type, headers=[("Cache-Control", "max-age=300")])

    # -- calls into the service --------------------------------------------------

    def context(self) -> RequestContext:
        """The dashboard's own session with the service (renewed as it expires)."""
        now = self._clock.now()
        if self._rpc_sessions.lookup(self._rpc_token, now) is None:
            self._rpc_token = self._rpc_sessions.open(versions.MINOR, now)
        return RequestContext(
            protocol_major=versions.MAJOR,
            protocol_minor=versions.MINOR,
            session_token=self._rpc_token,
        )

    # -- pages -------------------------------------------------------------------

    async def _page(self, view: _View, parts: list[str]) -> Response:
        match parts:
            case [""]:
                return _redirect("/queues")
            case ["queues"]:
                return await self._queues(view)
            case ["queues", queue]:
                return await self._tasks(view, queue)
            case ["queues", queue, "tasks", task_id]:
                return await self._task(view, queue, task_id)
            case ["queues", queue, "schedules"]:
                return await self._schedules(view, queue)
            case ["schedules"]:
                return await self._schedules(view, None)
            case ["workers"]:
                return self._workers(view)
            case ["limits"]:
                return await self._limits(view, None)
            case ["queues", queue, "limits"]:
                return await self._limits(view, queue)
        raise _Refused(404, "no such page")

    async def _queues(self, view: _View) -> Response:
        service = self._service
        answer = await service.list_queues(
            ListQueuesRequest(
                context=self.context(),
                page_size=QUEUES_PAGE,
                page_token=view.request.arg("page_token"),
            )
        )
        now = self._clock.now()
        rows = []
        for stats in answer.queues:
            succeeded, failed = self._activity.series(stats.queue)
            rows.append(
                {
                    "name": stats.queue,
                    "counts": {s: getattr(stats, s.lower()) for s in _STATES},
                    "oldest": views.age(stats.oldest_pending_at, now),
                    "spark": views.sparkline(succeeded, failed),
                    "paused": stats.paused,
                }
            )
        return view.render(
            "queues.html", queues=rows, next_token=answer.next_page_token, states=_STATES
        )

    async def _tasks(self, view: _View, queue: str) -> Response:
        request = view.request
        purge = self.jobs.shown(queue, request.arg("purge"))
        if request.arg("fragment") == "purge":
            return view.render("tasks.html", fragment="purge", purge=purge)
        stats = (
            await self._service.get_queue_stats(
                GetQueueStatsRequest(context=self.context(), queue=queue)
            )
        ).stats
        counts = {s: getattr(stats, s.lower()) if stats else 0 for s in _STATES}
        if request.arg("fragment") == "counts":
            return view.render("tasks.html", fragment="counts", queue=queue, counts=counts)
        found = request.arg("find").strip()
        if found:
            return await self._find(queue, found)
        state = request.arg("state")
        if state and state not in _STATES:
            raise _Refused(400, f"state must be one of {', '.join(_STATES)}")
        task_type = request.arg("type")
        key_prefix = request.arg("key_prefix")
        page = await self._service.list_tasks(
            ListTasksRequest(
                context=self.context(),
                queue=queue,
                states=[TaskState[state]] if state else [],
                task_types=[task_type] if task_type else [],
                unique_key_prefix=key_prefix,
                order=ListOrder.NEWEST_FIRST,
                page_size=TASKS_PAGE,
                page_token=request.arg("page_token"),
            )
        )
        filters = {"state": state, "type": task_type, "key_prefix": key_prefix}
        next_url = ""
        if page.next_page_token:
            query = {k: v for k, v in filters.items() if v}
            query["page_token"] = page.next_page_token
            next_url = f"/queues/{_quote(queue)}?{urllib.parse.urlencode(query)}"
        now = self._clock.now()
        tasks = [views.task_row(t, now) for t in page.tasks]
        return view.render(
            "tasks.html",
            bulk=views.bulk_buttons(filters, counts, stats.by_type if stats else []),
            queue=queue,
            counts=counts,
            paused=bool(stats and stats.paused),
            tasks=tasks,
            filters=filters,
            states=_STATES,
            finished=_FINISHED,
            next_url=next_url,
            paged=bool(request.arg("page_token")),
            not_found=request.arg("not_found"),
            purge=purge,
        )

    async def _find(self, queue: str, text: str) -> Response:
        """The search box: a task id or a unique key opens that task; else
        the list of tasks whose key starts with the text."""
        for lookup in ({"task_id": text}, {"unique_key": text}):
            try:
                task = (
                    await self._service.get_task(
                        GetTaskRequest(context=self.context(), queue=queue, **lookup)
                    )
                ).task
            except GRPCError as exc:
                if exc.status not in (Status.NOT_FOUND, Status.INVALID_ARGUMENT):
                    raise
                continue
            if task is not None:
                return _redirect(f"/queues/{_quote(queue)}/tasks/{_quote(task.id)}")
        query = urllib.parse.urlencode({"key_prefix": text, "not_found": text})
        return _redirect(f"/queues/{_quote(queue)}?{query}")

    async def _task(self, view: _View, queue: str, task_id: str) -> Response:
        task = (
            await self._service.get_task(
                GetTaskRequest(context=self.context(), queue=queue, task_id=task_id)
            )
        ).task
        if task is None:
            raise _Refused(404, "no such task")
        selected = view.request.arg("view", "text")
        if selected not in ("text", "json", "hex"):
            selected = "text"
        payload, payload_note = views.preview(task.payload, selected)
        result, result_note = ("", "")
        if task.result is not None:
            result, result_note = views.preview(task.result, "text")
        progress = task.progress
        return view.render(
            "task.html",
            fragment=view.request.arg("fragment") or None,
            queue=queue,
            task=task,
            state=task.state.name,
            view=selected,
            payload=payload,
            payload_note=payload_note,
            payload_size=len(task.payload),
            result=result,
            result_note=result_note,
            has_result=task.result is not None,
            progress=progress,
            can_retry=task.state.name in _FINISHED,
            can_cancel=task.state.name in ("PENDING", "LEASED"),
            scheduled=views.scheduled(task, self._clock.now()),
            attempts=views.attempts(task.history, self._clock.now()),
            now=self._clock.now(),
        )

    async def _schedules(self, view: _View, queue: str | None) -> Response:
        """Read-only: the stored schedules (of every queue, or of one)."""
        answer = await self._service.list_schedules(
            ListSchedulesRequest(context=self.context(), queue=queue or "")
        )
        now = self._clock.now()
        rows = [
            {
                "queue": s.queue,
                "name": s.name,
                "type": s.task_type,
                "timing": views.timing(s.cron, s.every, s.timezone),
                "next": views.moment(s.next_fire_at),
                "next_in": views.age(now, s.next_fire_at) if s.next_fire_at else "",
                "last": views.moment(s.last_fired_at),
                "last_task": s.last_task_id,
                "paused": s.paused,
                "fired": s.fired,
                "skipped": s.skipped,
            }
            for s in answer.schedules[: limits.MAX_LIST_PAGE]
        ]
        return view.render(
            "schedules.html",
            queue=queue,
            schedules=rows,
            truncated=len(answer.schedules) > limits.MAX_LIST_PAGE,
        )

    async def _limits(self, view: _View, queue: str | None) -> Response:
        """The limit rules of one queue (or of every queue), each with its
        keys the rule holds back now (docs/limits.md)."""
        answer = await self._service.list_limits(
            ListLimitsRequest(context=self.context(), queue=queue or "", with_keys=True)
        )
        rules = views.limit_rules(answer.limits, self._clock.now())
        return view.render("limits.html", queue=queue, rules=rules)

    def _workers(self, view: _View) -> Response:
        workers = sorted(
            self._service.work_streams.snapshot(), key=lambda w: (w.queue, w.worker_id)
        )
        return view.render("workers.html", workers=[views.worker_row(w) for w in workers])

    # -- actions -----------------------------------------------------------------

    async def _action(self, view: _View, parts: list[str]) -> Response:
        form = view.request.form()
        match parts:
            case ["queues", queue, "tasks", task_id, "retry"]:
                await self._service.retry_task(
                    RetryTaskRequest(context=self.context(), queue=queue, task_id=task_id)
                )
                return _redirect(f"/queues/{_quote(queue)}/tasks/{_quote(task_id)}")
            case ["queues", queue, "tasks", task_id, "cancel"]:
                reason = form.get("reason", [""])[0]
                await self._service.cancel_task(
                    CancelTaskRequest(
                        context=self.context(), queue=queue, task_id=task_id, reason=reason
                    )
                )
                return _redirect(f"/queues/{_quote(queue)}/tasks/{_quote(task_id)}")
            case ["queues", queue, "purge"]:
                purge = await self._purge(queue, form)
                return _redirect(f"/queues/{_quote(queue)}?purge={purge.id}")
            case ["queues", queue, "bulk", ("retry" | "cancel" | "purge") as kind]:
                job = await self._bulk(queue, kind, form)
                query = {**_filter_query(form), "purge": str(job.id)}
                return _redirect(f"/queues/{_quote(queue)}?{urllib.parse.urlencode(query)}")
            case ["queues", queue, ("pause" | "resume") as verb]:
                await self._service.set_queue_paused(
                    SetQueuePausedRequest(
                        context=self.context(), queue=queue, paused=verb == "pause"
                    )
                )
                return _redirect(f"/queues/{_quote(queue)}")
        raise _Refused(404, "no such action")

    async def _purge(self, queue: str, form: dict[str, list[str]]) -> Job:
        """Start a purge of `queue` (or find the one running) and wait for
        its first batch."""
        names = form.get("state", []) or list(_FINISHED)
        if any(name not in _FINISHED for name in names):
            raise _Refused(400, f"state must be among {', '.join(_FINISHED)}")
        older_than = form.get("older_than", [""])[0].strip()
        finished_before = self._clock.now()
        if older_than:
            try:
                finished_before -= parse_duration(older_than)
            except (ValueError, OverflowError) as exc:
                raise _Refused(400, f"older_than: {exc}") from None
        request = DeleteTasksRequest(
            queue=queue,
            states=[TaskState[name] for name in names],
            finished_before=finished_before,
            limit=self._purge_batch,
        )
        return await self._start(queue, "purge", self._deleting(request))

    async def _bulk(self, queue: str, kind: str, form: dict[str, list[str]]) -> Job:
        """Retry, cancel or purge every task the task list's filter (the
        form's state, type and key prefix) shows, in the background."""
        state = form.get("state", [""])[0]
        task_types = [t for t in form.get("type", [""])[:1] if t]
        prefix = form.get("key_prefix", [""])[0]
        allowed = views.BULK_STATES[kind]
        if state and state not in allowed:
            raise _Refused(400, f"{kind} takes {', '.join(allowed)} tasks, not {state}")
        states = [TaskState[s] for s in ([state] if state else allowed)]
        now = self._clock.now()
        batch: Batch
        if kind == "purge":
            batch = self._deleting(
                DeleteTasksRequest(
                    queue=queue,
                    states=states,
                    finished_before=now,
                    limit=self._purge_batch,
                    task_types=task_types,
                    unique_key_prefix=prefix,
                )
            )
        elif kind == "retry":
            retry = RetryTasksRequest(
                queue=queue,
                task_types=task_types,
                unique_key_prefix=prefix,
                finished_before=now,
                limit=self._purge_batch,
            )

            async def batch() -> tuple[int, bool]:
                retry.context = self.context()
                answer = await self._service.retry_tasks(retry)
                return answer.retried_count, answer.more

        else:
            cancel = CancelTasksRequest(
                queue=queue,
                states=states,
                task_types=task_types,
                unique_key_prefix=prefix,
                created_before=now,
                reason="cancelled from the dashboard",
                limit=self._purge_batch,
            )

            async def batch() -> tuple[int, bool]:
                cancel.context = self.context()
                answer = await self._service.cancel_tasks(cancel)
                return answer.cancelled_count, answer.more

        return await self._start(queue, kind, batch)

    def _deleting(self, request: DeleteTasksRequest) -> Batch:
        async def batch() -> tuple[int, bool]:
            request.context = self.context()
            answer = await self._service.delete_tasks(request)
            return answer.deleted_count, answer.more

        return batch

    async def _start(self, queue: str, kind: str, batch: Batch) -> Job:
        if self.jobs.group is None:
            raise _Refused(503, "the dashboard is not serving")
        return await self.jobs.start(queue, kind, batch)


def _filter_query(form: dict[str, list[str]]) -> dict[str, str]:
    """The task list's filter a bulk form carried, to show it again."""
    return {k: form[k][0] for k in ("state", "type", "key_prefix") if form.get(k, [""])[0]}


class _Unauthenticated(Exception):
    def __init__(self, *, close: bool) -> None:
        super().__init__("wrong token")
        self.close = close


class _View:
    """One request's rendering: the template globals every page needs."""

    def __init__(self, app: Dashboard, request: Request, sid: str | None) -> None:
        self.app = app
        self.request = request
        self.csrf = app.sessions.csrf(sid) if sid is not None else ""

    def render(self, name: str, *, status: int = 200, **values: Any) -> Response:
        template = self.app.templates.get_template(name)
        values.setdefault("fragment", None)
        fragment = self.request.arg("fragment") or values["fragment"]
        values.update(
            csrf=self.csrf,
            read_only=self.app.read_only,
            needs_login=not self.app.sessions.open,
        )
        if fragment:
            block = template.blocks.get(f"live_{fragment}") if fragment.isidentifier() else None
            if block is None:
                return Response(404, b"no such fragment\n")
            html = "".join(block(template.new_context(values)))
        else:
            html = template.render(values)
        return Response(
            status,
            # A lone surrogate (from a payload's JSON, say) is shown escaped.
            html.encode("utf-8", "backslashreplace"),
            "text/html; charset=utf-8",
            headers=[("Cache-Control", "no-store")],
        )

    def error(self, status: int, message: str) -> Response:
        if self.request.arg("fragment"):
            return Response(status, message.encode("utf-8", "backslashreplace") + b"\n")
        return self.render("error.html", status=status, status_code=status, message=message)


def _loopback_host(host: str) -> bool:
    """Whether a Host header (name, optional port) names a loopback host."""
    if host.startswith("["):
        return _loopback_name(host[1:].partition("]")[0])
    return _loopback_name(host.partition(":")[0])


def _loopback_name(name: str) -> bool:
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _redirect(location: str) -> Response:
    return Response(303, b"", headers=[("Location", location)])


def _cookie(value: str, *, max_age: int = SESSION_SECONDS) -> str:
    return f"{COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}"

"""Browser tests of the dashboard (``ringod --ui-listen``): real daemon, real Chromium.

One ``ringod`` (SQLite in a temporary directory, a bearer token, the UI on a
free port) and one headless Chromium serve all the tests of this package;
each test gets a fresh browser context (its own cookies), logged in by
reusing the storage state of a single login, and its own queue names, so
tests never see each other's tasks. The browser is the distribution's Chromium driven by
Playwright (``playwright install`` is never needed): the tests fail, not
skip, when it is missing.

The shared fixtures are package-scoped, not session-scoped: Playwright's
sync API leaves its asyncio loop marked as running on the main thread for as
long as it is started, where it would break any asyncio test (``asyncio.run``
refuses to start) that ran after these in the same pytest process.

Bounds: every Playwright wait has a timeout (`WAIT_MS`), and every test is
ended by ``faulthandler`` (traceback of every thread, then exit) if it runs
longer than `TEST_TIMEOUT` seconds; nothing sleeps, everything waits on
selectors or on the daemon's answers.
"""

from __future__ import annotations

import asyncio
import faulthandler
import http.server
import os
import re
import shutil
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, Playwright, expect, sync_playwright

from ringo_trio.testing import DaemonProcess
from tests._kit.browser import (
    CHROMIUM_ARGS,
    INSTALL_HINT,
    TEST_TIMEOUT,
    TOKEN,
    WAIT_MS,
    Dashboard,
    EvilSite,
    Shot,
    close_context,
    log_in,
    new_context,
    serve_dashboard,
    start_dashboard,
)
from tests._kit.ui_ops import Ops


@pytest.fixture(scope="package")
def _real_stderr(pytestconfig: pytest.Config) -> Iterator[Any]:
    """The terminal's stderr, not pytest's capture of it: pytest's fd-level
    capture points fd 2 (``sys.__stderr__`` too) at a temporary file while a
    test runs, and an exit by `faulthandler` would take the dump with it (a
    CI run once ended that way with no trace). Duplicated while capture is
    off, so the copy is the real stream."""
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    if capture is None:
        yield sys.__stderr__
        return
    with capture.global_and_fixture_disabled():
        stream = os.fdopen(os.dup(2), "w")
    with stream:
        yield stream


@pytest.fixture(autouse=True)
def _bounded(_real_stderr: Any) -> Iterator[None]:
    # A hung browser or daemon must not hang the suite: dump every thread's
    # stack and exit the run, loudly.
    faulthandler.dump_traceback_later(TEST_TIMEOUT, exit=True, file=_real_stderr)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture(scope="package")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with start_dashboard(tmp_path_factory.mktemp("ui") / "data") as process:
        yield process
    assert process.process.returncode == 0, process.stderr_text()


@pytest.fixture(scope="package")
def ui_url(daemon: DaemonProcess) -> str:
    return str(daemon.info["ui"])


@pytest.fixture(scope="package")
def ops(daemon: DaemonProcess) -> Ops:
    return Ops(daemon.endpoint, TOKEN)


@pytest.fixture(scope="package")
def open_dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    """A daemon without a token: its dashboard needs no login."""
    with serve_dashboard(tmp_path_factory.mktemp("ui-open") / "data", token=None) as ui:
        yield ui


@pytest.fixture(scope="package")
def evil_site() -> Iterator[EvilSite]:
    pages: dict[str, bytes] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = pages.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler) as server:
        thread = threading.Thread(target=server.serve_forever, name="evil-site")
        thread.start()
        try:
            yield EvilSite(f"http://127.0.0.1:{server.server_port}", pages)
        finally:
            server.shutdown()
            thread.join()


@pytest.fixture(scope="package")
def playwright() -> Iterator[Playwright]:
    # Once trio_asyncio is imported (the SDK's transport), asyncio.new_event_loop()
    # builds its trio-driven loop unless a policy was set explicitly; Playwright's
    # sync API needs a plain asyncio loop of its own. `None` restores the default.
    asyncio.set_event_loop_policy(asyncio.DefaultEventLoopPolicy())
    try:
        with sync_playwright() as pw:
            expect.set_options(timeout=WAIT_MS)
            yield pw
    finally:
        asyncio.set_event_loop_policy(None)


@pytest.fixture(scope="package")
def browser(playwright: Playwright) -> Iterator[Browser]:
    executable = shutil.which("chromium")
    if executable is None:
        pytest.fail(INSTALL_HINT, pytrace=False)
    # launch() gives the browser a fresh temporary profile (user data dir)
    # and removes it on close.
    browser = playwright.chromium.launch(
        executable_path=executable, headless=True, args=CHROMIUM_ARGS, timeout=30_000
    )
    yield browser
    browser.close()


@pytest.fixture(scope="package")
def auth_state(browser: Browser, ui_url: str) -> dict[str, Any]:
    """The cookies of one login, reused by every test's context."""
    context = new_context(browser, ui_url)
    try:
        page = context.new_page()
        log_in(page, TOKEN)
        expect(page).to_have_url(re.compile(r"/queues$"))
        return dict(context.storage_state())
    finally:
        close_context(context)


@pytest.fixture
def anonymous_context(browser: Browser, ui_url: str) -> Iterator[BrowserContext]:
    context = new_context(browser, ui_url)
    yield context
    close_context(context)


@pytest.fixture
def page(browser: Browser, ui_url: str, auth_state: dict[str, Any]) -> Iterator[Page]:
    """A logged-in page in a context of its own."""
    context = new_context(browser, ui_url, storage_state=auth_state)
    yield context.new_page()
    close_context(context)


@pytest.fixture
def queue(request: pytest.FixtureRequest) -> str:
    """A queue name no other test uses."""
    name = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")
    return f"{name[:40]}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def shot(tmp_path: Path) -> Shot:
    """``shot(page, name)``: a screenshot into the test's tmp_path and, when
    ``RINGO_UI_SCREENSHOTS=DIR`` is set, into DIR (docs/img for the docs)."""
    extra = os.environ.get("RINGO_UI_SCREENSHOTS")

    def take(page: Page, name: str) -> None:
        png = page.screenshot(path=tmp_path / f"{name}.png")
        if extra:
            Path(extra).mkdir(parents=True, exist_ok=True)
            (Path(extra) / f"{name}.png").write_bytes(png)

    return take

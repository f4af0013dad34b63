"""What the browser tests share besides fixtures: the daemon and browser
settings, and the steps every test may take (a context, a login)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from playwright.sync_api import Browser, BrowserContext, Page, ViewportSize

from ringo_trio.testing import DaemonProcess, spawn_daemon
from tests._kit.ui_ops import Ops

TOKEN = "ui-test-token-0123456789"
WAIT_MS = 10_000
TEST_TIMEOUT = 90.0
# ``shot(page, name)``: the conftest's screenshot fixture.
Shot = Callable[[Page, str], None]

# Screenshots for the docs stay small at this size.
VIEWPORT = ViewportSize(width=1280, height=800)

REBOUND_HOST = "rebound.test"

# A quiet, self-contained browser: no sandbox (containers rarely allow the
# namespaces it needs), no GPU, nothing that phones home or prompts.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # A name of an attacker's web page, re-pointed at the dashboard (DNS rebinding).
    f"--host-resolver-rules=MAP {REBOUND_HOST} 127.0.0.1",
]

INSTALL_HINT = (
    "the dashboard's browser tests drive the system's Chromium, and `chromium` is not on"
    " PATH. Install it (Debian/Ubuntu: `apt-get install chromium chromium-driver`;"
    " .ci/run does this itself); `playwright install` is not used."
)


def start_dashboard(data_dir: Path, *extra: str, token: str | None = TOKEN) -> DaemonProcess:
    daemon = spawn_daemon(data_dir, token=token, extra_args=["--ui-listen", "127.0.0.1:0", *extra])
    if "ui" not in daemon.info:
        daemon.stop()
        raise AssertionError(f"ringod announced no 'ui' address: {daemon.info}")
    return daemon


@dataclass
class Dashboard:
    url: str
    ops: Ops


@contextlib.contextmanager
def serve_dashboard(data_dir: Path, *extra: str, token: str | None = TOKEN) -> Iterator[Dashboard]:
    """A daemon of its own (for other flags than the session's)."""
    with start_dashboard(data_dir, *extra, token=token) as daemon:
        yield Dashboard(str(daemon.info["ui"]), Ops(daemon.endpoint, token))


class EvilSite:
    """Another origin on 127.0.0.1 (a real loopback server: Chromium lets a
    page reach the dashboard's loopback address only from a local page):
    ``site.serve(html)`` publishes a page and returns its URL."""

    def __init__(self, origin: str, pages: dict[str, bytes]) -> None:
        self.origin = origin
        self._pages = pages

    def serve(self, html: str) -> str:
        path = f"/{uuid.uuid4().hex}.html"
        self._pages[path] = html.encode()
        return self.origin + path


def new_context(browser: Browser, base_url: str, **options: Any) -> BrowserContext:
    context = browser.new_context(base_url=base_url, viewport=VIEWPORT, **options)
    context.set_default_timeout(WAIT_MS)
    return context


def close_context(context: BrowserContext) -> None:
    """Close the context once its pages have finished loading. Closed while
    a navigation is committing (the test's last click submitted a form and
    returned at "commit"), Chromium acks ``Target.closeTarget`` /
    ``Target.disposeBrowserContext`` and never closes the page, and
    Playwright waits for it forever (microsoft/playwright#42366, #41900;
    seen here in 5 runs of 12 of the CSRF tests before this)."""
    for page in context.pages:
        page.wait_for_load_state("load")
    context.close()


def log_in(page: Page, token: str) -> None:
    page.goto("/login")
    with page.expect_navigation():
        page.locator("input[name=token]").fill(token)
        page.locator("input[name=token]").press("Enter")

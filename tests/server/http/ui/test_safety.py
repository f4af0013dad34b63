"""The dashboard's safety in a real browser: user data is text, not markup;
another origin cannot drive the actions; read-only mode has none."""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect

from ringo_trio import TaskState
from tests._kit.browser import (
    REBOUND_HOST,
    TOKEN,
    Dashboard,
    EvilSite,
    close_context,
    log_in,
    new_context,
    serve_dashboard,
)
from tests._kit.ui_ops import Ops

SCRIPT = "<script>window.__xss=1</script>"
IMG = '<img src=x onerror="window.__xss=2">'
# Closes the attribute a careless template would put it in.
QUEUE_IMG = 'q"><img src=x onerror="window.__xss=3">'


def assert_inert(page: Page) -> None:
    expect(page.locator("img[src=x]")).to_have_count(0)
    expect(page.locator("body script:not([src])")).to_have_count(0)
    assert page.evaluate("typeof window.__xss") == "undefined"


def test_user_data_is_shown_as_text(page: Page, ops: Ops, queue: str) -> None:
    """Property: a payload, task type, key and error holding markup show as
    that text on the list and detail pages, and no script of theirs runs."""
    payload = json.dumps({"html": SCRIPT})
    task_id = ops.enqueue(
        queue, task_type=IMG, unique_key=IMG + "-key", payload=payload, max_attempts=1
    )
    ops.settle(queue, "reject", error=IMG)

    page.goto(f"/queues/{queue}")
    row = page.locator(f'tr[data-task-id="{task_id}"]')
    expect(row).to_contain_text(IMG)
    assert_inert(page)

    page.goto(f"/queues/{queue}/tasks/{task_id}")
    expect(page.locator("#payload")).to_contain_text(SCRIPT)
    expect(page.locator("#last-error")).to_contain_text(IMG)
    expect(page.locator("main")).to_contain_text(IMG + "-key")
    assert_inert(page)
    page.goto(f"/queues/{queue}/tasks/{task_id}?view=json")
    expect(page.locator("#payload")).to_contain_text(SCRIPT)
    assert_inert(page)


def test_queue_names_are_shown_as_text(page: Page, ops: Ops) -> None:
    """Property: a queue name holding markup (and a quote) stays text, in the
    overview's attributes and links too."""
    ops.enqueue(QUEUE_IMG, task_type="t")
    page.goto("/queues")
    row = page.locator("table#queues tr[data-queue]").filter(has_text=QUEUE_IMG)
    expect(row).to_have_count(1)
    assert row.get_attribute("data-queue") == QUEUE_IMG
    assert_inert(page)
    row.locator("a").first.click()
    expect(page.locator("table#tasks tr[data-task-id]")).to_have_count(1)
    assert_inert(page)


def test_csp_blocks_inline_scripts(page: Page) -> None:
    """Property: the Content-Security-Policy keeps an inline script that
    reached a page (had escaping failed) from running."""
    page.goto("/queues")
    ran = page.evaluate(
        """() => {
            const script = document.createElement("script");
            script.textContent = "window.__xss = 4";
            document.body.append(script);  // an allowed inline script runs right here
            return typeof window.__xss;
        }"""
    )
    assert ran == "undefined"


def attack(page: Page, site: EvilSite, action: str, fields: dict[str, str]) -> int:
    """Open a page of another origin whose script posts a form to `action`;
    the dashboard's status. The other origin is 127.0.0.1 on another port:
    the same site, so the SameSite=Strict cookie IS sent and only the
    dashboard's own checks stand in the way."""
    inputs = "".join(f'<input name="{k}" value="{v}">' for k, v in fields.items())
    evil = site.serve(
        f'<form id="f" method="POST" action="{action}">{inputs}</form>'
        "<script>document.getElementById('f').submit()</script>"
    )
    with page.expect_response(lambda r: r.url == action) as answer:
        page.goto(evil)
    sent = answer.value.request.all_headers()
    assert sent.get("origin") == site.origin
    assert "ringo_session=" in sent.get("cookie", "")
    return answer.value.status


def test_csrf_another_origin_cannot_cancel(
    page: Page, ops: Ops, queue: str, ui_url: str, evil_site: EvilSite
) -> None:
    """Property: a form posted from another origin is refused (403) and the
    task is unchanged, even when it carries the session's CSRF token
    (the Origin check alone refuses it)."""
    task_id = ops.enqueue(queue, task_type="victim")
    detail = f"{ui_url}/queues/{queue}/tasks/{task_id}"
    page.goto(detail)
    csrf = page.locator("form#cancel input[name=_csrf]").get_attribute("value")
    assert csrf

    assert attack(page, evil_site, f"{detail}/cancel", {"reason": "pwned"}) == 403
    assert ops.get(queue, task_id).state is TaskState.PENDING
    assert attack(page, evil_site, f"{detail}/cancel", {"reason": "pwned", "_csrf": csrf}) == 403
    assert ops.get(queue, task_id).state is TaskState.PENDING


@pytest.mark.parametrize("token", ["missing", "wrong"])
def test_csrf_token_required(page: Page, ops: Ops, queue: str, token: str) -> None:
    """Property: a same-origin form without the session's CSRF token is
    refused (403) and the task is unchanged."""
    task_id = ops.enqueue(queue, task_type="victim")
    page.goto(f"/queues/{queue}/tasks/{task_id}")
    field = page.locator("form#cancel input[name=_csrf]")
    if token == "missing":
        field.evaluate("input => input.remove()")
    else:
        field.evaluate("input => { input.value = 'forged-' + input.value }")
    page.on("dialog", lambda dialog: dialog.accept())
    with page.expect_response(lambda r: r.request.method == "POST") as answer:
        page.locator("form#cancel button, form#cancel [type=submit]").first.click()
    assert answer.value.status == 403
    assert ops.get(queue, task_id).state is TaskState.PENDING


def test_dns_rebinding_is_refused(page: Page, open_dashboard: Dashboard) -> None:
    """Property: a page whose own name was re-pointed at 127.0.0.1 gets no
    answer from a loopback dashboard (421), even an open one."""
    port = urllib.parse.urlsplit(open_dashboard.url).port
    answer = page.goto(f"http://{REBOUND_HOST}:{port}/queues")
    assert answer is not None
    assert answer.status == 421
    expect(page.locator("table#queues")).to_have_count(0)


def test_no_framing_by_another_origin(page: Page, ui_url: str, evil_site: EvilSite) -> None:
    """Property: another origin cannot show the dashboard in a frame
    (clickjacking): the frame stays empty."""
    page.goto(evil_site.serve(f'<iframe src="{ui_url}/queues" width="800" height="600"></iframe>'))
    # goto waited for the frame's load too.
    (frame,) = page.main_frame.child_frames
    expect(frame.locator("table#queues")).to_have_count(0)
    # Chromium puts its error page in a frame it refused.
    assert not frame.url.startswith(ui_url), frame.url


@pytest.fixture(scope="module")
def read_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    with serve_dashboard(tmp_path_factory.mktemp("ui-read-only") / "data", "--ui-read-only") as ui:
        yield ui


@pytest.fixture
def read_only_page(browser: Browser, read_only: Dashboard) -> Iterator[Page]:
    context: BrowserContext = new_context(browser, read_only.url)
    page = context.new_page()
    log_in(page, TOKEN)
    expect(page).to_have_url(re.compile(r"/queues$"))
    yield page
    close_context(context)


def test_read_only_has_no_actions(read_only_page: Page, read_only: Dashboard, queue: str) -> None:
    """Property: in read-only mode no action form is shown and a POST to an
    action is refused (403) with nothing changed."""
    page, ops = read_only_page, read_only.ops
    dead = ops.enqueue(queue, task_type="ro", max_attempts=1)
    ops.settle(queue, "reject", error="poison")
    pending = ops.enqueue(queue, task_type="ro")

    page.goto(f"/queues/{queue}")
    expect(page.locator("table#tasks tr[data-task-id]")).to_have_count(2)
    expect(page.locator("form#purge")).to_have_count(0)
    for task_id in (pending, dead):
        page.goto(f"/queues/{queue}/tasks/{task_id}")
        expect(page.locator("#task-state")).to_be_visible()
        expect(page.locator("form#cancel, form#retry, form#purge")).to_have_count(0)

    # A genuine session's CSRF token (the logout form still has one) and
    # our own Origin: only read-only mode is left to refuse.
    csrf = page.locator("input[name=_csrf]")
    fields: dict[str, str | float | bool] = {"reason": "x", "state": "DEAD"}
    if csrf.count():
        fields["_csrf"] = str(csrf.first.get_attribute("value"))
    base = f"{read_only.url}/queues/{queue}"
    for action in (f"tasks/{pending}/cancel", f"tasks/{dead}/retry", "purge"):
        answer = page.request.post(
            f"{base}/{action}", form=fields, headers={"Origin": read_only.url}
        )
        assert answer.status == 403, action
    assert ops.get(queue, pending).state is TaskState.PENDING
    assert ops.get(queue, dead).state is TaskState.DEAD

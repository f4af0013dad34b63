"""Logging in to the dashboard with the daemon's token."""

from __future__ import annotations

import re

from playwright.sync_api import Browser, BrowserContext, Page, expect

from tests._kit.browser import TOKEN, Dashboard, Shot, close_context, log_in, new_context


def test_pages_need_a_login(anonymous_context: BrowserContext) -> None:
    """Property: without the token, no page shows the daemon's data."""
    page = anonymous_context.new_page()
    page.goto("/queues")
    expect(page.locator("table#queues")).to_have_count(0)
    expect(page.locator("input[name=token]")).to_be_visible()


def test_login_with_the_token(anonymous_context: BrowserContext, shot: Shot) -> None:
    """Property: the login form's cookie is a signed session (HttpOnly,
    SameSite=Strict), never the token itself; it opens /queues."""
    page = anonymous_context.new_page()
    page.goto("/login")
    shot(page, "login")
    log_in(page, TOKEN)
    expect(page).to_have_url(re.compile(r"/queues$"))
    expect(page.locator("table#queues")).to_be_visible()
    (cookie,) = [c for c in anonymous_context.cookies() if c["name"] == "ringo_session"]
    assert cookie["httpOnly"]
    assert cookie["sameSite"] == "Strict"
    assert cookie["path"] == "/"
    assert TOKEN not in cookie["value"]


def test_login_refused_with_a_wrong_token(anonymous_context: BrowserContext) -> None:
    """Property: a wrong token gets the form again (401) and no session."""
    page = anonymous_context.new_page()
    page.goto("/login")
    page.locator("input[name=token]").fill(TOKEN + "-wrong")
    with page.expect_response(lambda r: r.request.method == "POST") as answer:
        page.locator("input[name=token]").press("Enter")
    assert answer.value.status == 401
    expect(page.locator("input[name=token]")).to_be_visible()
    assert not [c for c in anonymous_context.cookies() if c["name"] == "ringo_session"]
    page.goto("/queues")
    expect(page.locator("table#queues")).to_have_count(0)


def test_logout_ends_the_session(anonymous_context: BrowserContext) -> None:
    """Property: after logout the browser's pages need a login again."""
    # A login of its own: the session other tests share must stay valid.
    page = anonymous_context.new_page()
    log_in(page, TOKEN)
    expect(page.locator("table#queues")).to_be_visible()
    with page.expect_navigation():
        page.locator("form[action='/logout'] button, form[action='/logout'] [type=submit]").click()
    page.goto("/queues")
    expect(page.locator("table#queues")).to_have_count(0)


def test_a_lost_session_leads_to_the_login_form(page: Page) -> None:
    """Property: when the session stops working, a live page turns into the
    login form by itself instead of showing stale data."""
    page.goto("/queues")
    expect(page.locator("table#queues")).to_be_visible()
    page.context.clear_cookies()
    # The next poll of a live part is refused (401) and the page reloads.
    expect(page.locator("input[name=token]")).to_be_visible()
    expect(page.locator("table#queues")).to_have_count(0)


def test_without_a_token_the_dashboard_is_open(
    browser: Browser, open_dashboard: Dashboard, queue: str
) -> None:
    """Property: a daemon without a token serves the dashboard without a
    login, and its actions work (the CSRF session comes by itself)."""
    task_id = open_dashboard.ops.enqueue(queue, task_type="open")
    context = new_context(browser, open_dashboard.url)
    try:
        page = context.new_page()
        page.goto(f"/queues/{queue}/tasks/{task_id}")
        expect(page.locator("#task-state")).to_have_text("PENDING")
        page.on("dialog", lambda dialog: dialog.accept())
        with page.expect_navigation():
            page.locator("form#cancel button, form#cancel [type=submit]").first.click()
        expect(page.locator("#task-state")).to_have_text("CANCELLED")
    finally:
        close_context(context)

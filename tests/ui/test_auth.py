"""Logging in to the dashboard with the daemon's token."""

from __future__ import annotations

import re
from collections.abc import Callable

from playwright.sync_api import BrowserContext, Page, expect

from tests.ui._browser import TOKEN, log_in


def test_pages_need_a_login(anonymous_context: BrowserContext) -> None:
    """Property: without the token, no page shows the daemon's data."""
    page = anonymous_context.new_page()
    page.goto("/queues")
    expect(page.locator("table#queues")).to_have_count(0)
    expect(page.locator("input[name=token]")).to_be_visible()


def test_login_with_the_token(
    anonymous_context: BrowserContext, shot: Callable[[Page, str], None]
) -> None:
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

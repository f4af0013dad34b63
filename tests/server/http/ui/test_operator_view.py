"""The operator's view, second pass (issue 28), in a real browser: long text
never widens a page, scheduled tasks say so, priority and search, colours
that read right, and the pause, schedules and limits pages with their
XSS and CSRF guards."""

from __future__ import annotations

import json
import re
from datetime import timedelta

from playwright.sync_api import Page, expect

from ringo_trio import TaskQueue
from tests._kit.browser import Shot
from tests._kit.ui_ops import Ops

from .test_actions import accept_confirms, submit
from .test_safety import IMG, assert_inert

# What HTTP clients log: a compact JSON error body, no space to break at.
UNBROKEN = json.dumps(
    {"error": {"code": 503, "detail": "upstream-timeout-" * 150}}, separators=(",", ":")
)[:2500]


def _fits(page: Page) -> None:
    width = page.evaluate("document.documentElement.scrollWidth")
    viewport = page.evaluate("window.innerWidth")
    assert width <= viewport, f"the page is {width} px wide in a {viewport} px window"


def test_an_unbroken_error_keeps_every_list_within_the_window(
    page: Page, ops: Ops, queue: str, shot: Shot
) -> None:
    """Property (no horizontal scroll): a 2,500-character error without a
    space, a 200-character key and type keep the DEAD list, the overview
    and the task page within the viewport's width; the list shows the start
    of the error and a link to all of it."""
    assert len(UNBROKEN) == 2500
    task_id = ops.enqueue(queue, task_type="t" * 200, unique_key="k" * 200, max_attempts=1)
    ops.settle(queue, "reject", error=UNBROKEN)
    page.goto(f"/queues/{queue}?state=DEAD")
    row = page.locator(f'tr[data-task-id="{task_id}"]')
    expect(row.locator("td.error")).to_contain_text(UNBROKEN[:100])
    expect(row.locator("td.error a.more")).to_have_attribute("href", re.compile(task_id))
    _fits(page)
    shot(page, "dead-list-long-error")
    page.goto(f"/queues/{queue}/tasks/{task_id}")
    expect(page.locator("#last-error")).to_have_text(UNBROKEN)
    _fits(page)
    page.goto("/queues")
    _fits(page)


def test_scheduled_priority_and_search(page: Page, ops: Ops, queue: str, shot: Shot) -> None:
    """Property: a PENDING task due in 3 hours says "scheduled for ... (in
    3 h ...)" on the list and its page; the priority column shows each
    task's; the search box opens a task by id or by unique key, and an
    unknown text says so and lists the keys starting with it."""

    async def fill(q: TaskQueue) -> list[str]:
        later = (await q.enqueue(task_type="later", delay=timedelta(hours=3))).task.id
        urgent = (await q.enqueue(task_type="now", priority=7, unique_key="order-17")).task.id
        await q.enqueue(task_type="now", unique_key="order-18")
        return [later, urgent]

    later, urgent = ops.on_queue(queue, fill)
    page.goto(f"/queues/{queue}")
    expect(page.locator(f'tr[data-task-id="{later}"] .scheduled')).to_contain_text(
        re.compile(r"scheduled for .* \(in (2 h 59 m|3 h 0 m)\)")
    )
    expect(page.locator(f'tr[data-task-id="{urgent}"] .scheduled')).to_have_count(0)
    expect(page.locator(f'tr[data-task-id="{urgent}"] td.priority')).to_have_text("7")
    shot(page, "queue-scheduled")
    page.goto(f"/queues/{queue}/tasks/{later}")
    expect(page.locator("#scheduled")).to_contain_text("scheduled for")

    for text, landed in ((urgent, urgent), ("order-17", urgent)):
        page.goto(f"/queues/{queue}")
        page.locator("form#find input[name=find]").fill(text)
        submit(page, "form#find")
        expect(page).to_have_url(re.compile(f"/tasks/{landed}$"))
    page.goto(f"/queues/{queue}")
    page.locator("form#find input[name=find]").fill("order-")
    submit(page, "form#find")
    expect(page.locator("#not-found")).to_contain_text("order-")
    expect(page.locator("table#tasks tr[data-task-id]")).to_have_count(2)


def test_a_quiet_queue_draws_no_red(page: Page, ops: Ops, queue: str) -> None:
    """Property (colours that read right): a queue that saw successes and
    no failure draws no failure line, and its success line is green; a
    queue that saw nothing draws a grey line."""
    ops.enqueue(queue, task_type="ok")
    ops.settle(queue, "ack")
    idle = queue + "-idle"
    ops.enqueue(idle, task_type="ok")
    page.goto("/queues")
    busy = page.locator(f'tr[data-queue="{queue}"] svg.sparkline')
    expect(busy.locator("polyline.failed")).to_have_count(0)
    expect(busy.locator("polyline.ok")).to_have_count(1)
    quiet = page.locator(f'tr[data-queue="{idle}"] svg.sparkline')
    expect(quiet.locator("polyline.idle")).to_have_count(1)
    expect(quiet.locator("polyline.failed")).to_have_count(0)


def test_pause_schedules_and_limits_pages(page: Page, ops: Ops, queue: str, shot: Shot) -> None:
    """Property: Pause asks for confirmation, shows the badge and offers
    Resume, which lifts it; the schedules page lists a schedule with its
    timing and next fire; the limits page lists a rule and the keys it
    holds back. Names holding markup show as text on all three pages."""
    asked = accept_confirms(page)
    page.goto(f"/queues/{queue}")
    submit(page, "form#pause")
    expect(page.locator("#paused")).to_have_text("paused")
    assert asked
    assert "Pause this queue?" in asked[0]
    assert ops.on_queue(queue, lambda q: q.stats()).paused is True
    shot(page, "queue-paused")
    submit(page, "form#pause")
    expect(page.locator("#paused")).to_have_count(0)
    assert ops.on_queue(queue, lambda q: q.stats()).paused is False

    async def configure(q: TaskQueue) -> None:
        await q.put_schedule(IMG, IMG, every=timedelta(hours=1))
        await q.set_limit(IMG, rate=1, per=timedelta(hours=1))
        for _ in range(3):
            await q.enqueue(task_type="t", limit_key=IMG + "x")

    ops.on_queue(queue, configure)
    page.goto(f"/queues/{queue}/schedules")
    row = page.locator("table#schedules tr[data-schedule]")
    expect(row).to_have_count(1)
    expect(row.locator("td.name")).to_have_text(IMG)
    expect(row.locator("td.timing")).to_contain_text("1h")
    expect(row.locator("td.next-fire")).to_contain_text("in ")
    assert_inert(page)
    shot(page, "schedules")
    page.goto(f"/queues/{queue}/limits")
    rule = page.locator("table#limits tr[data-limit-prefix]")
    expect(rule.locator("td.prefix")).to_have_text(IMG)
    assert_inert(page)
    shot(page, "limits")

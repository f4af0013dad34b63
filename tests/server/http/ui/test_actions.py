"""What an operator does in the dashboard: filter, page, cancel, retry, purge,
and watch counts change live."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Dialog, Page, expect

from ringo_trio import NotFoundError, TaskQueue, TaskSpec, TaskState
from tests._kit.ui_ops import Ops


def accept_confirms(page: Page) -> list[str]:
    """Accept every confirm dialog; the messages asked."""
    asked: list[str] = []

    def accept(dialog: Dialog) -> None:
        asked.append(dialog.message)
        dialog.accept()

    page.on("dialog", accept)
    return asked


def submit(page: Page, form: str) -> None:
    with page.expect_navigation():
        page.locator(f"{form} button, {form} [type=submit]").first.click()


def shown_ids(page: Page) -> list[str]:
    rows = page.locator("table#tasks tr[data-task-id]")
    ids: list[str] = rows.evaluate_all("rows => rows.map(row => row.dataset.taskId)")
    return ids


def test_filters(page: Page, ops: Ops, queue: str) -> None:
    """Property: the filters form narrows the list to the tasks of that
    state, type and key prefix (and only those)."""

    async def fill(q: TaskQueue) -> dict[str, str]:
        # The DEAD one first: claim takes the oldest available task.
        ids = {
            "dead": (await q.enqueue(task_type="beta", unique_key="eu-3", max_attempts=1)).task.id
        }
        (leased,) = await q.claim(1)
        await leased.reject("broken for the test")
        for name, task_type, key in (
            ("a1", "alpha", "eu-1"),
            ("a2", "alpha", "us-1"),
            ("b1", "beta", "eu-2"),
            ("g1", "gamma", "us-2"),
        ):
            ids[name] = (await q.enqueue(task_type=task_type, unique_key=key)).task.id
        return ids

    ids = ops.on_queue(queue, fill)
    page.goto(f"/queues/{queue}")
    expect(page.locator("table#tasks tr[data-task-id]")).to_have_count(5)
    filters = page.locator("form#filters")

    filters.locator("select[name=state]").select_option("DEAD")
    submit(page, "form#filters")
    expect(page).to_have_url(re.compile(r"state=DEAD"))
    assert shown_ids(page) == [ids["dead"]]

    filters.locator("select[name=state]").select_option("")
    filters.locator("input[name=type]").fill("alpha")
    submit(page, "form#filters")
    expect(page.locator("table#tasks tr[data-task-id]")).to_have_count(2)
    assert set(shown_ids(page)) == {ids["a1"], ids["a2"]}

    filters.locator("input[name=type]").fill("")
    filters.locator("input[name=key_prefix]").fill("eu-")
    submit(page, "form#filters")
    expect(page.locator("table#tasks tr[data-task-id]")).to_have_count(3)
    assert set(shown_ids(page)) == {ids["a1"], ids["b1"], ids["dead"]}


def test_paging(page: Page, ops: Ops, queue: str) -> None:
    """Property: following a#next-page visits every task exactly once."""
    total = 120
    batch = ops.on_queue(
        queue, lambda q: q.enqueue_many([TaskSpec(task_type="page") for _ in range(total)])
    )
    expected = {r.task.id for r in batch.results}
    page.goto(f"/queues/{queue}")
    seen: list[str] = []
    pages = 0
    while True:
        expect(page.locator("table#tasks")).to_be_visible()
        shown = shown_ids(page)
        # Also what ends the loop if the pages went round in a circle.
        assert not set(shown) & set(seen), f"page {pages + 1} repeats tasks"
        seen += shown
        pages += 1
        if page.locator("a#next-page").count() == 0:
            break
        with page.expect_navigation():
            page.locator("a#next-page").click()
    assert pages > 1, f"one page held all {total} tasks: paging not exercised"
    assert len(seen) == len(set(seen)) == total
    assert set(seen) == expected


def test_cancel_a_pending_task(page: Page, ops: Ops, queue: str) -> None:
    """Property: cancel (after the confirm) makes a PENDING task CANCELLED."""
    task_id = ops.enqueue(queue, task_type="cancel-me")
    page.goto(f"/queues/{queue}/tasks/{task_id}")
    expect(page.locator("#task-state")).to_have_text("PENDING")
    asked = accept_confirms(page)
    cancel = page.locator("form#cancel")
    if cancel.locator("[name=reason]").count():
        cancel.locator("[name=reason]").fill("typo in the order")
    submit(page, "form#cancel")
    assert len(asked) == 1
    expect(page).to_have_url(re.compile(f"/tasks/{task_id}$"))
    expect(page.locator("#task-state")).to_have_text("CANCELLED")
    assert ops.get(queue, task_id).state is TaskState.CANCELLED


def test_dismissed_confirm_sends_nothing(page: Page, ops: Ops, queue: str) -> None:
    """Property: dismissing the confirm dialog sends no action."""
    task_id = ops.enqueue(queue, task_type="keep-me")
    page.goto(f"/queues/{queue}/tasks/{task_id}")
    posts: list[str] = []
    page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)
    answers = iter([False, True])
    page.on("dialog", lambda d: d.accept() if next(answers) else d.dismiss())
    button = page.locator("form#cancel button, form#cancel [type=submit]").first
    button.click()  # dismissed
    # Had the first click submitted, the page would be gone, and this second
    # (accepted) submission would never happen.
    submit(page, "form#cancel")
    assert len(posts) == 1
    expect(page.locator("#task-state")).to_have_text("CANCELLED")


def test_retry_a_dead_task(page: Page, ops: Ops, queue: str) -> None:
    """Property: retry (after the confirm) makes a DEAD task PENDING again."""
    task_id = ops.enqueue(queue, task_type="retry-me", max_attempts=1)
    ops.settle(queue, "reject", error="poison")
    page.goto(f"/queues/{queue}/tasks/{task_id}")
    expect(page.locator("#task-state")).to_have_text("DEAD")
    asked = accept_confirms(page)
    submit(page, "form#retry")
    assert len(asked) == 1
    expect(page.locator("#task-state")).to_have_text("PENDING")
    assert ops.get(queue, task_id).state is TaskState.PENDING


def test_purge(page: Page, ops: Ops, queue: str) -> None:
    """Property: purge deletes the queue's finished tasks (those older than
    `older_than` when given) and leaves the active ones."""
    done = ops.enqueue(queue, task_type="purge-me", max_attempts=1)
    ops.settle(queue, "ack")
    dead = ops.enqueue(queue, task_type="purge-me", max_attempts=1)
    ops.settle(queue, "reject", error="poison")
    pending = ops.enqueue(queue, task_type="keep-me")
    page.goto(f"/queues/{queue}")
    expect(page.locator("table#tasks tr[data-task-id]")).to_have_count(3)
    accept_confirms(page)
    # Finished a moment ago: not older than a day, so kept.
    page.locator("form#purge input[name=older_than]").fill("1d")
    submit(page, "form#purge")
    expect(page.locator("table#tasks tr[data-task-id]")).to_have_count(3)
    submit(page, "form#purge")
    page.goto(f"/queues/{queue}")
    expect(page.locator("table#tasks tr[data-task-id]")).to_have_count(1)
    expect(page.locator(f'tr[data-task-id="{pending}"]')).to_have_count(1)
    for gone in (done, dead):
        with pytest.raises(NotFoundError):
            ops.get(queue, gone)
    assert ops.get(queue, pending).state is TaskState.PENDING


def test_counts_change_live(page: Page, ops: Ops, queue: str) -> None:
    """Property: the overview's counts and a task's state follow the daemon
    without a reload."""
    ops.enqueue(queue, task_type="live")
    page.goto("/queues")
    pending = page.locator(f'tr[data-queue="{queue}"] td[data-state="PENDING"]')
    expect(pending).to_have_text("1")
    # A reload would drop this mark.
    page.evaluate("window.__still_here = true")
    ops.enqueue(queue, task_type="live")
    ops.enqueue(queue, task_type="live")
    expect(pending).to_have_text("3")
    assert page.evaluate("window.__still_here") is True

    task_id = ops.enqueue(queue, task_type="live")
    page.goto(f"/queues/{queue}/tasks/{task_id}")
    expect(page.locator("#task-state")).to_have_text("PENDING")
    page.evaluate("window.__still_here = true")
    ops.on_queue(queue, lambda q: q.cancel_by_id(task_id))
    expect(page.locator("#task-state")).to_have_text("CANCELLED")
    assert page.evaluate("window.__still_here") is True


def test_bulk_actions_by_the_current_filter(page: Page, ops: Ops, queue: str) -> None:
    """Property (the filter decides): with the list filtered by type, "Cancel
    all 3" asks with the count, cancels exactly that type's active tasks
    in the background and says how many; "Retry all 1 DEAD" and "Purge"
    under their filters touch only what the filter shows."""
    for n in range(3):
        ops.enqueue(queue, task_type="bulk-a", unique_key=f"a{n}")
    keep = ops.enqueue(queue, task_type="bulk-b", max_attempts=1)
    asked = accept_confirms(page)
    page.goto(f"/queues/{queue}?type=bulk-a")
    button = page.locator("form#bulk-cancel button")
    expect(button).to_have_text("Cancel all 3 PENDING/LEASED of type bulk-a")
    expect(page.locator("form#bulk-retry button")).to_be_disabled()
    submit(page, "form#bulk-cancel")
    expect(page.locator("#purged")).to_have_text("Cancelled 3 active task(s).")
    assert asked == ["Cancel all 3 PENDING/LEASED task(s) of this queue of type bulk-a?"]
    assert ops.get(queue, keep).state is TaskState.PENDING
    assert ops.on_queue(queue, lambda q: q.stats()).cancelled == 3

    ops.settle(queue, "reject", error="poison")
    page.goto(f"/queues/{queue}?state=DEAD")
    expect(page.locator("form#bulk-cancel")).to_have_count(0)
    submit(page, "form#bulk-retry")
    expect(page.locator("#purged")).to_have_text("Retried 1 DEAD task(s).")
    assert ops.get(queue, keep).state is TaskState.PENDING

    page.goto(f"/queues/{queue}?type=bulk-a&state=CANCELLED")
    submit(page, "form#bulk-purge")
    expect(page.locator("#purged")).to_have_text("Deleted 3 finished task(s).")
    page.goto(f"/queues/{queue}")
    expect(page.locator("table#tasks tr[data-task-id]")).to_have_count(1)

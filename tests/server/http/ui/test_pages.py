"""Each page of the dashboard shows the daemon's data under the contract's
selectors (docs/dashboard.md)."""

from __future__ import annotations

import json
import os
import re
import socket
from datetime import timedelta

from playwright.sync_api import Page, expect

from ringo_trio import RetryBackoff, TaskQueue, TaskSpec
from tests._kit.browser import Shot
from tests._kit.ui_ops import CALL_TIMEOUT, Ops

# Distinct counts, so a count shown in the wrong state's cell is caught.
COUNTS = {"PENDING": 4, "LEASED": 1, "SUCCEEDED": 2, "DEAD": 3, "CANCELLED": 5}


async def fill_states(q: TaskQueue) -> dict[str, list[str]]:
    """COUNTS tasks in each state; their ids by state."""
    ids: dict[str, list[str]] = {state: [] for state in COUNTS}
    # Settled ones first: claim takes the oldest available task.
    for state, how in (("SUCCEEDED", "ack"), ("DEAD", "reject"), ("LEASED", None)):
        for n in range(COUNTS[state]):
            task_id = (await q.enqueue(task_type=f"kind-{state.lower()}", max_attempts=1)).task.id
            (leased,) = await q.claim(1, lease_duration=timedelta(minutes=10))
            assert leased.task.id == task_id
            if how == "ack":
                await leased.ack(f"result-{n}")
            elif how == "reject":
                await leased.reject(f"broken-{n}")
            ids[state].append(task_id)
    for state in ("CANCELLED", "PENDING"):
        batch = await q.enqueue_many([TaskSpec(task_type=f"kind-{state.lower()}")] * COUNTS[state])
        ids[state] += [r.task.id for r in batch.results]
    for task_id in ids["CANCELLED"]:
        await q.cancel_by_id(task_id, reason="not needed")
    return ids


def test_queues_overview(page: Page, ops: Ops, queue: str, shot: Shot) -> None:
    """Property: /queues shows each queue's count per state in that state's
    cell, a sparkline and the oldest pending age."""
    ops.on_queue(queue, fill_states)
    page.goto("/queues")
    row = page.locator(f'table#queues tr[data-queue="{queue}"]')
    for state, count in COUNTS.items():
        expect(row.locator(f'td[data-state="{state}"]')).to_have_text(str(count))
    expect(row.locator("svg.sparkline")).to_have_count(1)
    expect(row.locator("td.oldest-pending")).not_to_be_empty()
    expect(page.locator("main h1")).to_be_visible()
    expect(page.locator('nav a[href="/queues"]')).to_have_count(1)
    expect(page.locator('nav a[href="/workers"]')).to_have_count(1)
    shot(page, "queues")


def test_queue_tasks(page: Page, ops: Ops, queue: str, shot: Shot) -> None:
    """Property: a queue's page lists its tasks, each linking to its detail,
    with the per-state counts."""
    ids = ops.on_queue(queue, fill_states)
    page.goto("/queues")
    page.locator(f'table#queues tr[data-queue="{queue}"] a').first.click()
    expect(page).to_have_url(re.compile(f"/queues/{queue}$"))
    for state, count in COUNTS.items():
        expect(page.locator(f'[data-count-state="{state}"]')).to_contain_text(str(count))
    rows = page.locator("table#tasks tr[data-task-id]")
    expect(rows).to_have_count(sum(COUNTS.values()))
    dead = ids["DEAD"][0]
    expect(page.locator(f'tr[data-task-id="{dead}"]')).to_contain_text("DEAD")
    shot(page, "queue-tasks")
    page.locator(f'tr[data-task-id="{dead}"] a[href$="/tasks/{dead}"]').click()
    expect(page).to_have_url(re.compile(f"/queues/{queue}/tasks/{dead}$"))
    expect(page.locator("#task-state")).to_have_text("DEAD")


def test_task_detail(page: Page, ops: Ops, queue: str, shot: Shot) -> None:
    """Property: the detail page shows the task's state, payload (text, JSON,
    hex), attempts, last error, progress and lease holder; a finished task
    its result."""
    payload = {"order": 1234, "items": ["apple", "pear"]}

    async def leased_after_a_failure(q: TaskQueue) -> str:
        task_id = (
            await q.enqueue(
                task_type="ship",
                payload=json.dumps(payload),
                unique_key="order-1234",
                max_attempts=3,
                retry_backoff=RetryBackoff(initial=timedelta(0), maximum=timedelta(0)),
            )
        ).task.id
        (first,) = await q.claim(1, worker_id="first-worker")
        await first.nack("carrier timed out", delay=timedelta(0))
        (second,) = await q.claim(
            1,
            worker_id="holder-worker",
            lease_duration=timedelta(minutes=10),
            wait_timeout=timedelta(seconds=CALL_TIMEOUT / 2),
        )
        assert second.task.id == task_id
        await second.report_progress(3, 10, "packing")
        return task_id

    task_id = ops.on_queue(queue, leased_after_a_failure)
    page.goto(f"/queues/{queue}/tasks/{task_id}")
    expect(page.locator("#task-state")).to_have_text("LEASED")
    expect(page.locator("#attempts")).to_contain_text("2")
    expect(page.locator("#last-error")).to_contain_text("carrier timed out")
    progress = page.locator("progress#progress")
    expect(progress).to_have_attribute("value", re.compile(r"^3(\.0*)?$"))
    expect(progress).to_have_attribute("max", re.compile(r"^10(\.0*)?$"))
    expect(page.locator("#lease")).to_contain_text("holder-worker")
    expect(page.locator("#payload")).to_contain_text('"order"')
    expect(page.locator("form#cancel")).to_have_count(1)
    expect(page.locator("form#retry")).to_have_count(0)
    # The attempt timeline: attempt 1 failed on first-worker (its error
    # folded until asked for), attempt 2 running on the holder.
    attempts = page.locator("#attempts-timeline li")
    expect(attempts).to_have_count(2)
    expect(attempts.nth(0)).to_have_class(re.compile(r"outcome-failed"))
    expect(attempts.nth(0).locator(".worker")).to_have_text("first-worker")
    expect(attempts.nth(0).locator("details pre")).not_to_be_visible()
    attempts.nth(0).locator("summary").click()
    expect(attempts.nth(0).locator("details pre")).to_have_text("carrier timed out")
    expect(attempts.nth(1)).to_have_class(re.compile(r"outcome-running"))
    expect(attempts.nth(1).locator(".worker")).to_have_text("holder-worker")
    expect(attempts.nth(1).locator(".took")).to_contain_text("running for")
    shot(page, "task-detail")

    page.locator('a[data-view="json"]').click()
    expect(page).to_have_url(re.compile(r"view=json"))
    expect(page.locator("#payload")).to_contain_text('"apple"')
    page.locator('a[data-view="hex"]').click()
    expect(page).to_have_url(re.compile(r"view=hex"))
    # '{"order"' in hex, whatever the grouping of the digits.
    hex_text = re.sub(r"[^0-9a-f]", "", page.locator("#payload").inner_text().lower())
    assert "7b226f7264657222" in hex_text

    finished = ops.on_queue(
        queue, lambda q: q.enqueue(task_type="ship", payload=b"x", max_attempts=1)
    ).task.id
    ops.settle(queue, "ack", result="shipped-ok")
    page.goto(f"/queues/{queue}/tasks/{finished}")
    expect(page.locator("#task-state")).to_have_text("SUCCEEDED")
    expect(page.locator("#result")).to_contain_text("shipped-ok")
    expect(page.locator("form#retry")).to_have_count(1)
    expect(page.locator("form#cancel")).to_have_count(0)


def test_workers(page: Page, ops: Ops, queue: str, shot: Shot) -> None:
    """Property: /workers shows a live Worker's Work stream: its queue,
    host and pid, how long it has been connected, concurrency, the leases it
    holds and the tasks it settled (succeeded, failed)."""
    ops.enqueue(queue, task_type="quick-ok")
    ops.enqueue(queue, task_type="quick-ok")
    ops.enqueue(queue, task_type="quick-fail", max_attempts=1)
    ops.enqueue(queue, task_type="hold")
    with ops.live_worker(queue, concurrency=3) as worker:
        assert worker.handling.wait(CALL_TIMEOUT)
        page.goto("/workers")
        row = page.locator(f'table#workers tr[data-worker-id="{worker.worker_id}"]')
        expect(row.locator("td.queue")).to_have_text(queue)
        expect(row.locator("td.host")).to_have_text(socket.gethostname())
        expect(row.locator("td.pid")).to_have_text(str(os.getpid()))
        expect(row.locator("td.uptime")).to_have_text(re.compile(r"\d"))
        expect(row.locator("td.succeeded")).to_have_text("2")
        expect(row.locator("td.failed")).to_have_text("1")
        expect(row.locator("td.concurrency")).to_have_text("3")
        expect(row.locator("td.leases")).to_have_text("1")
        # Credit is what the worker still grants: 3 slots, one task held.
        expect(row.locator("td.credit")).to_have_text("2")
        shot(page, "workers")
    # Gone once the worker closed its stream (the table is live).
    expect(row).to_have_count(0)

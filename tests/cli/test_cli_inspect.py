"""``ringo queues``, ``ringo tasks list`` and ``ringo tasks show`` run as
subprocesses against a real ``ringod``."""

from __future__ import annotations

import json
import pathlib
import subprocess

import pytest
import trio

from ringo_trio import Ringo, TaskSpec
from ringo_trio.testing import DaemonProcess
from tests._kit.cli import run_ringo


@pytest.fixture(scope="module")
def filled(daemon: DaemonProcess) -> dict[str, str]:
    """Queue "mail": three send tasks (one DEAD with a long error, one
    SUCCEEDED with a result, one PENDING with a binary payload), one bounce
    task; queue "audit": one task. Returns the task ids by role."""

    async def run() -> dict[str, str]:
        with trio.fail_after(20):
            async with Ringo.connect(daemon.endpoint) as client:
                mail = client.queue("mail")
                dead = (await mail.enqueue(task_type="send", payload=b"hello\nworld")).task
                done = (await mail.enqueue(task_type="send", unique_key="k-done")).task
                binary = (await mail.enqueue(task_type="send", payload=bytes(range(256)) * 40)).task
                await mail.enqueue(TaskSpec("bounce"))
                await client.queue("audit").enqueue(task_type="log")
                [first] = await mail.claim(worker_id="w")
                await first.reject("boom " * 100)
                [second] = await mail.claim(worker_id="w")
                await second.ack()
                return {"dead": dead.id, "done": done.id, "binary": binary.id}

    return trio.run(run)


def ringo(daemon: DaemonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return run_ringo(daemon, *args)


def test_queues_prints_counts_per_queue(daemon: DaemonProcess, filled: dict[str, str]) -> None:
    """Property: `ringo queues` prints one row per queue with its counts by
    state; --json is the same data as a list of objects."""
    table = ringo(daemon, "queues")
    assert table.returncode == 0, table.stderr
    header, _rule, *rows = table.stdout.splitlines()
    assert header.split()[:6] == ["queue", "pending", "leased", "succeeded", "dead", "cancelled"]
    by_name = {r.split()[0]: r.split()[1:6] for r in rows}
    assert by_name["mail"] == ["2", "0", "1", "1", "0"]
    assert by_name["audit"] == ["1", "0", "0", "0", "0"]
    document = json.loads(ringo(daemon, "queues", "--json").stdout)
    mail = next(q for q in document if q["queue"] == "mail")
    assert (mail["pending"], mail["succeeded"], mail["dead"]) == (2, 1, 1)
    assert mail["oldest_pending_age_seconds"] >= 0


def test_tasks_list_filters_and_limits(daemon: DaemonProcess, filled: dict[str, str]) -> None:
    """Property: `ringo tasks list` prints the queue's tasks oldest first,
    filtered by --state and --type, at most --limit of them; --json lists
    the same tasks without payloads."""
    everything = ringo(daemon, "tasks", "list", "mail")
    assert everything.returncode == 0, everything.stderr
    ids = [line.split()[0] for line in everything.stdout.splitlines()[2:]]
    assert ids[:3] == [filled["dead"], filled["done"], filled["binary"]]
    assert len(ids) == 4
    dead = ringo(daemon, "tasks", "list", "mail", "--state", "dead", "--json")
    [task] = json.loads(dead.stdout)
    assert task["id"] == filled["dead"]
    assert task["state"] == "dead"
    assert task["last_error"].startswith("boom")
    assert "payload" not in task
    limited = ringo(daemon, "tasks", "list", "mail", "--type", "send", "--limit", "2", "--json")
    assert [t["id"] for t in json.loads(limited.stdout)] == [filled["dead"], filled["done"]]


def test_tasks_show_previews_payloads_and_fails_with_one_line_when_missing(
    daemon: DaemonProcess, filled: dict[str, str]
) -> None:
    """Property: `ringo tasks show` prints a task in full: a text payload as
    text, a binary one as bounded hex, attempts and the last error; by --key
    too; a task that does not exist is one line on stderr and exit 1."""
    shown = ringo(daemon, "tasks", "show", "mail", filled["dead"])
    assert shown.returncode == 0, shown.stderr
    assert "hello" in shown.stdout
    assert "world" in shown.stdout
    assert "attempts:" in shown.stdout
    assert "1 of" in shown.stdout
    assert "boom" in shown.stdout
    binary = json.loads(ringo(daemon, "tasks", "show", "mail", filled["binary"], "--json").stdout)
    assert binary["payload"]["bytes"] == 256 * 40
    assert binary["payload"]["truncated"] is True
    assert bytes.fromhex(binary["payload"]["hex"]) == (bytes(range(256)) * 40)[:4096]
    by_key = json.loads(ringo(daemon, "tasks", "show", "mail", "--key", "k-done", "--json").stdout)
    assert by_key["id"] == filled["done"]
    assert by_key["state"] == "succeeded"
    missing = ringo(daemon, "tasks", "show", "mail", "no-such-task")
    assert missing.returncode == 1
    assert missing.stdout == ""
    assert len(missing.stderr.strip().splitlines()) == 1, missing.stderr
    assert "not" in missing.stderr.lower()


def test_tasks_show_prints_the_attempt_history(
    daemon: DaemonProcess, filled: dict[str, str]
) -> None:
    """Property: `ringo tasks show` ends with one row per attempt (number,
    worker, outcome, the error's first line), and --json carries the same
    as `history`."""
    shown = ringo(daemon, "tasks", "show", "mail", filled["dead"])
    assert shown.returncode == 0, shown.stderr
    _head, table = shown.stdout.split("attempts (oldest first):\n")
    header, _rule, row = table.splitlines()
    assert header.split() == ["attempt", "worker", "started", "took", "outcome", "error"]
    assert row.split()[:2] == ["1", "w"]
    assert "rejected" in row
    assert "boom" in row
    document = json.loads(ringo(daemon, "tasks", "show", "mail", filled["done"], "--json").stdout)
    [attempt] = document["history"]
    assert (attempt["attempt"], attempt["worker_id"], attempt["outcome"]) == (1, "w", "succeeded")
    assert attempt["started_at"] <= attempt["ended_at"]


def test_tasks_list_on_a_missing_queue_is_an_empty_table(
    daemon: DaemonProcess, filled: dict[str, str], tmp_path: pathlib.Path
) -> None:
    """Property: listing a queue with no tasks is not an error: a header only."""
    result = ringo(daemon, "tasks", "list", "nothing-here")
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 2

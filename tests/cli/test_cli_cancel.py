"""`ringo enqueue`, `ringo tasks retry` and `ringo tasks cancel`, each run as a
subprocess against a real ``ringod``."""

from __future__ import annotations

import pathlib
import subprocess
from typing import Any

import pytest
import trio

from ringo_trio import PermanentTaskError, Ringo, Task, TaskContext
from ringo_trio._contract import limits
from ringo_trio.testing import DaemonProcess, run_worker
from tests._kit.cli import run_ringo, run_ringo_json

TIMEOUT = 30


def ringo(
    daemon: DaemonProcess, *args: str, stdin: bytes | None = None, cwd: pathlib.Path | None = None
) -> subprocess.CompletedProcess[str]:
    return run_ringo(daemon, *args, stdin=stdin, cwd=cwd, encoding="latin-1")


def ringo_json(daemon: DaemonProcess, *args: str, **kwargs: Any) -> Any:
    return run_ringo_json(daemon, *args, encoding="latin-1", **kwargs)


def sdk(daemon: DaemonProcess, queue: str, call: Any) -> Any:
    """Run `call(queue)` with an SDK client of the daemon."""

    async def main() -> Any:
        with trio.fail_after(TIMEOUT):
            async with Ringo.connect(daemon.endpoint) as client:
                return await call(client.queue(queue))

    return trio.run(main)


def test_enqueue_takes_text_a_file_or_stdin(daemon: DaemonProcess, tmp_path: pathlib.Path) -> None:
    """`ringo enqueue` stores the payload given as text, @FILE (its exact bytes)
    or - (stdin), prints the new task's id and whether it was created; a second
    enqueue with the same --key is reported as a duplicate of the same task;
    --delay schedules it; --json gives the same facts as a document."""
    raw = bytes(range(256))
    (tmp_path / "payload.bin").write_bytes(raw)
    plain = ringo(daemon, "enqueue", "cli-enq", "mail", "--payload", "hello")
    assert plain.returncode == 0, plain.stderr
    task_id, how = plain.stdout.split(maxsplit=1)
    assert how.strip() == "created"
    from_file = ringo_json(daemon, "enqueue", "cli-enq", "mail", "--payload", "@payload.bin",
                           "--key", "k1", cwd=tmp_path)  # fmt: skip
    assert from_file["created"] is True
    again = ringo_json(daemon, "enqueue", "cli-enq", "mail", "--payload", "other", "--key", "k1")
    assert again["created"] is False
    assert again["id"] == from_file["id"]
    piped = ringo_json(
        daemon, "enqueue", "cli-enq", "mail", "--payload", "-", "--delay", "5m",
        stdin=b"from stdin\x00",
    )  # fmt: skip
    tasks = sdk(
        daemon,
        "cli-enq",
        lambda q: _get_all(q, [task_id, from_file["id"], piped["id"]]),
    )
    assert [t.payload for t in tasks] == [b"hello", raw, b"from stdin\x00"]
    assert tasks[2].available_at is not None
    assert tasks[2].created_at is not None
    assert (tasks[2].available_at - tasks[2].created_at).total_seconds() == pytest.approx(300)


def test_enqueue_refusals_are_one_line(daemon: DaemonProcess, tmp_path: pathlib.Path) -> None:
    """A missing @FILE and a payload over the limit are refused with one line on
    stderr and exit status 1; a bad --delay is a usage error (exit status 2, like
    `tasks purge --older-than`); nothing is enqueued."""
    big = tmp_path / "big.bin"
    big.write_bytes(b"x" * (limits.MAX_PAYLOAD_BYTES + 1))
    usage = ringo(daemon, "enqueue", "cli-refused", "t", "--delay", "soon", cwd=tmp_path)
    assert usage.returncode == 2, usage
    assert "--delay" in usage.stderr
    for args, fragment in (
        (["--payload", "@missing.bin"], "missing.bin"),
        (["--payload", f"@{big}"], str(limits.MAX_PAYLOAD_BYTES)),
    ):
        result = ringo(daemon, "enqueue", "cli-refused", "t", *args, cwd=tmp_path)
        assert result.returncode == 1, result
        assert fragment in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert sdk(daemon, "cli-refused", lambda q: q.active_count()) == 0


def test_tasks_cancel_and_retry(daemon: DaemonProcess) -> None:
    """`ringo tasks cancel` cancels by id or --key with --reason (shown as the
    task's last error); `ringo tasks retry` brings one task back by id or --key;
    a task that does not exist is one line and exit status 1."""
    first = ringo_json(daemon, "enqueue", "cli-cancel", "t", "--key", "a")
    second = ringo_json(daemon, "enqueue", "cli-cancel", "t")
    by_key = ringo_json(daemon, "tasks", "cancel", "cli-cancel", "--key", "a", "--reason", "typo")
    assert by_key["state"] == "cancelled"
    assert by_key["last_error"] == "cancelled: typo"
    table = ringo(daemon, "tasks", "cancel", "cli-cancel", second["id"])
    assert table.returncode == 0, table.stderr
    assert "cancelled" in table.stdout
    assert second["id"] in table.stdout
    back = ringo_json(daemon, "tasks", "retry", "cli-cancel", second["id"])
    assert back["state"] == "pending"
    assert ringo_json(daemon, "tasks", "retry", "cli-cancel", "--key", "a")["id"] == first["id"]
    missing = ringo(daemon, "tasks", "cancel", "cli-cancel", "--key", "nope")
    assert missing.returncode == 1
    assert "NotFoundError" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1


def test_tasks_retry_all_dead(daemon: DaemonProcess) -> None:
    """`ringo tasks retry QUEUE --all-dead [--type T]` retries every DEAD task (of
    that type) and says how many; --type without --all-dead is refused."""

    async def kill_all(queue: Any) -> None:
        for task_type in ("a", "a", "b"):
            await queue.enqueue(task_type=task_type, max_attempts=1)

        async def fail(task: Task, ctx: TaskContext) -> None:
            raise PermanentTaskError("no")

        await run_worker(queue, fail)

    sdk(daemon, "cli-retry", kill_all)
    typed = ringo_json(daemon, "tasks", "retry", "cli-retry", "--all-dead", "--type", "a")
    assert typed == {"queue": "cli-retry", "retried": 2}
    rest = ringo(daemon, "tasks", "retry", "cli-retry", "--all-dead")
    assert rest.returncode == 0, rest.stderr
    assert "retried 1 DEAD task(s)" in rest.stdout
    assert sdk(daemon, "cli-retry", lambda q: q.active_count()) == 3
    refused = ringo(daemon, "tasks", "retry", "cli-retry", "--key", "k", "--type", "a")
    assert refused.returncode == 1
    assert "--all-dead" in refused.stderr


async def _get_all(queue: Any, ids: list[str]) -> list[Task]:
    return [await queue.get_by_id(i) for i in ids]


def test_bulk_cancel_retry_and_purge_by_filter(daemon: DaemonProcess) -> None:
    """`ringo tasks cancel Q --all-active [--state] [--type] [--key-prefix]`
    cancels exactly the matching active tasks and says how many; `retry
    --all-dead --key-prefix` and `purge --type --key-prefix` narrow likewise;
    a filter without --all-active is refused."""

    async def fill(queue: Any) -> None:
        for n in range(3):
            await queue.enqueue(task_type="a", unique_key=f"t1:{n}")
        await queue.enqueue(task_type="b", unique_key="t1:b")
        await queue.enqueue(task_type="a", unique_key="t2:0")

    sdk(daemon, "cli-bulk", fill)
    cancelled = ringo_json(
        daemon, "tasks", "cancel", "cli-bulk", "--all-active", "--type", "a", "--key-prefix", "t1:"
    )
    assert cancelled == {"queue": "cli-bulk", "cancelled": 3}
    assert sdk(daemon, "cli-bulk", lambda q: q.active_count()) == 2
    retried = ringo_json(daemon, "tasks", "retry", "cli-bulk", "--all-dead", "--key-prefix", "t2:")
    assert retried == {"queue": "cli-bulk", "retried": 0}
    purged = ringo(daemon, "tasks", "purge", "cli-bulk", "--key-prefix", "t1:1", "--type", "a")
    assert purged.returncode == 0, purged.stderr
    assert "deleted 1 finished task(s)" in purged.stdout
    rest = ringo(daemon, "tasks", "cancel", "cli-bulk", "--all-active", "--state", "pending")
    assert "cancelled 2 task(s)" in rest.stdout
    refused = ringo(daemon, "tasks", "cancel", "cli-bulk", "--key", "t2:0", "--type", "a")
    assert refused.returncode == 1
    assert "--all-active" in refused.stderr

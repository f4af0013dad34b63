"""How ``ringo tasks list``, ``cancel`` and ``retry`` print tasks: one row
shape, a cut that says so, progress as people write it, and a quiet exit
when the reader (``| head``) goes away. Subprocesses against a real
``ringod`` (the module's shared daemon, tests/_kit/cli.py)."""

from __future__ import annotations

import subprocess

import pytest
import trio

from ringo_trio import Ringo, TaskSpec
from ringo_trio.testing import DaemonProcess
from tests._kit.cli import CLI, TIMEOUT, run_ringo


def _enqueue(daemon: DaemonProcess, queue: str, count: int) -> None:
    async def run() -> None:
        with trio.fail_after(60):
            async with Ringo.connect(daemon.endpoint) as client:
                specs = [TaskSpec("t", unique_key=f"{queue}-{i:04d}") for i in range(count)]
                for start in range(0, count, 1000):
                    await client.queue(queue).enqueue_many(specs[start : start + 1000])

    trio.run(run)


@pytest.fixture(scope="module")
def many(daemon: DaemonProcess) -> str:
    """Queue "many": 1,200 PENDING tasks (a table well over a pipe's 64 KiB)."""
    _enqueue(daemon, "many", 1200)
    return "many"


def _rows(stdout: str) -> list[str]:
    return stdout.splitlines()[2:]  # past the header and its rule


def test_tasks_list_says_when_it_stops_short(daemon: DaemonProcess, many: str) -> None:
    """Property: a listing cut at --limit (default 100) says so in one line on
    stderr naming --limit and --all, so nobody takes the first 100 for all of
    them; a limit that shows everything says nothing; --all shows every task;
    stdout (table or --json) holds only tasks."""
    default = run_ringo(daemon, "tasks", "list", many)
    assert default.returncode == 0, default.stderr
    assert len(_rows(default.stdout)) == 100
    assert "showed the first 100 tasks; more match" in default.stderr
    assert "--limit N" in default.stderr
    assert "--all" in default.stderr
    assert "more match" not in default.stdout
    exact = run_ringo(daemon, "tasks", "list", many, "--limit", "1200", "--json")
    assert exact.returncode == 0, exact.stderr
    assert exact.stdout.count('"id"') == 1200
    assert exact.stderr == ""
    everything = run_ringo(daemon, "tasks", "list", many, "--all")
    assert len(_rows(everything.stdout)) == 1200
    assert everything.stderr == ""
    cut = run_ringo(daemon, "tasks", "list", many, "--limit", "1199", "--json")
    assert cut.stdout.count('"id"') == 1199
    assert "showed the first 1199 tasks" in cut.stderr


def test_piping_into_head_exits_quietly(daemon: DaemonProcess, many: str) -> None:
    """Property: `ringo tasks list Q --all | head` prints no traceback (no
    BrokenPipeError, not at exit either) and exits 141, as a process killed by
    SIGPIPE does. The reader closes after the first bytes of a >64 KiB table,
    so the writer is sure to meet the closed pipe."""
    process = subprocess.Popen(
        [*CLI, "tasks", "list", many, "--all", "--endpoint", daemon.endpoint],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        assert process.stderr is not None
        assert process.stdout.read(200)
        process.stdout.close()
        status = process.wait(TIMEOUT)
        error = process.stderr.read().decode()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()
    assert error == ""
    assert status == 141


def _task_row(daemon: DaemonProcess, queue: str, key: str) -> tuple[str, str]:
    """The header and the one row `tasks list` prints for the task with ``key``."""
    listed = run_ringo(daemon, "tasks", "list", queue, "--key-prefix", key)
    assert listed.returncode == 0, listed.stderr
    header, _rule, row = listed.stdout.splitlines()
    return header, row


def test_cancel_and_retry_print_the_list_row(daemon: DaemonProcess) -> None:
    """Property: `tasks cancel` and `tasks retry` print the task they changed
    with exactly the columns (and cells) `tasks list` prints for it."""

    async def setup() -> None:
        with trio.fail_after(20):
            async with Ringo.connect(daemon.endpoint) as client:
                queue = client.queue("rows")
                await queue.enqueue(TaskSpec("t", unique_key="to-retry", max_attempts=1))
                [leased] = await queue.claim(worker_id="w")
                await leased.reject("boom")
                await queue.enqueue(TaskSpec("t", unique_key="to-cancel"))

    trio.run(setup)
    cancelled = run_ringo(daemon, "tasks", "cancel", "rows", "--key", "to-cancel")
    assert cancelled.returncode == 0, cancelled.stderr
    header, _rule, row = cancelled.stdout.splitlines()
    assert (header, row) == _task_row(daemon, "rows", "to-cancel")
    assert header.split()[:5] == ["id", "type", "state", "attempt", "progress"]
    retried = run_ringo(daemon, "tasks", "retry", "rows", "--key", "to-retry")
    assert retried.returncode == 0, retried.stderr
    header, _rule, row = retried.stdout.splitlines()
    assert (header, row) == _task_row(daemon, "rows", "to-retry")


@pytest.mark.parametrize(
    ("current", "total", "shown"),
    [(2.0, 2.0, "2/2 copied"), (2.5, 4.0, "2.5/4 copied"), (0.0, 0.0, "0/0 copied")],
)
def test_progress_prints_whole_numbers_without_a_point(
    daemon: DaemonProcess, current: float, total: float, shown: str
) -> None:
    """Property: progress reads as people write it: a whole number without
    ".0" (2/2, not 2.0/2.0), a fraction as it is, the message kept — in
    `tasks show` and in `tasks list`'s row."""
    key = f"progress-{current}-{total}"

    async def setup() -> None:
        with trio.fail_after(20):
            async with Ringo.connect(daemon.endpoint) as client:
                queue = client.queue("progress")
                await queue.enqueue(TaskSpec("t", unique_key=key))
                [leased] = await queue.claim(worker_id="w")
                await leased.report_progress(current, total, "copied")

    trio.run(setup)
    shown_task = run_ringo(daemon, "tasks", "show", "progress", "--key", key)
    assert shown_task.returncode == 0, shown_task.stderr
    [line] = [line for line in shown_task.stdout.splitlines() if line.startswith("progress:")]
    assert line.split(":", 1)[1].strip() == shown
    _header, row = _task_row(daemon, "progress", key)
    assert f"  {shown}  " in row

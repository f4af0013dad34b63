"""`ringo worker --data-dir D` and the operator commands on the same D work
together, as the README shows them one after the other: a worker with an
explicit data dir uses the dir's shared daemon (the one `ringo queues
--data-dir D` attaches to), not a private one holding the dir alone.

Real processes throughout; every wait is bounded (`Child.wait_for`, the
subprocess timeouts, `trio.fail_after`).
"""

from __future__ import annotations

import json
import pathlib
import signal
import subprocess
import textwrap
from collections.abc import Iterator

import pytest
import trio

from ringo_trio import Ringo, TaskState
from tests._kit.cli import CLI, Child
from tests._kit.processes import eventually, pid_alive

HANDLERS = """
    async def handle(task, ctx):
        print(f"handled {task.id}", flush=True)
"""


@pytest.fixture
def work(tmp_path: pathlib.Path) -> pathlib.Path:
    """The worker's cwd, holding ``ringo_dd_handlers.py``."""
    path = tmp_path / "work"
    path.mkdir()
    (path / "ringo_dd_handlers.py").write_text(textwrap.dedent(HANDLERS))
    return path


@pytest.fixture
def children() -> Iterator[list[Child]]:
    started: list[Child] = []
    yield started
    for child in started:
        child.kill()


def ringo(cwd: pathlib.Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def start_worker(work: pathlib.Path, data: pathlib.Path, *flags: str) -> Child:
    return Child(
        work, "worker", "ringo_dd_handlers:handle", "-q", "mail", "--data-dir", str(data), *flags
    )


def daemon_pid(data_dir: pathlib.Path) -> int:
    identity = json.loads((data_dir / "shared" / "identity.json").read_text())
    pid: int = identity["pid"]
    return pid


def _operate(work: pathlib.Path, data: pathlib.Path, worker: Child) -> None:
    """Enqueue, list and count through the CLI while the worker runs on the same dir."""
    enqueued = ringo(work, "enqueue", "mail", "t", "--payload", "hi", "--data-dir", str(data))
    assert enqueued.returncode == 0, enqueued.stderr
    task_id = enqueued.stdout.split()[0]
    worker.wait_for(f"handled {task_id}", timeout=30)
    queues = ringo(work, "queues", "--json", "--data-dir", str(data))
    assert queues.returncode == 0, queues.stderr
    [mail] = [q for q in json.loads(queues.stdout) if q["queue"] == "mail"]
    assert mail["succeeded"] >= 1
    listed = ringo(work, "tasks", "list", "mail", "--data-dir", str(data))
    assert listed.returncode == 0, listed.stderr
    assert task_id in listed.stdout
    assert "held by another ringod" not in queues.stderr + listed.stderr


def test_worker_first_then_commands_on_the_same_data_dir(
    work: pathlib.Path, tmp_path: pathlib.Path, children: list[Child]
) -> None:
    """The README's order: `ringo worker --data-dir D` running in the background,
    then `ringo enqueue/queues/tasks list --data-dir D` succeed against the same
    daemon (the worker handles the task they enqueue); when the worker, the last
    user, leaves, the daemon stops (after its short linger) and frees D."""
    data = tmp_path / "data"
    worker = start_worker(work, data)
    children.append(worker)
    worker.wait_for(r"registered \S+ on queue 'mail'", timeout=30)
    pid = daemon_pid(data)
    _operate(work, data, worker)
    assert daemon_pid(data) == pid  # one daemon served them all
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.finish(timeout=30) == 0, worker.lines

    async def stopped() -> None:
        await eventually(lambda: not pid_alive(pid), within=20)

    trio.run(stopped)


def test_commands_first_then_worker_on_the_same_data_dir(
    work: pathlib.Path, tmp_path: pathlib.Path, children: list[Child]
) -> None:
    """The other order: the data dir's daemon already serves another user (an app
    holding `Ringo.local(D, shared=True)`, as `ringo queues` leaves it lingering);
    `ringo worker --data-dir D` attaches to it rather than failing with "held by
    another ringod", and the commands keep working beside both."""
    data = tmp_path / "data"

    async def main() -> None:
        with trio.fail_after(90):
            async with Ringo.local(data, shared=True) as app:
                first = ringo(work, "queues", "--data-dir", str(data))
                assert first.returncode == 0, first.stderr
                worker = start_worker(work, data)
                children.append(worker)
                await trio.to_thread.run_sync(
                    lambda: worker.wait_for(r"registered \S+ on queue 'mail'", timeout=30)
                )
                assert daemon_pid(data) == app.daemon_pid
                await trio.to_thread.run_sync(_operate, work, data, worker)
                queue = app.queue("mail")
                found = [t async for t in queue.list(states=[TaskState.SUCCEEDED])]
                assert len(found) == 1
                worker.proc.send_signal(signal.SIGTERM)
                assert await trio.to_thread.run_sync(lambda: worker.finish(timeout=30)) == 0
                pid = app.daemon_pid
            assert pid is not None
            await eventually(lambda: not pid_alive(pid), within=20)

    trio.run(main)


def test_private_worker_holds_the_data_dir_alone(
    work: pathlib.Path, tmp_path: pathlib.Path, children: list[Child]
) -> None:
    """--private keeps the old behaviour for who wants it: the worker's own daemon,
    and the other commands on that dir are refused with a message naming it."""
    data = tmp_path / "data"
    worker = start_worker(work, data, "--private")
    children.append(worker)
    worker.wait_for(r"registered \S+ on queue 'mail'", timeout=30)
    refused = ringo(work, "queues", "--data-dir", str(data))
    assert refused.returncode == 1
    assert "held by another ringod" in refused.stderr
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.finish(timeout=30) == 0, worker.lines

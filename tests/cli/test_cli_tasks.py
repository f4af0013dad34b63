"""Typed tasks from the command line: ``ringo enqueue Q module:task --json ARGS``
and ``ringo worker module:registry``, in child processes against a real ``ringod``."""

from __future__ import annotations

import json
import pathlib
import signal
import textwrap
from collections.abc import Iterator

import pytest
import trio

from ringo_trio import Ringo, TaskState
from ringo_trio.testing import DaemonProcess
from tests._kit.cli import Child, run_ringo

APP = """
    from ringo_trio import TaskRegistry

    tasks = TaskRegistry(queue="typed")

    @tasks.task
    async def greet(name: str, times: int = 1) -> str:
        print(f"greeting {name}", flush=True)
        return ", ".join([f"hello {name}"] * times)
"""


@pytest.fixture
def app_dir(tmp_path: pathlib.Path) -> pathlib.Path:
    work = tmp_path / "app"
    work.mkdir()
    (work / "ringo_test_app.py").write_text(textwrap.dedent(APP))
    return work


@pytest.fixture
def worker(app_dir: pathlib.Path, daemon: DaemonProcess) -> Iterator[Child]:
    child = Child(
        app_dir, "worker", "ringo_test_app:tasks", "--queue", "typed", "--endpoint", daemon.endpoint
    )
    yield child
    child.kill()


def _task(daemon: DaemonProcess, task_id: str) -> tuple[TaskState, bytes | None, str | None]:
    async def run() -> tuple[TaskState, bytes | None, str | None]:
        with trio.fail_after(20):
            async with Ringo.connect(daemon.endpoint) as client:
                task = await client.queue("typed").wait(task_id, timeout=15)
                return task.state, task.result, task.last_error

    return trio.run(run)


def test_enqueue_by_name_and_run_a_registry(
    daemon: DaemonProcess, app_dir: pathlib.Path, worker: Child
) -> None:
    """Property: ``ringo enqueue`` with a task's name and ``--json`` arguments
    enqueues a task the registry's worker (``ringo worker module:registry``)
    runs, its result stored as the function's JSON return value."""
    worker.wait_for(r"registered \S+ on queue 'typed'")
    added = run_ringo(
        daemon,
        "enqueue",
        "typed",
        "ringo_test_app:greet",
        "--json",
        '{"name": "ada", "times": 2}',
        cwd=app_dir,
    )
    assert added.returncode == 0, added.stderr
    task_id = added.stdout.split()[0]
    worker.wait_for("greeting ada")
    state, result, _ = _task(daemon, task_id)
    assert state is TaskState.SUCCEEDED
    assert json.loads(result or b"") == "hello ada, hello ada"
    worker.proc.send_signal(signal.SIGINT)
    assert worker.finish() == 0


def test_arguments_are_checked_before_anything_is_sent(
    daemon: DaemonProcess, app_dir: pathlib.Path
) -> None:
    """Property: where the task's module imports, arguments that do not fit
    its signature are refused (one line, exit 1, like any refused enqueue)
    and nothing is enqueued."""
    for arguments in ('{"times": 2}', '{"name": 1}', "[1]", "not json"):
        refused = run_ringo(
            daemon, "enqueue", "refused", "ringo_test_app:greet", "--json", arguments, cwd=app_dir
        )
        assert refused.returncode == 1, (arguments, refused.stdout, refused.stderr)
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    listed = run_ringo(daemon, "queues", cwd=app_dir)
    assert listed.returncode == 0, listed.stderr
    assert "refused" not in listed.stdout


def test_without_the_module_the_worker_validates(
    daemon: DaemonProcess, tmp_path: pathlib.Path, app_dir: pathlib.Path, worker: Child
) -> None:
    """Property: an operator without the app's code can still enqueue by
    name; a task whose arguments do not validate then ends DEAD at once in
    the worker, with the validation error."""
    worker.wait_for(r"registered \S+ on queue 'typed'")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    added = run_ringo(
        daemon, "enqueue", "typed", "ringo_test_app:greet", "--json", '{"times": 1}', cwd=elsewhere
    )
    assert added.returncode == 0, added.stderr
    state, _, error = _task(daemon, added.stdout.split()[0])
    assert state is TaskState.DEAD
    assert "name" in (error or ""), error


def test_a_registry_refuses_task_types(daemon: DaemonProcess, app_dir: pathlib.Path) -> None:
    """Property: a registry's worker runs its own task types; --task-type or a
    queue without its tasks is a usage error (exit 2)."""
    for extra in (["--queue", "typed", "--task-type", "x"], ["--queue", "other"]):
        proc = run_ringo(daemon, "worker", "ringo_test_app:tasks", *extra, cwd=app_dir)
        assert proc.returncode == 2, proc.stderr

"""The ``ringo`` command line, end to end in child processes.

``ringo demo`` runs against its own private daemon; ``ringo worker`` runs
against a ``ringod`` started with `ringo_trio.testing.spawn_daemon`, fed and
checked through the SDK. Every child is bounded by a timeout (no test can
hang the suite) and killed if a test fails half-way.
"""

from __future__ import annotations

import pathlib
import re
import signal
import subprocess
import textwrap
import time
from collections.abc import Callable, Iterator

import pytest
import trio

from ringo_trio import Ringo, TaskState
from ringo_trio.testing import DaemonProcess, spawn_daemon
from tests._kit.cli import CLI, Child

NUMBER = r"[0-9][0-9,]*(?:\.[0-9]+)?"


# -- ringo demo ---------------------------------------------------------------


def _demo(tmp_path: pathlib.Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "demo", "--data-dir", str(tmp_path / "data"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _summary(stdout: str) -> dict[str, str]:
    rows = re.findall(r"^\| (.+?)\s+\|\s+(.+?) \|$", stdout, re.MULTILINE)
    return {name.strip(): value.strip() for name, value in rows}


def _count(rows: dict[str, str], name: str) -> int:
    return int(rows[name].replace(",", ""))


def _run_demo(tmp_path: pathlib.Path, *args: str) -> dict[str, str]:
    proc = _demo(tmp_path, "-n", "500", *args, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all 500 tasks accounted for" in proc.stdout
    rows = _summary(proc.stdout)
    assert _count(rows, "tasks") == 500
    assert _count(rows, "succeeded") + _count(rows, "dead") == 500
    assert re.fullmatch(rf"{NUMBER} tasks/s", rows["throughput"]), rows
    assert re.fullmatch(rf"{NUMBER} tasks/s", rows["enqueue (enqueue_many)"]), rows
    # The bar went to stderr (stdout is not a terminal), as plain lines.
    assert "progress: 500/500 done" in proc.stderr
    return rows


def test_demo_with_default_failures_accounts_for_every_task(tmp_path: pathlib.Path) -> None:
    """No task lost: with the default 5 % injected failures every task ends
    SUCCEEDED or DEAD (the daemon holds none active), retries happen, latency
    percentiles are reported, and the private daemon is gone afterwards."""
    rows = _run_demo(tmp_path)
    assert _count(rows, "retries") > 0
    p50 = float(rows["latency p50 enqueue→ack"].removesuffix(" ms").replace(",", ""))
    p99 = float(rows["latency p99 enqueue→ack"].removesuffix(" ms").replace(",", ""))
    assert 0 <= p50 <= p99
    # The daemon stopped and released its data dir: a new daemon may take it.
    with spawn_daemon(tmp_path / "data") as daemon:
        assert daemon.process.poll() is None


def test_demo_without_failures_succeeds_everything(tmp_path: pathlib.Path) -> None:
    """--failure-rate 0: every task succeeds on its first attempt (0 retries, 0 dead),
    also with handlers that sleep."""
    rows = _run_demo(tmp_path, "--failure-rate", "0", "--sleep", "0.005", "-c", "128")
    assert _count(rows, "succeeded") == 500
    assert _count(rows, "retries") == 0
    assert _count(rows, "dead") == 0
    assert rows["concurrency"] == "128"


def test_demo_always_failing_kills_everything(tmp_path: pathlib.Path) -> None:
    """--failure-rate 1 --max-attempts 2: every task is retried exactly once, then DEAD."""
    rows = _run_demo(tmp_path, "--failure-rate", "1", "--max-attempts", "2")
    assert _count(rows, "dead") == 500
    assert _count(rows, "retries") == 500
    assert _count(rows, "succeeded") == 0
    assert rows["latency p50 enqueue→ack"].startswith("n/a")


@pytest.mark.parametrize(
    ("phase", "tasks"), [("enqueueing", "200000"), ("working them off", "4000")]
)
def test_demo_stops_cleanly_on_ctrl_c(tmp_path: pathlib.Path, phase: str, tasks: str) -> None:
    """Ctrl-C (SIGINT) stops the demo promptly, in the enqueue phase as in the work
    phase, with exit status 130, and leaves no daemon behind (the data dir is free)."""
    child = Child(tmp_path, "demo", "-n", tasks, "--data-dir", str(tmp_path / "data"))
    try:
        child.wait_for(f"ringo demo: {phase}", timeout=60)
        child.proc.send_signal(signal.SIGINT)
        assert child.finish(timeout=20) == 130, child.lines
    finally:
        child.kill()
    assert any("SIGINT, stopping" in line for line in child.lines)
    with spawn_daemon(tmp_path / "data") as daemon:
        assert daemon.process.poll() is None


@pytest.mark.parametrize(
    "flags",
    [["--failure-rate", "1.5"], ["--tasks", "0"], ["--batch", "5000"], ["--concurrency", "0"]],
)
def test_demo_refuses_bad_flags(tmp_path: pathlib.Path, flags: list[str]) -> None:
    """Bad input gets a one-line message naming the flag, usage exit status 2,
    and starts nothing (no data dir is created)."""
    proc = _demo(tmp_path, *flags, timeout=30)
    assert proc.returncode == 2
    assert flags[0] in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "data").exists()


# -- ringo worker ---------------------------------------------------------------

HANDLERS = """
    import gc

    import trio
    from ringo_trio import RetryTaskError

    NOT_CALLABLE = 3

    async def handle(task, ctx):
        if task.payload.startswith(b"sleep:"):
            print(f"started {task.id}", flush=True)
            await trio.sleep(float(task.payload[6:]))
        if task.payload.startswith(b"stubborn:"):
            # Ignores its cancellation for this long, then exits.
            print(f"stubborn {task.id}", flush=True)
            with trio.CancelScope(shield=True):
                await trio.sleep(float(task.payload[9:]))
            return
        if task.payload == b"gc":
            print(f"gc threshold {gc.get_threshold()[0]}", flush=True)
        if task.payload == b"retry":
            raise RetryTaskError("mail server busy", delay=3600)
        if task.payload == b"crash":
            raise ValueError("boom")
        print(f"handled {task.id}", flush=True)
"""


@pytest.fixture
def handlers_dir(tmp_path: pathlib.Path) -> pathlib.Path:
    """A directory holding ``ringo_test_handlers.py`` (imported from the cwd)."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "ringo_test_handlers.py").write_text(textwrap.dedent(HANDLERS))
    return work


@pytest.fixture
def daemon(tmp_path: pathlib.Path) -> Iterator[DaemonProcess]:
    with spawn_daemon(tmp_path / "ringod") as d:
        yield d


@pytest.fixture
def start_worker(handlers_dir: pathlib.Path) -> Iterator[Callable[..., Child]]:
    """Starts ``ringo worker`` children in the handlers dir; kills leftovers at the end."""
    children: list[Child] = []

    def start(*args: str) -> Child:
        child = Child(handlers_dir, "worker", *args)
        children.append(child)
        return child

    yield start
    for child in children:
        child.kill()


def _enqueue(endpoint: str, queue: str, *payloads: bytes) -> list[str]:
    async def run() -> list[str]:
        with trio.fail_after(20):
            async with Ringo.connect(endpoint) as client:
                q = client.queue(queue)
                return [(await q.enqueue(task_type="t", payload=p)).task.id for p in payloads]

    return trio.run(run)


def _states(endpoint: str, queue: str, ids: list[str]) -> list[TaskState]:
    async def run() -> list[TaskState]:
        with trio.fail_after(20):
            async with Ringo.connect(endpoint) as client:
                q = client.queue(queue)
                return [(await q.get_by_id(task_id)).state for task_id in ids]

    return trio.run(run)


def test_worker_processes_enqueued_tasks(
    daemon: DaemonProcess, start_worker: Callable[..., Child]
) -> None:
    """`ringo worker module:function` (module importable from the cwd) announces its
    registration, runs the handler for every task enqueued on its queue, and the
    daemon records each one SUCCEEDED. The process runs with the worker's
    garbage-collector setting (`ringo_trio.tune_gc`: the bench's 10 ms worker
    does ~15 % more tasks/s with it)."""
    worker = start_worker(
        "ringo_test_handlers:handle", "--queue", "jobs", "--endpoint", daemon.endpoint, "-c", "8"
    )
    match = worker.wait_for(r"registered (\S+) on queue 'jobs' at (\S+)")
    assert match.group(2) == daemon.endpoint
    ids = _enqueue(daemon.endpoint, "jobs", *[f"n{i}".encode() for i in range(20)])
    for task_id in ids:
        worker.wait_for(f"handled {task_id}")
    _enqueue(daemon.endpoint, "jobs", b"gc")
    worker.wait_for("gc threshold 10000")
    deadline = time.monotonic() + 10
    while (states := _states(daemon.endpoint, "jobs", ids)) != [TaskState.SUCCEEDED] * 20:
        assert time.monotonic() < deadline, states
        time.sleep(0.05)
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.finish() == 0


def test_worker_logs_a_retry_as_info_and_a_crash_as_an_error(
    daemon: DaemonProcess, start_worker: Callable[..., Child]
) -> None:
    """An expected retry (RetryTaskError) is reported as INFO, not as a failure;
    a crash is an ERROR line with its traceback — one line per record on
    stderr, from the SDK's own logging."""
    worker = start_worker(
        "ringo_test_handlers:handle", "--queue", "logs", "--endpoint", daemon.endpoint
    )
    worker.wait_for(r"registered (\S+) on queue 'logs'")
    retry, crash = _enqueue(daemon.endpoint, "logs", b"retry", b"crash")
    retried = worker.wait_for(rf"ringo worker: (\w+) task {retry} .*asked for a retry")
    assert retried.group(1) == "INFO"
    crashed = worker.wait_for(rf"ringo worker: (\w+) task {crash} .*crashed: ValueError: boom")
    assert crashed.group(1) == "ERROR"
    worker.wait_for(r"Traceback \(most recent call last\)")
    assert not [line for line in worker.lines if retry in line and "failed" in line]
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.finish() == 0


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_worker_signal_drains_running_handler(
    daemon: DaemonProcess, start_worker: Callable[..., Child], signum: signal.Signals
) -> None:
    """Graceful drain: after SIGINT / SIGTERM a handler in the middle of its sleep
    (well within the grace period) finishes and its task is acked (SUCCEEDED);
    no task is started after the signal; the process exits 0 as soon as the
    handler is done, not after the whole grace period."""
    worker = start_worker(
        "ringo_test_handlers:handle",
        "--queue",
        "drain",
        "--endpoint",
        daemon.endpoint,
        "--grace-period",
        "15",
    )
    worker.wait_for("registered")
    [slow] = _enqueue(daemon.endpoint, "drain", b"sleep:1.5")
    worker.wait_for(f"started {slow}")
    signalled = time.monotonic()
    worker.proc.send_signal(signum)
    worker.wait_for(f"{signum.name}, draining")
    [late] = _enqueue(daemon.endpoint, "drain", b"late")
    assert worker.finish() == 0, worker.lines
    assert time.monotonic() - signalled < 10
    assert f"handled {slow}" in worker.lines
    assert not any(late in line for line in worker.lines)
    assert _states(daemon.endpoint, "drain", [slow, late]) == [
        TaskState.SUCCEEDED,
        TaskState.PENDING,
    ]


@pytest.mark.parametrize(
    ("handler", "message"),
    [
        ("no_such_module_xyz:handle", "cannot import module 'no_such_module_xyz'"),
        ("ringo_test_handlers:missing", "has no attribute 'missing'"),
        ("ringo_test_handlers", "must look like module:function"),
        ("ringo_test_handlers:NOT_CALLABLE", "not a callable"),
    ],
)
def test_worker_bad_handler_exits_2(handlers_dir: pathlib.Path, handler: str, message: str) -> None:
    """A handler that cannot be imported is a usage error: one line on stderr,
    exit status 2, before any connection is attempted (the endpoint is dead)."""
    proc = subprocess.run(
        [*CLI, "worker", handler, "--queue", "q", "--endpoint", "127.0.0.1:1"],
        cwd=handlers_dir,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_worker_needs_exactly_one_daemon(handlers_dir: pathlib.Path) -> None:
    """Neither --endpoint nor --data-dir (or both) is a usage error, exit status 2."""
    for flags in ([], ["--endpoint", "127.0.0.1:1", "--data-dir", "x"]):
        proc = subprocess.run(
            [*CLI, "worker", "ringo_test_handlers:handle", "--queue", "q", *flags],
            cwd=handlers_dir,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert proc.returncode == 2
        assert "exactly one of --endpoint and --data-dir" in proc.stderr


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--endpoint", "127.0.0.1:1", "--shared"], "--shared needs --data-dir"),
        (["--endpoint", "127.0.0.1:1", "--start-to-close", "0"], "--start-to-close must be > 0"),
        (["--endpoint", "127.0.0.1:1", "--no-start", "-1"], "--no-start must be > 0"),
        (["--endpoint", "127.0.0.1:1", "--cancel-grace", "nan"], "--cancel-grace must be > 0"),
        (["--endpoint", "127.0.0.1:1", "--stall-timeout", "0"], "--stall-timeout must be > 0"),
        (["--endpoint", "127.0.0.1:1", "--prefetch", "-1"], "--prefetch must be >= 0"),
        (
            ["--endpoint", "127.0.0.1:1", "--heartbeat-timeout", "inf"],
            "--heartbeat-timeout must be > 0",
        ),
    ],
)
def test_worker_refuses_bad_timeouts(
    handlers_dir: pathlib.Path, flags: list[str], message: str
) -> None:
    """Bad timeout flags: one line naming the flag, exit status 2, nothing started."""
    proc = subprocess.run(
        [*CLI, "worker", "ringo_test_handlers:handle", "--queue", "q", *flags],
        cwd=handlers_dir,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"ringo worker: {message}"


def test_timeout_flags_become_task_timeouts() -> None:
    """Every --…timeout flag of `ringo worker` / `ringo supervise` reaches
    TaskTimeouts, --heartbeat-timeout as ``heartbeat``; none given, none set."""
    from datetime import timedelta

    from ringo_trio import TaskTimeouts
    from ringo_trio._cli import main as _cli

    for command in ("worker", "supervise"):
        base = [command, "m:f", "--queue", "q"]
        assert _cli._task_timeouts(_cli._parser().parse_args(base)) is None
        args = _cli._parser().parse_args([*base, "--heartbeat-timeout", "2", "--no-start", "1"])
        assert _cli._task_timeouts(args) == TaskTimeouts(
            heartbeat=timedelta(seconds=2), no_start=timedelta(seconds=1)
        )


def test_worker_fenced_by_a_stubborn_handler_exits_75(
    daemon: DaemonProcess, start_worker: Callable[..., Child]
) -> None:
    """--start-to-close / --cancel-grace reach the worker: a handler that ignores
    its timeout's cancellation past the grace fences the worker, which takes no
    more work; once that handler exits, `ringo worker` ends with the fenced
    status 75 and a message naming process supervision as the remedy."""
    worker = start_worker(
        "ringo_test_handlers:handle",
        "--queue", "fence", "--endpoint", daemon.endpoint,
        "--start-to-close", "0.3", "--cancel-grace", "0.3",
    )  # fmt: skip
    worker.wait_for("registered")
    [stubborn] = _enqueue(daemon.endpoint, "fence", b"stubborn:2")
    worker.wait_for(f"stubborn {stubborn}")
    [late] = _enqueue(daemon.endpoint, "fence", b"late")
    assert worker.finish(timeout=30) == 75, worker.lines
    assert "WorkerFencedError" in worker.lines[-1]
    assert "ringo supervise" in worker.lines[-1]
    assert not any(late in line for line in worker.lines)

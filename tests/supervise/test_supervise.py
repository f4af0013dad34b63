"""Process supervision: `ringo supervise`, the `Supervisor` API, the loop watchdog.

The end-to-end tests run real processes: a ``ringod`` (`spawn_daemon`, or
the data dir's shared daemon), the supervisor, its worker processes, and
handlers written into the test's own directory. Each is bounded by a timeout
(a ``fail_after`` or a subprocess timeout) and killed if the test fails half
way. The restart policy is sans-IO and property-tested with hypothesis.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import select
import signal
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from ringo_trio import (
    InvalidArgumentError,
    RetryBackoff,
    Ringo,
    TaskState,
)
from ringo_trio._supervise import child as _supervision
from ringo_trio._supervise.child import (
    EXIT_FENCED,
    _Channel,
    report_fence,
    stall_threshold,
    watch_event_loop,
)
from ringo_trio._supervise.parent import TOKEN_ENV, RestartLedger, RestartPolicy, Supervisor
from ringo_trio._work._timeouts import TaskTimeouts
from ringo_trio.testing import DaemonProcess, spawn_daemon
from tests._kit.cli import Child

HANDLERS = """
    import os
    import sys
    import time

    import anyio

    def say(line):
        # One write per line: the worker processes share one output pipe.
        sys.stdout.write(line + "\\n")
        sys.stdout.flush()

    async def handle(task, ctx):
        kind = task.payload.decode()
        if kind == "block" and ctx.attempt == 1:
            say(f"blocking in pid {os.getpid()}")
            time.sleep(3600)
        if kind == "shield" and ctx.attempt == 1:
            say(f"shielding in pid {os.getpid()}")
            with anyio.CancelScope(shield=True):
                await anyio.sleep(3600)
        if kind.startswith("sleep:"):
            say(f"started {task.id}")
            await anyio.sleep(float(kind[6:]))
        say(f"handled {task.id} attempt {ctx.attempt}")
"""

CRASHING = """
    import os

    os._exit(3)
"""

READY = r"process #(\d+) \(pid (\d+)\) ready"
# Fast redelivery of a task whose worker process was killed.
FAST_RETRY = RetryBackoff(initial=timedelta(milliseconds=100))


@pytest.fixture
def work(tmp_path: pathlib.Path) -> pathlib.Path:
    """The supervisor's cwd, holding the handler modules."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "sv_handlers.py").write_text(textwrap.dedent(HANDLERS))
    (work / "sv_crashing.py").write_text(textwrap.dedent(CRASHING))
    return work


@pytest.fixture
def daemon(tmp_path: pathlib.Path) -> Iterator[DaemonProcess]:
    with spawn_daemon(tmp_path / "ringod") as d:
        yield d


@pytest.fixture
def supervise(work: pathlib.Path) -> Iterator[Callable[..., Child]]:
    """Starts ``ringo supervise`` children; kills leftovers (with their workers) at the end."""
    children: list[Child] = []

    def start(*args: str) -> Child:
        child = Child(work, "supervise", *args)
        children.append(child)
        return child

    yield start
    for child in children:
        for match in [m for line in child.lines if (m := re.search(READY, line))]:
            _kill_quietly(int(match.group(2)))
        child.kill()


def _kill_quietly(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie nobody reaps yet counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return any(_alive(pid) for pid in _group_members(pgid))


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(fields[2]) == pgid:
                members.append(int(entry))
    return members


def _ready_pids(child: Child, count: int, timeout: float = 30) -> dict[int, int]:
    """slot -> pid of the first ``count`` ready reports."""
    matches = child.wait_for_all(READY, count, timeout)
    return {int(m.group(1)): int(m.group(2)) for m in matches}


def _ops(
    connect: Callable[[], Ringo], queue: str
) -> tuple[Callable[..., list[str]], Callable[[list[str], float], list[tuple[TaskState, int]]]]:
    """enqueue(*payloads) -> ids; settle(ids, timeout) -> [(state, attempt)] once all are final."""

    def enqueue(*payloads: bytes) -> list[str]:
        async def run() -> list[str]:
            with trio.fail_after(30):
                async with connect() as client:
                    q = client.queue(queue)
                    return [
                        (
                            await q.enqueue(task_type="t", payload=p, retry_backoff=FAST_RETRY)
                        ).task.id
                        for p in payloads
                    ]

        return trio.run(run)

    def settle(ids: list[str], timeout: float) -> list[tuple[TaskState, int]]:
        async def run() -> list[tuple[TaskState, int]]:
            with trio.fail_after(timeout):
                async with connect() as client:
                    q = client.queue(queue)
                    while True:
                        tasks = [await q.get_by_id(task_id) for task_id in ids]
                        if all(t.state in (TaskState.SUCCEEDED, TaskState.DEAD) for t in tasks):
                            return [(t.state, t.attempt) for t in tasks]
                        await trio.sleep(0.1)

        return trio.run(run)

    return enqueue, settle


# -- end to end: ringo supervise ------------------------------------------------


def test_blocking_handler_is_fenced_and_its_process_replaced(
    tmp_path: pathlib.Path, supervise: Callable[..., Child]
) -> None:
    """Loop watchdog: a handler that blocks the event loop (``time.sleep``) is
    caught by the watchdog thread, which fences the process; the supervisor
    kills that process (and only it) and starts a replacement in the same
    slot; the task is redelivered after its lease and succeeds on attempt 2;
    every task SUCCEEDED. With --data-dir every process uses the one shared
    daemon of the data dir."""
    data = tmp_path / "data"
    sup = supervise(
        "sv_handlers:handle",
        "--queue", "jobs", "--processes", "2", "--data-dir", str(data),
        "--lease-duration", "2", "--stall-timeout", "1.5",
    )  # fmt: skip
    first = _ready_pids(sup, 2)
    endpoints = {m.group(1) for m in sup.wait_for_all(r"registered \S+ on queue \S+ at (\S+)", 2)}
    assert len(endpoints) == 1, sup.lines  # one shared daemon
    enqueue, settle = _ops(lambda: Ringo.local(data, shared=True), "jobs")
    ids = enqueue(b"a", b"block", b"b", b"c", b"d")
    blocked = int(sup.wait_for(r"blocking in pid (\d+)").group(1))
    fenced = sup.wait_for(r"process #(\d) \(pid (\d+)\) fenced: event loop blocked for")
    assert int(fenced.group(2)) == blocked
    slot = int(fenced.group(1))
    assert first[slot] == blocked
    sup.wait_for(rf"process #{slot} \(pid {blocked}\) was killed \(fenced\); restarting in 0.5 s")
    replacement = _ready_pids(sup, 3)
    assert sup.wait_for_all(READY, 3)[2].group(1) == str(slot)
    assert replacement[slot] != blocked
    assert not _alive(blocked)
    results = settle(ids, 30)
    assert [state for state, _ in results] == [TaskState.SUCCEEDED] * 5
    assert results[1][1] == 2  # the blocked attempt never acked
    # The other process was left alone.
    assert f"pid {first[1 - slot]}) was killed" not in "\n".join(sup.lines)
    sup.proc.send_signal(signal.SIGTERM)
    assert sup.finish(timeout=30) == 0, sup.lines


def test_handler_ignoring_cancellation_fences_worker_and_is_replaced(
    daemon: DaemonProcess, supervise: Callable[..., Child]
) -> None:
    """Fence protocol: a handler that ignores its start-to-close cancellation in
    a shielded scope (the loop keeps running) makes the worker fence itself
    after cancel_grace; it reports the fence, the supervisor kills the process
    and replaces it, and the task succeeds on attempt 2."""
    sup = supervise(
        "sv_handlers:handle",
        "--queue", "shield", "--processes", "1", "--endpoint", daemon.endpoint,
        "--lease-duration", "2", "--start-to-close", "0.5", "--cancel-grace", "0.5",
    )  # fmt: skip
    first = _ready_pids(sup, 1)[0]
    enqueue, settle = _ops(lambda: Ringo.connect(daemon.endpoint), "shield")
    ids = enqueue(b"shield", b"x")
    assert int(sup.wait_for(r"shielding in pid (\d+)").group(1)) == first
    sup.wait_for(rf"process #0 \(pid {first}\) fenced: ")
    sup.wait_for(rf"process #0 \(pid {first}\) was killed \(fenced\); restarting in")
    assert _ready_pids(sup, 2)[0] != first
    assert not _alive(first)
    results = settle(ids, 30)
    assert results[0] == (TaskState.SUCCEEDED, 2)
    assert results[1][0] is TaskState.SUCCEEDED
    sup.proc.send_signal(signal.SIGTERM)
    assert sup.finish(timeout=30) == 0, sup.lines


def test_crashing_process_restarts_with_backoff_until_budget_is_spent(
    supervise: Callable[..., Child],
) -> None:
    """Backoff and budget: a worker process that dies (os._exit(3)) is
    restarted after 0.5 s, then 1 s; the third death exceeds a budget of 2
    restarts, which ends the supervisor with a clear message and status 1."""
    sup = supervise(
        "sv_crashing:handle",
        "--queue", "q", "--endpoint", "127.0.0.1:1",
        "--restart-budget", "2", "--restart-window", "60",
    )  # fmt: skip
    assert sup.finish(timeout=40) == 1, sup.lines
    restarts = [
        m.group(1) for line in sup.lines if (m := re.search(r"restarting in (\S+) s", line))
    ]
    assert restarts == ["0.5", "1"], sup.lines
    assert sum("exited with status 3; restarting" in line for line in sup.lines) == 2
    assert sup.lines[-1].startswith("ringo supervise: SupervisorError: restart budget exhausted:")
    assert "exited with status 3 after 2 restart(s) within 60 s" in sup.lines[-1]


def test_usage_process_that_cannot_start_is_not_restarted(
    supervise: Callable[..., Child],
) -> None:
    """A worker process that exits with the usage status (its handler cannot be
    imported) is not restarted — no restart can help — and the supervisor
    stops at once with status 1, saying so."""
    sup = supervise("sv_no_such_module:handle", "--queue", "q", "--endpoint", "127.0.0.1:1")
    assert sup.finish(timeout=30) == 1, sup.lines
    assert any("cannot import module 'sv_no_such_module'" in line for line in sup.lines)
    assert not any("restarting in" in line for line in sup.lines)
    assert "exited with status 2" in sup.lines[-1]
    assert "not restarting" in sup.lines[-1]


def test_sigterm_drains_every_process_and_leaves_no_process(
    daemon: DaemonProcess, supervise: Callable[..., Child]
) -> None:
    """Drain: SIGTERM to the supervisor drains every worker process — in-flight
    tasks finish and are acked on their first attempt (none lost, none
    nacked), no task starts after the signal — then the supervisor exits 0
    and none of its processes (nor anything in their process groups) is left."""
    sup = supervise(
        "sv_handlers:handle",
        "--queue", "drain", "--processes", "2", "-c", "2", "--endpoint", daemon.endpoint,
        "--grace-period", "20",
    )  # fmt: skip
    pids = _ready_pids(sup, 2)
    enqueue, settle = _ops(lambda: Ringo.connect(daemon.endpoint), "drain")
    ids = enqueue(*[b"sleep:1.5"] * 4)
    sup.wait_for_all(r"started \S+", 4)
    sup.proc.send_signal(signal.SIGTERM)
    sup.wait_for("SIGTERM, draining the worker processes")
    [late] = enqueue(b"late")
    assert sup.finish(timeout=40) == 0, sup.lines
    assert settle(ids, 10) == [(TaskState.SUCCEEDED, 1)] * 4
    assert not any(late in line for line in sup.lines)
    for pid in pids.values():
        assert not _alive(pid)
        assert not _group_alive(pid)


def test_stall_guard_kills_a_stopped_process(
    daemon: DaemonProcess, supervise: Callable[..., Child]
) -> None:
    """Supervisor-side stall guard: a process that stops heartbeating (SIGSTOP:
    not even its watchdog thread runs) is killed after the heartbeat timeout
    and replaced."""
    sup = supervise(
        "sv_handlers:handle",
        "--queue", "stop", "--endpoint", daemon.endpoint, "--stall-timeout", "1",
    )  # fmt: skip
    pid = _ready_pids(sup, 1)[0]
    os.kill(pid, signal.SIGSTOP)
    sup.wait_for(rf"process #0 \(pid {pid}\) sent no heartbeat for \S+ s \(stopped")
    sup.wait_for(rf"process #0 \(pid {pid}\) was killed \(sent no heartbeat")
    assert _ready_pids(sup, 2)[0] != pid
    sup.proc.send_signal(signal.SIGTERM)
    assert sup.finish(timeout=30) == 0, sup.lines


def test_killed_supervisor_leaves_no_worker_behind(
    daemon: DaemonProcess, supervise: Callable[..., Child]
) -> None:
    """No orphans even when the supervisor is SIGKILLed: its worker processes
    see their report pipe break and drain on their own."""
    sup = supervise("sv_handlers:handle", "--queue", "orphan", "--endpoint", daemon.endpoint)
    pid = _ready_pids(sup, 1)[0]
    sup.proc.kill()
    sup.proc.wait()
    deadline = time.monotonic() + 20
    while _alive(pid):
        assert time.monotonic() < deadline, "the worker outlived its supervisor"
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--processes", "0"], "--processes must be >= 1"),
        (["--restart-budget", "-1"], "--restart-budget must be >= 0"),
        (["--restart-window", "0"], "--restart-window must be > 0"),
        (["--cancel-grace", "0"], "--cancel-grace must be > 0"),
        (["--stall-timeout", "-1"], "--stall-timeout must be > 0"),
    ],
)
def test_supervise_refuses_bad_flags(work: pathlib.Path, flags: list[str], message: str) -> None:
    """Bad input: one line naming the flag, usage status 2, no process started."""
    sup = Child(work, "supervise", "sv_handlers:handle", "-q", "q", "--endpoint", "h:1", *flags)
    try:
        assert sup.finish(timeout=30) == 2
    finally:
        sup.kill()
    assert sup.lines == [f"ringo supervise: {message}"]


# -- the Python API ---------------------------------------------------------------


@pytest.mark.trio
async def test_cancelled_supervisor_kills_its_processes(
    daemon: DaemonProcess, work: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No orphans when `Supervisor.run` is cancelled: every worker process (and
    its process group) is killed and reaped before the cancellation completes."""
    monkeypatch.chdir(work)
    supervisor = Supervisor(
        "sv_handlers:handle", queue="api", processes=2, endpoint=daemon.endpoint
    )
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(supervisor.run)  # every process registered
            assert all(c.worker_id is not None for c in supervisor.children)
            pids = [c.pid for c in supervisor.children]
            nursery.cancel_scope.cancel()
    assert supervisor.children == ()
    for pid in pids:
        assert not _alive(pid)
        assert not _group_alive(pid)


@pytest.mark.trio
async def test_close_drains_and_run_returns(
    daemon: DaemonProcess, work: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Supervisor.close` drains: the processes exit by themselves (SIGTERM,
    not a kill) and `run` returns without error."""
    monkeypatch.chdir(work)
    supervisor = Supervisor("sv_handlers:handle", queue="api", endpoint=daemon.endpoint)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(supervisor.run)
            [child] = supervisor.children
            await supervisor.close()
    assert supervisor.children == ()
    assert not _alive(child.pid)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"handler": "nocolon"}, "must look like module:function"),
        ({"processes": 0}, "processes must be a positive integer"),
        ({"endpoint": None}, "exactly one of endpoint and data_dir"),
        ({"data_dir": "x"}, "exactly one of endpoint and data_dir"),
        ({"stall_timeout": timedelta(0)}, "stall_timeout must be a positive timedelta"),
        ({"restarts": "often"}, "restarts must be a RestartPolicy"),
    ],
)
def test_supervisor_refuses_bad_arguments(kwargs: dict[str, object], message: str) -> None:
    """Bad arguments raise InvalidArgumentError naming the argument, before anything runs."""
    arguments: dict[str, object] = {"handler": "m:f", "queue": "q", "endpoint": "h:1", **kwargs}
    handler = arguments.pop("handler")
    with pytest.raises(InvalidArgumentError, match=message):
        Supervisor(handler, **arguments)  # type: ignore[arg-type]


def test_stall_threshold_rule() -> None:
    """The documented rule: explicit wins; else the lease; with start_to_close,
    the smaller of the lease and start_to_close + cancel_grace."""
    s = timedelta(seconds=1)
    assert stall_threshold(None, 60 * s) == 60 * s
    assert stall_threshold(None, timedelta(0)) == 60 * s  # the daemon's default lease
    assert stall_threshold(TaskTimeouts(cancel_grace=5 * s), 60 * s) == 60 * s
    timeouts = TaskTimeouts(start_to_close=10 * s, cancel_grace=5 * s)
    assert stall_threshold(timeouts, 60 * s) == 15 * s
    assert stall_threshold(timeouts, 12 * s) == 12 * s
    assert stall_threshold(timeouts, 60 * s, 3 * s) == 3 * s


def test_worker_argv_passes_every_option() -> None:
    """What the supervisor configures reaches each worker process's command line."""
    argv = Supervisor(
        "m:f",
        queue="q",
        data_dir="d",
        concurrency=4,
        task_types=["a", "b"],
        lease_duration=timedelta(seconds=7),
        grace_period=timedelta(seconds=3),
        task_timeouts=TaskTimeouts(
            start_to_close=timedelta(seconds=2),
            no_start=timedelta(seconds=1),
            heartbeat=timedelta(seconds=1.5),
        ),
    ).worker_argv()
    assert argv[:5] == [sys.executable, "-m", "ringo_trio._cli", "worker", "m:f"]
    assert "--shared" in argv
    argv.remove("--shared")
    flags = dict(zip(argv[5::2], argv[6::2], strict=True))
    assert flags["--data-dir"] == os.path.abspath("d")
    assert flags["--concurrency"] == "4"
    assert [argv[i + 1] for i, flag in enumerate(argv) if flag == "--task-type"] == ["a", "b"]
    assert flags["--lease-duration"] == "7.0"
    assert flags["--grace-period"] == "3.0"
    assert flags["--start-to-close"] == "2.0"
    assert flags["--no-start"] == "1.0"
    assert flags["--cancel-grace"] == "10.0"
    assert flags["--heartbeat-timeout"] == "1.5"
    assert flags["--stall-timeout"] == "7.0"  # min(lease 7, 2 + 10)


def test_token_travels_in_the_environment_not_the_command_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bearer token reaches the worker processes through $RINGO_TOKEN (readable
    only by the same user), never through their command line (readable by all
    through ps); without a token, an inherited $RINGO_TOKEN is not passed on."""
    monkeypatch.setenv(TOKEN_ENV, "inherited")
    with_token = Supervisor("m:f", queue="q", endpoint="h:1", token="s3cret")
    assert not any("s3cret" in arg for arg in with_token.worker_argv())
    assert with_token._environment(7)[TOKEN_ENV] == "s3cret"
    assert with_token._environment(7)[_supervision.ENV_FD] == "7"
    without = Supervisor("m:f", queue="q", endpoint="h:1")
    assert TOKEN_ENV not in without._environment(7)


# -- the child side: reports and the loop watchdog --------------------------------


@pytest.fixture
def report_pipe(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[int, _Channel]]:
    """A supervisor pipe installed as this process's channel: (read fd, channel)."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    channel = _Channel(write_fd)
    monkeypatch.setattr(_supervision, "_CHANNEL", channel)
    yield read_fd, channel
    os.close(read_fd)
    os.close(write_fd)


def _messages(read_fd: int) -> list[dict[str, object]]:
    """Every complete message readable right now."""
    data = b""
    while select.select([read_fd], [], [], 0)[0]:
        chunk = os.read(read_fd, 65536)
        if not chunk:
            break
        data += chunk
    return [json.loads(line) for line in data.split(b"\n") if line]


@pytest.mark.trio
async def test_watchdog_thread_fences_a_blocked_loop(report_pipe: tuple[int, _Channel]) -> None:
    """Loop watchdog: while the event loop is blocked (time.sleep, no await),
    the watchdog thread reports a fence naming the blocked loop; on exit the
    thread is stopped and joined (none left behind)."""
    read_fd, _ = report_pipe
    with trio.fail_after(30):
        async with watch_event_loop(timedelta(seconds=0.3)):
            # Block the loop (no await) until the fence arrives, at most 20 s.
            fences: list[dict[str, object]] = []
            deadline = time.monotonic() + 20
            while not fences and time.monotonic() < deadline:
                select.select([read_fd], [], [], 0.05)
                fences += [m for m in _messages(read_fd) if m["kind"] == "fenced"]
        assert fences, "no fence while the loop was blocked"
        assert "event loop blocked for" in str(fences[0]["reason"])
        assert "time.sleep" in str(fences[0]["reason"])
    assert not [t for t in threading.enumerate() if t.name == "ringo-loop-watchdog"]


@pytest.mark.trio
async def test_watchdog_leaves_no_thread_behind(report_pipe: tuple[int, _Channel]) -> None:
    """Leaving ``watch_event_loop`` stops its thread and joins it: no watchdog
    thread runs afterwards, and none was fenced on a loop that kept running."""
    read_fd, _ = report_pipe
    with trio.fail_after(30):
        async with watch_event_loop(timedelta(seconds=5)):
            await trio.lowlevel.wait_readable(read_fd)  # the first heartbeat
    assert not [t for t in threading.enumerate() if t.name == "ringo-loop-watchdog"]
    assert {m["kind"] for m in _messages(read_fd)} == {"heartbeat"}


@pytest.mark.trio
async def test_heartbeats_flow_and_a_vanished_supervisor_is_noticed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Heartbeats come from the running loop; when the supervisor's end of the
    pipe closes, ``on_supervisor_lost`` is called exactly once."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    channel = _Channel(write_fd)
    monkeypatch.setattr(_supervision, "_CHANNEL", channel)
    lost: list[int] = []
    noticed = trio.Event()

    def on_lost() -> None:
        lost.append(1)
        noticed.set()

    try:
        with trio.fail_after(30):
            async with watch_event_loop(timedelta(seconds=0.4), on_supervisor_lost=on_lost):
                await trio.lowlevel.wait_readable(read_fd)
                assert _messages(read_fd)[0] == {"kind": "heartbeat"}
                # Close the only read end: the next heartbeat breaks the pipe.
                os.close(read_fd)
                await noticed.wait()
                await trio.sleep(0.5)  # more heartbeats: still reported once
    finally:
        os.close(write_fd)
    assert lost == [1]
    assert channel.lost


def test_report_fence_never_blocks_nor_raises(report_pipe: tuple[int, _Channel]) -> None:
    """report_fence on a full pipe neither blocks nor raises; the fence is kept
    and goes out ahead of the next message once there is room. A reason too
    long for one atomic pipe write is cut to fit."""
    read_fd, channel = report_pipe
    filler = b"x" * 65536
    while True:
        try:
            os.write(channel.fd, filler)
        except BlockingIOError:
            break
    report_fence("stuck handler " + "y" * 100_000)  # returns at once
    assert channel.send({"kind": "heartbeat"}) is False  # still full
    while select.select([read_fd], [], [], 0)[0]:
        os.read(read_fd, 1 << 20)
    assert channel.send({"kind": "heartbeat"}) is True
    raw = os.read(read_fd, 1 << 20).split(b"\n")
    assert raw[-1] == b""
    fence, heartbeat = (json.loads(line) for line in raw[:-1])
    assert fence["kind"] == "fenced"
    assert str(fence["reason"]).startswith("stuck handler yyy")
    assert len(raw[0]) + 1 <= select.PIPE_BUF
    assert heartbeat == {"kind": "heartbeat"}


def test_report_fence_on_a_closed_pipe_does_not_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    """A supervisor that is gone (EPIPE) or a bad descriptor: report_fence still
    returns quietly, and the channel knows nobody listens."""
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    channel = _Channel(write_fd)
    monkeypatch.setattr(_supervision, "_CHANNEL", channel)
    report_fence("x")
    assert channel.lost
    os.close(write_fd)
    bad = _Channel(write_fd)  # closed descriptor: EBADF
    monkeypatch.setattr(_supervision, "_CHANNEL", bad)
    report_fence("x")
    assert bad.lost


def test_channel_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The inherited descriptor is taken over once: the variable is removed
    (nothing this process starts can inherit it) and the descriptor made
    non-inheritable and non-blocking; anything but a pipe is ignored."""
    read_fd, write_fd = os.pipe()
    try:
        os.set_inheritable(write_fd, True)
        monkeypatch.setenv(_supervision.ENV_FD, str(write_fd))
        channel = _Channel.from_environment()
        assert channel is not None
        assert channel.fd == write_fd
        assert _supervision.ENV_FD not in os.environ
        assert not os.get_inheritable(write_fd)
        assert not os.get_blocking(write_fd)
        for value in ("nonsense", "99999", "0" if not os.isatty(0) else "nonsense"):
            monkeypatch.setenv(_supervision.ENV_FD, value)
            assert _Channel.from_environment() is None
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_exit_fenced_is_distinct() -> None:
    """A fenced worker's exit status differs from success, failure, usage and Ctrl-C."""
    assert EXIT_FENCED not in (0, 1, 2, 130)


# -- the restart policy (sans-IO) ---------------------------------------------------

POLICY = RestartPolicy(
    initial_delay=timedelta(seconds=0.5),
    max_delay=timedelta(seconds=30),
    healthy_after=timedelta(seconds=10),
    max_restarts=1_000_000,
    window=timedelta(seconds=60),
)


@settings(max_examples=200, deadline=None)
@given(runs=st.lists(st.floats(min_value=0, max_value=30), max_size=60))
def test_backoff_is_bounded_and_doubles_until_a_healthy_run(runs: list[float]) -> None:
    """Backoff: every delay lies in [initial, max]; within a streak of short
    runs the delays never decrease (they double up to the cap); a run of at
    least ``healthy_after`` resets the next delay to ``initial``."""
    ledger = RestartLedger(POLICY)
    now = 0.0
    previous: float | None = None
    for ran in runs:
        started, now = now, now + ran
        delay = ledger.child_exited(0, started=started, now=now)
        assert delay is not None
        assert 0.5 <= delay <= 30
        if now - started >= 10:  # as the ledger computes it (floats)
            assert delay == 0.5
        elif previous is not None:
            assert delay == min(30, previous * 2)
        previous = delay
        now += delay


@settings(max_examples=200, deadline=None)
@given(
    budget=st.integers(min_value=0, max_value=5),
    window=st.floats(min_value=0.5, max_value=20),
    gaps=st.lists(
        st.tuples(st.integers(min_value=0, max_value=2), st.floats(min_value=0, max_value=10)),
        max_size=50,
    ),
)
def test_budget_counts_restarts_inside_the_window_only(
    budget: int, window: float, gaps: list[tuple[int, float]]
) -> None:
    """Budget: an exit is granted a restart exactly when fewer than
    ``max_restarts`` restarts (of any slot) were granted in the last
    ``window`` seconds; refused exits are not counted."""
    policy = RestartPolicy(max_restarts=budget, window=timedelta(seconds=window))
    ledger = RestartLedger(policy)
    window = policy.window.total_seconds()  # as the ledger sees it
    granted: list[float] = []
    now = 0.0
    for slot, gap in gaps:
        now += gap
        recent = [t for t in granted if now - t < window]
        delay = ledger.child_exited(slot, started=now, now=now)
        assert (delay is not None) == (len(recent) < budget)
        if delay is not None:
            granted.append(now)


def test_backoff_is_per_slot() -> None:
    """One slot's crash loop does not slow down another slot's first restart."""
    ledger = RestartLedger(POLICY)
    assert ledger.child_exited(0, started=0, now=1) == 0.5
    assert ledger.child_exited(0, started=1.5, now=2) == 1.0
    assert ledger.child_exited(1, started=0, now=2) == 0.5


@pytest.mark.parametrize(
    "kwargs",
    [
        {"initial_delay": timedelta(0)},
        {"max_delay": timedelta(seconds=0.1)},
        {"max_restarts": -1},
        {"max_restarts": True},
        {"window": timedelta(seconds=-1)},
    ],
)
def test_restart_policy_refuses_bad_values(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidArgumentError, match="RestartPolicy"):
        RestartPolicy(**kwargs)  # type: ignore[arg-type]

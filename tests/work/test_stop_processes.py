"""Stopping a worker is a protocol step: real programs, stopped the ways users stop them.

Each test runs a small program (written into ``tmp_path`` from the strings
below) in its own Python process against a real ``ringod``: a Worker of
concurrency 64 whose handlers never finish, over 200 tasks enqueued with
``max_attempts=1`` — so an attempt spent by the stop would make a task DEAD,
and a lease left behind shows as LEASED. Once the program prints that its 64
handlers run, it is stopped (SIGINT, an outer cancel scope, ``task.cancel()``,
``client.aclose()``), and the daemon is asked, with a fresh client, what
became of the tasks: every one must be PENDING again with no attempt spent,
at once — not after the lease expired.

The programs record the shape of the exception that leaves ``trio.run`` /
``asyncio.run`` (the nesting of exception groups, and the frame each leaf
was raised in) before re-raising it, so that Python's own exit status is
kept. For trio the shape is compared with a control program of the same
structure that does not use the SDK at all: the SDK may add no nesting of
its own.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import trio

from ringo_trio import Ringo, TaskSpec, TaskState
from ringo_trio.testing import DaemonProcess

pytestmark = pytest.mark.trio

TASKS = 200
CONCURRENCY = 64
# A generous bound on any one wait for a process; the stop itself is
# expected to take milliseconds.
GUARD_S = 20

# Shared by every program: argv is (endpoint, queue, shape file, extra...).
PROLOGUE = """
import json, signal, sys, time, traceback

ENDPOINT, QUEUE, SHAPE_PATH = sys.argv[1], sys.argv[2], sys.argv[3]
CONCURRENCY = @CONCURRENCY@

# A harness that started us with SIGINT ignored (a background job) must not
# change what Ctrl-C does: restore what a Python started from a terminal has.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def emit(**fields):
    print(json.dumps(fields), flush=True)


def shape(exc):
    if isinstance(exc, BaseExceptionGroup):
        return {"type": type(exc).__name__, "children": [shape(e) for e in exc.exceptions]}
    # Where it was raised: trio's signal handler raises a KeyboardInterrupt
    # in whatever frame it interrupted, so skip the handler's own frame.
    frames = traceback.extract_tb(exc.__traceback__)
    frames = [f for f in frames if "trio/_core/_ki" not in f.filename]
    where = f"{frames[-1].filename}:{frames[-1].lineno} {frames[-1].name}" if frames else ""
    return {"type": type(exc).__name__, "where": where}


def run_recording(runner, *args):
    try:
        runner(*args)
    except BaseException as exc:
        with open(SHAPE_PATH, "w") as f:
            json.dump(shape(exc), f)
        raise


running = 0


def started_one():
    global running
    running += 1
""".replace("@CONCURRENCY@", str(CONCURRENCY))

TRIO_SIGINT = """
import trio
from ringo_trio import Ringo

LANDING = sys.argv[4]
all_running = trio.Event()


async def handle(task, ctx):
    started_one()
    if running == CONCURRENCY:
        if LANDING == "handler":
            # Ctrl-C lands where unprotected code runs: here, a handler that
            # blocks the loop (time.sleep is interrupted by the signal).
            emit(event="running", handlers=running)
            time.sleep(60)
        all_running.set()
    await trio.sleep_forever()


async def main():
    async with Ringo.connect(ENDPOINT) as client:
        worker = client.queue(QUEUE).worker(handle, concurrency=CONCURRENCY)
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            await all_running.wait()
            # The loop is idle from here: Ctrl-C lands in this (the main) task.
            emit(event="running", handlers=running)
            await trio.sleep_forever()
            await worker.close()


run_recording(trio.run, main)
"""

# TRIO_SIGINT's structure without the SDK (its worker.run a plain task):
# what trio itself delivers for a Ctrl-C, which the SDK may not add to.
TRIO_SIGINT_CONTROL = """
import trio


async def fake_worker_run(task_status=trio.TASK_STATUS_IGNORED):
    task_status.started()
    await trio.sleep_forever()


async def main():
    async with trio.open_nursery() as nursery:
        await nursery.start(fake_worker_run)
        emit(event="running", handlers=CONCURRENCY)
        await trio.sleep_forever()


run_recording(trio.run, main)
"""

ASYNCIO_TASK_CANCEL = """
import asyncio
from ringo_trio import Ringo

all_running = None


async def handle(task, ctx):
    started_one()
    if running == CONCURRENCY:
        all_running.set()
    await asyncio.Event().wait()


async def main():
    global all_running
    all_running = asyncio.Event()
    async with Ringo.connect(ENDPOINT) as client:
        worker = client.queue(QUEUE).worker(handle, concurrency=CONCURRENCY)
        task = asyncio.create_task(worker.run())
        await all_running.wait()
        emit(event="running", handlers=running)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            emit(event="stopped", cancelled=True)
        else:
            emit(event="stopped", cancelled=False)


run_recording(asyncio.run, main())
"""

ASYNCIO_SIGINT = """
import asyncio
from ringo_trio import Ringo


async def handle(task, ctx):
    started_one()
    if running == CONCURRENCY:
        emit(event="running", handlers=running)
    await asyncio.Event().wait()


async def main():
    async with Ringo.connect(ENDPOINT) as client:
        worker = client.queue(QUEUE).worker(handle, concurrency=CONCURRENCY)
        await worker.run()


run_recording(asyncio.run, main())
"""

TRIO_OUTER_CANCEL = """
import trio
from ringo_trio import Ringo, TaskState

all_running = trio.Event()


async def handle(task, ctx):
    started_one()
    if running == CONCURRENCY:
        all_running.set()
    await trio.sleep_forever()


async def main():
    ids = json.loads(sys.stdin.readline())
    async with Ringo.connect(ENDPOINT) as client:
        queue = client.queue(QUEUE)
        worker = queue.worker(handle, concurrency=CONCURRENCY)
        with trio.move_on_after(60) as scope:
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                await all_running.wait()
                emit(event="running", handlers=running)
                scope.cancel()
        # The worker is gone; its leases must already be back in the queue.
        tasks = [await queue.get_by_id(task_id) for task_id in ids]
        emit(
            event="summary",
            cancelled_caught=scope.cancelled_caught,
            states={s.name: sum(t.state is s for t in tasks) for s in TaskState},
            attempts=sorted({t.attempt for t in tasks}),
        )


run_recording(trio.run, main)
"""

# ``client.aclose()`` under a 0.5 s deadline with 64 handlers running; argv
# picks the handlers: "stubborn" ignore cancellation for 3 s, "prompt" give
# up at once (the default grace period, 30 s, far exceeds the bound either way).
TRIO_BOUNDED_ACLOSE = """
import trio
from ringo_trio import Ringo

STUBBORN = sys.argv[4] == "stubborn"
all_running = trio.Event()


async def handle(task, ctx):
    started_one()
    if running == CONCURRENCY:
        all_running.set()
    if STUBBORN:
        with trio.CancelScope(shield=True):
            await trio.sleep(3)
    await trio.sleep_forever()


async def main():
    async with Ringo.connect(ENDPOINT) as client:
        worker = client.queue(QUEUE).worker(handle, concurrency=CONCURRENCY)
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            await all_running.wait()
            emit(event="running", handlers=running)
            began = time.monotonic()
            with trio.move_on_after(0.5):
                await client.aclose()
            emit(event="aclose returned", seconds=time.monotonic() - began)


run_recording(trio.run, main)
"""


# A worker whose stop would wait a minute for a daemon that does not answer.
TRIO_SECOND_SIGINT = """
from datetime import timedelta
import trio
from ringo_trio import Ringo

all_running = trio.Event()


async def handle(task, ctx):
    started_one()
    if running == CONCURRENCY:
        all_running.set()
    await trio.sleep_forever()


async def main():
    async with Ringo.connect(ENDPOINT) as client:
        worker = client.queue(QUEUE).worker(
            handle, concurrency=CONCURRENCY, stop_timeout=timedelta(seconds=60)
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            await all_running.wait()
            emit(event="running", handlers=running)
            await trio.sleep_forever()


try:
    run_recording(trio.run, main)
except* KeyboardInterrupt:
    sys.exit(130)
"""


class Program:
    """One program in its own process; stdout is read line by line as JSON."""

    def __init__(
        self, tmp_path: pathlib.Path, name: str, source: str, *argv: str, extra: Sequence[str] = ()
    ) -> None:
        script = tmp_path / f"{name}.py"
        script.write_text(PROLOGUE + source)
        self.shape_path = tmp_path / f"{name}.shape.json"
        self._stderr: str | None = None
        self.process = subprocess.Popen(
            [sys.executable, str(script), *argv, str(self.shape_path), *extra],
            cwd=tmp_path,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # Its own session: a Ctrl-C at the test's terminal is not ours to send.
            start_new_session=True,
        )

    async def line(self) -> dict[str, Any] | None:
        """Its next line; None (and the process killed) if none comes within the guard."""
        assert self.process.stdout is not None
        with trio.move_on_after(GUARD_S):
            text = await trio.to_thread.run_sync(
                self.process.stdout.readline, abandon_on_cancel=True
            )
            assert text, f"program ended early:\n{self.stderr()}"
            data: dict[str, Any] = json.loads(text)
            return data
        self.close()
        return None

    async def running(self) -> None:
        line = await self.line()
        assert line == {"event": "running", "handlers": CONCURRENCY}, self.stderr()

    def send(self, text: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(text + "\n")
        self.process.stdin.flush()

    async def wait(self) -> int | None:
        """Its exit status; None (and the process killed) if it hangs past the guard."""
        with trio.move_on_after(GUARD_S):
            return await trio.to_thread.run_sync(self.process.wait, abandon_on_cancel=True)
        self.process.kill()
        self.process.wait(10)
        return None

    def stderr(self) -> str:
        if self.process.poll() is None:
            return "(still running)"
        assert self.process.stderr is not None
        if self._stderr is None:
            self._stderr = self.process.stderr.read()
            self.process.stderr.close()
        return self._stderr

    def shape(self) -> dict[str, Any] | None:
        if not self.shape_path.exists():
            return None
        data: dict[str, Any] = json.loads(self.shape_path.read_text())
        return data

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def programs() -> Iterator[list[Program]]:
    started: list[Program] = []
    yield started
    for program in started:
        program.close()


async def enqueue(daemon: DaemonProcess, queue: str) -> list[str]:
    async with Ringo.connect(daemon.endpoint) as client:
        result = await client.queue(queue).enqueue_many(
            [TaskSpec("t", payload=str(i).encode(), max_attempts=1) for i in range(TASKS)]
        )
    return [r.task.id for r in result.results]


async def summary(daemon: DaemonProcess, queue: str, ids: list[str]) -> dict[str, Any]:
    """What the daemon holds for ``ids``, asked with a fresh client."""
    async with Ringo.connect(daemon.endpoint) as client:
        q = client.queue(queue)
        tasks = [await q.get_by_id(task_id) for task_id in ids]
    return {
        "states": {s.name: sum(t.state is s for t in tasks) for s in TaskState},
        "attempts": sorted({t.attempt for t in tasks}),
    }


ALL_BACK = {
    "states": {s.name: TASKS if s is TaskState.PENDING else 0 for s in TaskState},
    "attempts": [0],
}


def interrupted(returncode: int) -> bool:
    """Python's status for an uncaught KeyboardInterrupt: killed by SIGINT (130 via a shell)."""
    return returncode in (-signal.SIGINT, 128 + signal.SIGINT)


def without_where(shape: dict[str, Any] | None) -> dict[str, Any] | None:
    """The nesting alone: which frame a leaf was raised in differs between programs."""
    if shape is None:
        return None
    if "children" in shape:
        return {"type": shape["type"], "children": [without_where(c) for c in shape["children"]]}
    return {"type": shape["type"]}


async def sigint_after_running(program: Program) -> int | None:
    await program.running()
    os.kill(program.process.pid, signal.SIGINT)
    return await program.wait()


@pytest.mark.parametrize("landing", ["main task", "handler"])
async def test_trio_sigint_hands_every_lease_back_without_spending_an_attempt(
    tmp_path: pathlib.Path, daemon: DaemonProcess, programs: list[Program], landing: str
) -> None:
    """Ctrl-C on a trio program that wrote no signal handling (README's shape),
    whether the KeyboardInterrupt lands in the main task (an idle loop) or in
    a handler (one that blocks the loop): the process ends as trio alone
    ends it — the same exit status and the same exception-group nesting as
    the same program without the SDK — and the daemon holds all 200 tasks
    PENDING again, no attempt spent, none LEASED or DEAD."""
    with trio.fail_after(GUARD_S * 4):
        control = Program(tmp_path, "control", TRIO_SIGINT_CONTROL, "-", "-")
        programs.append(control)
        control_status = await sigint_after_running(control)
        control_stderr = control.stderr()

        ids = await enqueue(daemon, "sigint")
        program = Program(
            tmp_path, "trio_sigint", TRIO_SIGINT, daemon.endpoint, "sigint", extra=[landing]
        )
        programs.append(program)
        status = await sigint_after_running(program)
        stderr = program.stderr()
        after = await summary(daemon, "sigint", ids)

    report = (
        f"status {status}, shape {program.shape()}\n--- stderr:\n{stderr}\n"
        f"--- control: status {control_status}, shape {control.shape()}\n{control_stderr}"
    )
    assert status is not None, f"no exit within {GUARD_S} s of the stop (killed): {after} {report}"
    assert after == ALL_BACK, report
    assert status == control_status, report
    assert without_where(program.shape()) == without_where(control.shape()), report


async def test_asyncio_task_cancel_hands_every_lease_back_without_spending_an_attempt(
    tmp_path: pathlib.Path, daemon: DaemonProcess, programs: list[Program]
) -> None:
    """Under asyncio, ``task.cancel()`` on the task running ``worker.run()``:
    awaiting it raises CancelledError, the program exits 0, and the daemon
    holds all 200 tasks PENDING again, no attempt spent, none LEASED or DEAD."""
    with trio.fail_after(GUARD_S * 4):
        ids = await enqueue(daemon, "cancel")
        program = Program(
            tmp_path, "asyncio_cancel", ASYNCIO_TASK_CANCEL, daemon.endpoint, "cancel"
        )
        programs.append(program)
        await program.running()
        stopped = await program.line()
        status = await program.wait()
        stderr = program.stderr()
        after = await summary(daemon, "cancel", ids)

    report = f"status {status}, {stopped}, shape {program.shape()}\n--- stderr:\n{stderr}"
    assert status is not None, f"no exit within {GUARD_S} s of the stop (killed): {after} {report}"
    assert after == ALL_BACK, report
    assert stopped == {"event": "stopped", "cancelled": True}, report
    assert status == 0, report


async def test_asyncio_sigint_hands_every_lease_back_without_spending_an_attempt(
    tmp_path: pathlib.Path, daemon: DaemonProcess, programs: list[Program]
) -> None:
    """Ctrl-C on ``asyncio.run(main())`` with no signal handling: asyncio's own
    convention holds — the main task is cancelled and a bare KeyboardInterrupt
    ends the process (status -SIGINT) — and the daemon holds all 200 tasks
    PENDING again, no attempt spent, none LEASED or DEAD."""
    with trio.fail_after(GUARD_S * 4):
        ids = await enqueue(daemon, "asigint")
        program = Program(tmp_path, "asyncio_sigint", ASYNCIO_SIGINT, daemon.endpoint, "asigint")
        programs.append(program)
        status = await sigint_after_running(program)
        stderr = program.stderr()
        after = await summary(daemon, "asigint", ids)

    report = f"status {status}, shape {program.shape()}\n--- stderr:\n{stderr}"
    assert status is not None, f"no exit within {GUARD_S} s of the stop (killed): {after} {report}"
    assert after == ALL_BACK, report
    assert interrupted(status), report
    assert without_where(program.shape()) == {"type": "KeyboardInterrupt"}, report


async def test_trio_outer_cancel_scope_hands_every_lease_back_at_once(
    tmp_path: pathlib.Path, daemon: DaemonProcess, programs: list[Program]
) -> None:
    """An outer cancel scope ends ``worker.run``: by the time the scope's block
    has exited, the same client already sees all 200 tasks PENDING with no
    attempt spent (the leases were handed back, not left to expire), the
    program exits 0, and a fresh client sees the same."""
    with trio.fail_after(GUARD_S * 4):
        ids = await enqueue(daemon, "scope")
        program = Program(tmp_path, "trio_scope", TRIO_OUTER_CANCEL, daemon.endpoint, "scope")
        programs.append(program)
        program.send(json.dumps(ids))
        await program.running()
        seen = await program.line()
        status = await program.wait()
        stderr = program.stderr()
        after = await summary(daemon, "scope", ids)

    report = f"status {status}, {seen}, shape {program.shape()}\n--- stderr:\n{stderr}"
    assert status is not None, f"no exit within {GUARD_S} s of the stop (killed): {report}"
    assert seen is not None, f"no summary within {GUARD_S} s of the stop (killed): {after} {report}"
    assert seen == {"event": "summary", "cancelled_caught": True, **ALL_BACK}, report
    assert after == ALL_BACK, report
    assert status == 0, report


async def test_client_aclose_returns_within_the_callers_deadline(
    tmp_path: pathlib.Path, daemon: DaemonProcess, programs: list[Program]
) -> None:
    """The caller's deadline always wins: ``client.aclose()`` under
    ``move_on_after(0.5)`` returns shortly after 0.5 s even though every
    handler ignores cancellation for 3 s (a structural bound of the API, with
    a wide margin for a real process: under 2.5 s), and the program still
    ends on its own once those handlers give up."""
    with trio.fail_after(GUARD_S * 4):
        await enqueue(daemon, "aclose")
        program = Program(
            tmp_path,
            "trio_aclose",
            TRIO_BOUNDED_ACLOSE,
            daemon.endpoint,
            "aclose",
            extra=["stubborn"],
        )
        programs.append(program)
        await program.running()
        returned = await program.line()
        status = await program.wait()
        stderr = program.stderr()

    report = f"status {status}, {returned}, shape {program.shape()}\n--- stderr:\n{stderr}"
    assert status is not None, f"no exit within {GUARD_S} s of the stop (killed): {report}"
    assert returned is not None, f"aclose did not return within {GUARD_S} s (killed): {report}"
    assert returned["event"] == "aclose returned", report
    assert returned["seconds"] < 2.5, report


async def test_client_aclose_under_a_deadline_releases_before_the_channel_closes(
    tmp_path: pathlib.Path, daemon: DaemonProcess, programs: list[Program]
) -> None:
    """``client.aclose()`` under ``move_on_after(0.5)``, 64 handlers running and
    a 30 s grace period: the deadline bounds the drain AND the releases — the
    workers stop before it, hand every lease back on the still-open channel,
    and only then does the channel close. All 200 tasks are PENDING again,
    no attempt spent (closing the channel right after the stop left the 64
    leased until they expired)."""
    with trio.fail_after(GUARD_S * 4):
        ids = await enqueue(daemon, "aclose-release")
        program = Program(
            tmp_path,
            "trio_deadline_aclose",
            TRIO_BOUNDED_ACLOSE,
            daemon.endpoint,
            "aclose-release",
            extra=["prompt"],
        )
        programs.append(program)
        await program.running()
        returned = await program.line()
        status = await program.wait()
        after = await summary(daemon, "aclose-release", ids)

    report = f"status {status}, {returned}, {after}\n--- stderr:\n{program.stderr()}"
    assert returned is not None, report
    assert returned["event"] == "aclose returned", report
    assert returned["seconds"] < 2.5, report
    assert after == ALL_BACK, report
    assert status == 0, report


async def test_a_second_sigint_ends_a_stop_that_waits_for_a_frozen_daemon(
    tmp_path: pathlib.Path, daemon: DaemonProcess, programs: list[Program]
) -> None:
    """The first Ctrl-C starts the bounded stop (here: up to a 60 s
    ``stop_timeout``, the daemon frozen by SIGSTOP so no release is
    answered); a second Ctrl-C ends the process at once, with the program's
    own status (130) — it does not wait out the stop."""
    with trio.fail_after(GUARD_S * 4):
        await enqueue(daemon, "second")
        program = Program(tmp_path, "trio_second", TRIO_SECOND_SIGINT, daemon.endpoint, "second")
        programs.append(program)
        await program.running()
        os.kill(daemon.pid, signal.SIGSTOP)
        try:
            os.kill(program.process.pid, signal.SIGINT)
            await trio.sleep(1.0)
            still_stopping = program.process.poll() is None
            os.kill(program.process.pid, signal.SIGINT)
            status = await program.wait()  # None: still there after GUARD_S (20 s)
        finally:
            os.kill(daemon.pid, signal.SIGCONT)

    report = f"status {status}\n--- stderr:\n{program.stderr()}"
    assert still_stopping, f"the first Ctrl-C's stop did not wait for the daemon: {report}"
    assert status == 130, report

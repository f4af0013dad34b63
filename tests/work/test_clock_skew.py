"""Clock skew between a worker and its daemon changes nothing: real processes.

A worker whose wall clock runs minutes ahead of (or behind) the daemon's
used to turn the daemon's absolute ``until`` into a local deadline with its
own wall clock, and a clock 300 s ahead lost every lease on arrival. The
worker here is its own Python process under libfaketime (its wall clock
shifted, its monotonic clock left alone), against a ``ringod`` on the true
clock; its handlers outlive their lease, so each needs a renewal.

libfaketime is the distribution's ``faketime`` package; .ci/run installs it.
Without it these tests fail (not skip) with the command that installs it.
(Virtual-time twins of this, with any skew and drift: test_lease_time.py.)
"""

from __future__ import annotations

import glob
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from ringo_trio import Ringo, TaskSpec, TaskState
from ringo_trio.testing import DaemonProcess, spawn_daemon

pytestmark = pytest.mark.trio

INSTALL_HINT = (
    "the clock-skew tests run a worker under libfaketime, and libfaketime.so.1 is not"
    " installed. Install it (Debian/Ubuntu: `apt-get install faketime`; .ci/run does"
    " this itself)."
)

LEASE_S = 3.0
# Past the lease: the renewal, sent a third of the lease before the deadline,
# is what keeps each task.
HOLD_S = 4.0
TASKS = 4
# How long the worker waits for its handlers before it reports what it has
# (only a broken worker waits this long).
GIVE_UP_S = 3 * HOLD_S

WORKER = """
import json, sys, time
from datetime import timedelta

import trio

from ringo_trio import Ringo

ENDPOINT, QUEUE = sys.argv[1], sys.argv[2]
LEASE_S, HOLD_S, GIVE_UP_S = (float(arg) for arg in sys.argv[3:6])


async def main():
    ids = json.loads(sys.stdin.readline())
    print(json.dumps({"wall": time.time()}), flush=True)
    finished = 0
    all_finished = trio.Event()

    async def handle(task, ctx):
        nonlocal finished
        await trio.sleep(HOLD_S)
        finished += 1
        if finished == len(ids):
            all_finished.set()

    async with Ringo.connect(ENDPOINT) as client:
        worker = client.queue(QUEUE).worker(
            handle, concurrency=len(ids), lease_duration=timedelta(seconds=LEASE_S)
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            with trio.move_on_after(GIVE_UP_S):
                await all_finished.wait()
            await worker.close()


trio.run(main)
"""


def libfaketime() -> str:
    """The path of libfaketime.so.1; the test fails when it is missing."""
    for pattern in (
        "/usr/lib/*/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
        "/usr/local/lib/faketime/libfaketime.so.1",
    ):
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    pytest.fail(INSTALL_HINT, pytrace=False)


@pytest.fixture
def served_minor(request: pytest.FixtureRequest) -> int | None:
    return getattr(request, "param", None)


@pytest.fixture
def skew_daemon(tmp_path: Path, served_minor: int | None) -> Iterator[DaemonProcess]:
    with spawn_daemon(tmp_path / "data", protocol_minor=served_minor) as daemon:
        yield daemon


@pytest.mark.parametrize(
    ("skew", "served_minor"),
    [(300, None), (-300, None), (300, 10)],
    ids=["ahead-300s", "behind-300s", "ahead-300s-minor10"],
    indirect=["served_minor"],
)
async def test_a_worker_whose_clock_is_minutes_off_keeps_every_lease(
    skew_daemon: DaemonProcess, tmp_path: Path, skew: int
) -> None:
    """Property (the issue's proof): a worker whose wall clock is 300 s ahead
    of or behind the daemon's, with handlers that outlive their 3 s lease,
    finishes every task SUCCEEDED at attempt 1 — its lease deadlines are the
    daemon's ttl (from a daemon below minor 11: the lease duration) on its
    own monotonic clock, never ``until`` minus its wall clock."""
    preload = libfaketime()
    daemon = skew_daemon
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {
        **os.environ,
        "LD_PRELOAD": preload,
        "FAKETIME": f"{skew:+d}",
        # The skew is the wall clock's alone, as on a host whose clock is off.
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
    with trio.fail_after(60):
        async with Ringo.connect(daemon.endpoint) as client:
            queue = client.queue("skew")
            batch = await queue.enqueue_many([TaskSpec("t", max_attempts=5)] * TASKS)
            ids = [result.task.id for result in batch.results]
            argv = [str(script), daemon.endpoint, queue.name, str(LEASE_S), str(HOLD_S)]
            started = time.time()
            done = await trio.run_process(
                [sys.executable, *argv, str(GIVE_UP_S)],
                stdin=(json.dumps(ids) + "\n").encode(),
                capture_stdout=True,
                capture_stderr=True,
                env=env,
                check=False,
            )
            assert done.returncode == 0, done.stderr.decode()
            wall = json.loads(done.stdout.splitlines()[0])["wall"]
            # The worker really ran on the shifted clock.
            assert abs(wall - started - skew) < 30, (wall, started)
            tasks = [await queue.get_by_id(task_id) for task_id in ids]
            assert [(t.state, t.attempt) for t in tasks] == [(TaskState.SUCCEEDED, 1)] * TASKS, [
                (t.state, t.attempt, t.last_error) for t in tasks
            ]

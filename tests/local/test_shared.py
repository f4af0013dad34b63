"""`Ringo.local(data_dir, shared=True)`: many processes, one daemon per data dir.

Members run as real processes (a small script below) where the property is
about processes; in-process clients where it is about one client's recovery.
Every test waits for the shared daemon to linger out at the end, so no daemon
outlives its test.
"""

from __future__ import annotations

import json
import os
import pathlib
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
import trio

from ringo_trio import Ringo, Task, TaskContext, TaskSpec, TaskState
from tests._kit.processes import eventually, pid_alive

pytestmark = pytest.mark.trio

MEMBER = textwrap.dedent(
    """
    import json, sys, trio
    from ringo_trio import Ringo

    async def main() -> None:
        data_dir, name = sys.argv[1], sys.argv[2]
        async with Ringo.local(data_dir, shared=True) as client:
            queue = client.queue("shared")
            result = await queue.enqueue(task_type="t", unique_key=name)
            print(json.dumps({"pid": client.daemon_pid, "task": result.task.id}), flush=True)
            # Stay a member until told to leave (a line on stdin).
            await trio.to_thread.run_sync(sys.stdin.readline)

    trio.run(main)
    """
)


@pytest.fixture
def member_script(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "member.py"
    path.write_text(MEMBER)
    return path


@pytest.fixture
def members() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(10)
        for pipe in (process.stdin, process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()


def start_member(script: pathlib.Path, data_dir: pathlib.Path, name: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(script), str(data_dir), name],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def identity(data_dir: pathlib.Path) -> dict[str, object]:
    data: dict[str, object] = json.loads((data_dir / "shared" / "identity.json").read_text())
    return data


async def test_concurrent_starters_share_one_daemon_and_its_tasks(
    tmp_path: pathlib.Path, member_script: pathlib.Path, members: list[subprocess.Popen[str]]
) -> None:
    """Six processes starting at once elect exactly one daemon; all of them
    use it (a task enqueued by one is seen by the others); the daemon stays
    while any member remains and stops after the last one leaves."""
    data_dir = tmp_path / "data"
    with trio.fail_after(60):
        for i in range(6):
            members.append(start_member(member_script, data_dir, f"m{i}"))
        lines = []
        for process in members:
            assert process.stdout is not None
            line = await trio.to_thread.run_sync(process.stdout.readline)
            assert line, process.stderr.read() if process.stderr else ""
            lines.append(json.loads(line))
        pids = {line["pid"] for line in lines}
        assert len(pids) == 1
        [daemon_pid] = pids
        assert identity(data_dir)["pid"] == daemon_pid
        async with Ringo.local(data_dir, shared=True) as client:
            assert client.daemon_pid == daemon_pid
            queue = client.queue("shared")
            for i, line in enumerate(lines):
                task = await queue.get_by_unique_key(f"m{i}")
                assert task.id == line["task"]
        # All but one leave: the daemon stays for the remaining member.
        for process in members[:-1]:
            assert process.stdin is not None
            process.stdin.write("\n")
            process.stdin.flush()
        for process in members[:-1]:
            assert await trio.to_thread.run_sync(process.wait) == 0
        await trio.sleep(3)  # longer than the linger
        assert pid_alive(daemon_pid)
        last = members[-1]
        assert last.stdin is not None
        last.stdin.write("\n")
        last.stdin.flush()
        assert await trio.to_thread.run_sync(last.wait) == 0
        await eventually(lambda: not pid_alive(daemon_pid), within=15)


async def test_a_killed_shared_daemon_is_replaced_and_nothing_is_lost(
    tmp_path: pathlib.Path,
) -> None:
    """The shared daemon SIGKILLed: the members re-elect one new daemon, both
    reconnect (one of them running a worker), and every task — enqueued by the
    other member, before and after the kill — ends SUCCEEDED."""
    data_dir = tmp_path / "data"
    with trio.fail_after(90):
        async with (
            Ringo.local(data_dir, shared=True) as worker_side,
            Ringo.local(data_dir, shared=True) as producer,
        ):
            old_pid = producer.daemon_pid
            assert old_pid is not None
            assert worker_side.daemon_pid == old_pid
            done: list[str] = []

            async def handle(task: Task, ctx: TaskContext) -> None:
                await trio.sleep(0.01)
                done.append(task.id)

            from datetime import timedelta

            worker = worker_side.queue("jobs").worker(
                handle, concurrency=8, lease_duration=timedelta(seconds=2)
            )
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                batch = await producer.queue("jobs").enqueue_many(
                    [TaskSpec("t") for _ in range(100)]
                )
                ids = [r.task.id for r in batch.results]
                await eventually(lambda: len(done) >= 20, within=20)
                os.kill(old_pid, 9)
                # Both members re-join the same new daemon without being asked.
                await eventually(
                    lambda: (
                        producer.daemon_pid not in (None, old_pid)
                        and worker_side.daemon_pid == producer.daemon_pid
                    ),
                    within=30,
                )
                later = await producer.queue("jobs").enqueue_many(
                    [TaskSpec("t") for _ in range(50)]
                )
                ids += [r.task.id for r in later.results]
                queue = producer.queue("jobs")
                with trio.fail_after(45):
                    while True:
                        tasks = [await queue.get_by_id(t) for t in ids]
                        if all(t.state is TaskState.SUCCEEDED for t in tasks):
                            break
                        await trio.sleep(0.1)
                await worker.close()
            new_pid = producer.daemon_pid
        assert new_pid is not None
        await eventually(lambda: not pid_alive(new_pid), within=15)


async def test_an_untrusted_identity_is_never_used(tmp_path: pathlib.Path) -> None:
    """A forged identity file (pointing at a port that is not the daemon, with
    a token nobody issued) is never trusted: the client elects a real daemon
    of a new generation. The files the election writes are owner-only."""
    data_dir = tmp_path / "data"
    shared_dir = data_dir / "shared"
    shared_dir.mkdir(parents=True, mode=0o700)
    forged = {
        "version": 1,
        "endpoint": "127.0.0.1:9",
        "token": "f" * 64,
        "generation": "forged",
        "pid": os.getpid(),  # alive, but not a daemon
    }
    path = shared_dir / "identity.json"
    path.write_text(json.dumps(forged))
    path.chmod(0o600)
    with trio.fail_after(60):
        async with Ringo.local(data_dir, shared=True) as client:
            pid = client.daemon_pid
            assert pid is not None
            assert pid != os.getpid()
            assert (await client.queue("q").enqueue(task_type="t")).created
            written = identity(data_dir)
            assert written["generation"] != "forged"
            assert written["pid"] == pid
            for name in ("identity.json", "token"):
                mode = stat.S_IMODE((shared_dir / name).stat().st_mode)
                assert mode == 0o600, (name, oct(mode))
            assert stat.S_IMODE(shared_dir.stat().st_mode) & 0o077 == 0
        await eventually(lambda: not pid_alive(pid), within=15)


async def test_an_identity_that_fails_in_use_leads_to_one_re_election(
    tmp_path: pathlib.Path,
) -> None:
    """An identity that passes every file check (owner-only, well-formed, a
    live pid whose command line names the generation) but does not answer as
    that daemon is given up after one try: the client re-elects once and ends
    up on a real daemon of a new generation."""
    data_dir = tmp_path / "data"
    shared_dir = data_dir / "shared"
    shared_dir.mkdir(parents=True, mode=0o700)
    generation = "0" * 32
    impostor = await trio.lowlevel.open_process(
        [sys.executable, "-c", "import sys, time; time.sleep(120)", generation]
    )
    try:
        forged = {
            "version": 1,
            "endpoint": "127.0.0.1:9",  # nothing listens there
            "token": "f" * 64,
            "generation": generation,
            "pid": impostor.pid,
        }
        path = shared_dir / "identity.json"
        path.write_text(json.dumps(forged))
        path.chmod(0o600)
        with trio.fail_after(60):
            async with Ringo.local(data_dir, shared=True) as client:
                pid = client.daemon_pid
                assert pid is not None
                assert pid != impostor.pid
                assert (await client.queue("q").enqueue(task_type="t")).created
                assert identity(data_dir)["generation"] != generation
            await eventually(lambda: not pid_alive(pid), within=15)
    finally:
        impostor.kill()
        await impostor.wait()


async def test_a_group_readable_identity_is_not_trusted(tmp_path: pathlib.Path) -> None:
    """An identity file others could have written (group/other permission
    bits) is not trusted even when it names the live daemon: the member
    re-elects instead — and since the live daemon holds the data dir, it says
    so clearly rather than attach to an unverified daemon."""
    data_dir = tmp_path / "data"
    with trio.fail_after(60):
        async with Ringo.local(data_dir, shared=True) as first:
            pid = first.daemon_pid
            assert pid is not None
            path = data_dir / "shared" / "identity.json"
            path.chmod(0o644)
            with pytest.raises(Exception, match=r"(?i)held by"):
                async with Ringo.local(data_dir, shared=True):
                    pass
            path.chmod(0o600)
        await eventually(lambda: not pid_alive(pid), within=15)


async def test_shared_is_refused_with_postgres_and_must_be_a_bool(tmp_path: pathlib.Path) -> None:
    """shared=True with PostgreSQL storage is refused clearly; shared must be a bool."""
    from ringo_trio import InvalidArgumentError, PostgresStorage

    with pytest.raises(InvalidArgumentError, match="SQLite only"):
        Ringo.local(tmp_path, storage=PostgresStorage("postgresql://x"), shared=True)
    with pytest.raises(InvalidArgumentError, match="boolean"):
        Ringo.local(tmp_path, shared="yes")  # type: ignore[arg-type]

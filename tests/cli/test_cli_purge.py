"""``ringo tasks purge`` end to end: a child process against a real ``ringod``."""

from __future__ import annotations

import json
import subprocess

import pytest
import trio

from ringo_trio import NotFoundError, Ringo
from ringo_trio.testing import DaemonProcess
from tests._kit.cli import run_ringo


def ringo(daemon: DaemonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return run_ringo(daemon, "tasks", "purge", *args)


def finish(daemon: DaemonProcess, queue: str, *, ok: int, dead: int) -> dict[str, list[str]]:
    """`ok` SUCCEEDED and `dead` DEAD tasks of `queue`, through the SDK; their ids."""

    async def main() -> dict[str, list[str]]:
        ids: dict[str, list[str]] = {"ok": [], "dead": []}
        with trio.fail_after(30):
            async with Ringo.connect(daemon.endpoint) as client:
                q = client.queue(queue)
                for kind, n in (("ok", ok), ("dead", dead)):
                    for _ in range(n):
                        await q.enqueue(task_type="t")
                        [leased] = await q.claim()
                        await (leased.ack() if kind == "ok" else leased.reject("no"))
                        ids[kind].append(leased.task.id)
        return ids

    return trio.run(main)


def surviving(daemon: DaemonProcess, queue: str, ids: list[str]) -> list[str]:
    async def main() -> list[str]:
        alive = []
        with trio.fail_after(30):
            async with Ringo.connect(daemon.endpoint) as client:
                for task_id in ids:
                    try:
                        await client.queue(queue).get_by_id(task_id)
                    except NotFoundError:
                        continue
                    alive.append(task_id)
        return alive

    return trio.run(main)


def test_tasks_purge_deletes_the_asked_states_and_prints_the_count(
    daemon: DaemonProcess,
) -> None:
    """`ringo tasks purge QUEUE --state succeeded` deletes that queue's succeeded tasks
    and says how many; --older-than keeps tasks that finished more recently; --json
    prints {"queue", "deleted"} for scripts; without --state every finished state goes."""
    ids = finish(daemon, "mail", ok=3, dead=2)

    recent = ringo(daemon, "mail", "--state", "succeeded", "--older-than", "7d")
    assert recent.returncode == 0, recent.stderr
    assert "deleted 0 " in recent.stdout

    done = ringo(daemon, "mail", "--state", "succeeded")
    assert done.returncode == 0, done.stderr
    assert "deleted 3 " in done.stdout
    assert surviving(daemon, "mail", ids["ok"] + ids["dead"]) == ids["dead"]

    scripted = ringo(daemon, "mail", "--json")
    assert scripted.returncode == 0, scripted.stderr
    assert json.loads(scripted.stdout) == {"queue": "mail", "deleted": 2}
    assert surviving(daemon, "mail", ids["dead"]) == []


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--older-than", "a week"], "not a duration"),
        (["--state", "pending"], "invalid choice"),
    ],
)
def test_tasks_purge_refuses_what_it_cannot_do(
    daemon: DaemonProcess, args: list[str], fragment: str
) -> None:
    """An age that is not a duration, or a state that is not finished, is a usage
    error (exit 2) naming the problem, and nothing is deleted."""
    ids = finish(daemon, "mail", ok=1, dead=0)
    result = ringo(daemon, "mail", *args)
    assert result.returncode == 2
    assert fragment in result.stderr
    assert surviving(daemon, "mail", ids["ok"]) == ids["ok"]

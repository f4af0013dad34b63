"""`ringo schedules list | put | rm | pause | resume`, each run as a subprocess
against a real ``ringod`` (docs/schedules.md)."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from ringo_trio.testing import DaemonProcess
from tests._kit.cli import run_ringo, run_ringo_json


def ringo(daemon: DaemonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return run_ringo(daemon, "schedules", *args)


def ringo_json(daemon: DaemonProcess, *args: str) -> Any:
    return run_ringo_json(daemon, "schedules", *args)


def test_put_list_pause_resume_rm(daemon: DaemonProcess) -> None:
    """Property: what `schedules put` stores is what `schedules list` shows
    (cron + zone, every, payload, misfire, catch-up, priority, max attempts),
    per queue or across queues; pause clears the next fire and resume sets it
    again; rm deletes it (a second rm is one line on stderr, exit status 1);
    --json on every verb is one document."""
    cron = ringo_json(
        daemon, "put", "cli-sched-a", "nightly", "report", "--cron", "30 2 * * *",
        "--timezone", "Europe/Paris", "--payload", "hello", "--misfire", "catch_up",
        "--catch-up", "3", "--priority", "7", "--max-attempts", "4",
    )  # fmt: skip
    [stored] = cron
    assert stored["cron"] == "30 2 * * *"
    assert stored["timezone"] == "Europe/Paris"
    assert stored["misfire"] == "catch_up"
    assert stored["catch_up"] == 3
    assert stored["priority"] == 7
    assert stored["max_attempts"] == 4
    assert stored["payload"]["text"] == "hello"
    assert stored["next_fire_at"] is not None
    assert stored["paused"] is False
    [every] = ringo_json(daemon, "put", "cli-sched-b", "poll", "check", "--every", "1h", "--paused")
    assert every["every_seconds"] == 3600
    assert every["paused"] is True
    assert every["next_fire_at"] is None

    one = ringo_json(daemon, "list", "cli-sched-a")
    assert [s["name"] for s in one] == ["nightly"]
    everything = ringo_json(daemon, "list")
    assert {("cli-sched-a", "nightly"), ("cli-sched-b", "poll")} <= {
        (s["queue"], s["name"]) for s in everything
    }
    table = ringo(daemon, "list", "cli-sched-a")
    assert table.returncode == 0, table.stderr
    assert "30 2 * * * (Europe/Paris)" in table.stdout
    table = ringo(daemon, "list", "cli-sched-b")
    assert "every 1h" in table.stdout

    [paused] = ringo_json(daemon, "pause", "cli-sched-a", "nightly")
    assert paused["paused"] is True
    assert paused["next_fire_at"] is None
    [resumed] = ringo_json(daemon, "resume", "cli-sched-a", "nightly")
    assert resumed["paused"] is False
    assert resumed["next_fire_at"] is not None

    removed = ringo_json(daemon, "rm", "cli-sched-a", "nightly")
    assert removed == {"queue": "cli-sched-a", "name": "nightly", "deleted": True}
    assert ringo_json(daemon, "list", "cli-sched-a") == []
    again = ringo(daemon, "rm", "cli-sched-a", "nightly")
    assert again.returncode == 1
    assert again.stderr.strip() == "no schedule 'nightly' in queue 'cli-sched-a'"


def test_refusals_are_one_line(daemon: DaemonProcess) -> None:
    """Property: a cron syntax error is one line on stderr naming the field
    and its position, exit status 1, and nothing is stored; so are a bad
    time zone and a catch-up out of bounds; neither or both of --cron and
    --every is a usage error (exit status 2); pausing a schedule that does
    not exist is one line (NotFoundError)."""
    bad = ringo(daemon, "put", "cli-sched-bad", "s", "t", "--cron", "5 * 32 * *")
    assert bad.returncode == 1
    [line] = bad.stderr.splitlines()
    assert "day of month" in line
    assert "position 5" in line
    zone = ringo(daemon, "put", "cli-sched-bad", "s", "t", "--every", "5m", "--timezone", "Mars/X")
    assert zone.returncode == 1
    assert len(zone.stderr.splitlines()) == 1
    assert "timezone" in zone.stderr
    catch_up = ringo(daemon, "put", "cli-sched-bad", "s", "t", "--every", "5m", "--catch-up", "0")
    assert catch_up.returncode == 1
    assert len(catch_up.stderr.splitlines()) == 1
    assert "catch_up" in catch_up.stderr
    neither = ringo(daemon, "put", "cli-sched-bad", "s", "t")
    assert neither.returncode == 2
    both = ringo(daemon, "put", "cli-sched-bad", "s", "t", "--cron", "* * * * *", "--every", "5m")
    assert both.returncode == 2
    missing = ringo(daemon, "pause", "cli-sched-bad", "nope")
    assert missing.returncode == 1
    assert "NotFoundError" in missing.stderr
    assert len(missing.stderr.splitlines()) == 1
    assert (
        json.loads(run_ringo(daemon, "schedules", "list", "cli-sched-bad", "--json").stdout) == []
    )

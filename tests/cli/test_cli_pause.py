"""``ringo queues pause`` and ``ringo queues resume`` as subprocesses against
a real ``ringod``; ``ringo queues`` alone still lists, now with the flag."""

from __future__ import annotations

import json
import subprocess

from ringo_trio.testing import DaemonProcess
from tests._kit.cli import CLI, run_ringo, run_ringo_json


def test_pause_and_resume_show_in_the_queue_list(daemon: DaemonProcess) -> None:
    """Property: `ringo queues pause Q` pauses Q (a queue without tasks too)
    and says whether it changed it; `ringo queues` lists Q with paused "yes"
    (--json: "paused": true) and other queues "no"; `resume` undoes it."""
    assert run_ringo_json(daemon, "queues", "pause", "held") == {
        "queue": "held",
        "paused": True,
        "changed": True,
    }
    again = run_ringo(daemon, "queues", "pause", "held")
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "queue 'held' already paused"
    run_ringo_json(daemon, "queues", "pause", "other")
    assert run_ringo_json(daemon, "queues", "resume", "other")["changed"] is True

    table = run_ringo(daemon, "queues")
    assert table.returncode == 0, table.stderr
    header, _rule, *rows = table.stdout.splitlines()
    assert header.split()[-1] == "paused"
    assert {r.split()[0]: r.split()[-1] for r in rows}["held"] == "yes"
    listed = {q["queue"]: q for q in json.loads(run_ringo(daemon, "queues", "--json").stdout)}
    assert listed["held"]["paused"] is True
    assert "other" not in listed  # resumed and empty: not a queue any more

    resumed = run_ringo(daemon, "queues", "resume", "held")
    assert resumed.stdout.strip() == "queue 'held' resumed"
    listed = {q["queue"]: q for q in json.loads(run_ringo(daemon, "queues", "--json").stdout)}
    assert "held" not in listed


def test_queues_without_a_daemon_option_is_a_usage_error() -> None:
    """Property: `ringo queues` still needs --endpoint or --data-dir (exit 2,
    as argparse answers the other commands)."""
    result = subprocess.run([*CLI, "queues"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "--endpoint" in result.stderr

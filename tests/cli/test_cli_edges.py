"""Small `ringo` behaviours a newcomer meets first, against the module's
shared ``ringod`` (tests/_kit/cli.py)."""

from __future__ import annotations

from ringo_trio.testing import DaemonProcess
from tests._kit.cli import run_ringo, run_ringo_json


def test_enqueue_max_attempts_zero_is_the_default(daemon: DaemonProcess) -> None:
    """Property: `ringo enqueue --max-attempts 0` enqueues with the daemon's
    default (5), as the wire reads 0; a negative number is one line on
    stderr naming the field and the range, exit status 1."""
    task = run_ringo_json(daemon, "enqueue", "edges", "t", "--max-attempts", "0")
    assert task["max_attempts"] == 5
    refused = run_ringo(daemon, "enqueue", "edges", "t", "--max-attempts", "-1")
    assert refused.returncode == 1
    assert "max_attempts must be between 0 and 10000, got -1" in refused.stderr

"""`ringo limits list|set|rm` and `ringo enqueue --limit-key`, each run as a
subprocess against a real ``ringod`` (the module's daemon, tests/_kit/cli.py)."""

from __future__ import annotations

from typing import Any

import trio

from ringo_trio import Ringo
from ringo_trio.testing import DaemonProcess
from tests._kit.cli import run_ringo, run_ringo_json

TIMEOUT = 30


def sdk(daemon: DaemonProcess, queue: str, call: Any) -> Any:
    async def main() -> Any:
        with trio.fail_after(TIMEOUT):
            async with Ringo.connect(daemon.endpoint) as client:
                return await call(client.queue(queue))

    return trio.run(main)


def test_set_list_and_rm_a_rule(daemon: DaemonProcess) -> None:
    """Property: `limits set` creates and replaces a queue's rule (rate with
    --per and --burst, --concurrency), `limits list` shows it (one queue or
    every queue; a table or --json), `limits rm` deletes it and is exit
    status 1 when there is none; a rule without rate or concurrency is
    refused (exit 1, naming the problem)."""
    made = run_ringo_json(daemon, "limits", "set", "cli-lim", "api:", "--rate", "5",
                          "--per", "2s", "--burst", "3")  # fmt: skip
    assert made == {
        "queue": "cli-lim",
        "prefix": "api:",
        "rate": 5.0,
        "per_seconds": 2.0,
        "burst": 3,
        "concurrency": None,
        "keys": [],
    }
    text = run_ringo(daemon, "limits", "set", "cli-lim", "tenant:", "--concurrency", "2")
    assert text.returncode == 0, text.stderr
    assert "concurrency 2" in text.stdout
    listed = run_ringo_json(daemon, "limits", "list", "cli-lim")
    assert [(r["prefix"], r["rate"], r["concurrency"]) for r in listed] == [
        ("api:", 5.0, None),
        ("tenant:", None, 2),
    ]
    everywhere = run_ringo_json(daemon, "limits", "list")
    assert {("cli-lim", "api:"), ("cli-lim", "tenant:")} <= {
        (r["queue"], r["prefix"]) for r in everywhere
    }
    table = run_ringo(daemon, "limits", "list", "cli-lim")
    assert table.returncode == 0, table.stderr
    assert "5/2s" in table.stdout
    bad = run_ringo(daemon, "limits", "set", "cli-lim", "x:")
    assert bad.returncode == 1
    assert "rate" in bad.stderr
    removed = run_ringo_json(daemon, "limits", "rm", "cli-lim", "api:")
    assert removed == {"queue": "cli-lim", "prefix": "api:", "deleted": True}
    again = run_ringo(daemon, "limits", "rm", "cli-lim", "api:")
    assert again.returncode == 1
    assert "no rule" in again.stderr
    assert [r["prefix"] for r in run_ringo_json(daemon, "limits", "list", "cli-lim")] == ["tenant:"]


def test_enqueue_with_a_limit_key_and_list_the_keys(daemon: DaemonProcess) -> None:
    """Property: `enqueue --limit-key` stores the key (shown in --json);
    `limits list --keys` reports each key of a rule with its waiting and
    leased tasks, the held key's waiting count being what the rule holds
    back."""
    made = run_ringo(daemon, "limits", "set", "cli-keys", "t:", "--concurrency", "1")
    assert made.returncode == 0, made.stderr
    for _ in range(3):
        doc = run_ringo_json(daemon, "enqueue", "cli-keys", "job", "--limit-key", "t:a")
        assert doc["limit_key"] == "t:a"
    run_ringo_json(daemon, "enqueue", "cli-keys", "job", "--limit-key", "t:b")
    leased = sdk(daemon, "cli-keys", lambda q: q.claim(10))
    assert sorted(t.task.limit_key for t in leased) == ["t:a", "t:b"]
    [rule] = run_ringo_json(daemon, "limits", "list", "cli-keys", "--keys")
    keys = {k["key"]: (k["waiting"], k["leased"]) for k in rule["keys"]}
    assert keys == {"t:a": (2, 1), "t:b": (0, 1)}
    table = run_ringo(daemon, "limits", "list", "cli-keys", "--keys")
    assert table.returncode == 0, table.stderr
    assert "t:a" in table.stdout
    assert "waiting" in table.stdout

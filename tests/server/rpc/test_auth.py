"""Authentication: which tokens ringod accepts at startup, and the wrong-token throttle."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from grpclib.const import Status

from ringo_trio._proto.grpc.health.v1 import HealthCheckRequest
from ringo_trio.server import flags
from ringo_trio.server import main as _main
from ringo_trio.server.rpc.throttle import AuthThrottle
from ringo_trio.testing import spawn_daemon
from tests._kit.grpc_client import connect, expect_status, new_queue

MODULE = [sys.executable, "-m", "ringo_trio.server"]


def _start_and_stop(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ringod with a lifecycle pipe closed at once: it exits 0 right after
    serving, or with a usage error before."""
    command = [*MODULE, "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "data")]
    return subprocess.run(
        [*command, "--lifecycle-stdin", *args],
        input="",
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )


@pytest.mark.parametrize(
    "secret", ["pässwort", "tab\there", "bell\x07"], ids=["non-ascii", "tab", "control"]
)
def test_a_token_no_client_can_send_is_refused_at_startup(tmp_path: Path, secret: str) -> None:
    """Property: a bearer token that is not printable ASCII (no gRPC client can
    send it as metadata) is a usage error at startup, from --token-file,
    --token or $RINGO_DAEMON_TOKEN alike, instead of a daemon nobody can use."""
    token_file = tmp_path / "token"
    token_file.write_text(secret, encoding="utf-8")
    for args, env in (
        (["--token-file", str(token_file)], None),
        (["--token", secret], None),
        ([], {**os.environ, flags.TOKEN_ENV: secret}),
    ):
        result = _start_and_stop(tmp_path, *args, env=env)
        assert result.returncode == _main.EXIT_USAGE, (args, result.stderr)
        assert "printable ASCII" in result.stderr
        assert result.stdout == ""


@pytest.mark.anyio
async def test_the_token_can_come_from_the_environment(tmp_path: Path) -> None:
    """Property: $RINGO_DAEMON_TOKEN sets the bearer token (how the SDK hands
    its private daemon a secret without putting it on the command line);
    --token wins over it."""
    with spawn_daemon(tmp_path / "data", env={flags.TOKEN_ENV: "from-env"}) as process:
        assert process.info["auth"] is True
        with anyio.fail_after(10):
            async with connect(process, token="from-env") as client:
                await client.enqueue(new_queue())
            async with connect(process, negotiate=False) as anonymous:
                await expect_status(
                    anonymous.health.check(HealthCheckRequest()), Status.UNAUTHENTICATED
                )
    with spawn_daemon(
        tmp_path / "data", token="from-flag", env={flags.TOKEN_ENV: "from-env"}
    ) as process:
        with anyio.fail_after(10):
            async with connect(process, token="from-flag") as client:
                await client.enqueue(new_queue())


# -- the throttle (pure rules, explicit time) --------------------------------------


def test_failures_from_one_address_wait_longer_and_longer_up_to_the_cap() -> None:
    """Property: the n-th failure from an address waits cap/20 * 2**(n-1)
    seconds, never more than the cap; the port (connection) does not matter,
    so reconnecting buys nothing."""
    throttle = AuthThrottle(cap=1.0, per_connection=1000)
    delays = []
    for n in range(8):
        verdict = throttle.failed("10.0.0.1", 40000 + n, now=100.0 + n * 0.001)
        throttle.answered(verdict)
        delays.append(verdict.delay)
    assert delays == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    # Another address starts from the beginning.
    assert throttle.failed("10.0.0.2", 1, now=100.0).delay == 0.05


def test_one_address_waits_in_one_line() -> None:
    """Property: every failure of an address shares one lock (the gate answers
    them one at a time, so parallel guesses are no faster); other addresses
    have their own."""
    throttle = AuthThrottle()
    first = throttle.failed("10.0.0.1", 1, now=0.0)
    second = throttle.failed("10.0.0.1", 2, now=0.0)
    other = throttle.failed("10.0.0.2", 1, now=0.0)
    assert first.turn is not None
    assert first.turn is second.turn
    assert other.turn is not first.turn


def test_too_many_waiting_failures_drop_the_connection() -> None:
    """Property: while `max_waiting` failures of an address wait for their
    answer, the next one is dropped (connection closed, no answer); once
    answers went out, failures wait in line again."""
    throttle = AuthThrottle(max_waiting=3, per_connection=1000)
    verdicts = [throttle.failed("10.0.0.1", 1, now=0.0) for _ in range(4)]
    assert [v.drop for v in verdicts] == [False, False, False, True]
    assert throttle.waiting("10.0.0.1") == 3
    throttle.answered(verdicts[0])
    assert not throttle.failed("10.0.0.1", 1, now=0.0).drop


def test_a_connection_is_closed_after_a_few_failures() -> None:
    """Property: the `per_connection`-th failure on one connection (address and
    port) closes it after the answer; another connection counts on its own."""
    throttle = AuthThrottle(per_connection=3)
    closes = []
    for _ in range(3):
        verdict = throttle.failed("10.0.0.1", 5000, now=0.0)
        throttle.answered(verdict)
        closes.append(verdict.close)
    assert closes == [False, False, True]
    assert not throttle.failed("10.0.0.1", 5001, now=0.0).close


def test_a_quiet_address_is_forgiven_and_the_table_is_bounded() -> None:
    """Property: an address with no failure for `forget_after` seconds starts
    from the first delay again, and at most `max_addresses` are remembered."""
    throttle = AuthThrottle(cap=1.0, forget_after=60.0, max_addresses=2)
    for _ in range(5):
        throttle.answered(throttle.failed("10.0.0.1", 1, now=0.0))
    verdict = throttle.failed("10.0.0.1", 1, now=30.0)
    throttle.answered(verdict)
    assert verdict.delay == 1.0
    verdict = throttle.failed("10.0.0.1", 1, now=91.0)
    throttle.answered(verdict)
    assert verdict.delay == 0.05
    throttle.failed("10.0.0.2", 1, now=91.0)
    throttle.failed("10.0.0.3", 1, now=91.0)
    # 10.0.0.1 was the least recently failing: forgotten, so it starts over.
    assert throttle.failed("10.0.0.1", 1, now=92.0).delay == 0.05


def test_the_documented_defaults_hold() -> None:
    """docs/deployment.md's numbers, on the throttle ringod builds: the 5th
    failure on a connection closes it (the 4th does not); a failure while 16
    of its address wait is dropped (the 16th waits); an address quiet for
    60 s starts over (at exactly 60 s it does not); 10,000 addresses are
    remembered, one more forgets the least recently failing."""
    throttle = AuthThrottle()
    closes = []
    for _ in range(5):
        verdict = throttle.failed("10.0.0.1", 5000, now=0.0)
        throttle.answered(verdict)
        closes.append(verdict.close)
    assert closes == [False] * 4 + [True]

    waiting = [throttle.failed("10.0.0.2", port, now=0.0) for port in range(17)]
    assert [v.drop for v in waiting] == [False] * 16 + [True]

    throttle.answered(throttle.failed("10.0.0.3", 1, now=0.0))
    assert throttle.failed("10.0.0.3", 1, now=60.0).delay == 0.1
    assert throttle.failed("10.0.0.3", 1, now=120.5).delay == 0.05

    table = AuthThrottle()
    for n in range(10_000):
        table.failed(f"10.1.{n // 256}.{n % 256}", 1, now=0.0)
    assert table.waiting("10.1.0.0") == 1
    table.failed("10.2.0.0", 1, now=0.0)
    assert (table.waiting("10.1.0.0"), table.waiting("10.1.0.1")) == (0, 1)


def test_a_connection_count_is_kept_for_the_last_16_connections_per_allowed_failure() -> None:
    """Property: an address's per-connection counts are bounded (16 times
    `per_connection` connections), so a guesser cycling ports cannot grow
    them; within that bound a connection's failures add up across others'."""
    throttle = AuthThrottle(per_connection=2)
    first = throttle.failed("10.0.0.1", 0, now=0.0)
    throttle.answered(first)
    for port in range(1, 32):
        throttle.answered(throttle.failed("10.0.0.1", port, now=0.0))
    # 32 connections remembered: the first one's failure still counts.
    assert throttle.failed("10.0.0.1", 0, now=0.0).close
    for port in range(100, 133):
        throttle.answered(throttle.failed("10.0.0.1", port, now=0.0))
    # 33 more: the first one's count is gone, it starts over.
    assert not throttle.failed("10.0.0.1", 0, now=0.0).close


def test_answers_never_count_the_waiting_below_zero() -> None:
    """Property: each `answered` gives one slot back, and an answer beyond
    the failures waiting (an answer path run twice) gives back nothing, so
    `max_waiting` cannot be talked up by a surplus of answers."""
    throttle = AuthThrottle(max_waiting=2, per_connection=1000)
    first = throttle.failed("10.0.0.1", 1, now=0.0)
    second = throttle.failed("10.0.0.1", 1, now=0.0)
    throttle.answered(first)
    assert throttle.waiting("10.0.0.1") == 1
    throttle.answered(second)
    throttle.answered(second)
    assert throttle.waiting("10.0.0.1") == 0
    verdicts = [throttle.failed("10.0.0.1", 1, now=0.0) for _ in range(3)]
    assert [v.drop for v in verdicts] == [False, False, True]


def test_a_zero_cap_answers_at_once() -> None:
    """Property: --auth-failure-delay 0 answers every failure without waiting
    (a connection is still closed after a few)."""
    throttle = AuthThrottle(cap=0.0)
    verdicts = [throttle.failed("10.0.0.1", 1, now=0.0) for _ in range(5)]
    assert {v.delay for v in verdicts} == {0.0}
    assert verdicts[-1].close

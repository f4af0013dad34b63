"""The proof of the testing kit: a one-hour retry schedule runs in virtual time
under trio and asyncio, and its task history is the one a real ringod gives."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import anyio
import pytest
import trio
import trio.testing

from ringo_trio import Ringo
from ringo_trio.testing import AutojumpEventLoop, DaemonProcess, RingoTestEnv, spawn_daemon
from tests._kit.scenario import EXPECTED, retry_scenario

HOUR = timedelta(hours=1)


@pytest.mark.trio
async def test_under_trio_autojump_the_hourly_retries_give_the_expected_history(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Property: under trio's autojump clock the scenario (1-hour retry
    delays, 3 attempts) completes with the expected history, and at least
    the two hours its retries need have passed in virtual time."""
    begin = trio.current_time()
    with trio.fail_after(24 * 3600):  # virtual: a clock that never skipped fails here
        async with RingoTestEnv.start() as env:
            history = await retry_scenario(env.client, HOUR)
    assert history == EXPECTED
    assert trio.current_time() - begin >= 2 * 3600


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, object]]:
    return ("asyncio", {"loop_factory": AutojumpEventLoop})


@pytest.mark.anyio
async def test_under_asyncio_autojump_the_hourly_retries_give_the_expected_history() -> None:
    """Property: the same scenario under asyncio, on AutojumpEventLoop (anyio's
    plugin), completes with the same history and two virtual hours passed."""
    begin = anyio.current_time()
    with anyio.fail_after(24 * 3600):
        async with RingoTestEnv.start() as env:
            history = await retry_scenario(env.client, HOUR)
    assert history == EXPECTED
    assert anyio.current_time() - begin >= 2 * 3600


@pytest.fixture
def ringod(tmp_path: Path) -> Iterator[DaemonProcess]:
    with spawn_daemon(tmp_path / "data") as daemon:
        yield daemon


@pytest.mark.trio
async def test_a_real_ringod_gives_the_same_history(ringod: DaemonProcess) -> None:
    """Property: the same scenario against a real ringod process over a socket
    (real time, so the delay is 0.2 s) gives exactly the history the
    in-process daemon gave: the kit runs the real protocol."""
    with trio.fail_after(60):
        async with Ringo.connect(ringod.endpoint) as client:
            history = await retry_scenario(client, timedelta(seconds=0.2))
    assert history == EXPECTED


def test_the_autojump_loop_skips_to_the_next_timer() -> None:
    """Property: AutojumpEventLoop's clock is virtual: sleeping an hour returns
    with loop time advanced by exactly the sleeps, in order."""
    import asyncio

    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        stamps = [loop.time()]
        for delay in (3600, 0.5, 86400):
            await asyncio.sleep(delay)
            stamps.append(loop.time())
        return stamps

    loop = AutojumpEventLoop()
    try:
        stamps = loop.run_until_complete(main())
    finally:
        loop.close()
    assert [b - a for a, b in itertools.pairwise(stamps)] == [3600, 0.5, 86400]

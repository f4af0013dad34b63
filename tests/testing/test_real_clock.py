"""The kit refuses virtual time on a real clock (issue 28): a test that
expects virtual time but runs on a real one would otherwise sit out every
retry delay in real time (a one-hour backoff test under a wrong anyio marker
waited ten minutes before anyone noticed)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
import trio
import trio.testing

from ringo_trio.testing import AutojumpEventLoop, RealClockError, RingoTestEnv

ROOT = Path(__file__).resolve().parents[2]


async def an_hour_passes(limit: float = 2 * 3600) -> float:
    """Start an environment, let an hour pass, return the loop time it took;
    ``limit`` is in loop time (virtual on a mock clock, real otherwise)."""
    begin = anyio.current_time()
    with anyio.fail_after(limit):
        async with RingoTestEnv.start() as env:
            await env.client.queue("q").enqueue(task_type="t")
            await env.sleep(hours=1)
    return anyio.current_time() - begin


def test_refused_under_trio_without_a_mock_clock() -> None:
    """Property: under trio's real clock (pytest-trio without autojump_clock),
    RingoTestEnv.start() raises RealClockError at once, and its message names
    the fixes: the autojump_clock fixture, the anyio_backend for
    AutojumpEventLoop, and time="real" for a test that means real time."""

    with pytest.raises(RealClockError) as refused:
        trio.run(an_hour_passes, 10)
    message = str(refused.value)
    assert "autojump_clock" in message
    assert "AutojumpEventLoop" in message
    assert 'time="real"' in message


def test_refused_under_asyncio_on_the_default_loop() -> None:
    """Property: under asyncio's own loop (anyio's plugin with the default
    anyio_backend, the wrong-marker case) the refusal is the same."""

    with pytest.raises(RealClockError, match="AutojumpEventLoop"):
        asyncio.run(an_hour_passes(10))


def test_an_hour_passes_on_trio_mock_clock() -> None:
    """Property: on trio's MockClock (autojump) the same code runs, an hour
    of virtual time passing."""
    clock = trio.testing.MockClock(autojump_threshold=0)
    took = trio.run(an_hour_passes, clock=clock)
    assert took >= 3600


def test_an_hour_passes_on_autojump_event_loop() -> None:
    """Property: on AutojumpEventLoop under asyncio the same code runs."""
    with asyncio.Runner(loop_factory=AutojumpEventLoop) as runner:
        took = runner.run(an_hour_passes())
    assert took >= 3600


@pytest.mark.trio
async def test_real_time_when_asked_for() -> None:
    """Property: time="real" on a real clock is allowed (the test says it
    means real time)."""
    with trio.fail_after(30):
        async with RingoTestEnv.start(time="real") as env:
            result = await env.client.queue("q").enqueue(task_type="t")
            assert (await env.client.queue("q").get_by_id(result.task.id)).id == result.task.id


WRONG_MARKER = """
import pytest


@pytest.mark.anyio
async def test_an_hour_of_backoff(ringo_env):
    await ringo_env.sleep(hours=1)
"""


def test_the_fixture_under_a_wrong_anyio_marker_fails_at_once(tmp_path: Path) -> None:
    """Property: the issue's case — a test of the ``ringo_env`` fixture under
    anyio's plugin with its default backend (asyncio's own loop, real time)
    — errors at once with RealClockError instead of sleeping the hour."""
    (tmp_path / "test_wrong.py").write_text(WRONG_MARKER)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:trio"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stdout[-3000:]
    assert "RealClockError" in done.stdout, done.stdout[-3000:]
    # Every backend anyio's plugin runs it on (asyncio, and trio when installed).
    assert re.search(r"\b\d+ errors? in", done.stdout), done.stdout[-3000:]
    assert "passed" not in done.stdout, done.stdout[-3000:]
    assert time.monotonic() - began < 60

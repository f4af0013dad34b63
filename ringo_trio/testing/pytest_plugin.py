"""ringo_trio's pytest plugin (entry point ``pytest11``): the ``ringo_env`` and
``ringo_client`` fixtures, for pytest-trio and anyio's pytest plugin alike.

::

    async def test_send(ringo_client):              # a pytest-trio or anyio test
        await ringo_client.queue("emails").enqueue(task_type="send")

``ringo_env`` is a `RingoTestEnv` started for the test, on virtual time: the
test must run on a mock clock (pytest-trio's ``autojump_clock``, or
``anyio_backend = ("asyncio", {"loop_factory": AutojumpEventLoop})``), or the
fixture raises `RealClockError` naming the fix;
``ringo_client`` is its client. Both are plain async fixtures, so whichever
plugin runs the test runs them, in the test's own event loop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from .._client import RingoClient
from ._env import RingoTestEnv

__all__ = ["ringo_client", "ringo_env"]


@pytest.fixture
async def ringo_env() -> AsyncIterator[RingoTestEnv]:
    """A `RingoTestEnv`: an in-process daemon on the test loop's clock."""
    async with RingoTestEnv.start() as env:
        yield env


@pytest.fixture
def ringo_client(ringo_env: RingoTestEnv) -> RingoClient:
    """The client of ``ringo_env``."""
    return ringo_env.client

"""`Ringo.connect` reads ``$RINGO_TOKEN`` when given no token, as every
``ringo`` command does; the argument wins over the environment."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest
import trio

from ringo_trio import Ringo, UnauthenticatedError
from ringo_trio.testing import DaemonProcess, spawn_daemon

pytestmark = pytest.mark.trio

SECRET = "s3cret-token"


@pytest.fixture
def guarded(tmp_path: pathlib.Path) -> Iterator[DaemonProcess]:
    """A ringod that requires the bearer token SECRET."""
    with spawn_daemon(tmp_path / "data", token=SECRET) as process:
        yield process


async def _queues(endpoint: str, **kwargs: str) -> None:
    async with Ringo.connect(endpoint, **kwargs) as client:
        await client.queues()


async def test_connect_sends_the_environments_token_when_given_none(
    guarded: DaemonProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Property: with $RINGO_TOKEN set (after the import: it is read at
    connect), `Ringo.connect(endpoint)` is let in; without it, refused."""
    with trio.fail_after(30):
        monkeypatch.delenv("RINGO_TOKEN", raising=False)
        with pytest.raises(UnauthenticatedError):
            await _queues(guarded.endpoint)
        monkeypatch.setenv("RINGO_TOKEN", SECRET)
        await _queues(guarded.endpoint)


async def test_an_explicit_token_wins_over_the_environment(
    guarded: DaemonProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Property: precedence is argument > environment: an explicit token is
    sent even when $RINGO_TOKEN holds another (right or wrong), and
    ``token=""`` sends none whatever the environment."""
    with trio.fail_after(30):
        monkeypatch.setenv("RINGO_TOKEN", "wrong")
        await _queues(guarded.endpoint, token=SECRET)
        with pytest.raises(UnauthenticatedError):
            await _queues(guarded.endpoint)
        monkeypatch.setenv("RINGO_TOKEN", SECRET)
        with pytest.raises(UnauthenticatedError):
            await _queues(guarded.endpoint, token="wrong")
        with pytest.raises(UnauthenticatedError):
            await _queues(guarded.endpoint, token="")

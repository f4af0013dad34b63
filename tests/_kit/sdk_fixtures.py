"""Fixtures of the SDK tests: real daemons (remote and local), clients of both kinds, the
negotiated minor, and the leak check every SDK test ends with.

Defined here and re-exported by the conftest.py of each directory whose tests drive the SDK."""

from __future__ import annotations

import pathlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from ringo_trio import Ringo, RingoClient
from ringo_trio._contract import versions
from ringo_trio.testing import DaemonProcess, spawn_daemon
from tests._kit.processes import free_port, live_daemon_children


@pytest.fixture(params=[9, 11], ids=["minor9", "minor11"])
def sdk_minor(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """The Work-stream tests that matter run at both frame forms: the SDK
    negotiates minor 9 (a frame per command and per push) or 10 (batch
    frames both ways)."""
    monkeypatch.setattr(versions, "MINOR", request.param)
    return int(request.param)


@pytest.fixture
def daemon(tmp_path: pathlib.Path) -> Iterator[DaemonProcess]:
    """A ringod on a fixed port, so a restart (after kill) comes back where clients look."""
    port = free_port()
    with spawn_daemon(tmp_path / "remote", extra_args=["--listen", f"127.0.0.1:{port}"]) as d:
        yield d


@pytest.fixture(params=["local", "remote"])
def make_client(
    request: pytest.FixtureRequest, tmp_path: pathlib.Path
) -> Callable[[], RingoClient]:
    """A factory of (unentered) clients: Ringo.local on tmp_path, or Ringo.connect to a ringod."""
    if request.param == "local":
        return lambda: Ringo.local(tmp_path / "local")
    remote: DaemonProcess = request.getfixturevalue("daemon")
    return lambda: Ringo.connect(remote.endpoint)


@pytest.fixture(autouse=True)
def no_leaked_daemons() -> Iterator[None]:
    """Every SDK test ends with no daemon child left running that it started
    (a session-scoped daemon of another directory's fixtures may outlive it)."""
    before = set(live_daemon_children())
    yield
    assert [d for d in live_daemon_children() if d not in before] == []


def count_calls(
    client: RingoClient, monkeypatch: pytest.MonkeyPatch, *, most: int | None = None
) -> list[str]:
    """The names of the unary calls `client` sends from now on (so a test
    can say that a bad argument failed before anything was sent); with
    `most`, a call past that many fails the test instead of being sent (a
    loop of calls on virtual time would never end)."""
    connection = client._connection
    sent: list[str] = []
    call = connection.call

    async def counting(method: str, *args: Any, **kwargs: Any) -> Any:
        sent.append(method)
        if most is not None and len(sent) > most:
            raise AssertionError(f"more than {most} calls: {sent}")
        return await call(method, *args, **kwargs)

    monkeypatch.setattr(connection, "call", counting)
    return sent


def route_calls(
    client: RingoClient,
    monkeypatch: pytest.MonkeyPatch,
    route: Callable[..., Awaitable[Any]],
) -> None:
    """Send `client`'s unary calls through ``route(send, method, *args,
    **kwargs)``, `send` being the transport's own call (a route may fail a
    call instead, as a dropped connection does), and make the connection's
    recovery from a drop instant."""
    connection = client._connection
    transport = connection.require_transport()
    send = transport.unary

    async def routed(method: str, *args: Any, **kwargs: Any) -> Any:
        return await route(send, method, *args, **kwargs)

    async def back_at_once(*args: Any, **kwargs: Any) -> None:
        return None

    monkeypatch.setattr(transport, "unary", routed)
    monkeypatch.setattr(connection, "recover", back_at_once)

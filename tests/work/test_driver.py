"""The Work stream's driver (`_work._driver.StreamDriver`) on its own: the
frames it writes for the commands it sends, and what its reader does with a
frame that is neither a push nor a result."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import anyio
import pytest
import trio
from anyio.streams.memory import MemoryObjectReceiveStream

from ringo_trio._contract.work.client import RemoteProtocolError, State, WorkSession
from ringo_trio._contract.work.client_events import Drain
from ringo_trio._proto.ringo.v1 import Heartbeat, WorkRequest, WorkResponse
from ringo_trio._wire.codec import decode
from ringo_trio._work._driver import Frame, StreamDriver, StreamOwner


class _Session:
    """What the reader asks of a session for a heartbeat."""

    def __init__(self) -> None:
        self.heartbeats = 0

    def heartbeat(self) -> None:
        self.heartbeats += 1


@contextmanager
def _driver(
    session: object, owner: object = None
) -> Iterator[tuple[StreamDriver, MemoryObjectReceiveStream[Frame]]]:
    """A driver over `session` (and `owner`) whose written frames arrive in
    the stream given."""
    send, sent = anyio.create_memory_object_stream[Frame](10)
    with send, sent:
        yield StreamDriver(cast(WorkSession, session), send, cast(StreamOwner, owner)), sent


def _frames(*frames: object) -> MemoryObjectReceiveStream[Any]:
    """A closed stream of `frames` from the daemon, for the reader."""
    send, receive = anyio.create_memory_object_stream[Any](len(frames))
    with send:
        for frame in frames:
            send.send_nowait(frame)
    return receive


def test_a_drain_is_sent_as_the_drain_the_daemon_accepts() -> None:
    """Property: a worker's drain goes out as `drain{begin: true}`, the only
    drain the daemon accepts (a drain cannot be undone: `begin: false` is
    refused), with the command's request id; its waiter is registered."""

    async def main() -> None:
        with _driver(_Session()) as (driver, sent):
            waiter = driver.send_command(Drain(7))
            request = decode(sent.receive_nowait().data, WorkRequest)
            assert request.request_id == 7
            assert request.drain is not None
            assert request.drain.begin is True
            assert driver.waiters[7] is waiter

    trio.run(main)


def test_a_heartbeat_reaches_the_session_and_an_unknown_frame_is_a_protocol_error() -> None:
    """Property: the reader hands a heartbeat to the session (which counts
    the stream alive) and ends the stream with RemoteProtocolError on a
    frame that is no push, result, batch or heartbeat."""

    async def main() -> None:
        session = _Session()
        with _driver(session) as (driver, _):
            with _frames(WorkResponse(heartbeat=Heartbeat())) as receive:
                await driver.read(receive)
            assert session.heartbeats == 1
            with (
                _frames(WorkResponse()) as receive,
                pytest.raises(RemoteProtocolError, match="unexpected Work frame"),
            ):
                await driver.read(receive)
            assert session.heartbeats == 1

    trio.run(main)


class _QuietOwner:
    """An owner with no handler running (what `act` asks of it)."""

    def quiet(self) -> bool:
        return True

    def after_act(self) -> None:
        pass


def test_finishing_a_stream_ends_its_session_and_its_send_side() -> None:
    """Property: `finish` ends a session still open (a handler that returns
    later then finds nothing to settle into, instead of a closed stream)
    and closes the send side, whatever the session's state was."""

    async def main() -> None:
        session = WorkSession(concurrency=2, minor=7)
        session.register()
        session.registered(
            lease_duration=30.0, max_concurrency=2, ordered_request_ids=True, now=0.0
        )
        assert session.state is State.ACTIVE
        with _driver(session, _QuietOwner()) as (driver, _):
            await driver.finish(0)
            assert session.state is State.ENDED
            with pytest.raises(anyio.ClosedResourceError):
                driver.send.send_nowait(Frame(b""))

    trio.run(main)

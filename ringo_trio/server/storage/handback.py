"""Leases nobody received go back: a claim whose caller is cancelled while
it commits (`guard_claim`), and leases a stream claimed but never wrote
(`hand_back`), are released in a task of their own that the caller waits
for through its cancellation, bounded by `HAND_BACK_TIMEOUT`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import TypeVar

from ringo_trio._proto.ringo.v1 import LeaseRef

from .base import Storage

__all__ = ["HAND_BACK_TIMEOUT", "guard_claim", "hand_back"]

log = logging.getLogger("ringo_trio.server")

_R = TypeVar("_R")
_T = TypeVar("_T")

# Seconds a cancelled caller waits to hand back leases nobody received
# (`guard_claim`, `hand_back`): a claim and a release are one short statement
# each; one taking longer is stuck on an unreachable database, and its leases,
# if it ever commits, expire like those of any worker that vanished. Within
# the daemon's default shutdown timeout, which waits for the cancelled calls.
HAND_BACK_TIMEOUT = 5.0


async def guard_claim(
    storage: Storage,
    claim: Awaitable[_R],
    refs: Callable[[_R], Sequence[LeaseRef]],
    build: Callable[[_R], list[_T]],
    queue: str,
    now: datetime,
) -> list[_T]:
    """``build(await claim)``, such that no lease outlives a claim that does
    not return: `claim` commits leases of `queue` and answers with them
    (`refs` names them); `now` is the claim's own moment.

    A driver cancelled while it waits for a commit cannot say whether the
    commit happened (asyncpg sends a CancelRequest on another connection and
    drops the answer; a statement the server finished first stays
    committed), and nobody would ever see those leases. So the claim runs in
    a task of its own, shielded: a caller cancelled meanwhile waits for it
    (`hand_back`'s bound), releases whatever it leased, and only then goes on
    being cancelled. Released as of `now`, the leases are live by
    construction: each returns unless it changed meanwhile (cancelled, or
    expired by the reaper), as `release` says. `build` failing hands the
    leases back the same way. Either way `released_listener` hears of it."""
    claiming = asyncio.ensure_future(claim)
    try:
        rows = await asyncio.shield(claiming)
    except asyncio.CancelledError:

        async def release_when_done() -> int:
            try:
                rows = await claiming
            except BaseException:
                # Failed or cut short: nothing it could name was leased.
                return 0
            return await _release_logged(storage, refs(rows), queue, now)

        await _see_through(release_when_done())
        raise
    try:
        return build(rows)
    except BaseException:
        await _see_through(_release_logged(storage, refs(rows), queue, now))
        raise


async def hand_back(storage: Storage, refs: Sequence[LeaseRef], now: datetime) -> int:
    """`storage.release(refs, now)` for leases whose holder never heard of
    them, carried out even while the caller is being cancelled (at most
    `HAND_BACK_TIMEOUT`); a failure is logged, not raised. How many tasks
    went back to PENDING (0 when it failed)."""
    if not refs:
        return 0
    released = await _see_through(_release_logged(storage, refs, None, now))
    return released or 0


async def _release_logged(
    storage: Storage, refs: Sequence[LeaseRef], queue: str | None, now: datetime
) -> int:
    if not refs:
        return 0
    try:
        released = await storage.release(refs, now)
    except Exception:
        # Not raised over what ended the claim; the leases then expire.
        log.exception("handing back %d lease(s) nobody received failed", len(refs))
        return 0
    listener = storage.released_listener
    if released and queue is not None and listener is not None:
        listener(queue)
    return released


async def _see_through(work: Awaitable[_R]) -> _R | None:
    """`work`, run in a task of its own and waited for through any
    cancellation of the caller, for at most `HAND_BACK_TIMEOUT`; None when
    the bound ran out (`work` is then cancelled)."""
    running = asyncio.ensure_future(work)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + HAND_BACK_TIMEOUT
    while not running.done():
        left = deadline - loop.time()
        if left <= 0:
            running.cancel()
            log.warning(
                "handing back the leases of an abandoned claim took over %.1fs; given up"
                " (whatever it leased expires)",
                HAND_BACK_TIMEOUT,
            )
            return None
        try:
            await asyncio.wait((running,), timeout=left)
        except asyncio.CancelledError:
            # Cancelled again: the caller is being cancelled already and
            # raises that once this is done.
            continue
    return running.result()

"""Where a Ctrl-C may land: the SDK's own code is KI-protected, handlers are not.

Under trio, SIGINT raises KeyboardInterrupt in whatever frame was running,
unless that frame or one of its callers (up to its task's root) is marked
protected; then trio delivers it to the program's main task at its next
checkpoint instead. The SDK's tasks move protocol state between several
objects in plain synchronous steps (a frame read and applied to the Work
session, a lease settled and its slot freed, a stop's drain sent before its
releases): an exception between two such steps left leases that nobody
would release or a stream that nobody would read (issue 24: with only the
trio-asyncio island protected, 7 of 60 Ctrl-Cs at random moments still left
leases LEASED). Marked `protected`, they
never see the interrupt mid-step: the main task does, the cancellation it
causes reaches `Worker.run`, and that is the bounded stop every other
cancellation gets.

*A Ctrl-C during a stop.* The stop a first Ctrl-C (or any cancellation)
starts is bounded by ``stop_timeout`` and shielded, because it is what hands
the leases back; trio delivers a further Ctrl-C only to the main task, which
a shielded stop does not hear. So while such a stop runs, `abandon_on_interrupt`
puts a SIGINT handler in front of trio's: it cancels the stop's scope (through
the trio token, the signal-safe way in) and hands the signal on to trio's
handler unchanged. A second Ctrl-C therefore ends the stop at once — what is
left of it goes to lease expiry — and the program exits as trio makes it.
Only under trio, in the main thread, and only when the handler in place is a
Python callable (a program that ignores SIGINT keeps ignoring it).

A handler is the user's code: `unprotected` marks the one frame that calls
it, so a Ctrl-C lands in it as in any trio program (a busy loop without
checkpoints can still be interrupted) and `Handlers.handle` turns it into a
stop. Both are trio's own markers; under asyncio they change nothing
(asyncio.run turns SIGINT into a cancellation of the main task).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import types
from collections.abc import Callable
from typing import Any

import anyio
import sniffio
import trio
from trio.lowlevel import disable_ki_protection as unprotected
from trio.lowlevel import enable_ki_protection as protected

__all__ = ["abandon_on_interrupt", "forget", "protected", "unprotected"]

# The stops in progress a Ctrl-C abandons, and while any is: (the SIGINT
# handler that was in place before ours — trio's, nearly always —, ours).
_stops: set[anyio.CancelScope] = set()
_installed: tuple[Callable[[int, types.FrameType | None], Any], object] | None = None


def abandon_on_interrupt(scope: anyio.CancelScope) -> None:
    """Until `forget` (``scope``), a SIGINT cancels ``scope`` (a bounded stop
    in progress) before trio handles it as usual. A no-op where the rule does
    not apply."""
    global _installed
    if (
        sniffio.current_async_library() != "trio"
        or threading.current_thread() is not threading.main_thread()
    ):
        return
    if _installed is None:
        previous = signal.getsignal(signal.SIGINT)
        if not callable(previous):
            return
        token = trio.lowlevel.current_trio_token()

        def on_sigint(signum: int, frame: types.FrameType | None) -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(_abandon_stops, idempotent=True)
            previous(signum, frame)

        signal.signal(signal.SIGINT, on_sigint)
        _installed = (previous, on_sigint)
    _stops.add(scope)


def forget(scope: anyio.CancelScope) -> None:
    """The stop of ``scope`` is over (idempotent): the last one puts the
    SIGINT handler back as it was, unless somebody replaced ours meanwhile."""
    global _installed
    _stops.discard(scope)
    if not _stops and _installed is not None:
        previous, ours = _installed
        if signal.getsignal(signal.SIGINT) is ours:
            signal.signal(signal.SIGINT, previous)
        _installed = None


def _abandon_stops() -> None:
    for scope in list(_stops):
        scope.cancel()

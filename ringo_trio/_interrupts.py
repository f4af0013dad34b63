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

A handler is the user's code: `unprotected` marks the one frame that calls
it, so a Ctrl-C lands in it as in any trio program (a busy loop without
checkpoints can still be interrupted) and `Worker._handle` turns it into a
stop. Both are trio's own markers; under asyncio they change nothing
(asyncio.run turns SIGINT into a cancellation of the main task).
"""

from __future__ import annotations

from trio.lowlevel import disable_ki_protection as unprotected
from trio.lowlevel import enable_ki_protection as protected

__all__ = ["protected", "unprotected"]

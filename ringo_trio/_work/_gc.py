"""The cyclic garbage collector, set for a process whose main job is a Worker.

Why it matters: a worker's in-flight task holds a few dozen tracked objects
(its Task and context, the trio task, cancel scope and coroutine frame, the
settle it queues) for as long as the task is leased — 10-40 ms at the bench's
10 ms handlers with prefetch. CPython's default young generation collects
every 700 net allocations, which at 15,000 tasks/s is about once a
millisecond: nearly every in-flight object survives two young collections,
is promoted to the oldest generation, and makes a full collection due every
few thousand tasks — each one walks every object of the process, imported
modules included. In the bench (10 ms handlers, concurrency 256, SQLite)
that was a fifth of the worker's CPU (605 young, 55 middle and 4 full
collections per 10,000 tasks, 12 µs per task). With a young generation of
10,000 the objects die young, full collections all but stop, and the worker
does ~15 % more tasks per second (no-op: ~7 %); bench/results.md "Levers".

Setting the collector is the process owner's choice, never a library's
side effect: `ringo worker`, `ringo supervise`'s workers and `ringo demo`
call `tune_gc`; an application whose main job is a Worker calls it itself
(docs/worker.md "Garbage collection").
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000
"""Net allocations of tracked objects between young collections: enough that
a task's objects are freed before their second young collection, small
enough that cyclic garbage is still collected within milliseconds."""


def tune_gc() -> None:
    """Raise the collector's young-generation threshold to `YOUNG_THRESHOLD`
    (the other generations' thresholds kept), for a process whose main job
    is a `Worker`: see this module's docstring for the measurement.

    A threshold set higher already is kept, and a disabled collector stays
    disabled: the process owner's own setting wins."""
    young, *older = gc.get_threshold()
    if young < YOUNG_THRESHOLD:
        gc.set_threshold(YOUNG_THRESHOLD, *older)

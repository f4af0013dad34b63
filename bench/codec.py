"""Codec micro-benchmark: the shared generic codec vs hand-unrolled code vs betterproto2.

    python bench/codec.py [--repeat 5] [--batch 1000] [--unrolled REV]

µs per operation, best of ``--repeat`` samples (each sample runs >= 0.1 s;
a row's columns take their samples in turn, so load from elsewhere on a
shared machine falls on all of them alike).
Three columns per row:

* **generic**: `ringo_trio._wire.codec` over each frame's message (the
  daemon's frames in `ringo_trio._wire.work`, the references of the
  unrolled ones in ``tests/_kit/generic_frames.py``), including the SDK's model
  conversion where the SDK applies one;
* **tree unrolled**: this tree's hand-unrolled twin of the generic path,
  where it has one (`ringo_trio._wire.work`, `ringo_trio._work._frames`,
  `ringo_trio._queue._batch`);
* **unrolled**: the hand-unrolled codec this replaced, ``_fastwire.py`` as
  of git revision ``--unrolled`` (default ``cf773c5``, the last tree with it;
  loaded with ``git show``,
  so the figure stays reproducible after the file is gone);
* **betterproto2**: the generated dataclasses' own ``bytes()`` / ``parse``
  (plus the same model conversion).

Decoders cycle through 256 distinct frames (distinct ids and timestamps), so
the codec's timestamp memo only hits where one frame repeats a moment
(``created_at == available_at``, the task's ``lease_until`` and the lease's
``until``), as in a real stream. The task is realistic: a 26-character ULID,
16-byte payload, queue, type, retry backoff, a 32-hex lease token.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import subprocess
import sys
import timeit
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from itertools import cycle
from pathlib import Path
from types import ModuleType
from typing import Any

from ringo_trio import _models as models
from ringo_trio._proto.ringo.v1 import (
    AckRequest,
    EnqueueManyRequest,
    EnqueueManyResponse,
    EnqueueResult,
    Lease,
    LeasedTask,
    LeaseRef,
    RequestContext,
    RetryBackoff,
    Task,
    TaskState,
    WorkRequest,
    WorkResponse,
    WorkResult,
)
from ringo_trio._queue import _batch as _batch_wire
from ringo_trio._wire import work
from ringo_trio._wire.codec import decode
from ringo_trio._work import _frames as _work_wire

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the generic references live with the tests
from tests._kit import generic_frames as generic_frames  # noqa: E402

T0 = datetime(2026, 12, 2, 15, 30, 12, 345678, tzinfo=UTC)
TOKEN = "9f86d081884c7d659a2feaa0c55ad015"
CONTEXT = RequestContext(protocol_major=1, protocol_minor=8, session_token="s" * 32)
DISTINCT = 256


def _task(index: int, *, leased: bool) -> Task:
    created = T0 + timedelta(milliseconds=index)
    leased_at = created + timedelta(seconds=1, microseconds=234_567)
    return Task(
        id=f"01JE{index:022d}",
        queue="emails",
        task_type="send_welcome_email",
        payload=bytes(range(16)),
        state=TaskState.LEASED if leased else TaskState.PENDING,
        attempt=1 if leased else 0,
        max_attempts=5,
        retry_backoff=RetryBackoff(
            initial=timedelta(seconds=1), maximum=timedelta(minutes=5), multiplier=2.0
        ),
        created_at=created,
        updated_at=leased_at if leased else created,
        available_at=created,
        worker_id="host-4242-7f3a" if leased else "",
        lease_until=leased_at + timedelta(seconds=60) if leased else None,
    )


def _leased(index: int) -> LeasedTask:
    task = _task(index, leased=True)
    lease = Lease(
        task_id=task.id,
        attempt=1,
        lease_token=TOKEN,
        worker_id=task.worker_id,
        until=task.lease_until,
    )
    return LeasedTask(task=task, lease=lease)


def _unrolled(rev: str) -> ModuleType | None:
    """``ringo_trio/_fastwire.py`` at ``rev``, imported as a module of this tree's package."""
    try:
        source = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{rev}:ringo_trio/_fastwire.py"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    except subprocess.CalledProcessError:
        return None
    name = "ringo_trio._fastwire_reference"
    spec = importlib.util.spec_from_loader(name, loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "ringo_trio"
    sys.modules[name] = module
    exec(compile(source, f"{rev}:ringo_trio/_fastwire.py", "exec"), module.__dict__)
    return module


def best_us(funcs: list[Callable[[], object]], repeat: int) -> list[float]:
    """Best µs per call of each function; their samples alternate, so load from
    elsewhere on a shared machine falls on all of them alike."""
    timers = [timeit.Timer(func) for func in funcs]
    numbers = []
    for timer in timers:
        number = 1
        while timer.timeit(number) < 0.1:
            number *= 2
        numbers.append(number)
    best = [float("inf")] * len(funcs)
    for _ in range(repeat):
        for index, (timer, number) in enumerate(zip(timers, numbers, strict=True)):
            best[index] = min(best[index], timer.timeit(number) / number * 1e6)
    return best


def _cycling(items: list[Any], func: Callable[[Any], object]) -> Callable[[], object]:
    source = cycle(items)
    return lambda: func(next(source))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument(
        "--unrolled", default="cf773c5", help="git revision of _fastwire.py (the last one with it)"
    )
    args = parser.parse_args()
    repeat, batch = args.repeat, args.batch
    fw = _unrolled(args.unrolled)

    pushes = [_leased(i) for i in range(DISTINCT)]
    push_bytes = [bytes(WorkResponse(task=leased)) for leased in pushes]
    push_batches = [
        work.encode_work_response_batch(push_bytes[start : start + 32])
        for start in range(0, DISTINCT, 32)
    ]
    ok_bytes = bytes(WorkResponse(result=WorkResult(request_id=77)))
    pending = [(_task(i, leased=False), True) for i in range(batch)]
    for task, _ in pending:  # one daemon call stamps a batch with one clock reading
        task.created_at = task.updated_at = task.available_at = T0
    many = generic_frames.encode_enqueue_many_response(pending, batch, 0)
    specs = [
        models.TaskSpec(
            task_type="send_welcome_email", payload=bytes(range(16)), unique_key=f"user-{i}"
        )
        for i in range(batch)
    ]
    ack = generic_frames.encode_ack(1234, pushes[0].task.id, 1, TOKEN)  # type: ignore[union-attr]

    def bp_push(data: bytes) -> object:
        pushed = WorkResponse.parse(data).task
        assert pushed is not None
        return models.Task.from_wire(pushed.task)

    def bp_many() -> object:
        reply = EnqueueManyResponse.parse(many)
        return models.BatchResult(
            results=tuple(models.EnqueueResult.from_wire(r) for r in reply.results),
            created_count=reply.created_count,
            duplicate_count=reply.duplicate_count,
        )

    def bp_ack() -> object:
        return WorkRequest.parse(ack)

    Bench = Callable[[], object]
    rows: list[tuple[str, Bench, Bench | None, Bench | None, Bench, int]]
    rows = [
        # name, generic, tree unrolled, unrolled, betterproto2, items per call
        (
            "push decode (SDK: bytes -> PushedTask)",
            _cycling(push_bytes, generic_frames.decode_work_response),
            _cycling(push_bytes, _work_wire.decode_work_response),
            fw and _cycling(push_bytes, fw.decode_work_response),
            _cycling(push_bytes, bp_push),
            1,
        ),
        (
            "push batch decode (SDK: 32 pushes in one minor-10 frame)",
            _cycling(push_batches, generic_frames.decode_work_response),
            _cycling(push_batches, _work_wire.decode_work_response),
            None,
            _cycling(push_batches, WorkResponse.parse),
            32,
        ),
        (
            "push encode (daemon: LeasedTask -> bytes)",
            _cycling(pushes, work.encode_work_push),
            None,
            fw and _cycling(pushes, fw.encode_work_push),
            _cycling(pushes, lambda leased: bytes(WorkResponse(task=leased))),
            1,
        ),
        (
            "result encode (daemon: OK result)",
            lambda: work.encode_work_result(77, None, None),
            None,
            fw and (lambda: fw.encode_work_result(77, None, None)),
            lambda: bytes(WorkResponse(result=WorkResult(request_id=77))),
            1,
        ),
        (
            "result decode (SDK: OK result)",
            lambda: generic_frames.decode_work_response(ok_bytes),
            lambda: _work_wire.decode_work_response(ok_bytes),
            fw and (lambda: fw.decode_work_response(ok_bytes)),
            lambda: WorkResponse.parse(ok_bytes),
            1,
        ),
        (
            "ack encode (SDK)",
            lambda: generic_frames.encode_ack(1234, "01JE0000000000000000000001", 1, TOKEN),
            lambda: work.encode_ack(1234, "01JE0000000000000000000001", 1, TOKEN),
            fw and (lambda: fw.encode_ack(1234, "01JE0000000000000000000001", 1, TOKEN)),
            lambda: bytes(
                WorkRequest(
                    request_id=1234,
                    ack=AckRequest(
                        lease=LeaseRef(
                            task_id="01JE0000000000000000000001", attempt=1, lease_token=TOKEN
                        )
                    ),
                )
            ),
            1,
        ),
        (
            "ack decode (daemon, strict)",
            lambda: decode(ack, WorkRequest),
            None,
            None,
            bp_ack,
            1,
        ),
        (
            f"EnqueueMany request encode (SDK specs, {batch})",
            lambda: generic_frames.encode_enqueue_many_request_from_specs(CONTEXT, "emails", specs),
            lambda: _batch_wire.encode_enqueue_many_request(CONTEXT, "emails", specs),
            fw and (lambda: fw.encode_enqueue_many_request_from_specs(CONTEXT, "emails", specs)),
            lambda: bytes(
                EnqueueManyRequest(
                    context=CONTEXT, queue="emails", tasks=[s.to_wire() for s in specs]
                )
            ),
            batch,
        ),
        (
            f"EnqueueMany response encode (daemon, {batch})",
            lambda: generic_frames.encode_enqueue_many_response(pending, batch, 0),
            None,
            fw and (lambda: fw.encode_enqueue_many_response(pending, batch, 0)),
            lambda: bytes(
                EnqueueManyResponse(
                    results=[EnqueueResult(task=t, created=c) for t, c in pending],
                    created_count=batch,
                )
            ),
            batch,
        ),
        (
            f"EnqueueMany response decode (SDK: BatchResult, {batch})",
            lambda: generic_frames.decode_enqueue_many_response(many),
            lambda: _batch_wire.decode_enqueue_many_reply(many),
            fw and (lambda: fw.decode_enqueue_many_response(many)),
            bp_many,
            batch,
        ),
    ]

    print(
        f"# codec µs/op — CPython {platform.python_version()}, {platform.machine()}, "
        f"{os.cpu_count()} cores, best of {repeat}; unrolled = _fastwire.py at {args.unrolled}"
        + ("" if fw else " (not found)")
    )
    print()
    print("| operation | generic | tree unrolled | unrolled | betterproto2 | generic µs/item |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, generic, ours, unrolled, reference, items in rows:
        optional = [func for func in (ours, unrolled) if func is not None]
        generic_us, reference_us, *rest = best_us([generic, reference, *optional], repeat)
        cells = [f"{rest.pop(0):,.1f}" if func is not None else "—" for func in (ours, unrolled)]
        per_item = f"{generic_us / items:,.2f}" if items > 1 else ""
        print(
            f"| {name} | {generic_us:,.1f} | {' | '.join(cells)} | {reference_us:,.1f} "
            f"| {per_item} |"
        )
        sys.stdout.flush()


if __name__ == "__main__":
    main()

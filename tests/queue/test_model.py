"""A model-based test of the public API against one real daemon.

A hypothesis state machine enqueues, claims, acks, nacks, rejects, lets leases
expire and retries through `TaskQueue` / `LeasedTask`, and after every step
compares every task the daemon holds with a plain model. Properties checked:

* no task is lost (every enqueued key is found, with its id);
* no task is SUCCEEDED twice: an ack is accepted only for the current lease
  of a LEASED task, so a second ack of the same activation is LeaseLostError;
* a stale lease (settled, superseded by a reclaim, or expired) never changes
  a task: every operation on it raises LeaseLostError and the task is unchanged;
* claim hands out exactly the available tasks (up to its limit), each with
  attempt + 1; dedupe by unique key returns the existing task.
"""

from __future__ import annotations

import functools
import pathlib
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import anyio
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from ringo_trio import (
    FailedPreconditionError,
    LeasedTask,
    LeaseLostError,
    RetryBackoff,
    Ringo,
    RingoClient,
    TaskQueue,
    TaskState,
)
from ringo_trio.testing import DaemonProcess, spawn_daemon

_T = TypeVar("_T")

KEYS = st.sampled_from(["a", "b", "c", "d", "e"])
LONG_LEASE = timedelta(seconds=60)
SHORT_LEASE = timedelta(milliseconds=200)
# Every attempt available at once, and enough attempts that only reject kills.
NO_BACKOFF = RetryBackoff(initial=timedelta(0), maximum=timedelta(0))
MAX_ATTEMPTS = 100


@dataclass
class ModelTask:
    id: str
    state: str  # pending | leased | succeeded | dead
    attempt: int
    expired: bool = False  # leased, but the lease ran out (not yet reclaimed)
    activations: int = 1  # enqueue, then one per accepted retry
    successes: int = 0


@dataclass
class HeldLease:
    key: str
    leased: LeasedTask


class QueueMachine(RuleBasedStateMachine):
    leases = Bundle("leases")

    def __init__(self, portal: BlockingPortal, client: RingoClient) -> None:
        super().__init__()
        self.portal = portal
        self.queue: TaskQueue = client.queue(f"model-{uuid.uuid4().hex[:12]}")
        self.tasks: dict[str, ModelTask] = {}

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        async def guarded() -> Any:
            # Every step talks to a real daemon over a socket: bound it.
            with anyio.fail_after(30):
                return await fn(*args, **kwargs)

        return self.portal.call(guarded)

    # -- helpers ------------------------------------------------------------

    def is_current(self, held: HeldLease) -> bool:
        task = self.tasks[held.key]
        return task.state == "leased" and not task.expired and task.attempt == held.leased.attempt

    def claimable(self) -> set[str]:
        return {
            key
            for key, task in self.tasks.items()
            if task.state == "pending" or (task.state == "leased" and task.expired)
        }

    def take(self, got: list[LeasedTask], limit: int) -> list[HeldLease]:
        candidates = self.claimable()
        assert len(got) == min(limit, len(candidates)), (len(got), candidates)
        held = []
        for leased in got:
            key = leased.task.unique_key
            assert key in candidates, f"claimed {key}, which was not available"
            candidates.discard(key)
            task = self.tasks[key]
            assert leased.task.id == task.id
            assert leased.attempt == task.attempt + 1
            task.state, task.attempt, task.expired = "leased", leased.attempt, False
            held.append(HeldLease(key, leased))
        return held

    def settle(self, held: HeldLease, op: Callable[[], Any], new_state: str) -> None:
        if self.is_current(held):
            self.call(op)
            task = self.tasks[held.key]
            task.state = new_state
            if new_state == "succeeded":
                task.successes += 1
        else:
            with pytest.raises(LeaseLostError):
                self.call(op)

    # -- rules --------------------------------------------------------------

    @initialize(keys=st.lists(KEYS, min_size=1, max_size=3))
    def seed(self, keys: list[str]) -> None:
        for key in keys:
            self.enqueue(key)

    @rule(key=KEYS)
    def enqueue(self, key: str) -> None:
        result = self.call(
            self.queue.enqueue,
            task_type="t",
            unique_key=key,
            max_attempts=MAX_ATTEMPTS,
            retry_backoff=NO_BACKOFF,
        )
        if key in self.tasks:
            assert not result.created
            assert result.task.id == self.tasks[key].id
        else:
            assert result.created
            assert result.task.state is TaskState.PENDING
            self.tasks[key] = ModelTask(id=result.task.id, state="pending", attempt=0)

    @precondition(lambda self: self.claimable())
    @rule(target=leases, limit=st.integers(1, 3))
    def claim(self, limit: int) -> Any:
        got = self.call(self.queue.claim, limit, lease_duration=LONG_LEASE)
        return multiple(*self.take(got, limit))

    @precondition(lambda self: self.claimable())
    @rule(target=leases)
    def claim_and_expire(self) -> Any:
        got = self.call(self.queue.claim, 1, lease_duration=SHORT_LEASE)
        held = self.take(got, 1)
        if held:
            time.sleep(0.3)
            self.tasks[held[0].key].expired = True
        return multiple(*held)

    @rule(held=leases)
    def ack(self, held: HeldLease) -> None:
        self.settle(held, held.leased.ack, "succeeded")

    @rule(held=leases)
    def nack(self, held: HeldLease) -> None:
        self.settle(held, functools.partial(held.leased.nack, "nope"), "pending")

    @rule(held=leases)
    def reject(self, held: HeldLease) -> None:
        self.settle(held, functools.partial(held.leased.reject, "never"), "dead")

    @rule(held=leases)
    def extend(self, held: HeldLease) -> None:
        if self.is_current(held):
            self.call(held.leased.extend_lease, LONG_LEASE)
        else:
            with pytest.raises(LeaseLostError):
                self.call(held.leased.extend_lease, LONG_LEASE)

    @rule(key=KEYS)
    def retry(self, key: str) -> None:
        task = self.tasks.get(key)
        if task is None:
            return
        if task.state in ("succeeded", "dead"):
            retried = self.call(self.queue.retry, key)
            assert retried.id == task.id
            assert retried.state is TaskState.PENDING
            task.state = "pending"
            task.activations += 1
        else:
            with pytest.raises(FailedPreconditionError):
                self.call(self.queue.retry, key)

    # -- the check ----------------------------------------------------------

    @invariant()
    def daemon_matches_model(self) -> None:
        for key, task in self.tasks.items():
            stored = self.call(self.queue.get_by_unique_key, key)
            assert stored.id == task.id, f"task {key} lost or replaced"
            assert stored.attempt == task.attempt, (key, stored.attempt, task.attempt)
            expected = {
                "pending": {TaskState.PENDING},
                "succeeded": {TaskState.SUCCEEDED},
                "dead": {TaskState.DEAD},
                # An expired lease may be swept lazily, at the next claim.
                "leased": {TaskState.PENDING, TaskState.LEASED}
                if task.expired
                else {TaskState.LEASED},
            }[task.state]
            assert stored.state in expected, (key, stored.state, task)
            # At most one success per activation: never SUCCEEDED twice.
            assert task.successes <= task.activations


Served = tuple[BlockingPortal, RingoClient, DaemonProcess]


@pytest.fixture
def served_client(tmp_path: pathlib.Path) -> Iterator[Served]:
    with (
        spawn_daemon(tmp_path) as daemon,
        start_blocking_portal("trio") as portal,
        portal.wrap_async_context_manager(Ringo.connect(daemon.endpoint)) as client,
    ):
        yield portal, client, daemon


def test_queue_state_machine(served_client: Served) -> None:
    """Properties: no task lost, none SUCCEEDED twice, stale leases change nothing
    (see the module docstring), on a real daemon through the public API."""
    portal, client, daemon = served_client
    try:
        run_state_machine_as_test(
            lambda: QueueMachine(portal, client),
            settings=settings(
                max_examples=15,
                stateful_step_count=20,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
    except BaseException as exc:
        # One daemon serves every example: its log explains a failure that
        # outlives the example that caused it.
        exc.add_note(
            f"daemon running: {daemon.running}; stderr tail:\n{daemon.stderr_text()[-3000:]}"
        )
        raise

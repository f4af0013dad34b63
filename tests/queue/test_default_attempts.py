"""``max_attempts=0`` means the daemon's default (5), as it does on the wire,
wherever the SDK takes a max_attempts: `TaskSpec` (and `enqueue`'s keyword
arguments), `put_schedule`, typed tasks (`TaskRegistry`, ``@task``,
``configure``). A negative number is still refused before anything is sent."""

from __future__ import annotations

import pathlib
from datetime import timedelta

import pytest
import trio

from ringo_trio import InvalidArgumentError, PostgresStorage, Ringo, TaskRegistry, TaskSpec
from ringo_trio._contract.limits import DEFAULT_MAX_ATTEMPTS

pytestmark = pytest.mark.trio


async def test_task_spec_takes_zero_as_the_default() -> None:
    """Property: TaskSpec(max_attempts=0) is accepted and is the same spec as
    no max_attempts (one spelling of "the default": it reads back None);
    a negative number is refused naming the field and the range."""
    spec = TaskSpec("t", max_attempts=0)
    assert spec.max_attempts is None
    assert spec == TaskSpec("t")
    assert spec.to_wire().max_attempts == 0
    with pytest.raises(InvalidArgumentError, match="max_attempts must be between 0 and 10000"):
        TaskSpec("t", max_attempts=-1)


async def test_typed_tasks_take_zero_as_the_daemons_default() -> None:
    """Property: in a typed task's options 0 is the daemon's default and
    overrides a registry's or a decorator's number (the way back to the
    default); a negative number is refused where it is written."""
    tasks = TaskRegistry(max_attempts=3)

    @tasks.task(name="reset", max_attempts=0)
    def reset() -> None: ...

    @tasks.task(name="five", max_attempts=5)
    def five() -> None: ...

    assert reset.spec().max_attempts is None
    assert five.spec().max_attempts == 5
    assert five.configure(max_attempts=0).spec().max_attempts is None
    assert TaskRegistry(max_attempts=0).task(name="x")(lambda: None).spec().max_attempts is None
    with pytest.raises(InvalidArgumentError, match="max_attempts"):
        five.configure(max_attempts=-1)
    with pytest.raises(InvalidArgumentError, match="max_attempts"):
        TaskRegistry(max_attempts=-1)


@pytest.fixture(params=["sqlite", "postgres"])
def storage(request: pytest.FixtureRequest) -> str | PostgresStorage:
    if request.param == "sqlite":
        return "sqlite"
    return PostgresStorage(request.getfixturevalue("postgres_dsn"))


async def test_zero_stores_the_daemons_default_on_both_engines(
    tmp_path: pathlib.Path, storage: str | PostgresStorage
) -> None:
    """Property: a task enqueued with max_attempts=0 (a spec, keyword
    arguments, or enqueue_many) is stored with the daemon's default of 5,
    and a schedule put with max_attempts=0 is accepted and reads back as
    None (the default), on SQLite and on PostgreSQL."""
    with trio.fail_after(60):
        async with Ringo.local(tmp_path / "d", storage=storage) as client:
            queue = client.queue("q")
            one = (await queue.enqueue(TaskSpec("t", max_attempts=0))).task
            two = (await queue.enqueue(task_type="t", max_attempts=0)).task
            batch = await queue.enqueue_many([TaskSpec("t", max_attempts=0)])
            three = await queue.get_by_id(batch.results[0].task.id)
            assert [t.max_attempts for t in (one, two, three)] == [DEFAULT_MAX_ATTEMPTS] * 3
            stored = await queue.put_schedule("s", "t", every=timedelta(hours=1), max_attempts=0)
            assert stored.max_attempts is None
            with pytest.raises(InvalidArgumentError, match="max_attempts"):
                await queue.put_schedule("s", "t", every=timedelta(hours=1), max_attempts=-1)

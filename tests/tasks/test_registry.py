"""TaskRegistry and @registry.task without a daemon: names, options, refusals."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
import trio

from ringo_trio import InvalidArgumentError, RetryBackoff, TaskContext, TaskRegistry
from ringo_trio.testing import task_context

pytestmark = pytest.mark.trio


@dataclass
class Receipt:
    message_id: str


tasks = TaskRegistry()


@tasks.task(queue="emails", max_attempts=5)
async def send_email(to: str, subject: str, ctx: TaskContext) -> Receipt:
    await ctx.report_progress(0, 1, f"to {to}")
    return Receipt(message_id=f"{to}/{subject}")


@tasks.task(name="add", priority=3)
def add(a: int, b: int = 2) -> int:
    return a + b


async def test_the_default_name_is_module_and_qualname() -> None:
    """Property: a task's name (its task type on the wire) is
    ``module:qualname`` unless given, stable across imports."""
    assert send_email.name == f"{__name__}:send_email"
    assert add.name == "add"
    assert tasks["add"] is add
    assert "add" in tasks
    assert len(tasks) == 2
    assert [t.name for t in tasks] == [send_email.name, "add"]


async def test_options_merge_registry_task_and_call() -> None:
    """Property: registry defaults < decorator options < configure(), each
    call's spec carries the merged options and the encoded arguments."""
    local = TaskRegistry(queue="q0", max_attempts=2, priority=1)

    @local.task
    async def one(x: int) -> None: ...

    @local.task(queue="q1", max_attempts=7)
    async def two(x: int) -> None: ...

    assert (one.queue, one.options["max_attempts"], one.options["priority"]) == ("q0", 2, 1)
    assert (two.queue, two.options["max_attempts"], two.options["priority"]) == ("q1", 7, 1)
    later = datetime(2030, 1, 1, tzinfo=UTC)
    call = two.configure(unique_key="k", not_before=later, priority=9, queue="q2")
    spec = call.spec(5)
    assert (call.queue, spec.task_type, spec.unique_key, spec.priority) == ("q2", two.name, "k", 9)
    assert spec.not_before == later
    assert spec.max_attempts == 7
    assert json.loads(spec.payload) == {"x": 5}
    # delay replaces not_before (one schedule per task), and the original is unchanged.
    assert call.configure(delay=timedelta(minutes=5)).spec(1).not_before is None
    assert two.options["unique_key"] is None
    backoff = RetryBackoff(initial=timedelta(seconds=1))
    assert two.configure(retry_backoff=backoff).spec(1).retry_backoff == backoff


async def test_bad_options_and_arguments_are_refused_where_they_are_written() -> None:
    """Property: an invalid option is an InvalidArgumentError at decoration
    or configure time; arguments that do not fit the signature at spec time
    (nothing enqueued)."""
    local = TaskRegistry()
    with pytest.raises(InvalidArgumentError):
        local.task(priority=2**40)(add.fn)
    with pytest.raises(InvalidArgumentError):
        local.task(queue="")(add.fn)
    with pytest.raises(InvalidArgumentError):
        add.configure(max_attempts=-1)
    with pytest.raises(InvalidArgumentError):
        add.configure(delay=timedelta(minutes=1), not_before=datetime(2030, 1, 1, tzinfo=UTC))
    with pytest.raises(InvalidArgumentError):
        add.spec(1, 2, 3)
    with pytest.raises(InvalidArgumentError):
        add.spec(b=2)
    with pytest.raises(InvalidArgumentError):
        send_email.spec(to="a", subject="b", nope=1)


async def test_a_name_twice_in_one_registry_is_refused() -> None:
    """Property: two functions may not share a name in one registry (the
    second would silently take the first's tasks)."""
    local = TaskRegistry()

    @local.task(name="same")
    async def first() -> None: ...

    with pytest.raises(InvalidArgumentError, match="already in this registry"):

        @local.task(name="same")
        async def second() -> None: ...

    assert local["same"] is first
    assert len(local) == 1


async def test_enqueue_many_with_a_unique_key_is_refused() -> None:
    """Property: one unique key for many tasks would dedupe all but one away:
    refused before anything is sent."""
    with pytest.raises(InvalidArgumentError, match="unique_key"):
        await add.configure(unique_key="k").enqueue_many(None, [{"a": 1}])  # type: ignore[arg-type]


async def test_calling_a_task_calls_the_function_with_a_test_context() -> None:
    """Property: a task function stays callable as written; with the testing
    kit's task_context its progress reports are recorded."""
    ctx = task_context()
    receipt = await send_email("a@example.org", "hi", ctx=ctx)
    assert receipt == Receipt("a@example.org/hi")
    assert [p.message for p in ctx.progress] == ["to a@example.org"]
    assert add(1) == 3


async def test_run_decodes_calls_and_encodes_like_the_worker() -> None:
    """Property: `TaskFunction.run` (what the router calls) turns the payload
    into arguments, passes the context, and the return value into the
    stored result; a payload that does not validate is permanent."""
    from ringo_trio import PermanentTaskError

    ctx = task_context(task_type=send_email.name, payload=b'{"to": "x", "subject": "y"}')
    stored = await send_email.run(ctx.task, ctx)
    assert stored is not None
    assert json.loads(stored) == {"message_id": "x/y"}
    bad = task_context(task_type=send_email.name, payload=b'{"to": 1}')
    with pytest.raises(PermanentTaskError, match=r"subject|to"):
        await send_email.run(bad.task, bad)
    # A plain function runs in a worker thread, not on the event loop.
    loop_thread: list[bool] = []

    @TaskRegistry().task
    def where() -> bool:
        try:
            trio.lowlevel.current_task()
        except RuntimeError:
            loop_thread.append(False)
            return False
        loop_thread.append(True)
        return True

    ctx = task_context(task_type=where.name, payload=b"{}")
    assert await where.run(ctx.task, ctx) == b"false"
    assert loop_thread == [False]


async def test_a_worker_needs_a_queue_the_registry_has() -> None:
    """Property: a registry whose tasks span queues needs queue= to choose,
    and a queue without its tasks is refused (a worker of nothing)."""
    with pytest.raises(InvalidArgumentError, match="give queue="):
        tasks.handler()
    with pytest.raises(InvalidArgumentError, match="no task on queue"):
        tasks.handler("elsewhere")
    router = tasks.handler("emails")
    assert router.task_types == [send_email.name]
    assert router.queue == "emails"
    with pytest.raises(InvalidArgumentError, match="no tasks"):
        TaskRegistry().handler()

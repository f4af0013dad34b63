"""The hypothesis helpers: valid specs, outcome scripts and the model of where they end."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ringo_trio import TaskSpec, TaskState
from ringo_trio.testing import RingoTestEnv
from ringo_trio.testing.strategies import (
    Outcome,
    expected_history,
    outcome_scripts,
    scripted_handler,
    task_specs,
)

CASES = st.lists(st.tuples(task_specs(), outcome_scripts()), min_size=1, max_size=4)


@pytest.mark.trio
@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(cases=CASES)
async def test_every_task_ends_where_its_script_says(
    autojump_clock: trio.testing.MockClock, cases: list[tuple[TaskSpec, list[Outcome]]]
) -> None:
    """Property: for any valid specs (delays, backoffs, priorities) and any
    per-attempt outcome scripts, working the queue until settled leaves every
    task in the state, attempt count and last error the model predicts —
    the daemon accepts every drawn spec and applies the retry rules."""
    with trio.fail_after(30 * 24 * 3600):  # virtual: a queue that never settles fails
        await check_cases(cases)


async def check_cases(cases: list[tuple[TaskSpec, list[Outcome]]]) -> None:
    async with RingoTestEnv.start() as env:
        queue = env.client.queue("prop")
        scripts: dict[str, list[Outcome]] = {}
        expected = {}
        for spec, script in cases:
            result = await queue.enqueue(spec)
            task = result.task
            scripts[task.id] = script
            expected[task.id] = expected_history(script, task.max_attempts)
        await env.run_worker(queue, scripted_handler(scripts), until="settled")
        for task_id, (state, attempts, error) in expected.items():
            task = await queue.get_by_id(task_id)
            assert (task.state, task.attempt, task.last_error) == (state, attempts, error)


def test_the_model_of_a_script() -> None:
    """Property: expected_history follows the retry rules: ack succeeds, reject
    is dead at once, retries and crashes spend attempts up to max_attempts,
    and the last error survives a later success."""
    assert expected_history([], 3) == (TaskState.SUCCEEDED, 1, None)
    assert expected_history(["crash", "ack"], 3) == (
        TaskState.SUCCEEDED,
        2,
        "RuntimeError: scripted crash (attempt 1)",
    )
    assert expected_history(["retry", "reject"], 5) == (
        TaskState.DEAD,
        2,
        "scripted reject (attempt 2)",
    )
    assert expected_history(["retry", "retry", "retry"], 2) == (
        TaskState.DEAD,
        2,
        "scripted retry (attempt 2)",
    )

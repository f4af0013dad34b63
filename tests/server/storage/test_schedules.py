"""Schedules in storage, both engines: put/list/delete/pause, the firing's
exactly-once (compare-and-set, unique tick keys), misfire policies, and a
model of random operations with faults injected into the firing."""

from __future__ import annotations

import asyncio
import pathlib
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from ringo_trio._contract import limits
from ringo_trio._contract.cron import Every, parse_cron
from ringo_trio._proto.ringo.v1 import MisfirePolicy, Schedule
from ringo_trio.server.storage.base import FailedPrecondition, NotFound
from ringo_trio.server.storage.schedules import tick_key
from tests._kit.storage import EngineKind, SyncEngine, open_engine, spec, walk

T0 = datetime(2030, 1, 1, tzinfo=UTC)
LIMIT = 100


def sched(name: str = "s", **fields: Any) -> Schedule:
    fields.setdefault("task_type", "tick")
    fields.setdefault("queue", "q")
    fields.setdefault("misfire", MisfirePolicy.SKIP)
    fields.setdefault("catch_up", 1)
    return Schedule(name=name, **fields)


def keys(engine: SyncEngine, queue: str = "q") -> list[str]:
    return sorted(t.unique_key for t in walk(engine, queue, limit=1000))


def put(engine: SyncEngine, s: Schedule, now: datetime) -> Schedule:
    stored, _ = engine.put_schedule(s, now, max_per_queue=limits.MAX_SCHEDULES_PER_QUEUE)
    return stored  # type: ignore[no-any-return]


def test_put_list_delete(engine: SyncEngine) -> None:
    """Property: a put schedule is listed with next_fire_at from now; a
    re-put with the same timing keeps next_fire_at and counters; a changed
    expression recomputes it; delete says whether it existed."""
    stored, created = engine.put_schedule(
        sched(cron="0 * * * *"), T0 + timedelta(minutes=5), max_per_queue=10
    )
    assert created
    assert stored.next_fire_at == T0 + timedelta(hours=1)
    assert engine.list_schedules(None) == [stored]
    again, created = engine.put_schedule(
        sched(cron="0 * * * *", priority=3), T0 + timedelta(minutes=59), max_per_queue=10
    )
    assert not created
    assert again.next_fire_at == T0 + timedelta(hours=1)
    assert again.priority == 3
    changed = put(engine, sched(cron="30 * * * *"), T0 + timedelta(minutes=40))
    assert changed.next_fire_at == T0 + timedelta(hours=1, minutes=30)
    assert changed.created_at == stored.created_at
    assert engine.list_schedules("other") == []
    assert engine.delete_schedule("q", "s") is True
    assert engine.delete_schedule("q", "s") is False
    assert engine.list_schedules(None) == []


def test_a_re_put_replaces_what_the_task_will_be(engine: SyncEngine) -> None:
    """Property: putting a schedule again with another task type, payload,
    priority or attempts stores all of them (the firing's tasks are made
    from the stored row), keeping its timing, counters and creation time."""
    first = put(engine, sched(every=timedelta(minutes=1), payload=b"old"), T0)
    again = put(
        engine,
        sched(every=timedelta(minutes=1), task_type="other", payload=b"new", max_attempts=7),
        T0 + timedelta(seconds=5),
    )
    assert (again.task_type, again.payload, again.max_attempts) == ("other", b"new", 7)
    assert (again.next_fire_at, again.created_at) == (first.next_fire_at, first.created_at)
    assert engine.list_schedules("q") == [again]
    [task] = engine.fire_schedules(T0 + timedelta(minutes=1), LIMIT).created
    assert (task.task_type, task.payload, task.max_attempts) == ("other", b"new", 7)


def test_schedules_per_queue_are_bounded(engine: SyncEngine) -> None:
    """Property: past max_per_queue a new schedule is refused; an existing one changes."""
    for i in range(3):
        engine.put_schedule(sched(f"s{i}", every=timedelta(seconds=5)), T0, max_per_queue=3)
    with pytest.raises(FailedPrecondition):
        engine.put_schedule(sched("s9", every=timedelta(seconds=5)), T0, max_per_queue=3)
    engine.put_schedule(sched("s0", every=timedelta(seconds=9)), T0, max_per_queue=3)
    engine.put_schedule(sched("s0", every=timedelta(seconds=9)), T0, max_per_queue=3)
    engine.put_schedule(sched("x", queue="other", every=timedelta(1)), T0, max_per_queue=3)


def _run_until(engine: SyncEngine, end: datetime) -> int:
    """Fire at every next_due up to `end`, as the daemon's loop does; the firings."""
    firings = 0
    report = engine.fire_schedules(T0, LIMIT)
    while report.next_due is not None and report.next_due <= end:
        report = engine.fire_schedules(report.next_due, LIMIT)
        firings += 1
    return firings


def test_daily_for_a_month(engine: SyncEngine) -> None:
    """Property: a daily schedule fired at its own times for 30 days makes 30
    tasks, one per day, keyed by the tick."""
    put(engine, sched(cron="0 9 * * *", timezone="Europe/Berlin"), T0)
    _run_until(engine, T0 + timedelta(days=30))
    ticks = [datetime(2030, 1, d, 8, tzinfo=UTC) for d in range(1, 31)]
    assert keys(engine) == sorted(tick_key("s", t) for t in ticks)
    [stored] = engine.list_schedules("q")
    assert (stored.fired, stored.skipped) == (30, 0)
    assert stored.last_task_id == engine.get("q", unique_key=tick_key("s", ticks[-1])).id


def test_pause_resume_has_no_burst(engine: SyncEngine) -> None:
    """Property: ticks due while paused never fire; resume starts from now."""
    put(engine, sched(every=timedelta(minutes=1), misfire=MisfirePolicy.CATCH_UP, catch_up=50), T0)
    engine.fire_schedules(T0 + timedelta(minutes=1), LIMIT)
    paused = engine.set_schedule_paused("q", "s", True, T0 + timedelta(minutes=1, seconds=1))
    assert paused.paused
    assert paused.next_fire_at is None
    assert engine.fire_schedules(T0 + timedelta(minutes=30), LIMIT).created == []
    resumed = engine.set_schedule_paused("q", "s", False, T0 + timedelta(minutes=30, seconds=30))
    assert resumed.next_fire_at == T0 + timedelta(minutes=31)
    report = engine.fire_schedules(T0 + timedelta(minutes=31), LIMIT)
    assert [t.unique_key for t in report.created] == [tick_key("s", T0 + timedelta(minutes=31))]
    with pytest.raises(NotFound):
        engine.set_schedule_paused("q", "nope", True, T0)


@pytest.mark.parametrize(
    ("misfire", "catch_up", "fired_minutes", "skipped"),
    [
        (MisfirePolicy.SKIP, 1, [], 10),
        (MisfirePolicy.CATCH_UP, 3, [8, 9, 10], 7),
        (MisfirePolicy.CATCH_UP, 1, [10], 9),
        (MisfirePolicy.CATCH_UP, 50, list(range(1, 11)), 0),
    ],
)
def test_misfire_after_an_outage(
    engine: SyncEngine,
    misfire: MisfirePolicy,
    catch_up: int,
    fired_minutes: list[int],
    skipped: int,
) -> None:
    """Property: after an outage SKIP fires none of the stale ticks, CATCH_UP
    the latest `catch_up`; the rest are counted skipped; the next tick is in
    the future."""
    put(engine, sched(cron="1-10 * * * *", misfire=misfire, catch_up=catch_up), T0)
    now = T0 + timedelta(minutes=10, seconds=61)  # tick 10 is just past the grace
    report = engine.fire_schedules(now, LIMIT)
    assert keys(engine) == sorted(tick_key("s", T0 + timedelta(minutes=m)) for m in fired_minutes)
    assert report.skipped == {("q", "s"): skipped}
    [stored] = engine.list_schedules("q")
    assert stored.next_fire_at == T0 + timedelta(hours=1, minutes=1)
    assert (stored.fired, stored.skipped) == (len(fired_minutes), skipped)


def test_the_grace_includes_its_last_microsecond(engine: SyncEngine) -> None:
    """Property: SKIP fires a tick exactly `SCHEDULE_GRACE` late, not one
    µs later."""
    put(engine, sched(cron="1-10 * * * *"), T0)
    on_the_edge = T0 + timedelta(minutes=10) + limits.SCHEDULE_GRACE
    report = engine.fire_schedules(on_the_edge, LIMIT)
    assert keys(engine) == [tick_key("s", T0 + timedelta(minutes=10))]
    assert report.skipped == {("q", "s"): 9}


@pytest.mark.parametrize("catch_up", [1, 4])
def test_a_tick_at_the_edge_of_the_search_is_counted_once(
    engine: SyncEngine, catch_up: int
) -> None:
    """Property: firing exactly on a tick after an outage (so the search for
    the latest ticks starts on a tick too) fires the latest `catch_up` and
    counts every other tick skipped exactly once."""
    put(engine, sched(cron="* * * * *", misfire=MisfirePolicy.CATCH_UP, catch_up=catch_up), T0)
    report = engine.fire_schedules(T0 + timedelta(minutes=10), LIMIT)
    latest = range(11 - catch_up, 11)
    assert keys(engine) == sorted(tick_key("s", T0 + timedelta(minutes=m)) for m in latest)
    assert report.skipped == {("q", "s"): 10 - catch_up}


def test_putting_an_unchanged_schedule_again_keeps_its_due_tick(engine: SyncEngine) -> None:
    """Property: an application that puts its schedules at every start
    (the usual way) does not lose a tick that came due while it was down:
    a re-put with the same timing keeps the overdue ``next_fire_at``, and
    the next firing fires it (within the grace) with the schedule's
    priority and attempts, read back from the store as they were put. A
    re-put that pauses stores no next tick; one that resumes starts from
    now, as a resume does."""
    put(engine, sched(cron="0 * * * *", priority=3, max_attempts=5), T0 + timedelta(minutes=5))
    late = T0 + timedelta(hours=1, seconds=20)  # the 01:00 tick is due, not fired yet
    again = put(engine, sched(cron="0 * * * *", priority=3, max_attempts=5), late)
    assert again.next_fire_at == T0 + timedelta(hours=1)
    assert engine.list_schedules("q") == [again]
    report = engine.fire_schedules(late, LIMIT)
    [task] = report.created
    assert task.unique_key == tick_key("s", T0 + timedelta(hours=1))
    assert (task.priority, task.max_attempts) == (3, 5)
    paused = put(engine, sched(cron="0 * * * *", paused=True), T0 + timedelta(hours=1, minutes=1))
    assert paused.next_fire_at is None
    # Resumed by a re-put after 02:00 and 03:00 came due while paused: neither fires.
    resumed = put(engine, sched(cron="0 * * * *"), T0 + timedelta(hours=3, seconds=10))
    assert resumed.next_fire_at == T0 + timedelta(hours=4)


def test_skip_fires_the_tick_on_time(engine: SyncEngine) -> None:
    """Property: SKIP fires the latest tick when it is within the grace."""
    put(engine, sched(every=timedelta(seconds=10)), T0)
    report = engine.fire_schedules(T0 + timedelta(seconds=35), LIMIT)
    assert [t.unique_key for t in report.created] == [tick_key("s", T0 + timedelta(seconds=30))]
    assert report.skipped == {("q", "s"): 2}


def _by_queue_and_name(engine: SyncEngine) -> dict[tuple[str, str], Schedule]:
    return {(x.queue, x.name): x for x in engine.list_schedules(None)}


def test_each_schedule_is_its_own(engine: SyncEngine) -> None:
    """Property: a schedule is named by its queue and its name together:
    pausing, firing or deleting one leaves a schedule of the same name in
    another queue, and another schedule of the same queue, as they were --
    also when all of them are due at the same moment."""
    minute = timedelta(minutes=1)
    for queue, name in (("q", "s"), ("q", "t"), ("other", "s")):
        put(engine, sched(name, queue=queue, every=minute), T0)
    paused = engine.set_schedule_paused("q", "s", True, T0 + timedelta(seconds=1))
    assert (paused.paused, paused.next_fire_at) == (True, None)
    by_name = _by_queue_and_name(engine)
    assert not by_name["q", "t"].paused
    assert not by_name["other", "s"].paused
    assert by_name["q", "t"].next_fire_at == by_name["other", "s"].next_fire_at == T0 + minute

    report = engine.fire_schedules(T0 + minute, LIMIT)
    assert report.fired == {("q", "t"): 1, ("other", "s"): 1}
    assert sorted(t.queue for t in report.created) == ["other", "q"]
    by_name = _by_queue_and_name(engine)
    assert (by_name["q", "s"].paused, by_name["q", "s"].next_fire_at) == (True, None)
    assert by_name["q", "s"].fired == 0
    assert by_name["q", "s"].last_task_id == ""
    for queue, name in (("q", "t"), ("other", "s")):
        mine = by_name[queue, name]
        assert (mine.fired, mine.next_fire_at) == (1, T0 + 2 * minute)
        assert mine.last_task_id == engine.get(queue, unique_key=tick_key(name, T0 + minute)).id

    assert engine.delete_schedule("q", "s") is True
    assert sorted((x.queue, x.name) for x in engine.list_schedules(None)) == [
        ("other", "s"),
        ("q", "t"),
    ]


def test_a_firing_says_more_only_when_more_are_due(engine: SyncEngine) -> None:
    """Property: a firing takes at most `limit` due schedules, soonest
    first, and says `more` exactly when due schedules were left (the
    daemon then fires again at once, instead of at the next due moment);
    schedules not yet due neither fire nor count."""
    minute = timedelta(minutes=1)
    for i in range(2):
        put(engine, sched(f"due{i}", every=minute), T0)
    put(engine, sched("later", every=timedelta(hours=1)), T0)
    exactly = engine.fire_schedules(T0 + minute, 2)
    assert (set(exactly.fired), exactly.more) == ({("q", "due0"), ("q", "due1")}, False)
    put(engine, sched("due2", every=minute), T0 + minute)
    first = engine.fire_schedules(T0 + 2 * minute, 2)
    assert (len(first.fired), first.more) == (2, True)
    rest = engine.fire_schedules(T0 + 2 * minute, 2)
    assert (len(rest.fired), rest.more) == (1, False)
    assert set(first.fired) | set(rest.fired) == {("q", "due0"), ("q", "due1"), ("q", "due2")}
    assert ("q", "later") not in set(first.fired) | set(rest.fired) | set(exactly.fired)


def test_the_last_task_of_a_catch_up_is_its_latest_tick(engine: SyncEngine) -> None:
    """Property: a firing that catches up several ticks at once records the
    task of the latest of them as the schedule's last task (what
    ListSchedules and the dashboard show)."""
    put(engine, sched(cron="* * * * *", misfire=MisfirePolicy.CATCH_UP, catch_up=3), T0)
    report = engine.fire_schedules(T0 + timedelta(minutes=5), LIMIT)
    assert len(report.created) == 3
    [stored] = engine.list_schedules("q")
    latest = engine.get("q", unique_key=tick_key("s", T0 + timedelta(minutes=5)))
    assert stored.last_task_id == latest.id


def test_a_tick_whose_task_exists_points_at_that_task(engine: SyncEngine) -> None:
    """Property: when a tick's task already exists (its key enqueued by
    hand, or by a firing that another daemon committed), the firing
    creates no task and records the existing one as the schedule's last
    task, never the id of a task it did not store."""
    put(engine, sched(every=timedelta(minutes=1)), T0)
    due = T0 + timedelta(minutes=1)
    [existing] = engine.enqueue("q", [spec(task_type="tick", unique_key=tick_key("s", due))], T0)
    report = engine.fire_schedules(due, LIMIT)
    assert report.created == []
    assert report.fired == {("q", "s"): 1}
    [stored] = engine.list_schedules("q")
    assert stored.last_task_id == existing.task.id


def test_two_engines_fire_each_tick_once(engine_kind: EngineKind, tmp_path: pathlib.Path) -> None:
    """Property: two engines on one store firing at once (PostgreSQL: two
    pools racing; SQLite: two connections) make one task per tick."""
    with open_engine(engine_kind, tmp_path) as a:
        b = engine_kind.make(tmp_path)
        a.run(b.open())
        try:
            put(
                a, sched(every=timedelta(seconds=1), misfire=MisfirePolicy.CATCH_UP, catch_up=5), T0
            )

            async def race(now: datetime) -> None:
                await asyncio.gather(
                    a.raw.fire_schedules(now, LIMIT),
                    b.fire_schedules(now, LIMIT),
                    a.raw.fire_schedules(now, LIMIT),
                    b.fire_schedules(now, LIMIT),
                )

            for second in range(1, 41, 2):
                a.run(race(T0 + timedelta(seconds=second)))
            expected = sorted(tick_key("s", T0 + timedelta(seconds=s)) for s in range(1, 40))
            assert keys(a) == expected
            [stored] = a.list_schedules("q")
            assert stored.fired == 39
        finally:
            a.run(b.close())


class _Fault(Exception):
    pass


_POINTS = ["read", "cas", "insert", "commit"]
#: The model's schedules' `catch_up`: a one-second schedule left unfired for
#: over 100 s has more ticks due than that, and the oldest are skipped.
CATCH_UP = 100
_TIMINGS = st.one_of(
    st.integers(1, 20).map(lambda s: {"every": timedelta(seconds=s)}),
    st.sampled_from(["*/7 * * * * *", "0,30 * * * * *", "*/3 * * * * *", "* * * * *"]).map(
        lambda c: {"cron": c}
    ),
)


class ScheduleModel(RuleBasedStateMachine):
    """Random puts, pauses, resumes, time steps and firings, some failing at
    a point of their transaction, against a model from the tick expansion.

    Property: the set of tick tasks is exactly the model's: the latest
    `CATCH_UP` ticks due at each successful firing (CATCH_UP: every tick of
    an active stretch up to it while a firing finds no more than that due),
    or the latest one (SKIP); a failed firing adds nothing and loses nothing."""

    engine: SyncEngine
    cases = 0

    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        # name -> (timing, misfire, marker: ticks after it are still to fire, active)
        self.model: dict[str, dict[str, Any]] = {}
        self.expected: set[str] = set()

    @initialize()
    def clean(self) -> None:
        self.engine.raw.schedule_fault = None
        for s in self.engine.list_schedules(None):
            self.engine.delete_schedule(s.queue, s.name)
        ScheduleModel.cases += 1
        self.queue = f"model{self.cases}"

    @rule(
        timing=_TIMINGS,
        catch_up=st.booleans(),
        name=st.sampled_from(["a", "b", "c"]),
    )
    def put_new(self, timing: dict[str, Any], catch_up: bool, name: str) -> None:
        if name in self.model:
            return
        misfire = MisfirePolicy.CATCH_UP if catch_up else MisfirePolicy.SKIP
        stored = put(
            self.engine,
            sched(name, queue=self.queue, misfire=misfire, catch_up=CATCH_UP, **timing),
            self.now,
        )
        t = (
            parse_cron(timing["cron"])
            if "cron" in timing
            else Every(timing["every"], stored.created_at)
        )
        self.model[name] = {
            "timing": t,
            "misfire": misfire,
            "marker": self.now,
            "active": True,
            "spec": timing,
        }

    @rule(name=st.sampled_from(["a", "b", "c"]))
    def put_again(self, name: str) -> None:
        """The same schedule put again (an application's every start): an
        active one keeps its due ticks; a paused one is resumed from now."""
        if name not in self.model:
            return
        m = self.model[name]
        put(
            self.engine,
            sched(name, queue=self.queue, misfire=m["misfire"], catch_up=CATCH_UP, **m["spec"]),
            self.now,
        )
        if not m["active"]:
            m["active"] = True
            m["marker"] = self.now

    @rule(name=st.sampled_from(["a", "b", "c"]), paused=st.booleans())
    def pause(self, name: str, paused: bool) -> None:
        if name not in self.model:
            return
        self.engine.set_schedule_paused(self.queue, name, paused, self.now)
        m = self.model[name]
        if m["active"] == (not paused):
            return
        m["active"] = not paused
        m["marker"] = self.now

    @rule(seconds=st.integers(1, 50))
    def advance(self, seconds: int) -> None:
        self.now += timedelta(seconds=seconds)

    @rule(fault=st.sampled_from([None, None, *_POINTS]))
    def fire(self, fault: str | None) -> None:
        def hook(point: str) -> None:
            if point == fault:
                raise _Fault(point)

        self.engine.raw.schedule_fault = hook
        try:
            self.engine.fire_schedules(self.now, LIMIT)
        except _Fault:
            return  # rolled back: the model stays as it is
        finally:
            self.engine.raw.schedule_fault = None
        for name, m in self.model.items():
            if not m["active"]:
                continue
            ticks = []
            t = m["timing"].next_fire(m["marker"])
            while t <= self.now:
                ticks.append(t)
                t = m["timing"].next_fire(t)
            ticks = ticks[-1:] if m["misfire"] == MisfirePolicy.SKIP else ticks[-CATCH_UP:]
            self.expected |= {tick_key(name, tick) for tick in ticks}
            if ticks:
                m["marker"] = ticks[-1]

    @invariant()
    def tasks_are_the_models(self) -> None:
        assert set(keys(self.engine, self.queue)) == self.expected


def test_schedule_model(engine: SyncEngine) -> None:
    ScheduleModel.engine = engine

    class Case(ScheduleModel):
        pass

    Case.TestCase.settings = settings(
        max_examples=25,
        stateful_step_count=25,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    Case.TestCase().runTest()

"""A schedule's state, its record and the fire step (delaywheel/schedules/state.py).

Pure: each test passes ``now``, so a clock stepped back or forward is just
another ``now``.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from delaywheel.schedules.spec import check_schedule
from delaywheel.schedules.state import (
    ScheduleState,
    first_fire_ms,
    plan_fire,
    read_record,
    to_record,
)

NOW_MS = int(datetime(2026, 1, 5, tzinfo=timezone.utc).timestamp()) * 1000
MINUTE_MS = 60_000


def state(**fields: Any) -> ScheduleState:
    fields.setdefault("id", "tick")
    if "cron" not in fields:
        fields.setdefault("every", 60)
    fields.setdefault("topic", "t")
    schedule = check_schedule(fields, 0.01, NOW_MS)
    return ScheduleState(schedule, next_ms=schedule.first_after(NOW_MS))


def test_the_record_round_trips_and_refuses_what_it_did_not_write() -> None:
    made = replace(
        state(cron="30 1 * * *", tz="Europe/London", jitter=5, body=b"\x00", max_runs=3),
        version=4,
        paused=True,
        note="holiday",
        last_fired_ms=NOW_MS - MINUTE_MS,
        counts={"fired": 2, "skipped": 1, "missed": 7},
    )
    back = read_record(to_record(made))
    assert back == made
    # The zone's name, not its offset: a tzdata update applies to later occurrences.
    assert msgpack.unpackb(to_record(made))[2]["tz"] == "Europe/London"
    assert back.to_map()["counts"] == {"fired": 2, "skipped": 1, "missed": 7}
    assert back.to_map()["next"] == made.next_ms / 1000  # type: ignore[operator]
    with pytest.raises(ValueError, match="not a schedule record"):
        read_record(msgpack.packb([1, "topic"]))
    with pytest.raises(ValueError, match="version 9"):
        read_record(msgpack.packb(["schedule", 9, {}, 1, False, None, None, None, [0, 0, 0]]))
    bad = msgpack.packb(["schedule", 1, {"id": "x"}, 1, False, None, None, None, [0, 0, 0]])
    with pytest.raises(ValueError, match="schedule record 'x'"):
        read_record(bad)


def test_an_ended_schedule_and_a_raised_tick_still_load() -> None:
    made = replace(state(every=0.02), next_ms=None)
    assert read_record(to_record(made)) == made


def test_on_time_fires_the_pending_one_and_chains_the_next() -> None:
    made = state()
    pending = made.next_ms
    assert pending is not None
    assert plan_fire(made, pending - 1, False) is None  # early: the clock is behind
    step = plan_fire(made, pending + 5, False)
    assert step is not None
    assert [o.id for o in step.fire] == [f"s:tick:{pending // 1000}"]
    assert step.fire[0].fire_at_ms == pending + 5
    assert step.state.next_ms == pending + MINUTE_MS
    assert step.state.last_fired_ms == pending
    assert step.expected == (made.version, pending)
    assert step.state.counts == {"fired": 1, "skipped": 0, "missed": 0}


def test_the_same_state_and_now_decide_the_same() -> None:
    made = state(jitter=30)
    at = first_fire_ms(made)
    assert at is not None
    assert plan_fire(made, at + 1, False) == plan_fire(made, at + 1, False)


@pytest.mark.parametrize(("policy", "fired"), [("skip", 0), ("latest", 1), ("all", 10)])
def test_downtime_gives_0_1_or_all(policy: str, fired: int) -> None:
    made = state(catchup=policy)
    pending = made.next_ms
    assert pending is not None
    step = plan_fire(made, pending + 9 * MINUTE_MS + 1, False)  # 10 due
    assert step is not None
    assert len(step.fire) == fired
    assert step.state.counts["missed"] == 10 - fired
    assert step.state.next_ms == pending + 10 * MINUTE_MS
    assert all(o.fire_at_ms >= o.nominal_ms for o in step.fire)


@pytest.mark.parametrize(
    ("overlap", "fired", "held"), [("skip", 0, False), ("buffer_one", 0, True), ("allow", 1, False)]
)
def test_overlap_with_the_previous_in_flight(overlap: str, fired: int, held: bool) -> None:
    made = state(overlap=overlap)
    pending = made.next_ms
    assert pending is not None
    step = plan_fire(made, pending, True)
    assert step is not None
    assert len(step.fire) == fired and step.held is held
    if overlap == "skip":
        assert step.skipped == {"overlap": 1} and step.state.counts["skipped"] == 1
        assert step.state.next_ms == pending + MINUTE_MS
    if held:
        assert step.state.next_ms == pending  # waits for the previous one to end


@pytest.mark.parametrize("catchup", ["latest", "skip", "all"])
def test_buffer_one_holds_one_while_up_and_counts_the_ones_it_replaces_skipped(
    catchup: str,
) -> None:
    """Looked at each tick while the previous one stays in flight for 3.5
    minutes: the held one is replaced by each newer one (skipped, overlap),
    never counted missed by the catch-up policy, under every policy; when the
    previous ends, the one held fires."""
    made = state(overlap="buffer_one", catchup=catchup)
    pending = made.next_ms
    assert pending is not None
    step = plan_fire(made, pending, True, 10_000)
    assert step is not None and step.held
    for now in range(pending + 1000, pending + 210_001, 1000):  # each second, 3.5 min
        step = plan_fire(step.state, now, True, 10_000, holding=True)
        assert step is not None and step.held and step.fire == []
    assert step.state.counts == {"fired": 0, "skipped": 3, "missed": 0}
    assert step.state.next_ms == pending + 3 * MINUTE_MS  # the newest, held
    released = plan_fire(step.state, pending + 211_000, False, 10_000, holding=True)
    assert released is not None and not released.held
    assert [o.nominal_ms for o in released.fire] == [pending + 3 * MINUTE_MS]
    assert released.state.next_ms == pending + 4 * MINUTE_MS


def test_max_runs_ends_the_schedule() -> None:
    made = state(max_runs=2, catchup="all")
    pending = made.next_ms
    assert pending is not None
    step = plan_fire(made, pending + 4 * MINUTE_MS, False)
    assert step is not None
    assert len(step.fire) == 2 and step.state.next_ms is None
    assert plan_fire(step.state, pending + 10 * MINUTE_MS, False) is None


def test_paused_fires_nothing() -> None:
    made = replace(state(), paused=True)
    assert plan_fire(made, NOW_MS + 3600_000, False) is None


@settings(max_examples=100, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.integers(-3600_000, 6 * 3600_000), st.booleans()), min_size=1, max_size=30
    ),
    policy=st.sampled_from(["skip", "latest", "all"]),
    overlap=st.sampled_from(["skip", "allow"]),
)
def test_counters_balance_and_nothing_fires_twice_or_early(
    steps: list[tuple[int, bool]], policy: str, overlap: str
) -> None:
    """Wall-clock jumps back and forth: every occurrence up to the last pending
    one is fired, skipped or missed exactly once, and none fires before its time."""
    made = state(every=600, catchup=policy, overlap=overlap, catchup_window=3600)
    start = made.next_ms
    assert start is not None
    now = NOW_MS
    fired: list[int] = []
    for jump, in_flight in steps:
        now = max(NOW_MS, now + jump)
        step = plan_fire(made, now, in_flight)
        if step is None:
            continue
        for occurrence in step.fire:
            assert occurrence.nominal_ms <= now and occurrence.fire_at_ms >= occurrence.nominal_ms
            fired.append(occurrence.nominal_ms)
        made = step.state
    assert len(fired) == len(set(fired)) and fired == sorted(fired)
    assert made.next_ms is not None
    decided = (made.next_ms - start) // 600_000
    assert sum(made.counts.values()) == decided
    assert made.counts["fired"] == len(fired)

"""The time wheel against a plain oracle, and its boundary cases one by one."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    rule,
)

from delaywheel.wheel import MOVE_BUDGET, Entry, TimingWheel
from delaywheel.wheel._ticks import tick_ceil

YEAR_S = 365 * 24 * 3600.0


class Timer(Entry):
    __slots__ = ("name", "seq")

    def __init__(self, name: str, seq: int = 0) -> None:
        super().__init__()
        self.name = name
        self.seq = seq


# -- the oracle ---------------------------------------------------------------

# No limit (fire everything due), or a small one, so that advances often stop
# part way through a slot or the overdue list.
limits = st.none() | st.integers(1, 5)


class WheelVersusOracle(RuleBasedStateMachine):
    """Random inserts, removes, reschedules and advances; the oracle is a dict
    of due times. Checked after every advance: nothing fires early, nothing
    fires more than one tick late, firing order is due order (ties FIFO).

    Advances may have a random limit. One that returns its limit may leave a
    backlog: then everything still due must come after what fired (so the
    advances that work it off return, in all and in order, what one advance
    without a limit would have), and the lateness checks wait until an
    advance returns less than its limit, which means nothing due is left.
    """

    timers = Bundle("timers")

    def __init__(self) -> None:
        super().__init__()
        self.due: dict[Timer, float] = {}
        self.must_fire_next: set[Timer] = set()  # scheduled at or before the wheel's now
        self.seq = 0

    @initialize(
        # Spans of 1 tick (slots < 120), 2, 3, 10 and 60 ticks; 121 and 3601 leave
        # a remainder, so spans do not tile the lap.
        slots=st.sampled_from([1, 2, 3, 7, 60, 121, 180, 600, 3600, 3601]),
        tick_s=st.sampled_from([1.0, 0.5, 0.25, 3.0, 60.0, 0.01, 0.001]),
        start_s=st.one_of(st.just(0.0), st.floats(0, 2e9), st.integers(0, 2_000_000_000)),
        budget=st.sampled_from([1, 3, MOVE_BUDGET]),  # small: buckets move over many ticks
    )
    def start(self, slots: int, tick_s: float, start_s: float, budget: int) -> None:
        self.wheel = TimingWheel(slots=slots, tick_s=tick_s, now_s=float(start_s))
        self.wheel._budget = budget
        self.now_s = float(start_s)  # high-water mark, as the wheel keeps it

    def _delay(self, kind: int, fraction: float, laps: int) -> float:
        lap_s = self.wheel.slots * self.wheel.tick_s
        return [
            fraction * lap_s,  # within the first lap
            laps * lap_s,  # exactly k laps ahead
            laps * lap_s + fraction * self.wheel.tick_s,  # just past k laps
            fraction * 10 * YEAR_S,  # anywhere up to ten years
            -fraction * lap_s,  # already due
            float(laps) * self.wheel.tick_s,  # whole ticks
        ][kind]

    @rule(
        target=timers,
        kind=st.integers(0, 5),
        fraction=st.floats(0, 1),
        laps=st.integers(0, 30),
    )
    def insert(self, kind: int, fraction: float, laps: int) -> Timer:
        self.seq += 1
        timer = Timer(f"t{self.seq}", self.seq)
        due_s = self.now_s + self._delay(kind, fraction, laps)
        self.wheel.insert(timer, due_s)
        self.due[timer] = due_s
        if due_s <= self.now_s:
            self.must_fire_next.add(timer)
        return timer

    @rule(
        target=timers,
        laps=st.integers(0, 3),
        offset=st.floats(0, 1),
        quarters=st.lists(st.integers(0, 3), min_size=1, max_size=40),
    )
    def insert_burst(self, laps: int, offset: float, quarters: list[int]) -> object:
        """Many timers in one far span, some due at the same instant."""
        wheel = self.wheel
        span_s = wheel._span * wheel.tick_s
        base_s = self.now_s + (laps + offset) * wheel.slots * wheel.tick_s
        burst = []
        for quarter in quarters:
            self.seq += 1
            timer = Timer(f"b{self.seq}", self.seq)
            due_s = base_s + quarter * span_s / 4
            wheel.insert(timer, due_s)
            self.due[timer] = due_s
            if due_s <= self.now_s:
                self.must_fire_next.add(timer)
            burst.append(timer)
        return multiple(*burst)

    @rule(timer=consumes(timers))
    def remove(self, timer: Timer) -> None:
        if timer in self.due:
            self.wheel.remove(timer)
            del self.due[timer]
            self.must_fire_next.discard(timer)
        else:
            with pytest.raises(ValueError):
                self.wheel.remove(timer)

    @rule(timer=timers, kind=st.integers(0, 5), fraction=st.floats(0, 1), laps=st.integers(0, 30))
    def reschedule(self, timer: Timer, kind: int, fraction: float, laps: int) -> None:
        if timer not in self.due:
            return
        self.seq += 1
        timer.seq = self.seq  # a rescheduled timer queues behind its equals
        due_s = self.now_s + self._delay(kind, fraction, laps)
        self.wheel.reschedule(timer, due_s)
        self.due[timer] = due_s
        self.must_fire_next.discard(timer)
        if due_s <= self.now_s:
            self.must_fire_next.add(timer)

    @rule(
        step=st.one_of(
            st.floats(0, 3),  # in ticks
            st.integers(0, 5),  # whole ticks
            st.floats(0, 3).map(lambda x: x * 3600),  # many ticks
            st.floats(-5, 0),  # backwards
        ),
        limit=limits,
    )
    def advance(self, step: float, limit: int | None) -> None:
        self._advance_to(self.now_s + step * self.wheel.tick_s, limit)  # step is in ticks

    @rule(count=st.integers(1, 70), limit=limits)
    def tick_by_tick(self, count: int, limit: int | None) -> None:
        """One advance at the start of each of the next ``count`` ticks."""
        for _ in range(count):
            self._advance_to((self.wheel.stats().cursor_tick + 1) * self.wheel.tick_s, limit)

    @rule(limit=st.integers(1, 7))
    def work_off_the_backlog(self, limit: int) -> None:
        """Advance to the same time, a limit at a time, until nothing due is left."""
        while len(self._advance_to(self.now_s, limit)) == limit:
            pass

    @rule(jump_s=st.floats(0, 20 * YEAR_S))
    def jump(self, jump_s: float) -> None:
        """A stall or a forward clock jump, up to twenty years at once."""
        self._advance_to(self.now_s + jump_s)

    @rule()
    def advance_to_next_fire(self) -> None:
        next_s = self.wheel.next_fire_s()
        if next_s is not None:
            self._advance_to(next_s)

    @rule()
    def advance_to_just_before_next_fire(self) -> None:
        next_s = self.wheel.next_fire_s()
        if next_s is None or next_s <= self.now_s or self.must_fire_next:
            return
        fired = self._advance_to(max(self.now_s, next_s - self.wheel.tick_s / 2))
        assert fired == [], "fired before next_fire_s()"

    def _advance_to(self, now_s: float, limit: int | None = None) -> list[Timer]:
        fired = self.wheel.advance(now_s, limit)
        stats = self.wheel.stats()
        if stats.moved_last_advance:  # what kind of moving the run exercised
            event(
                "moved more than the budget"
                if stats.moved_last_advance > self.wheel._budget
                else "moved part of the buckets in reach"
                if self._in_reach()
                else "moved every bucket in reach"
            )
        self.now_s = max(self.now_s, now_s)
        tick_s = self.wheel.tick_s
        for timer in fired:
            assert isinstance(timer, Timer)
            assert timer in self.due, f"{timer.name} fired but is not scheduled"
            assert self.due[timer] <= self.now_s, f"{timer.name} fired early"
        keys = [(self.due[t], t.seq) for t in fired]  # type: ignore[index, attr-defined]
        assert keys == sorted(keys), "not in due order"
        for timer in fired:
            del self.due[timer]  # type: ignore[arg-type]
        if limit is not None and len(fired) >= limit:
            assert len(fired) == limit, f"{len(fired)} fired, over the limit of {limit}"
            event("an advance left a backlog")
            target = self.wheel.tick_floor(self.now_s)
            still_due = [
                (due_s, t.seq)
                for t, due_s in self.due.items()
                if t in self.must_fire_next or self.wheel.tick_ceil(due_s) <= target
            ]
            assert all(key > keys[-1] for key in still_due), "a backlog due before what fired"
            if still_due:  # the driver must come back at once
                next_s = self.wheel.next_fire_s()
                assert next_s is not None and next_s <= self.now_s, "a backlog, but no wake-up"
            self.must_fire_next -= set(fired)  # type: ignore[arg-type]
            return fired  # type: ignore[return-value]
        assert not self.must_fire_next - set(fired), "an overdue timer waited"
        self.must_fire_next.clear()
        # Never more than one tick late (with room for float rounding).
        late_limit = self.now_s - tick_s * (1 + 1e-9) - abs(self.now_s) * 1e-15
        late = [t.name for t, due_s in self.due.items() if due_s <= late_limit]
        assert not late, f"late by more than a tick: {late}"
        return fired  # type: ignore[return-value]

    def _in_reach(self) -> bool:
        wheel = self.wheel
        last = (wheel.stats().cursor_tick + wheel.slots + 1) // wheel._span - 1
        return any(key <= last for key in wheel._buckets)

    @invariant()
    def counts_agree(self) -> None:
        if not hasattr(self, "wheel"):
            return
        stats = self.wheel.stats()
        assert len(self.wheel) == len(self.due) == stats.pending
        assert stats.in_ring + stats.above_ring == stats.pending

    @invariant()
    def ring_and_buckets_are_sound(self) -> None:
        """Each ring slot holds one fire tick in (cursor, cursor + slots]; every
        bucket is ahead of its deadline and holds only its span's timers."""
        if not hasattr(self, "wheel"):
            return
        wheel = self.wheel
        cursor, slots, span = wheel.stats().cursor_tick, wheel.slots, wheel._span
        for index, head in enumerate(wheel._ring):
            ticks = {wheel.tick_ceil(entry.due_s) for entry in _entries(head)}
            ticks = {tick for tick in ticks if tick > cursor}  # else the float edge
            assert len(ticks) <= 1, f"slot {index} holds ticks {sorted(ticks)}"
            for tick in ticks:
                assert tick <= cursor + slots and tick % slots == index
        above = 0
        for key, bucket in wheel._buckets.items():
            entries = _entries(bucket)
            assert entries and bucket.count == len(entries)
            assert key * span > cursor, f"bucket {key} is past its deadline"
            for entry in entries:
                assert wheel.tick_ceil(entry.due_s) // span in (key, key - 1)  # or float edge
            above += len(entries)
        assert above == wheel.stats().above_ring

    @invariant()
    def never_oversleeps(self) -> None:
        if not hasattr(self, "wheel") or not self.due:
            return
        next_s = self.wheel.next_fire_s()
        assert next_s is not None
        earliest_s = min(self.due.values())
        fire_s = max(self.wheel.tick_ceil(earliest_s) * self.wheel.tick_s, self.now_s)
        assert next_s <= fire_s, f"next_fire_s {next_s} is after the earliest fire {fire_s}"


def _entries(head: object) -> list[Entry]:
    out = []
    node = head._next  # type: ignore[attr-defined]
    while node is not head:
        out.append(node)
        node = node._next
    return out


WheelVersusOracle.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
# 300 runs of 60 steps: about a minute, so not in the fast loop
test_wheel_matches_oracle = pytest.mark.slow(WheelVersusOracle.TestCase)


# -- boundaries, one by one ---------------------------------------------------


def wheel_at(now_s: float = 1_000_000.0, slots: int = 3600, tick_s: float = 1.0) -> TimingWheel:
    return TimingWheel(slots=slots, tick_s=tick_s, now_s=now_s)


@pytest.mark.parametrize("laps", [1, 2, 5])
def test_exact_laps_wait_exactly_that_many_laps(laps: int) -> None:
    start_s = 7200.0  # on a lap boundary: slot == cursor for the new timer
    wheel = wheel_at(start_s)
    timer = Timer("laps")
    wheel.insert(timer, start_s + laps * 3600)
    assert wheel.place(timer) == (laps, 0)
    assert wheel.advance(start_s + laps * 3600 - 0.001) == []
    assert wheel.advance(start_s + laps * 3600) == [timer]


def test_delay_multiple_of_slots_from_mid_lap() -> None:
    wheel = wheel_at(1_000_123.0)
    timer = Timer("x")
    wheel.insert(timer, 1_000_123.0 + 3600)  # delay % 3600 == 0, slot == cursor
    cycle, slot = wheel.place(timer)
    assert (cycle, slot) == (1, wheel.stats().cursor_slot)
    for step_s in range(1, 3600):  # one full lap, tick by tick: nothing
        assert wheel.advance(1_000_123.0 + step_s) == []
    assert wheel.advance(1_000_123.0 + 3600) == [timer]


def test_cycle_and_slot_follow_the_formula() -> None:
    wheel = wheel_at(1_000_000.0)
    cursor = wheel.stats().cursor_tick
    for delay_s in [1, 59, 3599, 3600, 3601, 7205, 86_400 * 7]:
        timer = Timer(str(delay_s))
        wheel.insert(timer, 1_000_000.0 + delay_s)
        assert wheel.place(timer) == (delay_s // 3600, (cursor + delay_s) % 3600)


def test_past_due_fires_at_next_advance_even_without_time_passing() -> None:
    wheel = wheel_at(100.5)
    timer, now_timer = Timer("past"), Timer("now")
    wheel.insert(timer, 50.0)
    wheel.insert(now_timer, 100.5)
    assert wheel.next_fire_s() == 100.5
    assert wheel.advance(100.5) == [timer, now_timer]


def test_fractional_due_fires_on_the_tick_after_it() -> None:
    wheel = wheel_at(10.0)
    timer = Timer("x")
    wheel.insert(timer, 12.3)
    assert wheel.next_fire_s() == 13.0
    assert wheel.advance(12.99) == []
    assert wheel.advance(13.0) == [timer]


def test_stall_over_many_laps_fires_everything_in_due_order() -> None:
    wheel = wheel_at(0.0, slots=10, tick_s=1.0)
    timers = [Timer(str(i), i) for i in range(200)]
    dues = [(i * 7919) % 1000 + 0.5 for i in range(200)]
    for timer, due_s in zip(timers, dues, strict=True):
        wheel.insert(timer, due_s)
    fired = wheel.advance(5000.0)
    assert [t.due_s for t in fired] == sorted(dues)
    assert len(wheel) == 0 and wheel.next_fire_s() is None


def test_equal_due_times_fire_in_insertion_order() -> None:
    wheel = wheel_at(0.0)
    timers = [Timer(str(i)) for i in range(5)]
    for timer in timers:
        wheel.insert(timer, 42.0)
    assert wheel.advance(42.0) == timers


def test_time_going_backwards_fires_nothing_and_holds_the_cursor() -> None:
    wheel = wheel_at(1000.0)
    timer = Timer("x")
    wheel.insert(timer, 1001.0)
    cursor = wheel.stats().cursor_tick
    assert wheel.advance(500.0) == []
    assert wheel.stats().cursor_tick == cursor
    assert wheel.now_s == 1000.0
    assert wheel.advance(1001.0) == [timer]


def test_far_future_timers_wait_above_the_ring() -> None:
    wheel = wheel_at(0.0)
    far = [Timer(f"far{i}") for i in range(1000)]
    for i, timer in enumerate(far):
        wheel.insert(timer, 3600.0 * (1 + i % 5) + 17)  # all share slot 17
    near = Timer("near")
    wheel.insert(near, 17.0)
    stats = wheel.stats()
    assert (stats.in_ring, stats.above_ring) == (1, 1000)
    assert wheel.advance(17.0) == [near]
    assert wheel.stats().in_ring == 0  # slot 17 was passed without touching them
    fired = wheel.advance(3600.0 + 17)
    assert len(fired) == 200
    assert wheel.stats().buckets == 4


def test_lap_boundary_wake_may_cascade_only() -> None:
    wheel = wheel_at(0.0, slots=10)
    timer = Timer("x")
    wheel.insert(timer, 25.0)
    first_s = wheel.next_fire_s()
    assert first_s is not None and first_s <= 25.0
    while (next_s := wheel.next_fire_s()) is not None and next_s < 25.0:
        assert wheel.advance(next_s) == []
    assert wheel.next_fire_s() == 25.0
    assert wheel.advance(25.0) == [timer]


def test_remove_and_reschedule_are_exact() -> None:
    wheel = wheel_at(0.0)
    a, b = Timer("a"), Timer("b")
    wheel.insert(a, 10.0)
    wheel.insert(b, 10.0)
    wheel.remove(a)
    wheel.reschedule(b, 20_000.0)
    assert not a.scheduled and b.scheduled
    assert wheel.advance(19_999.0) == []
    assert wheel.advance(20_000.0) == [b]
    with pytest.raises(ValueError, match="not scheduled"):
        wheel.remove(a)
    wheel.insert(a, 1.0)
    with pytest.raises(ValueError, match="already scheduled"):
        wheel.insert(a, 1.0)


def test_millisecond_tick() -> None:
    wheel = wheel_at(1_700_000_000.0, tick_s=0.001)
    timer = Timer("ms")
    wheel.insert(timer, 1_700_000_000.0105)
    assert wheel.advance(1_700_000_000.010) == []
    assert wheel.advance(1_700_000_000.011) == [timer]


def test_heaps_stay_bounded_under_churn() -> None:
    wheel = wheel_at(0.0, slots=8)
    timer = Timer("x")
    for i in range(10_000):
        wheel.insert(timer, 3.0 if i % 2 else 3600.0 * (i % 50 + 1))
        wheel.remove(timer)
    assert len(wheel._ring_ticks) <= 2 * 8 + 65
    assert len(wheel._bucket_keys) <= 65


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"slots": 0, "tick_s": 1.0}, "slots"),
        ({"slots": 3600, "tick_s": 0.0001}, "tick_s"),
        ({"slots": 3600, "tick_s": math.nan}, "tick_s"),
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TimingWheel(now_s=0.0, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("due_s", [math.nan, math.inf, -math.inf])
def test_non_finite_times_are_refused(due_s: float) -> None:
    wheel = wheel_at()
    with pytest.raises(ValueError, match="due_s"):
        wheel.insert(Timer("x"), due_s)
    with pytest.raises(ValueError, match="now_s"):
        wheel.advance(due_s)


def test_equal_due_times_keep_schedule_order_across_ring_and_overdue() -> None:
    # Found by the state machine: a timer put in the ring before `now` passed
    # its due time must still come out before an equal one scheduled after.
    wheel = wheel_at(0.0, slots=1)
    ring, overdue = Timer("ring"), Timer("overdue")
    wheel.insert(ring, 1.5)
    wheel.advance(1.5)  # fires nothing: 1.5 fires on tick 2
    wheel.insert(overdue, 1.5)
    assert wheel.advance(2.5) == [ring, overdue]


# -- buckets moving into the ring a little at a time -----------------------------


def _burst(wheel: TimingWheel, first_s: float, count: int, seed: int = 7) -> list[Timer]:
    """``count`` timers firing on the minute of ticks from ``first_s``, many equal."""
    rng = random.Random(seed)
    timers = [Timer(str(i), i) for i in range(count)]
    for timer in timers:
        wheel.insert(timer, first_s - 1 + rng.randrange(1, 241) / 4)
    return timers


def _in_due_order(fired: list[Entry]) -> bool:
    keys = [(t.due_s, t.seq) for t in fired]  # type: ignore[attr-defined]
    return keys == sorted(keys)


def test_a_bucket_moved_over_several_ticks_still_fires_in_due_order() -> None:
    wheel = wheel_at(0.0)
    wheel._budget = 10
    timers = _burst(wheel, 7200.0, 500)  # one span, two laps out
    assert wheel.stats().buckets == 1
    fired: list[Entry] = []
    moving_ticks = []
    for tick in range(1, 7261):
        out = wheel.advance(float(tick))
        moved = wheel.stats().moved_last_advance
        if moved:
            moving_ticks.append(tick)
            assert moved <= 10
        for timer in out:
            assert wheel.tick_ceil(timer.due_s) == tick  # never early, never late
        fired += out
    assert len(moving_ticks) == 50  # 500 timers, 10 a tick
    assert moving_ticks[0] == 7259 - 3600  # the tick its last tick came within reach
    assert len(fired) == 500 and set(fired) == set(timers)
    assert _in_due_order(fired)


def test_next_fire_wakes_for_a_moving_bucket_then_once_a_tick() -> None:
    wheel = wheel_at(0.0)
    wheel._budget = 100
    _burst(wheel, 7200.0, 250)
    assert wheel.next_fire_s() == 7259.0 - 3600  # when the span comes within reach
    assert wheel.advance(3659.0) == [] and wheel.stats().moved_last_advance == 100
    assert wheel.next_fire_s() == 3660.0  # moving: the next tick, no sooner
    wheel.advance(3660.0)
    wheel.advance(3661.0)
    assert wheel.stats().above_ring == 0
    assert wheel.next_fire_s() == 7200.0  # moved: the first timer's tick


def test_a_jump_past_a_half_moved_bucket() -> None:
    wheel = wheel_at(0.0)
    wheel._budget = 10
    timers = _burst(wheel, 7200.0, 500)
    tick = 3600
    while wheel.stats().above_ring == 500:
        tick += 1
        assert wheel.advance(float(tick)) == []
    for _ in range(20):
        tick += 1
        wheel.advance(float(tick))
    assert 0 < wheel.stats().above_ring < 500  # half moved
    # Late equal timers join the bucket's tail, behind their equals already moved.
    late = [Timer(f"late{i}", 1000 + i) for i in range(50)]
    for i, timer in enumerate(late):
        wheel.insert(timer, 7200.0 + i % 8)
    everyone = {*timers, *late}
    fired = wheel.advance(7200.0 + 30)  # into the middle of the span at once
    assert set(fired) == {t for t in everyone if wheel.tick_ceil(t.due_s) <= 7230}
    assert _in_due_order(fired)
    assert wheel.stats().moved_last_advance > 10  # its deadline forced the rest
    rest = wheel.advance(7200.0 + 90)
    assert _in_due_order(rest) and set(fired + rest) == everyone
    assert len(wheel) == 0 and wheel.next_fire_s() is None


def test_a_jump_over_many_buckets_moves_them_in_order() -> None:
    wheel = wheel_at(0.0, slots=120)  # span 2
    wheel._budget = 1
    timers = [Timer(str(i), i) for i in range(300)]
    for i, timer in enumerate(timers):
        wheel.insert(timer, 200.0 + (i * 37) % 400)
    wheel.advance(150.0)  # some buckets in reach, some half moved
    fired = wheel.advance(10_000.0)
    assert len(fired) == 300 and _in_due_order(fired)


def test_a_burst_one_lap_out_never_moves_more_than_the_budget_a_tick() -> None:
    wheel = wheel_at(0.0)
    count = 100_000
    timers = [Timer(str(i), i) for i in range(count)]
    for i, timer in enumerate(timers):
        wheel.insert(timer, 3700.0 + (i + 1) / (count + 1))  # all due in one second
    most = moved = 0
    for tick in range(1, 3701):
        assert wheel.advance(float(tick)) == []
        step = wheel.stats().moved_last_advance
        most, moved = max(most, step), moved + step
    assert most <= MOVE_BUDGET
    assert moved == count and wheel.stats().above_ring == 0
    fired = wheel.advance(3701.0)
    assert fired == timers


def test_the_budget_rises_just_enough_to_meet_the_deadline() -> None:
    wheel = wheel_at(0.0, slots=10)  # span 1: a bucket per tick, 10 ticks to move it
    wheel._budget = 1
    timers = [Timer(str(i), i) for i in range(1000)]
    for timer in timers:
        wheel.insert(timer, 50.0)
    moved = []
    for tick in range(40, 50):
        assert wheel.advance(float(tick)) == []
        moved.append(wheel.stats().moved_last_advance)
    assert moved == [100] * 10  # 1000 timers over the 10 advances in reach
    assert wheel.advance(50.0) == timers
    assert wheel.stats().moved_last_advance == 0  # nothing left for the deadline


def test_fired_and_removed_timers_are_freed_without_the_cyclic_collector() -> None:
    # The server freezes loaded tasks out of the cyclic collector's reach, so a
    # task the wheel lets go of must hold no reference cycle: links are dropped.
    import gc
    import weakref

    class Freeable(Entry):
        __slots__ = ("__weakref__",)

    wheel = wheel_at(0.0, slots=8)
    timers = [Freeable() for _ in range(300)]
    for i, timer in enumerate(timers):
        wheel.insert(timer, 5.0 if i % 3 else 5000.0 + i)  # a shared slot, and buckets
    refs = [weakref.ref(t) for t in timers]
    gc.disable()
    try:
        for timer in timers[2::3][:50] + timers[0::3][:20]:  # from the slot and from buckets
            wheel.remove(timer)
        del timer, timers
        fired = wheel.advance(6.0)
        assert len(fired) == 150
        del fired
        later = wheel.advance(10_000.0)  # every bucket moves into the ring, then fires
        assert len(later) == 80
        del later
        assert all(ref() is None for ref in refs), "a timer survives only through a cycle"
    finally:
        gc.enable()


# -- advancing a limited number at a time ------------------------------------------


def _fire_all(wheel: TimingWheel, now_s: float, limit: int) -> list[list[Entry]]:
    """Advance to ``now_s`` ``limit`` at a time until an advance returns fewer
    (every timer given to these tests is due by ``now_s``)."""
    rounds = [wheel.advance(now_s, limit)]
    while len(rounds[-1]) == limit:
        if len(wheel):  # a backlog: the driver must come back at once
            next_s = wheel.next_fire_s()
            assert next_s is not None and next_s <= now_s
        rounds.append(wheel.advance(now_s, limit))
    return rounds


@pytest.mark.parametrize("shuffled", [False, True])
def test_a_crowded_tick_fires_a_limit_at_a_time_in_due_order(shuffled: bool) -> None:
    wheel = wheel_at(0.0)
    dues = [100.0 + i / 1000 for i in range(1000)] + [100.5] * 200  # one tick, ties
    if shuffled:  # scheduled out of due order: the slot is sorted when it fires
        random.Random(3).shuffle(dues)
    timers = [Timer(str(i), i) for i in range(len(dues))]
    for timer, due_s in zip(timers, dues, strict=True):
        wheel.insert(timer, due_s)
    expected = sorted(timers, key=lambda t: (t.due_s, t.seq))
    rounds = _fire_all(wheel, 101.0, 100)
    assert [len(r) for r in rounds] == [100] * 12 + [0]
    assert [t for r in rounds for t in r] == expected
    assert len(wheel) == 0


def test_what_a_limit_leaves_can_be_removed_and_new_timers_go_elsewhere() -> None:
    wheel = wheel_at(0.0, slots=10)
    timers = [Timer(str(i), i) for i in range(10)]
    for timer in timers:
        wheel.insert(timer, 5.0)
    assert wheel.advance(5.0, 3) == timers[:3]
    assert wheel.next_fire_s() == 5.0
    wheel.remove(timers[3])
    late = Timer("late")
    wheel.insert(late, 15.0)  # the part-fired slot's own, a lap on: waits above the ring
    early = Timer("early")
    wheel.insert(early, 4.0)  # already due: the overdue list, merged by due time
    assert wheel.advance(5.0, 4) == [early, *timers[4:7]]
    assert wheel.advance(5.0) == timers[7:]
    assert wheel.advance(14.9) == []
    assert wheel.advance(15.0, 1) == [late]


def test_an_overdue_list_is_fired_in_due_order_across_ticks() -> None:
    wheel = wheel_at(50.0, slots=10)
    ring = [Timer(f"ring{i}", i) for i in range(3)]
    for i, timer in enumerate(ring):
        wheel.insert(timer, 51.0 + i)  # ticks 51, 52, 53
    wheel.advance(53.5, 1)  # fires ring0; the wheel's time is now 53.5
    overdue = [Timer(f"overdue{i}", 10 + i) for i in range(4)]
    for timer, due_s in zip(overdue, [53.0, 40.0, 52.0, 53.5], strict=True):
        wheel.insert(timer, due_s)  # at or before the wheel's time
    fired = [t for r in _fire_all(wheel, 53.5, 2) for t in r]
    names = [t.name for t in fired]
    assert names == ["overdue1", "ring1", "overdue2", "ring2", "overdue0", "overdue3"]


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="limit must be at least 1, got 0"):
        wheel_at().advance(0.0, 0)


# -- one tick_ceil --------------------------------------------------------------

# Ticks whose products round: a due time a few ulps either side of a tick's
# start is where a quotient rounds to the neighbouring tick.
awkward_ticks = st.sampled_from([0.001, 0.003, 0.01, 0.1, 0.7, 1.0, 1 / 3])


def _nudged(t_s: float, ulps: int) -> float:
    for _ in range(abs(ulps)):
        t_s = math.nextafter(t_s, math.inf if ulps > 0 else -math.inf)
    return t_s


@given(tick_s=awkward_ticks, tick=st.integers(100, 2 * 10**12), ulps=st.integers(-3, 3))
def test_insert_and_a_bucket_move_put_a_timer_on_tick_ceils_tick(
    tick_s: float, tick: int, ulps: int
) -> None:
    """``TimingWheel.insert_many`` and ``_lists.move_front`` both place a timer
    by ``_ticks.tick_ceil``: each puts it in the slot of that tick, float
    edges included."""
    due_s = _nudged(tick * tick_s, ulps)
    slots = 64
    # Inserted within the ring's reach: insert_many's copy.
    wheel = wheel_at(now_s=(tick - 10) * tick_s, slots=slots, tick_s=tick_s)
    timer = Timer("ring")
    wheel.insert(timer, due_s)
    expected = max(tick_ceil(due_s, tick_s), wheel.tick_floor(wheel.now_s) + 1)
    assert timer._home is wheel._ring[expected % slots]
    # Inserted beyond it, into a bucket, then moved into the ring: move_front's.
    wheel = wheel_at(now_s=(tick - 200) * tick_s, slots=slots, tick_s=tick_s)
    timer = Timer("bucket")
    wheel.insert(timer, due_s)
    assert timer._home is not None and timer._home.key >= 0  # in a bucket
    wheel.advance((tick - 20) * tick_s)
    assert timer._home.key == -1  # moved into the ring
    assert timer._home is wheel._ring[tick_ceil(due_s, tick_s) % slots]

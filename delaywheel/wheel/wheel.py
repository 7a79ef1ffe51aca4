"""The hierarchical time wheel: which timers are due, and when to look again.

How it works
------------
Time is cut into ticks of ``tick_s`` seconds, numbered from the Unix epoch
(tick ``n`` starts at ``n * tick_s``). A timer due at ``due_s`` *fires on* the
first tick that starts at or after it: the smallest ``n`` with
``n * tick_s >= due_s``. The cursor is the last tick processed; ``advance(now)``
moves it to the last tick that has started by ``now`` and returns every timer
whose fire tick it passed: never early, and at most one tick late.

The ring has ``slots`` slots, each a circular doubly linked list whose nodes
are the entries themselves, so unlinking is O(1) with no search (see
``_lists``). The ring holds only timers whose fire tick is within its
*reach*, ``(cursor, cursor + slots]``: each slot holds timers of exactly one
fire tick, and a tick never walks past far-future timers that share its slot.
A timer further out waits above the ring in a *bucket* keyed by its *span*:
``span = max(1, slots // 60)`` ticks (a minute of the default hour-long lap),
so bucket ``b`` holds the timers that fire on ticks ``b*span .. b*span+span-1``.

Buckets move into the ring a few hundred entries at a time. Bucket ``b`` may
move once all its ticks are within reach (cursor ``>= (b+1)*span - 1 - slots``)
and must be moved before the cursor processes tick ``b*span``, its deadline.
An advance first fires the ring up to ``now``, in tick order; a bucket whose
deadline comes up first is moved whole there and then, so a jump over many
ticks moves what it must, in order, and costs what it fires plus what it
moves. Then the advance moves a *budget* of entries from buckets within
reach, earliest deadline first, resuming a half-moved bucket where it
stopped. The budget is ``MOVE_BUDGET`` (256) or, if more, the least rate that
moves every reachable bucket by its deadline if advances come once a tick
(``_lists.move_budget``; served that way, no bucket's rate ever rises).
A bucket has ``slots - span + 1`` such advances (59 minutes by default), so
with the driver waking every tick, an advance that fires nothing moves at most
``max(256, timers due within one lap / (slots - span + 1))`` entries whatever
is pending further out: 283 (~0.2 ms) for a million due in one minute.

A timer inserted into a span whose bucket still exists joins the end of that
bucket even when its tick is within reach: the bucket may hold earlier timers
due at the same instant, and ties fire in scheduling order. Otherwise a timer
within reach goes straight to its slot.

Two small heaps (``_heaps``) say where to look next: the fire ticks of
ring slots that hold something, and the keys of the buckets. An advance jumps
from one to the next instead of stepping over empty ticks, so catching up
after a long stall (or a clock jump of years) costs only what it fires and
moves. Both heaps are lazy: an entry whose slot or bucket has since emptied is
dropped when it surfaces, and a heap grown well past what it can refer to is
rebuilt. ``next_fire_s()`` reads them to say when to advance next.

A timer due at or before the wheel's ``now`` (set by the last advance) goes to
the *overdue* list and fires at the very next advance. Time going backwards
changes nothing: ``now`` only grows, so the cursor holds until the clock
catches up.

An advance may be given a *limit*: it then returns only the earliest that
many of what is due (``_fire``), and the rest comes first at the next
advance, which ``next_fire_s()`` asks for at once; so a crowded tick is
handed out over several turns of the event loop, not in one stall. A slot
left part fired keeps the cursor just short of its tick. Nothing new can
join it then: a new timer is due after ``now``, and the slot's next tick
after this one is a lap on, beyond reach, so it waits above the ring.

Assumptions and weak spots. The tick bound assumes an advance about once a
tick: a driver late by ``k`` ticks does ``k`` ticks' moving at once, and one
that first wakes at a deadline moves the whole bucket then. It grows with what
is due within one lap: ten million timers in one minute would mean ~2,800
moves (~1-2 ms) a tick. Each timer is relinked twice (bucket, then slot), at
~0.3-0.7 us a move. Sparse far-future timers (one a minute for months) cost a
bucket each, ~155 bytes on top of the entry. Tick arithmetic is float
(``tick_s`` may be 0.001): ``_ticks`` rounds to stay late by a tick
rather than early. An entry belongs to one wheel at a time; nothing checks that.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from operator import attrgetter

from delaywheel.wheel._fire import fire_some
from delaywheel.wheel._heaps import BucketKeys, RingTicks
from delaywheel.wheel._lists import Entry as Entry  # re-exported: subclass it
from delaywheel.wheel._lists import _Head, append, move_budget, move_front
from delaywheel.wheel._ticks import check_time, tick_ceil, tick_floor

DEFAULT_SLOTS = 3600
DEFAULT_TICK_S = 1.0
# A tick below 1 ms would make the driver wake more often than asyncio can
# schedule reliably; the issue asks for 1 ms as the finest setting.
MIN_TICK_S = 0.001
MAX_SLOTS = 1 << 24
# A bucket above the ring holds one span of max(1, slots // SPANS_PER_LAP) ticks.
SPANS_PER_LAP = 60
# The fewest entries an advance moves from buckets into the ring when it has to.
MOVE_BUDGET = 256

_by_due = attrgetter("due_s")


@dataclass(frozen=True)
class WheelStats:
    pending: int  # every scheduled timer
    in_ring: int  # timers in the ring or the overdue list
    above_ring: int  # timers waiting in span buckets
    buckets: int  # span buckets in use
    cursor_tick: int  # absolute tick number last processed
    cursor_slot: int  # the same, as a ring position
    moved_last_advance: int = 0  # timers the last advance moved from buckets into the ring


class TimingWheel:
    """A hierarchical timing wheel. Pure: no I/O, no clock; pass ``now_s`` in."""

    def __init__(
        self, *, slots: int = DEFAULT_SLOTS, tick_s: float = DEFAULT_TICK_S, now_s: float
    ) -> None:
        if not isinstance(slots, int) or not 1 <= slots <= MAX_SLOTS:
            raise ValueError(f"slots must be an int from 1 to {MAX_SLOTS}, got {slots!r}")
        if not math.isfinite(tick_s) or tick_s < MIN_TICK_S:
            raise ValueError(f"tick_s must be at least {MIN_TICK_S}, got {tick_s!r}")
        check_time("now_s", now_s)
        self.slots = slots
        self.tick_s = float(tick_s)
        self._span = max(1, slots // SPANS_PER_LAP)  # ticks per bucket
        self._budget = MOVE_BUDGET  # tests lower it to exercise partial moves
        self._now_s = float(now_s)
        self._cursor = self.tick_floor(now_s)
        self._ring = [_Head() for _ in range(slots)]
        self._ticks = RingTicks(self._ring)  # fire ticks of non-empty slots
        self._ring_ticks = self._ticks.heap  # the same list, read on the hot path
        self._buckets: dict[int, _Head] = {}
        self._keys = BucketKeys(self._buckets)
        self._bucket_keys = self._keys.heap
        self._overdue = _Head()
        self._pending = 0
        self._above_ring = 0  # entries in buckets
        self._moved = 0  # by the last advance

    # -- time arithmetic ---------------------------------------------------

    def tick_floor(self, t_s: float) -> int:
        """The last tick that has started by ``t_s``: largest n, n*tick_s <= t_s."""
        return tick_floor(t_s, self.tick_s)

    def tick_ceil(self, t_s: float) -> int:
        """The tick a timer due at ``t_s`` fires on: smallest n, n*tick_s >= t_s."""
        return tick_ceil(t_s, self.tick_s)

    @property
    def now_s(self) -> float:
        """The latest time the wheel has been advanced to."""
        return self._now_s

    @property
    def cursor_slot(self) -> int:
        """The ring position of the last tick processed."""
        return self._cursor % self.slots

    # -- scheduling --------------------------------------------------------

    def insert(self, entry: Entry, due_s: float) -> None:
        """Schedule ``entry`` at absolute time ``due_s``. O(1) (a heap push at most)."""
        self.insert_many(((entry, due_s),))

    def insert_many(self, timers: Iterable[tuple[Entry, float]]) -> None:
        """Schedule each ``(entry, due_s)`` in turn, as ``insert`` would.

        The one implementation of scheduling, shaped for start-up, which
        places a million tasks: the wheel's fields are read once per call,
        not once per timer. A bad timer raises ValueError; those before it
        stay scheduled.
        """
        now_s, cursor, tick_s = self._now_s, self._cursor, self.tick_s
        span, slots, ring, buckets = self._span, self.slots, self._ring, self._buckets
        added = above = 0
        try:
            for entry, due_s in timers:
                if entry._home is not None:
                    raise ValueError("entry is already scheduled; use reschedule()")
                check_time("due_s", due_s)
                entry.due_s = due_s
                added += 1
                if due_s <= now_s:
                    append(self._overdue, entry)
                    continue
                tick = tick_ceil(due_s, tick_s)
                if tick <= cursor:  # float edge: never behind the cursor
                    tick = cursor + 1
                key = tick // span
                home = buckets.get(key)
                if home is None:
                    if tick - cursor <= slots:
                        # Within the ring's reach, and no bucket holds earlier
                        # timers of this span (ties keep their scheduling order).
                        home = ring[tick % slots]
                        if home._next is home:
                            self._ticks.push(tick, cursor)
                        append(home, entry)
                        continue
                    home = buckets[key] = _Head(key)
                    self._keys.push(key)
                home.count += 1
                above += 1
                last = home._prev  # append(home, entry), inlined on the commonest path
                entry._prev = last
                entry._next = home
                last._next = entry
                home._prev = entry
                entry._home = home
        finally:
            self._pending += added
            self._above_ring += above

    def remove(self, entry: Entry) -> None:
        """Unschedule ``entry``. O(1)."""
        home = entry._home
        if home is None:
            raise ValueError("entry is not scheduled")
        prev, nxt = entry._prev, entry._next
        prev._next = nxt
        nxt._prev = prev
        del entry._prev, entry._next
        entry._home = None
        self._pending -= 1
        if home.key >= 0:
            self._above_ring -= 1
            home.count -= 1
            if not home.count:
                del self._buckets[home.key]

    def reschedule(self, entry: Entry, due_s: float) -> None:
        """Move a scheduled entry to a new due time. O(1)."""
        check_time("due_s", due_s)
        self.remove(entry)
        self.insert(entry, due_s)

    # -- the passing of time ------------------------------------------------

    def advance(self, now_s: float, limit: int | None = None) -> list[Entry]:
        """Move to ``now_s``; unschedule and return every due timer, in due order.

        Timers due at the same instant come out in the order they were
        scheduled. A ``now_s`` earlier than a previous one fires only the
        overdue list (timers scheduled at or before the wheel's time).

        With a ``limit`` (>= 1), at most that many: the earliest of what is
        due, the same as the front of what an advance without one returns.
        The rest stay scheduled (and removable) and come first at the next
        advance; ``next_fire_s()`` is then at or before ``now_s``. Fewer than
        ``limit`` means nothing due is left.
        """
        check_time("now_s", now_s)
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit!r}")
        if now_s > self._now_s:
            self._now_s = now_s
        fired: list[Entry] = []
        self._moved = 0
        target = self.tick_floor(self._now_s)
        if limit is not None:
            fire_some(self._due_slots(target), self._overdue, limit, fired)
        else:
            if target > self._cursor:
                for head in self._due_slots(target):
                    head.drain_into(fired)
            # After the ring's: of two timers due at the same instant, one in
            # the ring was scheduled before one in the overdue list (which was
            # scheduled once now had passed it), and the sort below is stable.
            self._overdue.drain_into(fired)
        if self._buckets:
            self._move_some()
        count = len(fired)
        if count:
            self._pending -= count
            if count > 1 and limit is None:
                fired.sort(key=_by_due)  # runs are sorted: timsort merges them in O(n)
        return fired

    def _due_slots(self, target: int) -> Iterator[_Head]:
        """The ring slots due by ``target``, in tick order; the cursor ends there.

        While a slot is handed out the cursor is just short of its tick; a
        bucket whose first tick comes before it has been finished (its
        deadline) with the cursor just short of that tick. Once the caller
        has emptied the slot the cursor passes it. A caller that stops in a
        slot leaves the cursor short of it, and the next advance resumes there.
        """
        ring, ticks, slots = self._ring, self._ring_ticks, self.slots
        cursor = self._cursor
        deadline = self._next_deadline(target)
        while True:
            while ticks:  # the next live ring tick (the heap is lazy)
                tick = ticks[0]
                head = ring[tick % slots]
                if tick > cursor and head._next is not head:
                    break
                heapq.heappop(ticks)
            else:
                tick = target + 1
            if deadline <= tick and deadline <= target:
                self._cursor = cursor = deadline - 1
                self._finish_bucket()
                deadline = self._next_deadline(target)
                continue
            if tick > target:
                break
            self._cursor = tick - 1
            yield head
            if head._next is not head:
                return  # the caller stopped in this slot
            cursor = tick  # its tick leaves the heap at the next look
        self._cursor = target

    def _next_deadline(self, target: int) -> int:
        """The first tick of the earliest bucket, or ``target + 1`` if none."""
        key = self._keys.peek()
        return target + 1 if key is None else key * self._span

    def _finish_bucket(self) -> None:
        """Move all of the earliest bucket into the ring (the cursor is just before it)."""
        key = self._keys.pop()  # live: _next_deadline peeked it
        bucket = self._buckets.pop(key)
        self._move(bucket, bucket.count)

    def _move_some(self) -> None:
        """Move up to a budget of entries from buckets the ring can reach, earliest first."""
        cursor = self._cursor
        last = (cursor + self.slots + 1) // self._span - 1  # all its ticks <= cursor + slots
        key = self._keys.peek()
        if key is None or key > last:
            return
        budget = move_budget(self._buckets, self._span, cursor, key, last, self._budget)
        buckets = self._buckets
        while True:
            bucket = buckets[key]
            n = min(bucket.count, budget)
            self._move(bucket, n)
            budget -= n
            if bucket.count:
                return  # budget spent
            del buckets[key]
            self._keys.pop()
            key = self._keys.peek()
            if not budget or key is None or key > last:
                return

    def _move(self, bucket: _Head, n: int) -> None:
        self._ticks.trim(self._cursor)
        move_front(bucket, n, self._ring, self.tick_s, self._cursor, self._ring_ticks)
        self._above_ring -= n
        self._moved += n

    def next_fire_s(self) -> float | None:
        """When the next advance has work: a time to sleep until, or None if idle.

        That is the next tick with timers in the ring, or the tick at which the
        earliest bucket comes within the ring's reach and starts moving into it.
        While a bucket is moving (a few entries per advance) it is the next
        tick, never sooner, so the driver wakes once a tick until the move is
        done. An advance at such a time can return nothing; ask again.
        """
        if self._overdue._next is not self._overdue:
            return self._now_s
        tick = self._ticks.peek(self._cursor)
        key = self._keys.peek()
        if key is not None:
            reach = max((key + 1) * self._span - 1 - self.slots, self._cursor + 1)
            if tick is None or reach < tick:
                tick = reach
        return None if tick is None else tick * self.tick_s

    # -- introspection -----------------------------------------------------------

    def place(self, entry: Entry) -> tuple[int, int]:
        """``(cycle, slot)`` of a scheduled entry, as the protocol reports them.

        ``ticks`` is how far the fire tick is past the cursor (0 when overdue):
        ``cycle = ticks // slots`` and ``slot = (cursor + ticks) % slots``.
        """
        if entry._home is None:
            raise ValueError("entry is not scheduled")
        if entry._home is self._overdue:
            return 0, self._cursor % self.slots
        return self.place_at(entry.due_s)

    def place_at(self, due_s: float) -> tuple[int, int]:
        """``(cycle, slot)`` an entry due at ``due_s`` would have if scheduled now."""
        ticks = max(tick_ceil(due_s, self.tick_s) - self._cursor, 0)
        return ticks // self.slots, (self._cursor + ticks) % self.slots

    def __len__(self) -> int:
        return self._pending

    def __iter__(self) -> Iterator[Entry]:
        """Every scheduled entry, in no particular order."""
        for head in (self._overdue, *self._ring, *self._buckets.values()):
            node = head._next
            while node is not head:
                assert isinstance(node, Entry)
                yield node
                node = node._next

    def stats(self) -> WheelStats:
        return WheelStats(
            pending=self._pending,
            in_ring=self._pending - self._above_ring,
            above_ring=self._above_ring,
            buckets=len(self._buckets),
            cursor_tick=self._cursor,
            cursor_slot=self.cursor_slot,
            moved_last_advance=self._moved,
        )

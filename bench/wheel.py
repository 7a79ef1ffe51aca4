"""The timing wheel alone: insert, remove and fire rates, idle-tick latency, memory.

Setup: the default wheel (``DEFAULT_SLOTS`` = 3600 slots of ``DEFAULT_TICK_S`` =
1 s, so one lap is an hour) started at a fixed ``NOW_S`` on a lap boundary, and
``ENTRIES`` = 1,000,000 bare ``Entry`` objects created up front with due times
drawn uniformly at random (seeded) from the week after ``NOW_S``. Times are
``time.perf_counter`` deltas taken with the cyclic GC paused (as ``timeit``
does), so a full collection of a million live objects is not billed to the
wheel. Rates are the best of ``REPEATS`` runs; JSON output carries every run.

What is measured:

1. insert: one loop of ``wheel.insert(entry, due)`` over the 1,000,000
   pre-created entries into a fresh wheel; entries per second. Nearly every
   entry lands in a span bucket (one minute of ticks) above the ring (the ring
   reaches only the coming hour).
2. remove: ``wheel.remove(entry)`` for all of them, in a random order fixed
   once per benchmark; entries per second. Each insert run is followed by a
   remove run, which also readies the entries for the next insert.
3. fire: the entries re-inserted into a fresh wheel (not timed), then
   ``wheel.advance`` called once per simulated minute through the whole week
   (10,080 calls of ~100 timers each); fired entries / total time inside
   ``advance()`` (each call timed on its own). This includes moving every
   bucket into the ring and the per-advance sort. Shown once more, for
   comparison, as a single ``advance`` straight to the end of the week (one
   run: it returns and sorts all 1,000,000 at once).
4. idle tick: 1,000,000 entries due 1 hour to 1 week out, then 3,600
   consecutive one-tick advances through the first hour, none of which fires
   anything. Longest and median single advance, in microseconds, each the best
   of ``REPEATS`` passes. Once a minute a minute's bucket (about 100 entries)
   comes within the ring's reach and that tick moves it into the ring, as in
   steady state; the longest such tick is reported separately (with the most
   entries one tick moved, from ``stats().moved_last_advance``), as is the
   longest tick that moved nothing.
5. memory: ``tracemalloc`` started, baseline read, an empty wheel built (the
   ring alone: its fixed cost), then 1,000,000 bare entries created and
   inserted with fresh due-time floats. (Total - baseline) / 1,000,000 is the
   bytes of bookkeeping per pending timer: the entry object (its links and due
   time), its ``due_s`` float, and the wheel's share. The list the benchmark
   keeps the entries in is allocated before tracing starts, so it is not
   counted. tracemalloc counts requested bytes, not allocator rounding.
6. burst: the 1,000,000 entries due uniformly within one minute a week out
   (``(NOW_S + WEEK_S, NOW_S + WEEK_S + 60]``), one advance straight to an
   hour before the first is due (timed on its own), then 3,600 one-tick
   advances through that hour, none of which fires anything while the burst
   moves into the ring a few hundred a tick (those firing on the 60th second
   are in the next span's bucket, which need not be moved yet). Longest and
   median one-tick advance, each the best of ``REPEATS`` passes, and the most
   entries one advance moved.

The targets printed beside the figures: insert, remove and fire each at least
500,000 entries/s; one tick with nothing due under 1 ms (whatever is pending,
so the burst's ticks too); at most 150 bytes per pending entry. The section
takes about 40-70 s.
"""

from __future__ import annotations

import math
import random
import statistics
import sys
import time
import tracemalloc
from dataclasses import dataclass

from bench import Figure, Report, Target, paused_gc, progress
from delaywheel.wheel import DEFAULT_SLOTS, DEFAULT_TICK_S, Entry, TimingWheel

ENTRIES = 1_000_000
REPEATS = 3
SEED = 20240601
SLOTS = DEFAULT_SLOTS
TICK_S = DEFAULT_TICK_S
HOUR_S = 3600.0
WEEK_S = 7 * 24 * HOUR_S
FIRE_STEP_S = 60.0  # one advance per simulated minute in the fire run
LAP_S = SLOTS * TICK_S
# A fixed start on a lap boundary: the idle-tick run then crosses into a full lap.
NOW_S = math.floor(1_700_000_000 / LAP_S) * LAP_S

RATE_TARGET = Target(">=", 500_000)
TICK_TARGET_US = Target("<", 1_000)
BYTES_TARGET = Target("<=", 150)

perf_counter = time.perf_counter


def new_wheel() -> TimingWheel:
    return TimingWheel(slots=SLOTS, tick_s=TICK_S, now_s=NOW_S)


def random_dues(rng: random.Random, n: int, lo_s: float, hi_s: float) -> list[float]:
    """``n`` due times uniform in ``(NOW_S + lo_s, NOW_S + hi_s]``."""
    rand = rng.random
    span = hi_s - lo_s
    return [NOW_S + lo_s + span * (1.0 - rand()) for _ in range(n)]


# -- 1 and 2: insert and remove ---------------------------------------------------


def measure_insert_remove(
    entries: list[Entry], dues: list[float], order: list[Entry], repeats: int
) -> tuple[list[float], list[float]]:
    """Per run: insert every entry (timed), then remove them in ``order`` (timed)."""
    n = len(entries)
    insert_rates: list[float] = []
    remove_rates: list[float] = []
    for run in range(repeats):
        progress(f"insert + remove, run {run + 1}/{repeats}")
        wheel = new_wheel()
        insert = wheel.insert
        with paused_gc():
            started = perf_counter()
            for entry, due in zip(entries, dues, strict=True):
                insert(entry, due)
            insert_s = perf_counter() - started
        if len(wheel) != n:
            raise RuntimeError(f"expected {n} pending after insert, found {len(wheel)}")
        remove = wheel.remove
        with paused_gc():
            started = perf_counter()
            for entry in order:
                remove(entry)
            remove_s = perf_counter() - started
        if len(wheel):
            raise RuntimeError(f"{len(wheel)} entries left after removing all")
        insert_rates.append(n / insert_s)
        remove_rates.append(n / remove_s)
    return insert_rates, remove_rates


# -- 3: fire ----------------------------------------------------------------------


def measure_fire(
    entries: list[Entry], dues: list[float], repeats: int, step_s: float
) -> list[float]:
    """Per run: fill a fresh wheel, then advance by ``step_s`` through the week.

    Returns fired entries per second of time spent inside ``advance()``.
    """
    n = len(entries)
    steps = math.ceil(WEEK_S / step_s)
    targets = [NOW_S + step_s * i for i in range(1, steps + 1)]
    rates: list[float] = []
    for run in range(repeats):
        progress(f"fire, {len(targets):,} advance(s) of {step_s:g} s, run {run + 1}/{repeats}")
        wheel = new_wheel()
        insert = wheel.insert
        for entry, due in zip(entries, dues, strict=True):
            insert(entry, due)
        advance = wheel.advance
        fired = 0
        spent_s = 0.0
        with paused_gc():
            for target in targets:
                started = perf_counter()
                out = advance(target)
                spent_s += perf_counter() - started
                fired += len(out)
                del out
        if fired != n or len(wheel):
            raise RuntimeError(f"fired {fired} of {n}; {len(wheel)} still pending")
        rates.append(fired / spent_s)
    return rates


# -- 4: idle ticks ----------------------------------------------------------------


@dataclass(frozen=True)
class TickPass:
    """One pass of one-tick advances over an hour with nothing due."""

    max_us: float
    median_us: float
    p99_us: float
    max_plain_us: float  # longest tick that moved nothing
    cascade_us: float  # longest tick that moved entries from a bucket into the ring
    cascaded: int  # entries moved from buckets into the ring in the hour
    most_moved: int  # most entries one tick moved


def measure_idle_ticks(entries: list[Entry], dues: list[float], passes: int) -> list[TickPass]:
    """Per pass: fill a fresh wheel with far-future entries, then tick through an hour."""
    ticks = round(HOUR_S / TICK_S)
    targets = [NOW_S + TICK_S * i for i in range(1, ticks + 1)]
    results: list[TickPass] = []
    for run in range(passes):
        progress(f"idle ticks, {ticks:,} one-tick advances, pass {run + 1}/{passes}")
        wheel = new_wheel()
        insert = wheel.insert
        for entry, due in zip(entries, dues, strict=True):
            insert(entry, due)
        advance = wheel.advance
        stats = wheel.stats
        plain: list[float] = []
        cascades: list[float] = []
        cascaded = most_moved = 0
        fired = 0
        with paused_gc():
            for target in targets:
                started = perf_counter()
                out = advance(target)
                elapsed = perf_counter() - started
                fired += len(out)
                del out
                moved = stats().moved_last_advance
                if moved:
                    cascades.append(elapsed)
                    cascaded += moved
                    most_moved = max(most_moved, moved)
                else:
                    plain.append(elapsed)
        if fired:
            raise RuntimeError(f"{fired} entries fired in an hour that should have none due")
        remove = wheel.remove
        for entry in entries:
            remove(entry)
        every = sorted(plain + cascades)
        results.append(
            TickPass(
                max_us=every[-1] * 1e6,
                median_us=statistics.median(every) * 1e6,
                p99_us=every[min(len(every) - 1, math.ceil(0.99 * len(every)) - 1)] * 1e6,
                max_plain_us=max(plain) * 1e6,
                cascade_us=max(cascades, default=0.0) * 1e6,
                cascaded=cascaded,
                most_moved=most_moved,
            )
        )
    return results


# -- 6: a burst due in one minute a week out ----------------------------------------


@dataclass(frozen=True)
class BurstPass:
    """One pass of one-tick advances over the hour before a burst falls due."""

    jump_us: float  # the one advance from NOW_S to an hour before the burst
    max_us: float
    median_us: float
    most_moved: int  # most entries one advance moved into the ring
    moved: int  # entries moved in the hour (the rest fire on the next span's ticks)


def measure_burst(entries: list[Entry], dues: list[float], passes: int) -> list[BurstPass]:
    """Per pass: fill a fresh wheel with the burst, jump to an hour before it, tick on."""
    first_tick = math.ceil(min(dues) / TICK_S)
    ticks = round(HOUR_S / TICK_S)
    start_s = (first_tick - 1 - ticks) * TICK_S
    targets = [start_s + TICK_S * i for i in range(1, ticks + 1)]  # the last: first_tick - 1
    results: list[BurstPass] = []
    for run in range(passes):
        progress(f"burst, {ticks:,} one-tick advances before it, pass {run + 1}/{passes}")
        wheel = new_wheel()
        insert = wheel.insert
        for entry, due in zip(entries, dues, strict=True):
            insert(entry, due)
        advance = wheel.advance
        stats = wheel.stats
        every: list[float] = []
        moved = most_moved = fired = 0
        with paused_gc():
            started = perf_counter()
            fired += len(advance(start_s))
            jump_s = perf_counter() - started
            for target in targets:
                started = perf_counter()
                out = advance(target)
                every.append(perf_counter() - started)
                fired += len(out)
                del out
                step = stats().moved_last_advance
                moved += step
                most_moved = max(most_moved, step)
        if fired:
            raise RuntimeError(f"{fired} entries fired before the burst was due")
        remove = wheel.remove
        for entry in entries:
            remove(entry)
        results.append(
            BurstPass(
                jump_us=jump_s * 1e6,
                max_us=max(every) * 1e6,
                median_us=statistics.median(every) * 1e6,
                most_moved=most_moved,
                moved=moved,
            )
        )
    return results


# -- 5: memory --------------------------------------------------------------------


def measure_memory(n: int, rng: random.Random) -> tuple[int, int]:
    """Bytes traced for an empty wheel, and for the wheel plus ``n`` scheduled entries.

    Both are net of the baseline read right after ``tracemalloc.start()``.
    """
    keep: list[Entry | None] = [None] * n  # allocated before tracing: not counted
    rand = rng.random
    with paused_gc():
        tracemalloc.start()
        try:
            baseline, _ = tracemalloc.get_traced_memory()
            wheel = new_wheel()
            ring, _ = tracemalloc.get_traced_memory()
            insert = wheel.insert
            for i in range(n):
                entry = Entry()
                insert(entry, NOW_S + WEEK_S * (1.0 - rand()))
                keep[i] = entry
            del entry
            total, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    if len(wheel) != n:
        raise RuntimeError(f"expected {n} pending, found {len(wheel)}")
    return ring - baseline, total - baseline


# -- the section ------------------------------------------------------------------


def run() -> Report:
    started = perf_counter()
    n = ENTRIES
    rng = random.Random(SEED)
    progress(f"creating {n:,} entries")
    entries = [Entry() for _ in range(n)]
    dues = random_dues(rng, n, 0.0, WEEK_S)
    order = entries[:]
    rng.shuffle(order)

    insert_rates, remove_rates = measure_insert_remove(entries, dues, order, REPEATS)
    del order
    fire_rates = measure_fire(entries, dues, REPEATS, FIRE_STEP_S)
    (fire_once,) = measure_fire(entries, dues, 1, WEEK_S)

    far_dues = random_dues(rng, n, HOUR_S, WEEK_S)
    del dues
    passes = measure_idle_ticks(entries, far_dues, REPEATS)
    burst_dues = random_dues(rng, n, WEEK_S, WEEK_S + 60.0)
    del far_dues
    bursts = measure_burst(entries, burst_dues, REPEATS)
    del entries, burst_dues

    progress("memory (tracemalloc)")
    ring_bytes, total_bytes = measure_memory(n, rng)
    entry_bytes = sys.getsizeof(Entry())  # includes the GC header
    float_bytes = sys.getsizeof(1.5)
    per_entry = total_bytes / n
    rest = per_entry - entry_bytes - float_bytes

    best_tick = min(passes, key=lambda p: p.max_us)
    figures = [
        Figure(
            "insert_rate",
            "insert",
            max(insert_rates),
            "/s",
            RATE_TARGET,
            tuple(insert_rates),
            "entries/s into a fresh wheel",
        ),
        Figure(
            "remove_rate",
            "remove (random order)",
            max(remove_rates),
            "/s",
            RATE_TARGET,
            tuple(remove_rates),
            "entries/s, all of them",
        ),
        Figure(
            "fire_rate",
            "fire (1 advance per sim. minute)",
            max(fire_rates),
            "/s",
            RATE_TARGET,
            tuple(fire_rates),
            f"fired / time in advance(); {math.ceil(WEEK_S / FIRE_STEP_S):,} advances",
        ),
        Figure(
            "fire_rate_one_advance",
            "fire (1 advance to end of week)",
            fire_once,
            "/s",
            None,
            (fire_once,),
            "one run, for comparison",
        ),
        Figure(
            "idle_tick_max_us",
            "idle tick: longest",
            min(p.max_us for p in passes),
            "us",
            TICK_TARGET_US,
            tuple(p.max_us for p in passes),
            "a tick that moved a bucket into the ring"
            if best_tick.cascade_us >= best_tick.max_plain_us
            else "a tick that moved nothing",
        ),
        Figure(
            "idle_tick_median_us",
            "idle tick: median",
            min(p.median_us for p in passes),
            "us",
            TICK_TARGET_US,
            tuple(p.median_us for p in passes),
            f"{round(HOUR_S / TICK_S):,} one-tick advances, nothing due",
        ),
        Figure(
            "idle_tick_p99_us",
            "idle tick: 99th percentile",
            min(p.p99_us for p in passes),
            "us",
            TICK_TARGET_US,
            tuple(p.p99_us for p in passes),
        ),
        Figure(
            "idle_tick_max_no_cascade_us",
            "idle tick: longest w/o moving",
            min(p.max_plain_us for p in passes),
            "us",
            TICK_TARGET_US,
            tuple(p.max_plain_us for p in passes),
            "ticks that moved nothing into the ring",
        ),
        Figure(
            "idle_tick_cascade_us",
            "idle tick: longest that moved",
            min(p.cascade_us for p in passes),
            "us",
            TICK_TARGET_US,
            tuple(p.cascade_us for p in passes),
            f"once a minute, up to {best_tick.most_moved:,} entries; "
            f"{best_tick.cascaded:,} moved in the hour",
        ),
        Figure(
            "burst_tick_max_us",
            "burst: longest tick, hour before",
            min(p.max_us for p in bursts),
            "us",
            TICK_TARGET_US,
            tuple(p.max_us for p in bursts),
            f"{n:,} due in one minute a week out; "
            f"up to {max(p.most_moved for p in bursts):,} moved a tick",
        ),
        Figure(
            "burst_tick_median_us",
            "burst: median tick, hour before",
            min(p.median_us for p in bursts),
            "us",
            TICK_TARGET_US,
            tuple(p.median_us for p in bursts),
            f"{round(HOUR_S / TICK_S):,} one-tick advances; "
            f"{min(p.moved for p in bursts):,} moved in all",
        ),
        Figure(
            "burst_jump_us",
            "burst: jump to an hour before",
            min(p.jump_us for p in bursts),
            "us",
            None,
            tuple(p.jump_us for p in bursts),
            "one advance over ~1 week with nothing due",
        ),
        Figure(
            "bytes_per_entry",
            "bytes per pending entry",
            per_entry,
            "B",
            BYTES_TARGET,
            (per_entry,),
            f"Entry {entry_bytes} + due_s float {float_bytes} + wheel share {rest:.1f}",
        ),
        Figure(
            "ring_bytes",
            "ring alone (empty wheel)",
            float(ring_bytes),
            "B",
            None,
            (float(ring_bytes),),
            f"{ring_bytes / SLOTS:.1f} B per slot; {ring_bytes / n:.2f} B per entry at {n:,}",
        ),
    ]
    title = (
        f"TimingWheel, {n:,} entries due uniformly over one week; "
        f"{SLOTS} slots x {TICK_S:g} s tick; best of {REPEATS}"
    )
    params = {
        "entries": n,
        "repeats": REPEATS,
        "slots": SLOTS,
        "tick_s": TICK_S,
        "now_s": NOW_S,
        "span_s": WEEK_S,
        "fire_step_s": FIRE_STEP_S,
        "seed": SEED,
        "gc_paused_while_timing": True,
    }
    return Report("wheel", title, figures, params, perf_counter() - started)

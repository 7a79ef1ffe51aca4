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
takes about 40-70 s; ``run(quick=True)`` does it all with ``QUICK_ENTRIES`` =
10,000 entries and one run each, in a few seconds (a smoke run, not figures to quote).

Items 1-4 are measured here; the burst in ``bench/wheel_burst.py``, memory in
``bench/wheel_memory.py``, and the setup above is in ``bench/wheel_common.py``.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass

from bench import Figure, Report, paused_gc, progress
from bench.wheel_burst import burst_figures
from bench.wheel_common import (
    ENTRIES,
    FIRE_STEP_S,
    HOUR_S,
    NOW_S,
    QUICK_ENTRIES,
    RATE_TARGET,
    REPEATS,
    SEED,
    SLOTS,
    TICK_S,
    TICK_TARGET_US,
    WEEK_S,
    filled_wheel,
    new_wheel,
    perf_counter,
    random_dues,
)
from bench.wheel_memory import memory_figures
from delaywheel.wheel import Entry

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
        wheel = filled_wheel(entries, dues)
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
        wheel = filled_wheel(entries, dues)
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


# -- the figures ------------------------------------------------------------------


def insert_remove_figures(
    entries: list[Entry], dues: list[float], rng: random.Random, repeats: int
) -> list[Figure]:
    """Insert, then remove in an order ``rng`` shuffles once: items 1 and 2."""
    order = entries[:]
    rng.shuffle(order)
    insert_rates, remove_rates = measure_insert_remove(entries, dues, order, repeats)
    return [
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
    ]


def fire_figures(entries: list[Entry], dues: list[float], repeats: int) -> list[Figure]:
    """Fire a week of timers a minute at a time, then in one advance: item 3."""
    fire_rates = measure_fire(entries, dues, repeats, FIRE_STEP_S)
    (fire_once,) = measure_fire(entries, dues, 1, WEEK_S)
    return [
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
    ]


def idle_tick_figures(entries: list[Entry], dues: list[float], repeats: int) -> list[Figure]:
    """An hour of one-tick advances with nothing due: item 4."""
    passes = measure_idle_ticks(entries, dues, repeats)
    best = min(passes, key=lambda p: p.max_us)
    return [
        Figure(
            "idle_tick_max_us",
            "idle tick: longest",
            min(p.max_us for p in passes),
            "us",
            TICK_TARGET_US,
            tuple(p.max_us for p in passes),
            "a tick that moved a bucket into the ring"
            if best.cascade_us >= best.max_plain_us
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
            f"once a minute, up to {best.most_moved:,} entries; "
            f"{best.cascaded:,} moved in the hour",
        ),
    ]


# -- the section ------------------------------------------------------------------


def run(quick: bool = False) -> Report:
    """The figures above; ``quick``: ``QUICK_ENTRIES`` entries, one run each (a smoke run)."""
    started = perf_counter()
    n = QUICK_ENTRIES if quick else ENTRIES
    repeats = 1 if quick else REPEATS
    rng = random.Random(SEED)  # draws, in order: dues, remove order, far, burst, memory
    progress(f"creating {n:,} entries")
    entries = [Entry() for _ in range(n)]
    dues = random_dues(rng, n, 0.0, WEEK_S)
    figures = insert_remove_figures(entries, dues, rng, repeats)
    figures += fire_figures(entries, dues, repeats)
    del dues
    figures += idle_tick_figures(entries, random_dues(rng, n, HOUR_S, WEEK_S), repeats)
    figures += burst_figures(entries, random_dues(rng, n, WEEK_S, WEEK_S + 60.0), repeats)
    del entries
    figures += memory_figures(n, rng)
    title = (
        f"TimingWheel, {n:,} entries due uniformly over one week; "
        f"{SLOTS} slots x {TICK_S:g} s tick; best of {repeats}{' (quick)' if quick else ''}"
    )
    params = {
        "entries": n,
        "repeats": repeats,
        "quick": quick,
        "slots": SLOTS,
        "tick_s": TICK_S,
        "now_s": NOW_S,
        "span_s": WEEK_S,
        "fire_step_s": FIRE_STEP_S,
        "seed": SEED,
        "gc_paused_while_timing": True,
    }
    return Report("wheel", title, figures, params, perf_counter() - started)

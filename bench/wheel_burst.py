"""The wheel benchmark's burst case: a million timers due in one minute a week out.

See item 6 of ``bench/wheel.py``'s docstring for what is measured and how.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from bench import Figure, paused_gc, progress
from bench.wheel_common import HOUR_S, TICK_S, TICK_TARGET_US, filled_wheel, perf_counter
from delaywheel.wheel import Entry


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
        wheel = filled_wheel(entries, dues)
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


def burst_figures(entries: list[Entry], dues: list[float], passes: int) -> list[Figure]:
    """Measure the burst case and return its three figures."""
    bursts = measure_burst(entries, dues, passes)
    return [
        Figure(
            "burst_tick_max_us",
            "burst: longest tick, hour before",
            min(p.max_us for p in bursts),
            "us",
            TICK_TARGET_US,
            tuple(p.max_us for p in bursts),
            f"{len(entries):,} due in one minute a week out; "
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
    ]

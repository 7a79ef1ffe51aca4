"""The wheel benchmark's memory measurement: bytes per pending timer.

See item 5 of ``bench/wheel.py``'s docstring for what is measured and how.
"""

from __future__ import annotations

import random
import sys
import tracemalloc

from bench import Figure, paused_gc, progress
from bench.wheel_common import BYTES_TARGET, NOW_S, SLOTS, WEEK_S, new_wheel
from delaywheel.wheel import Entry


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


def memory_figures(n: int, rng: random.Random) -> list[Figure]:
    """Measure memory with ``n`` entries and return the per-entry and ring figures."""
    progress("memory (tracemalloc)")
    ring_bytes, total_bytes = measure_memory(n, rng)
    entry_bytes = sys.getsizeof(Entry())  # includes the GC header
    float_bytes = sys.getsizeof(1.5)
    per_entry = total_bytes / n
    rest = per_entry - entry_bytes - float_bytes
    return [
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

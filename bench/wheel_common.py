"""What the wheel benchmark's measurements share: the setup and the targets.

See ``bench/wheel.py`` for what is measured and how.
"""

from __future__ import annotations

import math
import random
import time

from bench import Target
from delaywheel.wheel import DEFAULT_SLOTS, DEFAULT_TICK_S, Entry, TimingWheel

ENTRIES = 1_000_000
QUICK_ENTRIES = 10_000  # run(quick=True): enough to exercise every path, not to quote
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


def filled_wheel(entries: list[Entry], dues: list[float]) -> TimingWheel:
    """A fresh wheel with ``entries[i]`` inserted at ``dues[i]`` (not timed)."""
    wheel = new_wheel()
    insert = wheel.insert
    for entry, due in zip(entries, dues, strict=True):
        insert(entry, due)
    return wheel


def random_dues(rng: random.Random, n: int, lo_s: float, hi_s: float) -> list[float]:
    """``n`` due times uniform in ``(NOW_S + lo_s, NOW_S + hi_s]``."""
    rand = rng.random
    span = hi_s - lo_s
    return [NOW_S + lo_s + span * (1.0 - rand()) for _ in range(n)]

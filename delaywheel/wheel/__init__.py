"""The hierarchical time wheel: pure, no I/O and no clock (``now_s`` is passed in).

``wheel.py`` holds ``TimingWheel`` and says how it works; the private modules
beside it are its linked lists (``_lists``), the heaps that say where to look
next (``_heaps``), the firing of due lists (``_fire``) and tick rounding
(``_ticks``).
"""

from delaywheel.wheel.wheel import (
    DEFAULT_SLOTS,
    DEFAULT_TICK_S,
    MAX_SLOTS,
    MIN_TICK_S,
    MOVE_BUDGET,
    Entry,
    TimingWheel,
    WheelStats,
)

__all__ = [
    "DEFAULT_SLOTS",
    "DEFAULT_TICK_S",
    "MAX_SLOTS",
    "MIN_TICK_S",
    "MOVE_BUDGET",
    "Entry",
    "TimingWheel",
    "WheelStats",
]

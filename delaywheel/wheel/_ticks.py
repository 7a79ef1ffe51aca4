"""Time to tick numbers and back, for the time wheel (see ``delaywheel.wheel.wheel``).

Tick ``n`` starts at ``n * tick_s`` seconds after the Unix epoch. The
arithmetic is float (``tick_s`` may be 0.001), so a quotient can round to
the neighbouring tick: each helper re-checks its product and steps by one,
so that a timer fires late by a tick rather than early. ``tick_ceil`` is the
one rounding of a due time to its tick: the wheel's insert and its cascade
(``_lists.move_front``) both call it. Inlined, it saved about 4 % of an
insert's instructions (callgrind), 0.5 % of an add through a connection; one
copy that cannot drift was judged worth that (docs/performance.md).
"""

from __future__ import annotations

import math


def tick_floor(t_s: float, tick_s: float) -> int:
    """The last tick that has started by ``t_s``: largest n, n*tick_s <= t_s."""
    n = math.floor(t_s / tick_s)
    if n * tick_s > t_s:
        n -= 1
    elif (n + 1) * tick_s <= t_s:
        n += 1
    return n


def tick_ceil(t_s: float, tick_s: float) -> int:
    """The tick a timer due at ``t_s`` fires on: smallest n, n*tick_s >= t_s."""
    n = math.ceil(t_s / tick_s)
    if n * tick_s < t_s:
        n += 1
    elif (n - 1) * tick_s >= t_s:
        n -= 1
    return n


def check_time(name: str, value: float) -> None:
    """Refuse a time the wheel cannot place: not a number, or not finite."""
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")

"""The tick driver: sleeps until the wheel's next non-empty tick, then advances it.

The wheel never reads a clock; this is where the wall clock meets it. After
every change that may have moved a timer earlier, ``rearm`` looks again, so
the driver sleeps exactly until the next thing due instead of waking every
tick. It also wakes at least every ``MAX_SLEEP_S``, so that a forward jump
of the wall clock is noticed without waiting out a long sleep.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from delaywheel.engine.engine import Engine

log = logging.getLogger("delaywheel.server")  # pinned: its name is documented

MAX_SLEEP_S = 1.0


class Ticker:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._timer: asyncio.TimerHandle | None = None
        self._armed_s: float | None = None  # when the armed timer fires (wall clock)
        self._stopped = False

    def start(self) -> None:
        self._on_tick()

    def stop(self) -> None:
        """Nothing fires from now on (the server is shutting down)."""
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def rearm(self) -> None:
        """Sleep until the wheel's next non-empty tick (called after every change)."""
        if self._stopped:
            return
        next_s = self.engine.next_fire_s()
        if next_s is None:
            next_s = time.time() + MAX_SLEEP_S
        if self._armed_s is not None and self._armed_s <= next_s:
            return
        if self._timer is not None:
            self._timer.cancel()
        delay_s = min(max(next_s - time.time(), 0.0), MAX_SLEEP_S)
        self._armed_s = time.time() + delay_s
        self._timer = asyncio.get_running_loop().call_later(delay_s, self._on_tick)

    def _on_tick(self) -> None:
        self._timer = None
        self._armed_s = None
        try:
            self.engine.advance(time.time())
        except Exception:  # the driver must survive a bug in one task's handling
            log.exception("advancing the wheel failed")
        self.rearm()

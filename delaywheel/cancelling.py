"""Cancelling tasks that may be inside a redis-py call, within a bound.

redis-py (8.2, on Python 3.11) swallows a cancel that lands while a command
is being sent: its ``asyncio.wait_for`` around the send returns the finished
send, and the command goes on to wait for its reply. A task cancelled once
can therefore run on until Redis answers or the socket times out, which with
Redis paused (``CLIENT PAUSE``) or frozen is longer than a stop may wait: a
node's SIGTERM once waited out a 10 s pause in a broker's connection attempt
(tests/test_ha_stop.py). So a stop cancels again until the task ends (a later
cancel lands in the read, where it is honoured), and stops waiting after a
bound. The loops such tasks run end on a flag of their own as well
(``_closing``, ``_stopping``): a loop whose one cancel was swallowed would
otherwise go on for ever.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any

# How often a task that is still running is cancelled again.
RECANCEL_EVERY_S = 0.02
# How long a close waits, by default, for its tasks to end once cancelled
# (connecting, probing, renewing, resending, a delivery cut off at shutdown);
# past it they are left to end by themselves and the close goes on.
CANCEL_WAIT_S = 1.0


async def cancel_and_wait(
    tasks: Iterable[asyncio.Task[Any]], within_s: float = CANCEL_WAIT_S
) -> set[asyncio.Task[Any]]:
    """Cancel ``tasks`` until they end, for up to ``within_s``; returns those
    still running then (left to end by themselves)."""
    pending = set(tasks)
    deadline_s = time.monotonic() + within_s
    while True:
        done = {task for task in pending if task.done()}
        for task in done:  # retrieved, as gather(return_exceptions=True) did: no
            if not task.cancelled():  # "exception was never retrieved" at exit
                task.exception()
        pending -= done
        left_s = deadline_s - time.monotonic()
        if not pending or left_s <= 0:
            return pending
        for task in pending:
            task.cancel()
        await asyncio.wait(pending, timeout=min(RECANCEL_EVERY_S, left_s))

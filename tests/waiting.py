"""Waiting for a condition in a test: poll it, with a deadline and a message.

A test that must wait for something to happen (a reserve blocked in the
server, a request at an endpoint, a log line) polls for it here rather than
sleeping a guessed time: a fixed sleep is too short on a loaded machine and
too long everywhere else. A sleep stays only where time passing is the test
itself (nothing fires early, a backoff is waited out), with a comment saying so.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

WAIT_TIMEOUT_S = 20.0  # a bound for a hung condition: polls return as soon as it holds
POLL_S = 0.02


def wait_until(
    condition: Callable[[], T | None], timeout_s: float = WAIT_TIMEOUT_S, what: str = ""
) -> T:
    """Call ``condition`` until it returns something true, and return that; past
    ``timeout_s``, fail the test saying ``what`` it waited for."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = condition()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what or condition}")
        time.sleep(POLL_S)


async def wait_until_async(
    condition: Callable[[], Awaitable[T | None]],
    timeout_s: float = WAIT_TIMEOUT_S,
    what: str = "",
) -> T:
    """``wait_until`` inside an event loop, for an async ``condition``."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = await condition()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what or condition}")
        await asyncio.sleep(POLL_S)

"""What every broker sender shares: its connection state, its log lines, its backoff.

A sender connects in the background (``start``) and never makes the server's
start-up wait or fail on a broker that is down. While the broker is known to
be unreachable, a delivery fails at once with the last connection error, so
a dead broker costs the dispatcher no time; the task is retried on its own
schedule. Only the very first connection attempt is waited for (up to the
connect timeout), so deliveries due at start-up do not fail merely because
the connection was still being made.

State changes are logged once per change, not per retry: a warning when the
broker becomes unreachable, an info line when it is back. Every text that may
reach a log line, ``stats`` or a task's last error goes through ``describe``
or ``failed``, which remove the URL's secrets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ClassVar

from delaywheel.cancelling import cancel_and_wait
from delaywheel.delivery.base import Delivery, DeliveryFailed
from delaywheel.store.base import scrub

log = logging.getLogger("delaywheel.delivery.brokers")

# Waits between connection attempts double from the first to the cap: a
# broker that restarts is usually back within a second, and one that stays
# down is tried every few seconds, which costs nothing worth bounding further.
RECONNECT_MIN_S = 0.1
RECONNECT_MAX_S = 2.0
# An exception's text can be long (a traceback-ish repr from a driver);
# stats and a task's last error only need the gist.
MAX_ERROR_CHARS = 300


class BrokerLink:
    """One named broker: the state ``stats`` shows, shared by every sender kind.

    Subclasses implement ``start``, ``send`` and ``_release``; they report
    their connection with ``mark_up`` and ``mark_down``.
    """

    kind: ClassVar[str]

    def __init__(
        self,
        name: str,
        url: str,
        *,
        display_url: str,
        secrets: list[str],
        timeout_s: float,
        connect_timeout_s: float,
    ) -> None:
        self.name = name
        self.url = display_url
        self._raw_url = url
        self._secrets = secrets
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.connected = False
        self.failing_since: float | None = None  # Unix s of the first failure in a row
        self.last_error: str | None = None  # the last connection failure, kept after recovery
        self._closing = False
        self._tasks: set[asyncio.Task[None]] = set()
        # Set when the first connection attempt has ended, either way.
        self._first_attempt: asyncio.Event | None = None

    def start(self) -> None:
        """Begin connecting in the background; returns at once."""
        raise NotImplementedError

    async def send(self, delivery: Delivery) -> None:
        """Deliver, once connected (``usable``); raise only ``DeliveryFailed``."""
        raise NotImplementedError

    async def _release(self) -> None:
        """Close the driver's connection (the background tasks are already stopped)."""
        raise NotImplementedError

    def state(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "url": self.url,
            "connected": self.connected,
            "failing_since": self.failing_since,
            "last_error": self.last_error,
        }

    async def close(self) -> None:
        self._closing = True  # first: a retry loop whose cancel is swallowed ends on it
        # Cancelled until they end, not once and waited for: a Redis sender's
        # connection attempt swallowed the cancel and held a SIGTERM for as
        # long as Redis was paused (delaywheel/cancelling.py); past the bound the
        # connection is closed under them.
        await cancel_and_wait(self._tasks)
        await self._release()
        self.connected = False

    # -- for the subclasses ------------------------------------------------------

    def spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``work`` in the background until it ends or ``close`` cancels it."""
        if self._first_attempt is None:
            self._first_attempt = asyncio.Event()  # made here: it needs the running loop
        task = asyncio.get_running_loop().create_task(work, name=f"broker {self.name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def retry(self, attempt: Callable[[], Awaitable[None]]) -> None:
        """Call ``attempt`` until it returns, backing off between failures."""
        delay_s = RECONNECT_MIN_S
        while not self._closing:
            try:
                await attempt()
            except Exception as exc:  # any failure to connect is retried, and logged once
                self.mark_down(exc)
            else:
                self.mark_up()
                return
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, RECONNECT_MAX_S)

    def mark_up(self) -> None:
        self._attempted()
        if self.connected or self._closing:
            return
        if self.failing_since is None:
            log.info("broker %r (%s) connected", self.name, self.url)
        else:
            log.info(
                "broker %r (%s) is back after %.1f s",
                self.name,
                self.url,
                time.time() - self.failing_since,
            )
        self.connected = True
        self.failing_since = None

    def mark_down(self, error: BaseException | str) -> None:
        self._attempted()
        if self._closing:
            return
        self.last_error = error if isinstance(error, str) else self.describe(error)
        if self.connected or self.failing_since is None:
            log.warning(
                "broker %r (%s) unreachable: %s; reconnecting in the background",
                self.name,
                self.url,
                self.last_error,
            )
        self.connected = False
        if self.failing_since is None:
            self.failing_since = time.time()

    async def usable(self) -> None:
        """Return when the broker is connected, else raise ``DeliveryFailed``."""
        if self.connected:
            return
        first = self._first_attempt
        if first is not None and not first.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(first.wait(), self.connect_timeout_s)
        if not self.connected:
            raise self.failed(f"not connected ({self.last_error or 'still connecting'})")

    def describe(self, exc: BaseException) -> str:
        """An exception as one line for a log, ``stats`` or a task: no secrets, bounded."""
        # Some drivers end their text with a period; the callers add more after it.
        detail = scrub(str(exc), self._secrets).strip().rstrip(".")
        text = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
        return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."

    def failed(self, reason: str) -> DeliveryFailed:
        return DeliveryFailed(f"{self.kind} broker {self.name!r}: {scrub(reason, self._secrets)}")

    def _attempted(self) -> None:
        if self._first_attempt is not None:
            self._first_attempt.set()

"""Live numbers: one producer, a one-hour ring of 1 s samples, and the SSE streams.

One task builds a snapshot each second (``Producer``): counts by state, the
per-second rates of added, fired, delivered, failed and acked, lateness
p50/p99 over the last ``LATENESS_WINDOW_S``, the store's health and the
connections. It appends the sample to the ring and hands the JSON to every
subscriber, which keeps only the latest: a slow viewer skips samples
instead of piling them up, and the work per second is the same whatever
the number of viewers. The ring is columns of doubles, 3,600 samples of
``len(COLUMNS)`` values (under 400 KB); it starts empty at the server's
start, and longer history is Prometheus' job (docs/dashboard.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from array import array
from collections import deque
from typing import TYPE_CHECKING, Any

from delaywheel.engine.task import STATES
from delaywheel.tallies import LATENESS_BOUNDS_S

if TYPE_CHECKING:
    from delaywheel.net.server import Server

RING_SAMPLES = 3600  # one hour of 1 s samples
SAMPLE_S = 1.0
HEARTBEAT_S = 15.0
MAX_STREAMS = 32
LATENESS_WINDOW_S = 10  # lateness quantiles over this many recent samples
RATES = ("added", "fired", "delivered", "failed", "acked")
COLUMNS = ("t", *STATES, *RATES, "p50", "p99")


def quantile(counts: list[int], q: float) -> float | None:
    """The upper bound of the bucket holding the ``q`` quantile (None: no values;
    above the last bound: that bound, the most a histogram can say)."""
    total = sum(counts)
    if not total:
        return None
    rank = q * total
    running = 0
    for bound, n in zip((*LATENESS_BOUNDS_S, LATENESS_BOUNDS_S[-1]), counts, strict=True):
        running += n
        if running >= rank:
            return bound
    return LATENESS_BOUNDS_S[-1]


class Ring:
    """The last ``RING_SAMPLES`` samples, a column of doubles per figure."""

    def __init__(self, size: int = RING_SAMPLES) -> None:
        self.size = size
        self._columns = {name: array("d", bytes(8 * size)) for name in COLUMNS}
        self._next = 0
        self.count = 0

    def append(self, sample: dict[str, float]) -> None:
        at = self._next
        for name, column in self._columns.items():
            column[at] = sample.get(name, float("nan"))
        self._next = (at + 1) % self.size
        self.count = min(self.count + 1, self.size)

    def series(self, name: str, last: int | None = None) -> list[float]:
        """One column's samples, oldest first (the last ``last`` of them)."""
        n = self.count if last is None else min(last, self.count)
        column = self._columns[name]
        start = (self._next - n) % self.size
        return [column[(start + i) % self.size] for i in range(n)]

    def nbytes(self) -> int:
        return sum(column.itemsize * len(column) for column in self._columns.values())


class Producer:
    """Samples the server once a second for the ring and every stream."""

    def __init__(self, server: Server) -> None:
        self._server = server
        self.ring = Ring()
        self.latest: dict[str, Any] = {}
        self._last_totals: dict[str, int] | None = None
        self._lateness: deque[list[int]] = deque(maxlen=LATENESS_WINDOW_S + 1)
        self._subscribers: set[Subscriber] = set()
        self._task: asyncio.Task[None] | None = None
        self.samples = 0  # built since the start: one a second, whatever the viewers

    def start(self) -> None:
        self.sample()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for subscriber in list(self._subscribers):
            subscriber.close()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(SAMPLE_S - time.time() % SAMPLE_S)
            self.sample()

    def _totals(self) -> dict[str, int]:
        engine, deliveries = self._server.engine, self._server.deliveries
        events = engine.events
        dispatcher = None if deliveries is None else deliveries.dispatcher
        return {
            "added": events.added,
            "fired": events.fired,
            "acked": events.acked,
            "delivered": 0 if dispatcher is None else dispatcher.delivered,
            "failed": 0 if dispatcher is None else dispatcher.failed,
        }

    def sample(self) -> dict[str, Any]:
        """Build one snapshot, keep it in the ring and offer it to every stream."""
        server = self._server
        now_s = time.time()
        snapshot = server.engine.snapshot()
        totals = self._totals()
        last = self._last_totals or totals
        self._last_totals = totals
        self._lateness.append(list(snapshot.lateness.counts))
        oldest = self._lateness[0]
        window = [new - old for new, old in zip(self._lateness[-1], oldest, strict=True)]
        p50, p99 = quantile(window, 0.5), quantile(window, 0.99)
        states = snapshot.counts.by_state()
        rates = {name: totals[name] - last[name] for name in RATES}
        sample = {
            "t": now_s,
            **{state: float(states[state]) for state in STATES},
            **{name: float(n) for name, n in rates.items()},
            "p50": float("nan") if p50 is None else p50,
            "p99": float("nan") if p99 is None else p99,
        }
        self.ring.append(sample)
        self.samples += 1
        self.latest = {
            "t": now_s,
            "uptime": now_s - snapshot.started_s,
            "tasks": snapshot.tasks,
            "states": states,
            "rates": rates,
            "lateness": {"p50": p50, "p99": p99},
            "store": {
                "url": snapshot.store,
                "up": snapshot.store_up,
                "errors": snapshot.store_errors,
            },
            "connections": len(server.connections),
            "waiting_reserves": snapshot.waiting_reserves,
            "wheel": {"pending": snapshot.wheel.pending, "cursor": snapshot.wheel.cursor_slot},
        }
        data = json.dumps(self.latest, separators=(",", ":"))
        for subscriber in self._subscribers:
            subscriber.offer(data)
        return self.latest

    # -- streams ---------------------------------------------------------------

    def subscribe(self) -> Subscriber | None:
        """A new stream, or None past ``MAX_STREAMS`` (the caller answers 503)."""
        if len(self._subscribers) >= MAX_STREAMS:
            return None
        subscriber = Subscriber(self._subscribers)
        self._subscribers.add(subscriber)
        subscriber.offer(json.dumps(self.latest, separators=(",", ":")))
        return subscriber

    @property
    def streams(self) -> int:
        return len(self._subscribers)


class Subscriber:
    """One stream: holds only the latest snapshot not yet sent."""

    def __init__(self, registry: set[Subscriber]) -> None:
        self._registry = registry
        self._latest: str | None = None
        self._wake = asyncio.Event()
        self.closed = False

    def offer(self, data: str) -> None:
        self._latest = data  # an unsent older one is dropped: nothing piles up
        self._wake.set()

    async def next(self, timeout_s: float) -> str | None:
        """The latest snapshot, or None after ``timeout_s`` without one (a heartbeat)."""
        try:
            await asyncio.wait_for(self._wake.wait(), timeout_s)
        except asyncio.TimeoutError:
            return None
        self._wake.clear()
        data, self._latest = self._latest, None
        return data

    def close(self) -> None:
        self.closed = True
        self._registry.discard(self)
        self._wake.set()


def frame(data: str, event: str = "snapshot") -> bytes:
    """One SSE event; ``data`` is one line of JSON (json.dumps writes no newline)."""
    return f"event: {event}\ndata: {data}\n\n".encode()


HEARTBEAT = b": heartbeat\n\n"
PREAMBLE = b"retry: 3000\n\n"  # the browser reconnects 3 s after a drop


def chart_values(values: list[float]) -> str:
    """Samples for ``dash.js`` to extend (``data-values``): a NaN (nothing
    fired, so no lateness) is an empty item, a gap, never a zero."""
    return ",".join("" if v != v else f"{v:g}" for v in values)

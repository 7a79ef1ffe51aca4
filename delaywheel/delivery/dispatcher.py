"""Runs deliveries beside the tick and the requests, and reports their outcome.

The engine queues each targeted task as it falls due (``queue``). Tasks wait
in lanes, one per destination: an HTTP origin (scheme, host and port) or a
broker. A lane runs at most its limit at a time; when it has room it asks
the engine to begin the next task's attempt (``Engine.attempts.begin``:
journaled first), sends it once durable with the target's sender, and tells
the engine how it went (``Engine.delivered``), which journals the outcome.

So a slow or dead destination fills its own lane and nothing else: 1,000
callbacks to an endpoint that takes a second each hold 64 requests in flight
there, while the other lanes, the wheel and the clients go on. A waiting
task is a task id in a deque, not a coroutine nor a journaled attempt: a
burst of 200,000 due at once costs the wheel and the lanes a few hundred
nanoseconds each, and only the attempts that start are written.

At shutdown ``drain`` gives the deliveries in flight a grace period and then
cancels them; those stay ``delivering`` in the store and are tried again
after the restart with the same attempt number, and the ones still waiting
stay ``delayed`` and due (at-least-once).
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import logging
import time
from collections import deque
from collections.abc import Callable
from functools import partial
from itertools import count
from typing import Any
from urllib.parse import urlsplit

from delaywheel.cancelling import cancel_and_wait
from delaywheel.delivery.attempt_log import AttemptLog
from delaywheel.delivery.base import PUBLISHED, Answer, Delivery, DeliveryFailed, Sender
from delaywheel.tallies import DELIVERY_BOUNDS_S, Histogram

log = logging.getLogger("delaywheel.delivery.dispatcher")  # pinned: its name is documented

# Pushes in flight to one broker: each waits for the broker's confirmation
# over one connection, so a few hundred keep it busy without a backlog there.
BROKER_LANE_LIMIT = 256
# A Redis push holds a pooled connection for its round trip, and redis-py's
# asyncio pool has at most 100: past that, pushes fail at once ("Too many
# connections"), which bench/deliveries.py saw for 94 % of a 20,000 burst.
REDIS_LANE_LIMIT = 64

# (task id, attempt, error or None, now_s): Engine.delivered.
Report = Callable[[str, int, str | None, float, Answer | None], None]
# (task id, ready): Engine.attempts.begin; False when the task is not waiting.
# ready answers whether the send began.
Begin = Callable[[str, Callable[[Delivery | None], bool]], bool]
# The sender for a target: the HTTP sender, or a broker's.
SenderFor = Callable[[dict[str, Any]], Sender]


# The task priority most tasks have (the engine's DEFAULT_PRIORITY; delivery
# sits below the engine and cannot import it).
DEFAULT_PRIORITY = 1024


class _Lane:
    """A destination's line. Tasks of the default priority wait in
    ``waiting`` in the order they fell due; others in ``ranked``, a heap of
    (priority, arrival, task id): the next to start is the most urgent, the
    first due of that priority. A lane of default-priority tasks alone never
    touches the heap."""

    __slots__ = ("limit", "ranked", "running", "waiting")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.running = 0
        self.waiting: deque[str] = deque()  # task ids
        self.ranked: list[tuple[int, int, str]] = []

    def __len__(self) -> int:
        return len(self.waiting) + len(self.ranked)

    def next_id(self) -> str:
        """The next task id to start (the lane is not empty)."""
        ranked = self.ranked
        if ranked and (ranked[0][0] < DEFAULT_PRIORITY or not self.waiting):
            return heapq.heappop(ranked)[2]
        return self.waiting.popleft()

    def clear(self) -> None:
        self.waiting.clear()
        self.ranked.clear()


def lane_of(target: dict[str, Any]) -> str:
    """The destination a delivery waits in line for."""
    if target["type"] == "http":
        return _origin(target["url"])
    return f"broker {target['broker']}"


@functools.lru_cache(maxsize=4096)
def _origin(url: str) -> str:
    # Cached: a burst of 20,000 due to one endpoint would split its URL 20,000
    # times on the loop (a microsecond or two each) for one answer.
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme}://{parts.hostname}:{port}"


class Dispatcher:
    def __init__(
        self,
        sender_for: SenderFor,
        begin: Begin,
        report: Report,
        *,
        http_lane_limit: int,
        changed: Callable[[], None] = lambda: None,
    ) -> None:
        self._sender_for = sender_for
        self._begin = begin
        self._report = report
        self._changed = changed  # the wheel may have a new next fire time
        self._http_lane_limit = http_lane_limit
        self._lanes: dict[str, _Lane] = {}
        self._arrivals = count()  # orders a lane's ranked tasks of one priority
        self._running: set[asyncio.Task[None]] = set()
        self._closed = False
        self.attempts = AttemptLog()  # the last few of each task lately attempted: the dashboard's
        self.delivered = 0
        self.failed = 0
        # How long attempts took, by (target type, "delivered" or "failed"): for metrics.
        self.durations: dict[tuple[str, str], Histogram] = {}

    def queue(self, task_id: str, target: dict[str, Any], priority: int) -> None:
        """A targeted task is due: it waits for a place in its destination's
        lane, before those of a less urgent ``priority``."""
        if self._closed:
            return  # shutting down: it stays in the store as it is, for the restart
        key = lane_of(target)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane(self._lane_limit(target["type"]))
        if priority == DEFAULT_PRIORITY:
            lane.waiting.append(task_id)
        else:
            heapq.heappush(lane.ranked, (priority, next(self._arrivals), task_id))
        self._pump(key, lane)

    def _lane_limit(self, target_type: str) -> int:
        if target_type == "http":
            return self._http_lane_limit
        return REDIS_LANE_LIMIT if target_type == "redis" else BROKER_LANE_LIMIT

    def _pump(self, key: str, lane: _Lane) -> None:
        while lane.running < lane.limit and (lane.waiting or lane.ranked) and not self._closed:
            lane.running += 1  # before begin(): it may call back at once
            if not self._begin(lane.next_id(), partial(self._ready, key, lane)):
                lane.running -= 1  # deleted or changed since it was queued
        if not (lane.running or lane.waiting or lane.ranked) and self._lanes.get(key) is lane:
            del self._lanes[key]  # lanes come and go with their destinations

    def _ready(self, key: str, lane: _Lane, delivery: Delivery | None) -> bool:
        """A begun attempt is durable: send it (None: it is not to be sent).
        Whether its send began: not once closed (a stop's drain is over)."""
        if delivery is None or self._closed:
            lane.running -= 1
            self._pump(key, lane)
            return False
        task = asyncio.get_running_loop().create_task(self._run(key, lane, delivery))
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return True

    async def _run(self, key: str, lane: _Lane, delivery: Delivery) -> None:
        error: str | None = None
        answer: Answer | None = None
        sent_at_s = time.time()
        started_s = time.monotonic()
        try:
            answer = await self._sender_for(delivery.target).send(delivery) or PUBLISHED
        except DeliveryFailed as exc:
            error = str(exc) or type(exc).__name__
        except Exception as exc:  # a sender's bug: the attempt fails, the server goes on
            log.exception("delivering task %r failed unexpectedly", delivery.task_id)
            error = f"internal error: {exc!r}"
        finally:
            lane.running -= 1
        if self._closed:
            return  # cut off by drain: left delivering, for the restart
        took_s = time.monotonic() - started_s
        self._took(delivery.target["type"], error is None, took_s)
        self.attempts.note(delivery.task_id, delivery.attempt, sent_at_s, took_s, error)
        if error is None:
            self.delivered += 1
        else:
            self.failed += 1
            log.info(
                "task %r attempt %d to %s failed: %s",
                *(delivery.task_id, delivery.attempt, key, error),
            )
        try:
            self._report(delivery.task_id, delivery.attempt, error, time.time(), answer)
            self._changed()
        finally:
            self._pump(key, lane)

    def _took(self, target_type: str, delivered: bool, took_s: float) -> None:
        key = (target_type, "delivered" if delivered else "failed")
        durations = self.durations.get(key)
        if durations is None:
            durations = self.durations[key] = Histogram(DELIVERY_BOUNDS_S)
        durations.observe(took_s)

    def stats(self) -> dict[str, Any]:
        return {
            "in_flight": len(self._running),
            "waiting": sum(len(lane) for lane in self._lanes.values()),
            "delivered": self.delivered,
            "failed": self.failed,
        }

    async def drain(self, grace_s: float) -> int:
        """Let deliveries in flight finish for up to ``grace_s``; start no more.
        Returns how many were cut off (they are tried again after a restart)."""
        for lane in self._lanes.values():
            lane.clear()
        # Until every send has ended, not only those running now: an attempt
        # begun before the lanes were cleared, its own write in flight, starts
        # its send when that write comes back. Cut off, it may have reached its
        # receiver with no outcome written, and the next owner (or the
        # restart) sends it again at its deadline.
        until_s = time.monotonic() + grace_s
        while self._running and (left_s := until_s - time.monotonic()) > 0:
            await asyncio.wait(set(self._running), timeout=left_s)
        self._closed = True
        cut = list(self._running)
        if cut:
            # A Redis push can swallow its cancel and would hold the stop until
            # its reply or its timeout (delaywheel/cancelling.py).
            await cancel_and_wait(cut)
            log.warning("shutdown: %d deliveries cut off, tried again after a restart", len(cut))
        return len(cut)

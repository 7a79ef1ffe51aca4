"""Per-topic ready queues, dead lists, and the consumers waiting on them.

A ready queue is a heap of ``(at_s, queue_seq, task)``: the oldest due task
comes out first, ties in the order they became ready. Removing a task from the
middle (delete, update) is lazy: the task's ``queue_seq`` no longer matches its
heap entry, which is dropped when it surfaces; a heap with more stale entries
than live ones is rebuilt.

Waiters are blocked ``reserve`` calls. Each topic keeps its waiters in arrival
order, and a waiter on several topics sits in each of those lines; the first
live waiter of a topic gets that topic's next ready task (fair FIFO).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable
from contextlib import suppress
from itertools import count
from typing import Any

from delaywheel.task import READY, Task


class ReadyQueue:
    __slots__ = ("heap", "live")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, Task]] = []
        self.live = 0

    def head(self) -> Task | None:
        heap = self.heap
        while heap:
            _, seq, task = heap[0]
            if task.queue_seq == seq and task.state == READY:
                return task
            heapq.heappop(heap)
        return None


class Waiter:
    """A blocked reserve. ``deliver`` is called once, with the reserved task's map."""

    __slots__ = ("deliver", "topics")

    def __init__(self, topics: list[str], deliver: Callable[[dict[str, Any]], None]) -> None:
        self.topics = topics
        self.deliver = deliver


class Queues:
    def __init__(self) -> None:
        self._ready: dict[str, ReadyQueue] = {}
        self._dead: dict[str, dict[str, Task]] = {}  # insertion order = order of death
        self._waiters: dict[str, deque[Waiter]] = {}
        self._woken: set[str] = set()  # see waiting_topics
        self._seq = count(1)

    # -- ready -------------------------------------------------------------

    def push_ready(self, task: Task) -> None:
        queue = self._ready.get(task.topic)
        if queue is None:
            queue = self._ready[task.topic] = ReadyQueue()
        task.queue_seq = seq = next(self._seq)
        heapq.heappush(queue.heap, (task.at_s, seq, task))
        queue.live += 1
        if task.topic in self._waiters:
            self._woken.add(task.topic)

    def drop_ready(self, task: Task) -> None:
        task.queue_seq = -1
        queue = self._ready[task.topic]
        queue.live -= 1
        if queue.live == 0:
            del self._ready[task.topic]
        elif len(queue.heap) > 2 * queue.live + 64:
            queue.heap = [item for item in queue.heap if item[2].queue_seq == item[1]]
            heapq.heapify(queue.heap)

    def oldest_ready(self, topics: Iterable[str]) -> Task | None:
        """The oldest due ready task among ``topics`` (it stays queued)."""
        best: Task | None = None
        for name in topics:
            queue = self._ready.get(name)
            if queue is None:
                continue
            task = queue.head()
            if task is not None and (
                best is None or (task.at_s, task.queue_seq) < (best.at_s, best.queue_seq)
            ):
                best = task
        return best

    # -- dead --------------------------------------------------------------

    def push_dead(self, task: Task) -> None:
        self._dead.setdefault(task.topic, {})[task.id] = task

    def drop_dead(self, task: Task) -> None:
        dead = self._dead[task.topic]
        del dead[task.id]
        if not dead:
            del self._dead[task.topic]

    def oldest_dead(self, topic: str, limit: int) -> list[Task]:
        dead = self._dead.get(topic, {})
        return [task for task, _ in zip(dead.values(), range(limit), strict=False)]

    # -- waiters -------------------------------------------------------------

    def add_waiter(self, waiter: Waiter) -> None:
        for name in waiter.topics:
            self._waiters.setdefault(name, deque()).append(waiter)

    def cancel_waiter(self, waiter: Waiter) -> None:
        """Take a waiter out of every line (a timed-out or disconnected reserve).

        O(waiters on its topics): lines are as long as the consumers of a
        topic, and leaving it behind a long-lived waiter would leak it.
        """
        for name in waiter.topics:
            line = self._waiters.get(name)
            if line is None:
                continue
            with suppress(ValueError):  # not in this line: already served from another
                line.remove(waiter)
            if not line:
                del self._waiters[name]

    def waiting_topics(self) -> list[str]:
        """Topics that got a ready task while a reserve waited on them, since
        the last call: only those can have a waiter to serve. (Scanning every
        topic with a waiter would cost each add as much as there are idle
        consumers.)"""
        woken, self._woken = self._woken, set()
        return [name for name in woken if name in self._waiters and name in self._ready]

    def next_waiter(self, topic: str) -> Waiter | None:
        """The longest-waiting reserve on ``topic`` (lines never hold cancelled ones)."""
        line = self._waiters.get(topic)
        return line[0] if line else None

    def waiter_count(self) -> int:
        return len({id(w) for line in self._waiters.values() for w in line})

    def has_waiters(self) -> bool:
        return bool(self._waiters)

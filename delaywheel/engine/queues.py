"""Per-topic ready queues, dead lists, and the consumers waiting on them.

A ready queue holds ``(at_s, queue_seq, task)`` entries: the oldest due task
comes out first, ties in the order they became ready. Most tasks become ready
in that order already (the wheel fires in due order; adds due now come in
turn), so those go to a run, a deque in order, and only a task older than the
run's newest (a reservation that ran out, a release, an update to an earlier
time) goes to a heap; the head is the older of the two fronts. Taking the
head of a run is O(1), where a large heap's pop was a visible share of a
reserve (docs/performance.md). Removing a task from the middle (delete, update) is
lazy: the task's ``queue_seq`` no longer matches its entry, which is dropped
when it surfaces; a queue with more stale entries than live ones is rebuilt.

Priority comes first (0 is the most urgent), then that order. Tasks of the
default priority (1024, most of them) stay in the run and the heap above,
which know nothing of priority, so a topic that never uses it pays one
comparison per push and one per head. A task of another priority goes to
``ranked``, a heap of ``(priority, at_s, queue_seq, task)``; the head is the
more urgent of its front and the default ones' head.

Watches are blocked ``wait`` calls, one line per task id (the task table
keeps them: a task's every move passes there).

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

from delaywheel.engine.task import DEFAULT_PRIORITY, READY, Task

Entry = tuple[float, int, Task]
# A task of another priority than the default: (priority, at_s, queue_seq, task).
Ranked = tuple[int, float, int, Task]


def _is_live(entry: Entry) -> bool:
    task = entry[2]
    return task.queue_seq == entry[1] and task.state == READY


def _is_live_ranked(entry: Ranked) -> bool:
    task = entry[3]
    return task.queue_seq == entry[2] and task.state == READY


class ReadyQueue:
    __slots__ = ("heap", "live", "ranked", "run")

    def __init__(self) -> None:
        self.run: deque[Entry] = deque()  # in (at_s, queue_seq) order
        self.heap: list[Entry] = []  # the entries that came out of order
        self.ranked: list[Ranked] = []  # tasks of another priority than the default
        self.live = 0

    def __len__(self) -> int:
        """Entries held, stale ones included."""
        return len(self.run) + len(self.heap) + len(self.ranked)

    def push_ranked(self, entry: Ranked) -> None:
        heapq.heappush(self.ranked, entry)

    def push(self, entry: Entry) -> None:
        run = self.run
        # queue_seq only grows, so an entry is in order when its time is.
        if not run or entry[0] >= run[-1][0]:
            run.append(entry)
        else:
            heapq.heappush(self.heap, entry)

    # The head is ``ranked_head()`` when ``ranked`` holds entries, else
    # ``default_head()``: the caller looks (``Queues.oldest_ready``), one call
    # fewer on a reserve than a ``head()`` that chose.

    def default_head(self) -> Task | None:
        """The head among the tasks of the default priority."""
        run, heap = self.run, self.heap
        while run and not _is_live(run[0]):
            run.popleft()
        while heap and not _is_live(heap[0]):
            heapq.heappop(heap)
        if not heap:
            return run[0][2] if run else None
        if run and run[0][:2] < heap[0][:2]:
            return run[0][2]
        return heap[0][2]

    def ranked_head(self) -> Task | None:
        """The head when some tasks have another priority than the default."""
        ranked = self.ranked
        while ranked and not _is_live_ranked(ranked[0]):
            heapq.heappop(ranked)
        task = self.default_head()
        if not ranked:
            return task
        front = ranked[0]
        if task is None or front[:3] < (DEFAULT_PRIORITY, task.at_s, task.queue_seq):
            return front[3]
        return task

    def compact(self) -> None:
        """Drop every stale entry (each keeps its order)."""
        self.run = deque(entry for entry in self.run if entry[2].queue_seq == entry[1])
        self.heap = [entry for entry in self.heap if entry[2].queue_seq == entry[1]]
        heapq.heapify(self.heap)
        self.ranked = [entry for entry in self.ranked if entry[3].queue_seq == entry[2]]
        heapq.heapify(self.ranked)


class Waiter:
    """A blocked reserve. ``deliver`` is called once, with the reserved task's map."""

    __slots__ = ("deliver", "topics")

    def __init__(self, topics: list[str], deliver: Callable[[dict[str, Any]], None]) -> None:
        self.topics = topics
        self.deliver = deliver


class Watch:
    """A blocked ``wait`` on one task. ``deliver`` is called once, with the
    task's map when it is done, dead or gone, or with None when its
    partition leaves this node (the wait is to be sent to its new owner)."""

    __slots__ = ("deliver", "task_id")

    def __init__(self, task_id: str, deliver: Callable[[dict[str, Any] | None], None]) -> None:
        self.task_id = task_id
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
        if task.priority == DEFAULT_PRIORITY:
            queue.push((task.at_s, seq, task))
        else:
            queue.push_ranked((task.priority, task.at_s, seq, task))
        queue.live += 1
        if task.topic in self._waiters:
            self._woken.add(task.topic)

    def drop_ready(self, task: Task) -> None:
        task.queue_seq = -1
        queue = self._ready[task.topic]
        queue.live -= 1
        if queue.live == 0:
            del self._ready[task.topic]
        elif len(queue) > 2 * queue.live + 64:
            queue.compact()

    def oldest_ready(self, topics: Iterable[str]) -> Task | None:
        """The most urgent ready task among ``topics``, the oldest due of
        those (it stays queued)."""
        best: Task | None = None
        for name in topics:
            queue = self._ready.get(name)
            if queue is None:
                continue
            task = queue.ranked_head() if queue.ranked else queue.default_head()
            if task is not None and (
                best is None
                or (task.priority, task.at_s, task.queue_seq)
                < (best.priority, best.at_s, best.queue_seq)
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

    def wake(self, topic: str) -> None:
        """Look at ``topic``'s waiters again at the next ``waiting_topics`` (its
        gate may have opened: engine/flow.py)."""
        if topic in self._waiters:
            self._woken.add(topic)

    def has_ready(self, topic: str) -> bool:
        return topic in self._ready

    def next_waiter(self, topic: str) -> Waiter | None:
        """The longest-waiting reserve on ``topic`` (lines never hold cancelled ones)."""
        line = self._waiters.get(topic)
        return line[0] if line else None

    def waiter_count(self) -> int:
        return len({id(w) for line in self._waiters.values() for w in line})

    def has_waiters(self) -> bool:
        return bool(self._waiters)

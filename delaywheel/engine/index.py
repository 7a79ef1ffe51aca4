"""The engine's bookkeeping of live tasks: by id, in creation order, and counted.

``TaskIndex`` finds a task by id and pages through tasks in the order they
were created (for ``list``). A delayed task due later on may be held packed
(see ``delaywheel.engine.cold``): its id maps to its store record until ``get``
decodes it through ``thaw`` (``ColdTasks.decode``), and it is out of the creation
order until then. ``TaskCounts`` keeps
the per-state and per-topic counts that ``stats`` reports, updated as tasks
move, so ``stats`` never scans.
"""

from __future__ import annotations

import bisect
import heapq
from collections import Counter
from collections.abc import Callable, Iterable
from itertools import count

from delaywheel.engine.task import STATES, Task


def _seq_of(task: Task) -> int:
    return task.seq


# The order list is compacted once its dead entries outnumber the live by this many.
COMPACT_SLACK = 1024


class TaskIndex:
    """Live tasks by id, and every task ever indexed in creation order.

    The order list keeps removed (and packed) tasks until they are more than
    half of it (then it is compacted), so removal stays O(1) and paging skips
    the dead.
    """

    def __init__(self, thaw: Callable[[str, bytes], Task]) -> None:
        self.by_id: dict[str, Task | bytes] = {}  # bytes: a packed task's record
        self._order: list[Task] = []  # sorted by seq; packed tasks join when decoded
        self._ordered = 0  # how many of _order are live (in by_id as themselves)
        self._seq = count(1)
        self._thaw = thaw

    def __len__(self) -> int:
        return len(self.by_id)

    def __contains__(self, task_id: str) -> bool:
        return task_id in self.by_id

    def get(self, task_id: str) -> Task | None:
        """The task with this id, decoded first if it was packed."""
        found = self.by_id.get(task_id)
        if isinstance(found, bytes):
            return self._thaw(task_id, found)
        return found

    def add(self, task: Task) -> None:
        """Index a new (or newly decoded) task: it gets the next sequence number."""
        task.seq = next(self._seq)
        self.by_id[task.id] = task
        order = self._order
        order.append(task)
        self._ordered += 1
        # _compact's test inline, so an add makes no call for it
        if len(order) > 2 * self._ordered + COMPACT_SLACK:
            self._compact()

    def add_loaded(self, tasks: list[Task]) -> None:
        """Index a batch of tasks loaded from the store (distinct ids, none
        indexed yet) in one go: the bulk form of ``add``."""
        first = next(self._seq)
        for seq, task in enumerate(tasks, first):
            task.seq = seq
        if tasks:
            self._seq = count(first + len(tasks))
        self.by_id.update(zip([task.id for task in tasks], tasks, strict=True))
        self._order += tasks
        self._ordered += len(tasks)

    def hold(self, records: list[tuple[str, bytes]]) -> None:
        """Index packed tasks by id, as ``(id, record)`` (distinct ids, none
        indexed yet); each is decoded when first asked for."""
        self.by_id.update(records)

    def last_seq(self) -> int:
        """The sequence number of the newest task indexed (0 before any)."""
        return self._order[-1].seq if self._order else 0

    def freeze(self, task_ids: list[str], records: list[bytes]) -> None:
        """Hold indexed tasks packed, each as its record, until asked for again
        (a batch's at once: one update and one compaction test)."""
        self.by_id.update(zip(task_ids, records, strict=True))
        self._ordered -= len(task_ids)
        self._compact()

    def remove(self, task: Task) -> None:
        if self.by_id.get(task.id) is task:
            del self.by_id[task.id]
            self._ordered -= 1
            self._compact()

    def restore(self, task: Task) -> None:
        """Index again a task that was removed (an undone delete), at its old place."""
        self.by_id[task.id] = task
        self._ordered += 1
        at = bisect.bisect_left(self._order, task.seq, key=_seq_of)
        if at == len(self._order) or self._order[at] is not task:
            self._order.insert(at, task)  # compaction had dropped it

    def _compact(self) -> None:
        """Drop the dead from the order list once they outnumber the live."""
        if len(self._order) > 2 * self._ordered + COMPACT_SLACK:
            by_id = self.by_id
            self._order = [t for t in self._order if by_id.get(t.id) is t]
            self._ordered = len(self._order)

    def page(
        self, after_seq: int, wanted: Callable[[Task], bool], limit: int, budget: int
    ) -> tuple[list[Task], int | None]:
        """Up to ``limit`` live tasks created after ``after_seq`` that are ``wanted``,
        looking at no more than ``budget`` entries; also the cursor to go on from
        (None when the end was reached)."""
        order, by_id = self._order, self.by_id
        start = bisect.bisect_right(order, after_seq, key=_seq_of)
        end = min(len(order), start + budget)
        found: list[Task] = []
        index = start
        while index < end and len(found) < limit:
            task = order[index]
            index += 1
            if by_id.get(task.id) is task and wanted(task):
                found.append(task)
        more = index < len(order)
        return found, (order[index - 1].seq if more and index > start else None)


class TaskCounts:
    """How many tasks are in each state, overall and per topic."""

    def __init__(self) -> None:
        # Plain dicts, not Counters: a Counter's += costs three times a dict's,
        # twice per add (docs/performance.md, "Measurements behind the code").
        self._states: dict[str, int] = dict.fromkeys(STATES, 0)
        self._topics: dict[str, dict[str, int]] = {}  # no zeros in these

    def add(self, topic: str, state: str, n: int = 1) -> None:
        self._states[state] += n
        counts = self._topics.get(topic)
        if counts is None:
            self._topics[topic] = {state: n}
        else:
            counts[state] = counts.get(state, 0) + n

    def remove(self, topic: str, state: str) -> None:
        self._states[state] -= 1
        counts = self._topics[topic]
        left = counts[state] - 1
        if left:
            counts[state] = left
            return
        del counts[state]  # counts holds no zeros: empty when no task of the topic is left
        if not counts:
            del self._topics[topic]

    def remove_many(self, topic: str, state: str, n: int) -> None:
        """``remove`` ``n`` times over, in one step (a handover's far counts:
        millions of far tasks, engine/far_pull.py)."""
        if not n:
            return
        self._states[state] -= n
        counts = self._topics[topic]
        left = counts[state] - n
        if left:
            counts[state] = left
            return
        del counts[state]
        if not counts:
            del self._topics[topic]

    def add_all(self, tasks: Iterable[Task]) -> None:
        """Count many tasks at once (a batch of a load): one C-level pass."""
        for (topic, state), n in Counter((t.topic, t.state) for t in tasks).items():
            self.add(topic, state, n)

    def add_topics(self, topics: Iterable[str], state: str) -> None:
        """Count tasks in ``state``, one per topic given (repeats and all)."""
        for topic, n in Counter(topics).items():
            self.add(topic, state, n)

    def of_topic(self, topic: str) -> dict[str, int]:
        """``topic``'s counts by state (states with none left out): read, never change."""
        return self._topics.get(topic, _NONE)

    def by_state(self) -> dict[str, int]:
        return {state: self._states[state] for state in STATES}

    def topic_count(self) -> int:
        """How many topics have a task."""
        return len(self._topics)

    def largest_topics(self, limit: int) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
        """The ``limit`` topics with the most tasks, each counted by state (every
        state, zeros too), and the other topics' counts summed by state. One
        pass over the topics (for metrics, whose labels must stay few)."""
        largest = heapq.nlargest(
            limit, self._topics.items(), key=lambda item: sum(item[1].values())
        )
        named = {
            topic: {state: counts.get(state, 0) for state in STATES} for topic, counts in largest
        }
        rest = dict.fromkeys(STATES, 0)
        if len(self._topics) > len(named):
            for state, n in self._states.items():
                rest[state] = n - sum(counts[state] for counts in named.values())
        return named, rest

    def by_topic(self) -> dict[str, dict[str, int]]:
        return {
            topic: {state: n for state, n in counts.items() if n}
            for topic, counts in self._topics.items()
        }


_NONE: dict[str, int] = {}  # of_topic's answer for a topic with no task

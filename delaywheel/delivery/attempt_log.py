"""The last few delivery attempts of the tasks attempted lately, for the dashboard.

Kept in memory only, apart from the task: a task that never had an attempt
(most tasks, and every task waiting in the wheel) costs nothing here, and
the log is bounded whatever the traffic: the last ``PER_TASK`` attempts of
each of the last ``TASKS`` tasks attempted, each error cut at
``ERROR_CHARS`` (under 3 MB at worst). Noting one is a dict move and an
append, beside a send that costs far more; the request path never touches
it. It starts empty at the server's start and is not written to the store:
the task itself keeps its attempts count and last error durably.

Only the server's own deliveries (HTTP and broker targets) are noted: a
worker's reserve and release are requests, and stay as fast as they are.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

TASKS = 1000
PER_TASK = 5
ERROR_CHARS = 300


class Attempt(NamedTuple):  # a tuple: made in a fraction of a frozen dataclass' time
    number: int  # the task's attempt number (1 for the first)
    started_s: float  # wall clock, when it was sent
    took_s: float
    error: str | None  # None: delivered


class AttemptLog:
    def __init__(self, tasks: int = TASKS, per_task: int = PER_TASK) -> None:
        self._tasks = tasks
        self._per_task = per_task
        # Oldest noted first. An OrderedDict: dropping the oldest of a plain
        # dict again and again makes finding the first entry slower each time.
        self._by_task: OrderedDict[str, list[Attempt]] = OrderedDict()

    def note(
        self, task_id: str, number: int, started_s: float, took_s: float, error: str | None
    ) -> None:
        by_task = self._by_task
        attempts = by_task.get(task_id)
        if attempts is None:
            attempts = by_task[task_id] = []
            if len(by_task) > self._tasks:
                by_task.popitem(last=False)
        else:
            by_task.move_to_end(task_id)  # the newest
        if error is not None and len(error) > ERROR_CHARS:
            error = error[: ERROR_CHARS - 1] + "…"
        attempts.append(Attempt(number, started_s, took_s, error))
        if len(attempts) > self._per_task:
            del attempts[0]

    def of(self, task_id: str) -> list[Attempt]:
        """The task's last attempts, the newest first (none noted: [])."""
        return self._by_task.get(task_id, [])[::-1]

    def __len__(self) -> int:
        return len(self._by_task)

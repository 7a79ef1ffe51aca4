"""memory:// -- a dict in the server's process. Nothing is persisted.

For tests and throwaway runs. "Durable" here means only that the change is in
the dict: every record is gone when the store object is. A write cannot fail
half way, so it is all or nothing, and it completes before ``submit()``
returns: a reply waiting on it can leave in the same loop turn.
``warnings()`` says so, once, at start-up.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import ClassVar

from delaywheel.store.base import DEFAULT_BATCH_SIZE, Changes, Done, Store, check_batch_size


class MemoryStore(Store):
    persistent: ClassVar[bool] = False
    inline: ClassVar[bool] = True

    def __init__(self, url: str = "memory://") -> None:
        super().__init__(url)
        self._records: dict[str, bytes] = {}

    async def open(self) -> None:
        self._start_open()
        self._state = "open"

    async def load(
        self, batch_size: int = DEFAULT_BATCH_SIZE
    ) -> AsyncIterator[list[tuple[str, bytes]]]:
        check_batch_size(batch_size)
        self._check_open("load")
        items = list(self._records.items())  # a snapshot, as the other stores give
        for start in range(0, len(items), batch_size):
            yield items[start : start + batch_size]

    def submit(self, changes: Changes, done: Done) -> None:
        error = self._not_open("write")
        if error is not None:
            done(error)
            return
        records = self._records
        for task_id, record in changes.items():
            if record is None:
                records.pop(task_id, None)
            else:
                records[task_id] = record
        done(None)

    async def close(self) -> None:
        self._state = "closed"
        self._records = {}

    def warnings(self) -> list[str]:
        return ["memory:// persists nothing: every task is lost when the server stops"]

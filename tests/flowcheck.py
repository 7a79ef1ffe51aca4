"""Checking a topic's limits from the outside: workers that reserve and ack
on clients of their own, recording when each task was handed out and how
many they held at once, and the most arrivals in any window of t.

A worker counts a task held from the moment its ``reserve`` is answered to
the moment before it sends the ``ack``: the server counts it from before the
answer to after the ack, so what the workers see held at once is never more
than what the server had reserved at once. Likewise a task is handed out
(``handed_s``) a little after the server handed it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from delaywheel_client import Client, ClusterClient

AnyClient = Client | ClusterClient
RESERVE_SLICE_S = 0.3  # how long a worker's reserve blocks before it looks at the count


def most_in_any_window(arrivals_s: list[float], window_s: float) -> int:
    """The most of ``arrivals_s`` (times, in s) in any window of ``window_s``."""
    arrivals_s = sorted(arrivals_s)
    most, start = 0, 0
    for end, at_s in enumerate(arrivals_s):
        while arrivals_s[start] <= at_s - window_s:
            start += 1
        most = max(most, end - start + 1)
    return most


class Workers:
    """Threads reserving ``topic`` until ``count`` tasks were acked, each on the
    client its ``connect`` makes, each holding a task ``hold_s`` before its ack.

    ``handed_s`` (``time.monotonic()``) and ``ids`` are in the order the reserves
    were answered; ``most_held`` is the most the workers held at once; ``by``
    names the worker (its index in ``connects``) that got each id."""

    def __init__(
        self,
        connects: Sequence[Callable[[], AnyClient]],
        topic: str,
        count: int,
        hold_s: float = 0.0,
    ) -> None:
        self.topic, self.count, self.hold_s = topic, count, hold_s
        self.lock = threading.Lock()
        self.handed_s: list[float] = []
        self.ids: list[str] = []
        self.by: dict[str, int] = {}
        self.held = 0
        self.most_held = 0
        self.acked = 0
        self.errors: list[BaseException] = []
        self.threads = [
            threading.Thread(target=self._work, args=(n, connect), daemon=True)
            for n, connect in enumerate(connects)
        ]
        for thread in self.threads:
            thread.start()

    def _done(self) -> bool:
        with self.lock:
            return self.acked >= self.count or bool(self.errors)

    def _work(self, n: int, connect: Callable[[], AnyClient]) -> None:
        try:
            with connect() as dw:
                while not self._done():
                    task = dw.reserve(self.topic, RESERVE_SLICE_S)
                    if task is None:
                        continue
                    with self.lock:
                        self.handed_s.append(time.monotonic())
                        self.ids.append(task["id"])
                        self.by[task["id"]] = n
                        self.held += 1
                        self.most_held = max(self.most_held, self.held)
                    if self.hold_s:
                        time.sleep(self.hold_s)  # the work: what a limit on held tasks counts
                    with self.lock:
                        self.held -= 1
                    assert dw.ack(task["id"]) is True, task
                    with self.lock:
                        self.acked += 1
        except BaseException as exc:  # handed to the test by join()
            with self.lock:
                self.errors.append(exc)

    def handed(self) -> int:
        with self.lock:
            return len(self.ids)

    def join(self, within_s: float) -> None:
        """Wait for every worker to stop; raise the first worker's error."""
        deadline = time.monotonic() + within_s
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if self.errors:
            raise self.errors[0]
        alive = sum(thread.is_alive() for thread in self.threads)
        assert not alive, f"{alive} workers still running after {within_s} s: {self.acked} acked"

    def report(self) -> dict[str, Any]:
        """What a failed assertion shows."""
        return {"handed": len(self.ids), "acked": self.acked, "most_held": self.most_held}

"""Checking a topic's flow from the outside: workers that reserve and ack
on clients of their own, recording when each task was handed out and how
many they held at once, and the most arrivals in any window of t; on
nodes sharing a keyspace (clusternodes.py), what each node applies to a
topic, ids spread over the nodes, and waits through a ClusterClient.

A worker counts a task held from the moment its ``reserve`` is answered to
the moment before it sends the ``ack``: the server counts it from before the
answer to after the ack, so what the workers see held at once is never more
than what the server had reserved at once. Likewise a task is handed out
(``handed_s``) a little after the server handed it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from clusternodes import PARTITIONS, address, node_pair, served
from delaywheel_client import Client, ClusterClient
from delaywheel_client.errors import ConnectionFailed, NotFound
from delaywheel_client.partitions import partition_of
from endpoint import Endpoint
from serverproc import ServerProcess
from waiting import wait_until

AnyClient = Client | ClusterClient
RESERVE_SLICE_S = 0.3  # how long a worker's reserve blocks before it looks at the count
ACK_AGAIN_S = 20.0  # how long a worker sends an ack again while a node dies and is replaced
# A change reaches the other node within two coordinator rounds (half a
# second each with clusternodes' lease); generous for a loaded machine.
LEARN_TIMEOUT_S = 10.0


def most_in_any_window(arrivals_s: list[float], window_s: float) -> int:
    """The most of ``arrivals_s`` (times, in s) in any window of ``window_s``."""
    arrivals_s = sorted(arrivals_s)
    most, start = 0, 0
    for end, at_s in enumerate(arrivals_s):
        while arrivals_s[start] <= at_s - window_s:
            start += 1
        most = max(most, end - start + 1)
    return most


class Waiting:
    """A ``wait`` blocked in a thread of its own, on the client ``connect`` makes."""

    def __init__(self, connect: Callable[[], AnyClient], task_id: str, timeout_s: float):
        self.answer: Any = "no answer"
        self.error: BaseException | None = None
        self.took_s = 0.0

        def run() -> None:
            started = time.monotonic()
            try:
                with connect() as dw:
                    self.answer = dw.wait(task_id, timeout_s)
            except BaseException as exc:  # handed to the test
                self.error = exc
            self.took_s = time.monotonic() - started

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def result(self, within_s: float = 60.0) -> Any:
        self.thread.join(within_s)
        assert not self.thread.is_alive(), "the wait was never answered"
        if self.error is not None:
            raise self.error
        return self.answer


class Workers:
    """Threads reserving ``topic`` until ``count`` tasks were acked, each on the
    client its ``connect`` makes, each holding a task ``hold_s`` before its ack.

    ``handed_s`` (``time.monotonic()``) and ``ids`` are in the order the reserves
    were answered; ``most_held`` is the most the workers held at once; ``by``
    names the worker (its index in ``connects``) that got each id.

    With ``kill_expected`` a worker outlives a node's death: a ``reserve`` whose
    connection dropped is given up (the task it may have reserved comes back
    after its TTR), an ``ack`` is sent again until it is answered (``not_found``
    then: one sent before was applied before the node died). ``dropped``
    counts them."""

    def __init__(
        self,
        connects: Sequence[Callable[[], AnyClient]],
        topic: str,
        count: int,
        hold_s: float = 0.0,
        kill_expected: bool = False,
    ) -> None:
        self.topic, self.count, self.hold_s = topic, count, hold_s
        self.kill_expected = kill_expected
        self.dropped = 0
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
                    task = self._reserve(dw)
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
                    self._ack(dw, task["id"])
                    with self.lock:
                        self.acked += 1
        except BaseException as exc:  # handed to the test by join()
            with self.lock:
                self.errors.append(exc)

    def _reserve(self, dw: AnyClient) -> dict[str, Any] | None:
        try:
            return dw.reserve(self.topic, RESERVE_SLICE_S)
        except ConnectionFailed:
            if not self.kill_expected:
                raise
            with self.lock:
                self.dropped += 1
            return None

    def _ack(self, dw: AnyClient, task_id: str) -> None:
        deadline_s = time.monotonic() + ACK_AGAIN_S
        while True:
            try:
                assert dw.ack(task_id) is True, task_id
                return
            except NotFound:
                if not self.kill_expected:
                    raise
                return  # an ack before was applied, its answer lost: the task is gone
            except ConnectionFailed:
                # Lost with the node, or sent to it while it died (a dying process's
                # socket may still take a connection).
                if not self.kill_expected or time.monotonic() > deadline_s:
                    raise
                with self.lock:
                    self.dropped += 1
                time.sleep(0.1)

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
        return {
            "handed": len(self.ids),
            "acked": self.acked,
            "most_held": self.most_held,
            "dropped": self.dropped,
        }


# -- on nodes sharing a keyspace ---------------------------------------------------


@pytest.fixture(scope="module")
def nodes(module_redis_url: str) -> Iterator[list[ServerProcess]]:
    """Two nodes on a database of the module's (a fast tick, HTTP targets on this
    machine allowed): import it by name, one pair for each module that does."""
    with node_pair(module_redis_url, "--tick", "0.02", "--http-allow", "127.0.0.1") as pair:
        yield pair


@pytest.fixture
def dw(nodes: list[ServerProcess]) -> Iterator[ClusterClient]:
    with ClusterClient([address(proc) for proc in nodes]) as client:
        yield client


@pytest.fixture
def sink(endpoint: Endpoint) -> Endpoint:
    """The ``endpoint``, its ``/slow`` answering after 0.1 s."""
    endpoint.slow_s = 0.1
    return endpoint


def shares(proc: ServerProcess, topic: str) -> dict[str, Any] | None:
    """What ``proc`` applies to ``topic`` now (its ``stats.topic_shares``)."""
    with Client(*proc.address) as direct:
        found: dict[str, Any] | None = direct.stats()["topic_shares"].get(topic)
        return found


def learned(nodes: list[ServerProcess], topic: str, **wanted: Any) -> list[dict[str, Any]]:
    """Wait until every node applies ``topic``'s settings with ``wanted`` in them."""

    def each() -> list[dict[str, Any]] | None:
        found = [shares(proc, topic) for proc in nodes]
        if all(f is not None and wanted.items() <= f.items() for f in found):
            return found  # type: ignore[return-value]
        return None

    wait_until(lambda: each() is not None, LEARN_TIMEOUT_S, f"both nodes to apply {topic}'s")
    got = each()
    assert got is not None
    return got


def spread_ids(nodes: list[ServerProcess], topic: str, count: int) -> list[str]:
    """``count`` ids of which each node serves about half (and some, at least)."""
    ids = [f"{topic}-{n}" for n in range(count)]
    owned = [served(proc) for proc in nodes]
    per_node = [sum(1 for i in ids if partition_of(i, PARTITIONS) in mine) for mine in owned]
    assert all(per_node), per_node
    return ids


def owner_of(nodes: list[ServerProcess], task_id: str) -> int:
    owned = [partition_of(task_id, PARTITIONS) in served(proc) for proc in nodes]
    assert owned.count(True) == 1, owned
    return owned.index(True)


def one_each(nodes: list[ServerProcess], topic: str) -> list[str]:
    """An id for each node, in ``nodes``' order, that node owning it."""
    return [next(f"{topic}-{n}" for n in range(1000) if owner_of(nodes, f"{topic}-{n}") == i)
            for i in range(len(nodes))]  # fmt: skip


def cluster_wait(nodes: list[ServerProcess], task_id: str, timeout_s: float) -> Waiting:
    """A ``wait`` through a ClusterClient of its own, in a thread."""
    seeds = [address(proc) for proc in nodes]
    return Waiting(lambda: ClusterClient(seeds), task_id, timeout_s)


def blocked_waits(nodes: list[ServerProcess], n: int) -> None:
    def count() -> int:
        total = 0
        for proc in nodes:
            with Client(*proc.address) as direct:
                total += direct.stats()["blocked_waits"]
        return total

    wait_until(lambda: count() >= n, LEARN_TIMEOUT_S, f"{n} waits blocked")


def workers_on_both(nodes: list[ServerProcess], per_node: int, cluster: int) -> list[Any]:
    """Connects for ``per_node`` direct Clients on each node and ``cluster`` ClusterClients."""
    direct = [lambda proc=proc: Client(*proc.address) for proc in nodes for _ in range(per_node)]
    seeds = [address(proc) for proc in nodes]
    return [*direct, *(lambda: ClusterClient(seeds) for _ in range(cluster))]

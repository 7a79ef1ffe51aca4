"""The cluster clients follow ``moved`` while partitions move, and never raise it.

Two real nodes on one keyspace: node b joins node a (half the partitions
move to b), leaves with SIGTERM (they move back), and joins again, while a
``ClusterClient`` (in a thread) and an ``AsyncClusterClient`` (in a loop of
its own) add one task after another. Around each move a partition's nodes
disagree for a moment (the old owner names the new one before it serves,
a map read a moment ago names the old one); a client that gave up after a
fixed number of follows raised ``Moved`` into the caller's code there. Now
a call follows ``moved`` until its deadline, so every add is acknowledged
and none raises.
"""

from __future__ import annotations

import asyncio
import itertools
import threading

import pytest
from clusternodes import LEASE_S, PARTITIONS, address, node, owned_once, served
from conftest import free_port
from delaywheel_client import AsyncClusterClient, Client, ClusterClient
from serverproc import ServerProcess
from waiting import wait_until

pytestmark = [pytest.mark.process, pytest.mark.redis, pytest.mark.slow]

MOVES = 2  # b joins and leaves this many times


class Adder:
    """One client adding a task after another in a thread of its own until ``stop``."""

    def __init__(self, seeds: list[str], topic: str, kind: str, stop: threading.Event) -> None:
        self.seeds, self.topic, self.kind, self.stop = seeds, topic, kind, stop
        self.added: list[str] = []
        self.errors: list[BaseException] = []
        run = self._sync if kind == "sync" else lambda: asyncio.run(self._async())
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def _sync(self) -> None:
        with ClusterClient(self.seeds) as dw:
            for n in itertools.count():
                if self.stop.is_set():
                    return
                try:
                    task_id = f"{self.topic}-{self.kind}{n}"
                    self.added.append(dw.add(self.topic, n, id=task_id, delay=3600)["id"])
                except BaseException as exc:  # reported by the test
                    self.errors.append(exc)

    async def _async(self) -> None:
        async with AsyncClusterClient(self.seeds) as dw:
            for n in itertools.count():
                if self.stop.is_set():
                    return
                try:
                    task_id = f"{self.topic}-{self.kind}{n}"
                    result = await dw.add(self.topic, n, id=task_id, delay=3600)
                    self.added.append(result["id"])
                except BaseException as exc:  # reported by the test
                    self.errors.append(exc)


def _more_adds(adders: list[Adder], what: str) -> None:
    counts = [len(adder.added) for adder in adders]
    wait_until(
        lambda: all(len(x.added) > c + 20 for x, c in zip(adders, counts, strict=True)), 20, what
    )


def test_adds_follow_moved_while_partitions_move_between_two_nodes(
    redis_url: str, topic: str
) -> None:
    a = node(redis_url, "a")
    b: ServerProcess | None = None
    stop = threading.Event()
    adders: list[Adder] = []
    try:
        wait_until(lambda: len(served(a)) == PARTITIONS, 20, "a serving every partition")
        b_port = free_port()
        seeds = [address(a), f"127.0.0.1:{b_port}"]
        adders = [Adder(seeds, topic, kind, stop) for kind in ("sync", "async")]
        _more_adds(adders, "adds to a")
        for _ in range(MOVES):
            b = ServerProcess(
                *("--port", str(b_port), "--node", "b", "--lease", str(LEASE_S)), store=redis_url
            )
            joined = b
            wait_until(lambda: owned_once(a, joined), 30, "half the partitions on b")  # noqa: B023
            _more_adds(adders, "adds while b serves")
            assert b.stop() == 0  # SIGTERM: its partitions go back to a
            b = None
            wait_until(lambda: len(served(a)) == PARTITIONS, 20, "a serving every partition again")
            _more_adds(adders, "adds after b left")
        stop.set()
        for adder in adders:
            adder.thread.join(40)
        assert [e for adder in adders for e in adder.errors] == []
        added = [task_id for adder in adders for task_id in adder.added]
        with Client(*a.address) as dw:
            missing = [task_id for task_id in added if dw.get(task_id) is None]
        assert missing == [], f"{len(missing)} acknowledged adds missing: {missing[:5]}"
        print(f"\n{[len(adder.added) for adder in adders]} adds (sync, async), none raised")
    finally:
        stop.set()
        for proc in (a, b):
            if proc is not None:
                proc.kill()
        for adder in adders:
            adder.thread.join(10)

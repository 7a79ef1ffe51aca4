"""The horizon with real servers: on SQLite, killed with SIGKILL while a
start pulls the far tier, it starts again with every task, counted exactly
(the pull only reads; engine/far_pull.py); on Redis, two nodes, one killed
with SIGKILL: the other takes its partitions' far tiers and fires each far
task once, on time."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest
from clusternodes import LEASE_S, PARTITIONS, node_pair, served
from delaywheel_client import Client
from delaywheel_client.partitions import partition_of
from serverproc import ServerProcess
from waiting import wait_until

from delaywheel.engine.engine import Engine
from delaywheel.store import open_store

PULLED = 6_000  # due within the horizon at the real start: pulled before it listens
FAR = 2_000  # due beyond it: left in the store


def fill(url: str, now_s: float) -> None:
    """A far tier as a server whose clock was far behind would have written."""

    async def main() -> None:
        store = open_store(url)
        await store.open()
        then_s = now_s - 100_000
        engine = Engine(store, now_s=then_s, horizon_s=120.0)
        await engine.load(store.load())
        tasks = [
            {"id": f"p{i}", "topic": "t", "at": now_s + 60 + i % 50} for i in range(PULLED)
        ] + [{"id": f"f{i}", "topic": "u", "at": now_s + 5000 + i} for i in range(FAR)]
        for start in range(0, len(tasks), 1000):
            batch = tasks[start : start + 1000]
            await engine.through_store(lambda batch=batch: engine.add_many(batch, then_s))
            await engine.journal.drain()
        assert engine.horizon.far_total == PULLED + FAR
        await store.close()

    asyncio.run(main())


@pytest.mark.slow
@pytest.mark.process
def test_kill_9_while_a_start_pulls_the_far_tier(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/far.db"
    fill(url, time.time())
    for after_s in (0.7, 1.0):
        proc = subprocess.Popen(
            [sys.executable, "-m", "delaywheel", "serve", "--port", "0", "--store", url,
             "--horizon", "2m"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(after_s)
        proc.kill()
        proc.wait()
    server = ServerProcess("--horizon", "2m", store=url)
    try:
        with Client(*server.address) as client:
            stats = client.stats()
            assert stats["tasks"] == PULLED + FAR
            assert stats["states"]["delayed"] == PULLED + FAR
            assert stats["wheel"]["far"] == FAR
            assert stats["topics"] == {"t": {"delayed": PULLED}, "u": {"delayed": FAR}}
            assert client.get("p123")["topic"] == "t"  # type: ignore[index]
            assert client.get("f1234")["at"] > time.time() + 4000  # type: ignore[index]
            assert client.delete("f1234") is True
            assert client.stats()["wheel"]["far"] == FAR - 1
    finally:
        server.stop()


# -- a takeover of far tasks by another node -----------------------------------------

SOON = 600  # far tasks due after the takeover, in every partition
LATER = 400  # far tasks due in an hour: they stay far, counted


def fill_far(url: str, now_s: float, due_from_s: float) -> None:
    """Far tasks in every partition of the keyspace, written as a node whose
    clock was far behind would have written them: ``SOON`` of topic ``soon``
    due over 10 s from ``due_from_s``, ``LATER`` of topic ``later`` in an hour."""

    async def main() -> None:
        store = open_store(url, partitions=PARTITIONS)
        await store.open()
        then_s = now_s - 100_000
        engine = Engine(store, now_s=then_s, horizon_s=120.0)
        await engine.load(store.load())
        tasks = [
            {"id": f"s{i}", "topic": "soon", "at": due_from_s + 10 * i / SOON} for i in range(SOON)
        ] + [{"id": f"l{i}", "topic": "later", "at": now_s + 3600 + i} for i in range(LATER)]
        await engine.through_store(lambda: engine.add_many(tasks, then_s))
        await engine.journal.drain()
        assert engine.horizon.far_total == SOON + LATER
        await store.close()

    asyncio.run(main())


def far_of(node: ServerProcess) -> tuple[int, int]:
    with Client(*node.address) as client:
        stats = client.stats()
    return stats["wheel"]["far"], stats["tasks"]


@pytest.mark.slow
@pytest.mark.process
@pytest.mark.serial
@pytest.mark.redis
def test_a_node_killed_9_its_far_tasks_fire_once_on_time_from_the_other(redis_url: str) -> None:
    """Two nodes on one keyspace with a short horizon, far tasks in every
    partition (so in node a's); kill -9 of a. Node b takes a's partitions,
    reads their far tier, and every far task is reserved from b once, none
    early, late by at most the bound after a crash (2 leases); the tasks an
    hour away stay far, and b's ``wheel.far`` counts each of them once."""
    now_s = time.time()
    due_from_s = now_s + 45  # after the nodes settle, the kill and the takeover
    fill_far(redis_url, now_s, due_from_s)
    with node_pair(redis_url, "--horizon", "2m", "--tick", "0.05") as (a, b):
        mine = served(a)
        assert any(partition_of(f"s{i}", PARTITIONS) in mine for i in range(SOON))
        # Before the kill: each far task counted by its owner alone.
        (far_a, tasks_a), (far_b, tasks_b) = far_of(a), far_of(b)
        assert (far_a + far_b, tasks_a + tasks_b) == (LATER, SOON + LATER)
        assert far_a == sum(partition_of(f"l{i}", PARTITIONS) in mine for i in range(LATER))
        a.kill()
        wait_until(lambda: len(served(b)) == PARTITIONS, 4 * LEASE_S, "b serves every partition")
        took_over_s = time.time()
        assert took_over_s < due_from_s, "the takeover came after the first far task was due"
        assert far_of(b) == (LATER, SOON + LATER)
        seen: dict[str, int] = {}
        late_s: list[float] = []
        with Client(*b.address) as client:
            deadline_s = due_from_s + 10 + 4 * LEASE_S
            while len(seen) < SOON and time.time() < deadline_s:
                task = client.reserve("soon", timeout=0.5)
                if task is None:
                    continue
                late_s.append(time.time() - task["at"])
                seen[task["id"]] = seen.get(task["id"], 0) + 1
                client.ack(task["id"])
            assert client.reserve("soon", timeout=1.0) is None  # none a second time
            stats = client.stats()
        assert sorted(seen) == sorted(f"s{i}" for i in range(SOON))
        assert set(seen.values()) == {1}
        assert min(late_s) >= 0, min(late_s)  # none early
        assert max(late_s) < 2 * LEASE_S, max(late_s)
        assert (stats["wheel"]["far"], stats["tasks"]) == (LATER, LATER)
        assert stats["topics"] == {"later": {"delayed": LATER}}

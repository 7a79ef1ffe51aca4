"""Saved schedules in a real server process on SQLite and on a private
redis-server: kill -9 at random points of a schedule firing every second, and
restarts, lose no occurrence and double none (the ids are the proof); two
nodes on one Redis keyspace fire each occurrence once (docs/schedules.md)."""

from __future__ import annotations

import random
import sqlite3
import threading
import time
from pathlib import Path

import pytest
import redis
from delaywheel_client import Client, ClusterClient
from delaywheel_client.partitions import record_key
from hacheck import Sink
from schedulenodes import SCHEDULE, assert_each_once, nominal_seconds, schedule_node
from serverproc import ServerProcess
from waiting import wait_until

from delaywheel.schedules.state import read_record

pytestmark = [pytest.mark.process, pytest.mark.slow]


def _nominal_s(task_id: str) -> float:
    return float(task_id.rsplit(":", 1)[1])


def _take(address: tuple[str, int], until_s: float, got: list[str]) -> None:
    """Reserve occurrences until ``until_s`` (ttr 0: each is gone once handed out)."""
    with Client(*address) as dw:
        while time.time() < until_s:
            task = dw.reserve("occ", timeout=0.2)
            if task is not None:
                got.append(task["id"])


def _drain_fired(address: tuple[str, int], schedule_id: str, got: list[str]) -> int:
    """Pause the schedule, then take every occurrence it fired; its count of fired."""
    with Client(*address) as dw:
        state = dw.schedule_pause(schedule_id)

    def all_taken() -> bool:
        _take(address, time.time() + 0.3, got)
        return len(nominal_seconds(got, schedule_id)) >= state["counts"]["fired"]

    wait_until(all_taken, 10, "every fired occurrence to be taken")
    return int(state["counts"]["fired"])


def test_kill_9_and_restart_lose_no_occurrence_and_double_none(durable_store_url: str) -> None:
    proc = ServerProcess(store=durable_store_url)
    try:
        with Client(*proc.address) as dw:
            dw.schedule_add({"id": "beat", **SCHEDULE})
        got: list[str] = []
        rng = random.Random(17)
        for _ in range(3):
            # A kill at a random point of a second: before, during or after a fire.
            _take(proc.address, time.time() + 1.5 + rng.random(), got)
            proc.kill()
            time.sleep(rng.random())
            proc.start()
        _take(proc.address, time.time() + 1.5, got)
        fired = _drain_fired(proc.address, "beat", got)
    finally:
        proc.kill()
    assert fired >= 5
    assert_each_once(got, "beat", fired)


def test_a_restart_loads_the_schedule_and_its_state(durable_store_url: str) -> None:
    proc = ServerProcess(store=durable_store_url)
    try:
        with Client(*proc.address) as dw:
            dw.schedule_add({"id": "kept", "every": 3600, "topic": "t", "jitter": 30})
            dw.schedule_update("kept", {"max_runs": 3}, 1)
            dw.schedule_pause("kept", "for the restart")
            before = dw.schedule_get("kept")
        proc.stop()
        proc.start()
        with Client(*proc.address) as dw:
            after = dw.schedule_get("kept")
            stats = dw.stats()
    finally:
        proc.kill()
    assert after == before and after["version"] == 3 and after["note"] == "for the restart"
    assert stats["schedules"] == {"count": 1, "paused": 1}


@pytest.mark.redis
def test_two_nodes_on_one_redis_fire_each_occurrence_once(redis_url: str) -> None:
    nodes = [schedule_node(redis_url, "a"), schedule_node(redis_url, "b")]
    try:
        seeds = [f"{node.host}:{node.port}" for node in nodes]

        def settled() -> bool:
            with ClusterClient(seeds) as dw:
                owners = {entry["node"] for entry in dw.cluster()["owners"]}
            return owners == {"a", "b"}

        wait_until(settled, 15, "the two nodes to share the partitions")
        names = [f"sched-{n}" for n in range(8)]
        with ClusterClient(seeds) as dw:
            for name in names:
                dw.schedule_add({"id": name, **SCHEDULE})
        got: list[str] = []
        takers = [
            threading.Thread(target=_take, args=(node.address, time.time() + 4, got))
            for node in nodes
        ]
        for taker in takers:
            taker.start()
        for taker in takers:
            taker.join()
        fired: dict[str, int] = {}
        with ClusterClient(seeds) as dw:
            for name in names:
                fired[name] = dw.schedule_pause(name)["counts"]["fired"]

        def collected() -> bool:
            for node in nodes:
                _take(node.address, time.time() + 0.3, got)
            return all(len(nominal_seconds(got, n)) >= fired[n] for n in names)

        wait_until(collected, 10, "every fired occurrence to be taken")
    finally:
        for node in nodes:
            node.kill()
    for name in names:
        assert fired[name] >= 3
        assert_each_once(got, name, fired[name])


# -- kill -9 before, during and after the fire-and-chain write, with an HTTP sink ---------


class HeldWrites:
    """The store's writes held until ``release``: on SQLite an exclusive
    transaction of the test's own (the server's ``BEGIN IMMEDIATE`` waits in
    its busy timeout, 5 s); on Redis ``CLIENT PAUSE WRITE`` (the server's
    script waits in Redis, and may still run after the kill). Reads go on:
    ``stored_next_ms`` is what the store holds for a schedule now."""

    def __init__(self, store_url: str) -> None:
        self.sqlite: sqlite3.Connection | None = None
        self.redis: redis.Redis | None = None
        if store_url.startswith("sqlite:///"):
            self.sqlite = sqlite3.connect(store_url.removeprefix("sqlite:///"), timeout=10)
            self.sqlite.isolation_level = None
            self.sqlite.execute("BEGIN EXCLUSIVE")
        else:
            self.redis = redis.Redis.from_url(store_url)
            self.redis.execute_command("CLIENT", "PAUSE", 5000, "WRITE")

    def stored_next_ms(self, schedule_id: str) -> int | None:
        key = record_key(schedule_id)
        if self.sqlite is not None:
            row = self.sqlite.execute("SELECT record FROM tasks WHERE id = ?", (key,)).fetchone()
            record = row[0]
        else:
            assert self.redis is not None
            # The partition's hash holds it (store/redis/store.py names them).
            hashes = [k for k in self.redis.scan_iter() if self.redis.type(k) == b"hash"]
            [record] = [r for k in hashes if (r := self.redis.hget(k, key)) is not None]
        return read_record(record).next_ms

    def release(self) -> None:
        if self.sqlite is not None:
            self.sqlite.execute("ROLLBACK")
            self.sqlite.close()
        if self.redis is not None:
            self.redis.execute_command("CLIENT", "UNPAUSE")
            self.redis.close()


def _delivered(sink: Sink) -> set[str]:
    return {d.task_id for d in sink.received() if d.task_id.startswith("s:beat:")}


def test_kill_9_before_during_and_after_the_fire_step_loses_and_doubles_none(
    durable_store_url: str, tmp_path: Path
) -> None:
    """A schedule every second with an HTTP target, on a real server at a 10 ms
    tick. It is killed with SIGKILL three times, each at a chosen point of an
    occurrence's fire step (one store write: the occurrence's task and the
    schedule's new ``next``):

    - after: as soon as the sink has an occurrence (its write was durable);
    - before: 0.2 s before an occurrence's nominal time, restarted after it;
    - during: with the store's writes held (an exclusive SQLite transaction,
      Redis ``CLIENT PAUSE WRITE``) across an occurrence's nominal time, so
      the server has decided the fire (``schedule_get`` shows it) and its
      write is waiting; killed then, the writes let go, restarted.

    Every occurrence from the first to the last fired arrives at the sink (the
    ids are the nominal seconds: no gap), none under two ids, and the sink's
    distinct ids are exactly ``counts.fired``."""
    sink = Sink()
    schedule = {
        "id": "beat",
        "every": 1,
        "topic": "occ",
        "catchup": "all",
        "overlap": "allow",
        "target": {"type": "http", "url": sink.url},
    }
    proc = ServerProcess("--http-allow", "127.0.0.1", store=durable_store_url, tick="0.01")
    points: dict[str, int] = {}
    try:
        with Client(*proc.address) as dw:
            dw.schedule_add(schedule)
        wait_until(lambda: len(_delivered(sink)) >= 2, 10, "two occurrences delivered")

        # After: the write of the newest delivered occurrence was durable.
        seen = _delivered(sink)
        wait_until(lambda: _delivered(sink) - seen, 5, "the next occurrence delivered")
        proc.kill()
        points["after"] = max(int(_nominal_s(i)) for i in _delivered(sink))
        proc.start()

        # Before: the pending occurrence is not written yet when the server dies.
        with Client(*proc.address) as dw:
            pending_s = int(dw.schedule_get("beat")["next"])  # type: ignore[index]
        time.sleep(max(0.0, pending_s - 0.2 - time.time()))
        proc.kill()
        points["before"] = pending_s
        time.sleep(max(0.0, pending_s + 0.5 - time.time()))  # past it, while down
        proc.start()

        # During: the fire step decided in memory, its write held in the store.
        with Client(*proc.address) as dw:
            pending_s = int(dw.schedule_get("beat")["next"])  # type: ignore[index]
            time.sleep(max(0.0, pending_s - 0.3 - time.time()))
            held = HeldWrites(durable_store_url)
            try:
                wait_until(
                    lambda: dw.schedule_get("beat")["last_fired"] == pending_s,  # type: ignore[index]
                    3,
                    "the server to decide the fire while its write is held",
                )
                proc.kill()
                # Decided in memory, not written: the store still has it pending.
                assert held.stored_next_ms("beat") == pending_s * 1000
            finally:
                held.release()
        points["during"] = pending_s
        proc.start()

        time.sleep(2.5)  # on time again: the time passing is what is tested
        with Client(*proc.address) as dw:
            fired = dw.schedule_pause("beat")["counts"]["fired"]
        wait_until(lambda: len(_delivered(sink)) >= fired, 15, "every fired occurrence delivered")
    finally:
        proc.kill()
        sink.close()
    nominals = sorted(int(_nominal_s(task_id)) for task_id in _delivered(sink))
    assert nominals == list(range(nominals[0], nominals[0] + len(nominals))), (nominals, points)
    assert len(nominals) == fired, (nominals, fired)
    assert set(points.values()) <= set(nominals), points

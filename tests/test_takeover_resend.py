"""A partition taken over, dropped and taken again: its due tasks are still sent.

Real processes: one ``delaywheel serve`` node on a private redis-server, an
HTTP sink (tests/hacheck.py). The test writes a task's record in its
partition as another node leaves it, and deletes the partition's lease so
that the node drops the partition and takes it again, loading the record:

1. ``delivering``, attempt 1, its deadline a minute away: an attempt another
   node had journaled when it stopped. The node holds it until that deadline.
2. ``delayed``, attempt 1, due now: that other node's attempt failed (or, after
   a Sentinel failover, the promoted replica never had the attempt).

And every delivery right after a load carries the epoch the partition was
loaded under (the first attempts of a load once went out with epoch 0).

Scenario 4 of tests/test_ha_sentinel.py left such tasks ``delayed`` and never
sent (the second load found the id still marked as an attempt to resend
from the first, found no attempt, and dropped the task from its lane).
"""

from __future__ import annotations

import re
import time
import zlib
from collections import Counter
from collections.abc import Iterator

import msgpack  # type: ignore[import-untyped, unused-ignore]
import pytest
import redis
from delaywheel_client import Client
from endpoint import Endpoint
from endpoint import endpoint as endpoint  # the fixture
from hacheck import Sink, sink
from serverproc import ServerProcess, free_port
from waiting import wait_until

from delaywheel.engine.record import from_record, to_record
from delaywheel.engine.task import DELAYED, DELIVERING, Task
from delaywheel.ha.assignment import rebalance
from delaywheel.store.redis.layout import Layout

pytestmark = [pytest.mark.process, pytest.mark.redis, pytest.mark.slow]

PARTITIONS = 16
LEASE_S = 1.5  # the node notices a deleted lease within L/3
TASK_ID = "resent-1"


@pytest.fixture
def receiver() -> Iterator[Sink]:
    with sink() as running:
        yield running


@pytest.fixture
def node(redis_url: str) -> Iterator[ServerProcess]:
    proc = ServerProcess(
        *("--port", str(free_port()), "--node", "solo", "--lease", str(LEASE_S)),
        *("--partitions", str(PARTITIONS), "--http-allow", "127.0.0.1"),
        store=redis_url,
    )
    try:
        wait_until(lambda: _served(proc) == PARTITIONS, 10, "every partition served")
        yield proc
    finally:
        proc.stop()


def _served(proc: ServerProcess) -> int:
    with Client(*proc.address) as dw:
        return len(dw.stats()["partitions"])


def _record(receiver: Sink, state: str, at_s: float, deadline_s: float) -> bytes:
    """The record another node leaves for attempt 1 of ``TASK_ID``."""
    target = {"type": "http", "url": receiver.url, "method": "POST", "headers": {}, "timeout": 10.0}
    task = Task(
        TASK_ID,
        "hooks",
        at_s,
        body_packed=msgpack.packb({"n": 1}),
        ttr_s=60.0,
        max_attempts=5,
        created_s=at_s,
        attempts=1,
        state=state,
        deadline_s=deadline_s,
        target=target,
    )
    if state == DELAYED:
        task.last_error = "HTTP 503"
    return to_record(task)


def _taken_again(
    store: redis.Redis, node: ServerProcess, partition: int, record: bytes, epoch: int
) -> None:
    """Put ``record`` in the partition, delete its lease and wait until the node
    has dropped the partition and loaded it again (with ``epoch``)."""
    keys = Layout("delaywheel", PARTITIONS).partition(partition)
    store.hset(keys.tasks, TASK_ID, record)
    store.delete(keys.lease)
    serving = re.compile(rf"serving partition {partition}, epoch {epoch}: 1 tasks loaded")
    wait_until(lambda: serving.search(node.log_text()), 10, f"partition {partition} taken again")


def test_a_task_held_as_an_attempt_then_loaded_as_delayed_is_sent(
    redis_url: str, node: ServerProcess, receiver: Sink
) -> None:
    partition = zlib.crc32(TASK_ID.encode()) % PARTITIONS
    now_s = time.time()
    with redis.Redis.from_url(redis_url) as store:
        held = _record(receiver, DELIVERING, now_s - 1, deadline_s=now_s + 60)
        _taken_again(store, node, partition, held, epoch=2)
        time.sleep(0.5)  # held to its deadline: nothing is sent meanwhile (time is the test)
        assert receiver.received() == []
        failed = _record(receiver, DELAYED, time.time(), deadline_s=0.0)
        _taken_again(store, node, partition, failed, epoch=3)
    wait_until(receiver.received, 5, f"{TASK_ID} delivered")
    assert [(d.task_id, d.attempt) for d in receiver.received()] == [(TASK_ID, 2)]
    with Client(*node.address) as dw:
        wait_until(lambda: dw.get(TASK_ID) is None, 5, f"{TASK_ID} gone once delivered")


def test_a_handoff_does_not_wait_for_an_attempt_it_only_holds(
    redis_url: str, node: ServerProcess, receiver: Sink
) -> None:
    """A partition taken over with an attempt held to its deadline, then handed
    back to a node that joins: the attempt is not in flight here, so the
    handoff does not wait for it (it waited up to the handoff's 10 s, the
    partition served by no one: 6.3 s in a run of scenario 4), and the next
    owner holds it to the same deadline: nothing is sent."""
    partition = zlib.crc32(TASK_ID.encode()) % PARTITIONS
    now_s = time.time()
    with redis.Redis.from_url(redis_url) as store:
        held = _record(receiver, DELIVERING, now_s - 1, deadline_s=now_s + 60)
        _taken_again(store, node, partition, held, epoch=2)
    name = next(
        f"joining-{n}" for n in range(100) if _joined(f"joining-{n}")[partition] == f"joining-{n}"
    )
    joined_s = time.monotonic()
    other = ServerProcess(
        *("--port", str(free_port()), "--node", name, "--lease", str(LEASE_S)),
        *("--partitions", str(PARTITIONS), "--http-allow", "127.0.0.1"),
        store=redis_url,
    )
    try:
        serving = re.compile(rf"serving partition {partition}, epoch 3: 1 tasks loaded")
        wait_until(lambda: serving.search(other.log_text()), 15, f"{name} serving {partition}")
        assert time.monotonic() - joined_s < 5.0, node.log_text()
        assert f"handed back partition {partition}" in node.log_text()
        time.sleep(0.5)  # held by the new owner too: nothing sent (time is the test)
        assert receiver.received() == []
    finally:
        other.stop()


def test_deliveries_right_after_a_load_carry_the_partitions_epoch(
    redis_url: str, node: ServerProcess, receiver: Sink
) -> None:
    """Attempts the load itself sends (interrupted ones past their deadline,
    tasks due already) go out before the partition is marked served: each
    carries the epoch it was loaded under, never 0 (``Delaywheel-Epoch: 0``
    was seen on the first attempts after a load)."""
    partition = zlib.crc32(TASK_ID.encode()) % PARTITIONS
    ids = [i for i in (f"e-{n}" for n in range(2000)) if _partition(i) == partition][:20]
    now_s = time.time()
    keys = Layout("delaywheel", PARTITIONS).partition(partition)
    with redis.Redis.from_url(redis_url) as store:
        for n, task_id in enumerate(ids):
            state, deadline_s = (DELIVERING, now_s - 1) if n % 2 else (DELAYED, 0.0)
            store.hset(keys.tasks, task_id, _record_of(receiver, task_id, state, now_s, deadline_s))
        store.delete(keys.lease)
    serving = re.compile(rf"serving partition {partition}, epoch 2: {len(ids)} tasks loaded")
    wait_until(lambda: serving.search(node.log_text()), 10, f"partition {partition} taken again")
    wait_until(lambda: len(receiver.received()) >= len(ids), 10, "every task delivered")
    epochs = Counter(d.epoch for d in receiver.received())
    assert list(epochs) == [2], epochs
    assert sorted(d.task_id for d in receiver.received()) == sorted(ids)


def _joined(name: str) -> dict[int, str]:
    """The assignment record once ``name`` joined "solo", which owned every partition."""
    return rebalance(dict.fromkeys(range(PARTITIONS), "solo"), ["solo", name], PARTITIONS)


def _partition(task_id: str) -> int:
    return zlib.crc32(task_id.encode()) % PARTITIONS


def _record_of(receiver: Sink, task_id: str, state: str, at_s: float, deadline_s: float) -> bytes:
    """``_record`` of another id."""
    task = from_record(task_id, _record(receiver, state, at_s, deadline_s))
    return to_record(task)


def test_a_node_stays_registered_through_a_handback_longer_than_its_lease(
    redis_url: str, node: ServerProcess, endpoint: Endpoint
) -> None:
    """A node joins while the partition it is due is sending an attempt that
    lasts 4 L: the handback waits for it, and meanwhile the handing node's
    rounds go on, so its registration never lapses (held, it lapsed: the
    others saw the node gone mid-handback)."""
    endpoint.slow_s = 4 * LEASE_S
    name = "joining-0"
    partition = next(p for p, owner in _joined(name).items() if owner == name)
    task_id = next(i for i in (f"slow-{n}" for n in range(2000)) if _partition(i) == partition)
    target = {"type": "http", "url": endpoint.url("/slow"), "timeout": 30}
    with Client(*node.address) as dw:
        dw.add("hooks", {}, id=task_id, target=target)
    wait_until(lambda: endpoint.in_flight == 1, 10, "the slow attempt under way")
    members = Layout("delaywheel", PARTITIONS).members
    lapsed: list[float] = []
    other = ServerProcess(
        *("--port", str(free_port()), "--node", name, "--lease", str(LEASE_S)),
        *("--partitions", str(PARTITIONS), "--http-allow", "127.0.0.1"),
        store=redis_url,
    )
    try:
        joined_s = time.monotonic()
        handed_back = f"handed back partition {partition}"
        with redis.Redis.from_url(redis_url) as store:
            while handed_back not in node.log_text():
                assert time.monotonic() - joined_s < 30, node.log_text()
                seconds, micros = store.time()
                expires_ms = store.zscore(members, "solo")
                if expires_ms is None or expires_ms <= seconds * 1000 + micros // 1000:
                    lapsed.append(time.monotonic() - joined_s)
                time.sleep(0.05)  # a look every 50 ms (time passing is the test)
        took_s = time.monotonic() - joined_s
        wait_until(lambda: _served(other) == PARTITIONS // 2, 10, "the joiner's share")
    finally:
        other.stop()
    print(f"handback of partition {partition}: {took_s:.2f} s, lapsed at {lapsed[:3]}")
    assert took_s > LEASE_S, took_s  # a handback longer than the lease, as meant
    assert lapsed == []
    assert len(endpoint.requests("/slow")) == 1  # sent once: the attempt ended here

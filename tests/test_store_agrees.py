"""The node and its store agree after writes answered ``unavailable`` (docs/protocol.md,
"Durability"), and a sent attempt is not sent again while its owner keeps
the partition (docs/ha.md, "Duplicates").

Real processes: ``delaywheel serve --replicas 1`` on a private Redis primary
with one replica (conftest ``primary_with_replica``), an HTTP sink
(tests/hacheck.py) that can hold an attempt in flight.

- A write that reached the primary but that too few replicas confirmed
  (``WAIT 1`` short: the replica killed, or stopped) is answered
  ``unavailable`` and kept: ``get`` on the owner shows what the primary
  holds, a task added so fires on time, and a retry of the add with the same
  id is ``unavailable`` while the replica is away, ``exists`` once it is back.
- An attempt's outcome that could not be journaled (WAIT short; a write the
  primary refused) is journaled again, not sent again: the sink gets each
  task once.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import RedisServer, primary_with_replica, wait_for_link
from delaywheel_client import Client
from delaywheel_client.errors import Exists, Unavailable
from hacheck import Sink, sink
from helpers import load_all, run
from serverproc import ServerProcess
from waiting import wait_until

from delaywheel.engine.record import from_record
from delaywheel.engine.task import Task
from delaywheel.store.redis import RedisStore
from delaywheel.store.redis.layout import Layout

# A task added just before the replica is stopped is due this long after: time
# for the add's confirmation (WAIT) on a loaded machine, which must come first.
DUE_AFTER_S = 2.0

pytestmark = [pytest.mark.process, pytest.mark.redis, pytest.mark.slow]

PARTITIONS = 16
LEASE = "3"
# A task added with the replica away is due this long after its add: after
# the nine writes of the test, each of which waits out WAIT's 1 s.
DUE_S = 12.0
# How late "on time" may be on a loaded 2-core machine (a 0.05 s tick).
ON_TIME_S = 1.5


@pytest.fixture
def receiver() -> Iterator[Sink]:
    with sink() as running:
        yield running


def _node(primary: RedisServer, *args: str, lease: str = LEASE) -> ServerProcess:
    return ServerProcess(
        *("--replicas", "1", "--lease", lease, "--partitions", str(PARTITIONS)),
        *("--http-allow", "127.0.0.1", "--retry-base", "0.5", *args),
        store=primary.url,
    )


def _stored(primary: RedisServer) -> dict[str, Task]:
    """Every task the primary holds, by id."""

    async def read() -> dict[str, bytes]:
        store = RedisStore(primary.url, partitions=PARTITIONS)
        await store.open()
        try:
            return await load_all(store)
        finally:
            await store.close()

    return {task_id: from_record(task_id, record) for task_id, record in run(read).items()}


def _listed(dw: Client) -> dict[str, dict[str, Any]]:
    """Every task the node holds, by id."""
    found: dict[str, dict[str, Any]] = {}
    cursor = None
    while True:
        page = dw.list(limit=1000, cursor=cursor)
        found.update((task["id"], task) for task in page["tasks"])
        cursor = page["next"]
        if cursor is None:
            return found


def _exists(dw: Client, task_id: str) -> bool:
    """A retry of the add of ``task_id``: ``exists`` (True) or ``unavailable``."""
    try:
        dw.add("t", {}, id=task_id, delay=DUE_S)
    except Exists:
        return True
    except Unavailable:
        return False
    raise AssertionError(f"the add of {task_id} was taken again: the node had lost it")


def test_one_replica_killed_under_replicas_1_the_node_and_the_store_agree(
    tmp_path: Path, receiver: Sink
) -> None:
    """Issue scenario: one replica killed under ``--replicas 1`` on plain Redis.
    Adds, an update and a delete answered ``unavailable`` reached the primary:
    the node serves what the primary holds; the adds fire on time; a retry
    with the same id is ``unavailable`` while the replica is away and
    ``exists`` once it is back; a targeted task so added is sent once, when
    its attempt is confirmed; and the store and the node hold the same tasks."""
    target = {"type": "http", "url": receiver.url}
    with primary_with_replica(tmp_path) as (primary, replica):
        node = _node(primary)
        try:
            with Client(*node.address, timeout_s=30) as dw:
                for n in range(3):
                    dw.add("t", {"n": n}, id=f"up-{n}", delay=3600)
                replica.kill()
                added_s: dict[str, float] = {}
                for n in range(6):
                    task_id = f"down-{n}"
                    added_s[task_id] = time.time()
                    with pytest.raises(Unavailable, match="WAIT 1: 0 replica"):
                        dw.add("t", {"n": n}, id=task_id, delay=DUE_S)
                with pytest.raises(Unavailable, match="WAIT 1"):
                    dw.add("hooks", {}, id="down-hook", delay=1, target=target)
                with pytest.raises(Unavailable, match="WAIT 1"):
                    dw.update("up-0", body={"changed": True})
                with pytest.raises(Unavailable, match="WAIT 1"):
                    dw.delete("up-1")

                # Served as the primary holds them.
                for task_id in added_s:
                    shown = dw.get(task_id)
                    assert shown is not None and shown["state"] == "delayed", (task_id, shown)
                changed = dw.get("up-0")
                assert changed is not None and changed["body"] == {"changed": True}
                assert dw.get("up-1") is None
                assert _listed(dw).keys() == _stored(primary).keys()

                # Fired on time, the replica still away (a queue task: no write to fire).
                for task_id, at_s in added_s.items():
                    due_s = at_s + DUE_S
                    wait_until(
                        lambda t=task_id: dw.get(t)["state"] == "ready",
                        DUE_S + ON_TIME_S + 5,
                        f"{task_id} ready",
                    )
                    assert time.time() < due_s + ON_TIME_S + 0.5, f"{task_id} fired late"
                # The retry's answer follows what is held: exists, once confirmed.
                assert _exists(dw, "down-0") is False
                assert receiver.received() == []  # its attempt is not confirmed: not sent

                replica.start()
                wait_for_link(replica)
                wait_until(lambda: _exists(dw, "down-0"), 20, "exists for down-0")
                assert all(_exists(dw, task_id) for task_id in added_s)
                wait_until(receiver.received, 20, "down-hook delivered")
                time.sleep(1.0)  # a second send would come within a retry base (time is the test)
                assert [(d.task_id, d.attempt) for d in receiver.received()] == [("down-hook", 1)]
                wait_until(lambda: dw.get("down-hook") is None, 10, "down-hook gone")

                listed, stored = _listed(dw), _stored(primary)
                assert listed.keys() == stored.keys() == {"up-0", "up-2", *added_s}
                for task_id, task in stored.items():
                    shown = listed[task_id]
                    assert (shown["state"], shown["attempts"]) == (task.state, task.attempts)
                print(
                    f"6 of 6 adds answered unavailable were served and fired; stored {len(stored)}"
                )
        finally:
            node.stop()


def test_an_attempt_whose_outcome_could_not_be_journaled_is_not_sent_again(
    tmp_path: Path, receiver: Sink
) -> None:
    """Every path by which a sent attempt's outcome fails to be journaled, its
    owner keeping the partition: the sink gets each task once.

    1. The attempt's own write short of replicas: kept, written again until
       confirmed, and only then sent; when a write of it is refused meanwhile,
       never sent, it is begun again later as the next attempt.
    2. The outcome's write short of replicas (the replica stopped while the
       attempt is in flight): kept, written again until confirmed.
    3. The outcome's write refused by the primary (out of memory): undone,
       and the same outcome journaled again a retry base later."""
    target = {"type": "http", "url": receiver.url}
    with primary_with_replica(tmp_path) as (primary, replica):
        # L = 10 s: the primary refuses the lease's renewals too while it is
        # full, for less than the 0.8 L after which the node self-fences.
        node = _node(primary, lease="10")
        assert replica.proc is not None
        try:
            with Client(*node.address, timeout_s=30) as dw, primary.client() as admin:
                # 1. Due while the replica is stopped (stopped before it is due,
                # however long the add's confirmation took on a loaded machine).
                sent_s = time.monotonic()
                dw.add("hooks", {}, id="begun-short", delay=DUE_AFTER_S, target=target)
                replica.proc.send_signal(signal.SIGSTOP)
                assert time.monotonic() - sent_s < DUE_AFTER_S, "the add took longer than its delay"
                try:
                    time.sleep(DUE_AFTER_S + 2.5)  # due, its attempt's writes short of the replica
                    assert receiver.received() == []
                finally:
                    replica.proc.send_signal(signal.SIGCONT)
                wait_until(lambda: dw.get("begun-short") is None, 20, "begun-short done")
                sent_s = time.monotonic()
                dw.add("hooks", {}, id="begun-refused", delay=DUE_AFTER_S, target=target)
                replica.proc.send_signal(signal.SIGSTOP)
                assert time.monotonic() - sent_s < DUE_AFTER_S, "the add took longer than its delay"
                try:
                    time.sleep(DUE_AFTER_S + 1.5)  # due, its attempt's writes short of the replica
                    admin.config_set("maxmemory", 1)  # and then refused
                    time.sleep(2.0)
                    assert not _arrived(receiver, "begun-refused")
                finally:
                    admin.config_set("maxmemory", 0)
                    replica.proc.send_signal(signal.SIGCONT)
                wait_until(lambda: dw.get("begun-refused") is None, 20, "begun-refused done")

                # 2. and 3.: the attempt in flight when the fault starts.
                receiver.answering.clear()
                try:
                    dw.add("hooks", {}, id="outcome-short", delay=0.1, target=target)
                    wait_until(lambda: _arrived(receiver, "outcome-short"), 10, "sent")
                    replica.proc.send_signal(signal.SIGSTOP)
                finally:
                    receiver.answering.set()
                try:
                    time.sleep(2.5)  # its outcome's writes short of the replica, a few times
                    assert dw.get("outcome-short") is None  # kept: done, as on the primary
                finally:
                    replica.proc.send_signal(signal.SIGCONT)

                # A failed last attempt: its outcome (dead) is a put, which the
                # primary refuses while full (a delivered one is a delete, which
                # Redis takes even then).
                receiver.answering.clear()
                receiver.status = 500
                try:
                    dw.add(
                        "hooks", {}, id="outcome-refused", delay=0.1, target=target, max_attempts=1
                    )
                    wait_until(lambda: _arrived(receiver, "outcome-refused"), 10, "sent")
                    admin.config_set("maxmemory", 1)
                finally:
                    receiver.answering.set()
                try:
                    time.sleep(2.5)  # its outcome's writes refused: a retry base several times
                    # (the node's memory shows it dead while each write is out)
                    key = Layout("delaywheel", PARTITIONS).of("outcome-refused").tasks
                    record = admin.hget(key, "outcome-refused")
                    assert from_record("outcome-refused", record).state == "delivering"
                finally:
                    admin.config_set("maxmemory", 0)
                wait_until(lambda: dw.get("outcome-refused")["state"] == "dead", 20, "dead")
            time.sleep(1.0)  # a second send would come within a retry base (time is the test)
            sent = [(d.task_id, d.attempt) for d in receiver.received()]
            assert sent == [
                ("begun-short", 1),
                ("begun-refused", 2),  # attempt 1 never sent
                ("outcome-short", 1),
                ("outcome-refused", 1),
            ]
            stored = _stored(primary)
            assert stored.keys() == {"outcome-refused"}
            assert stored["outcome-refused"].state == "dead"
        finally:
            node.stop()


def _arrived(receiver: Sink, task_id: str) -> bool:
    return any(d.task_id == task_id for d in receiver.received())


def test_a_node_stops_while_an_attempt_waits_for_its_replicas(
    tmp_path: Path, receiver: Sink
) -> None:
    """An attempt whose write is not confirmed is written again a retry base
    apart, so the journal drains between those writes: a SIGTERM with the
    replica away ends the node within its bound, and the next node sends the
    attempt once, from the store's record."""
    target = {"type": "http", "url": receiver.url, "timeout": 1}
    with primary_with_replica(tmp_path) as (primary, replica):
        node = _node(primary, "--shutdown-grace", "2")
        with Client(*node.address, timeout_s=30) as dw:
            # Due 2 s on, so that the replica is surely dead when the attempt is
            # written: with 0.5 s, a test process held up that long on a busy CI
            # machine killed it after the attempt's write was confirmed (sent).
            dw.add("hooks", {}, id="waiting", delay=2.0, target=target)
        replica.kill()
        time.sleep(4.5)  # due; its attempt's writes short of the replica
        stopping_s = time.monotonic()
        assert node.stop(timeout_s=30) == 0, node.log_text()
        took_s = time.monotonic() - stopping_s
        assert took_s < 10.0, took_s
        assert receiver.received() == []
        replica.start()
        wait_for_link(replica)
        again = _node(primary)
        try:
            wait_until(receiver.received, 20, "the attempt sent by the next node")
            time.sleep(1.0)  # a second send would come within a retry base (time is the test)
            assert [(d.task_id, d.attempt) for d in receiver.received()] == [("waiting", 1)]
        finally:
            again.stop()
        print(f"stopped in {took_s:.2f} s with an attempt waiting for its replica")

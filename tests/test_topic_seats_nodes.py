"""A topic's concurrency below the number of nodes serving partitions, on real
nodes of one Redis keyspace: its seats are handed between the nodes
(ha/seats.py), so every node's tasks of the topic go out, to an HTTP sink or
through ``reserve``, and never more at once than the concurrency; a node
killed while holding the seat gives it up within about a lease.

docs/ha.md ("Topic settings on several nodes") says what holds."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from clusternodes import address, nodes_named
from delaywheel_client import Client, ClusterClient
from delaywheel_client.errors import DelaywheelError
from endpoint import Endpoint
from endpoint import endpoint as endpoint  # the fixture
from flowcheck import Workers, learned, one_each, shares, spread_ids, workers_on_both
from flowcheck import dw as dw  # the fixtures
from flowcheck import nodes as nodes
from flowcheck import sink as sink
from helpers import unique
from serverproc import ServerProcess
from waiting import wait_until

pytestmark = [pytest.mark.process, pytest.mark.redis, pytest.mark.slow]

EVERY_TASK_S = 60.0  # a seat changes hands within two rounds: a second each, with room


def deliver_all(nodes: list[ServerProcess], sink: Endpoint, concurrency: int, count: int) -> None:
    """``count`` tasks of a new topic of ``concurrency``, spread over ``nodes``, to the
    sink's /slow: every one arrives, each once."""
    topic = unique()
    with ClusterClient([address(proc) for proc in nodes]) as dw:
        dw.topic_set(topic, {"concurrency": concurrency})
        learned(nodes, topic)
        target = {"type": "http", "url": sink.url("/slow")}
        for task_id in spread_ids(nodes, topic, count):
            dw.add(topic, task_id, id=task_id, target=target)
    wait_until(lambda: len(sink.requests()) == count, EVERY_TASK_S, "every delivery")
    assert len({seen.body for seen in sink.requests()}) == count


def test_one_seat_over_two_nodes_delivers_every_task_one_at_a_time(
    nodes: list[ServerProcess], sink: Endpoint
) -> None:
    deliver_all(nodes, sink, 1, 10)  # both nodes hold some of them
    assert sink.max_in_flight == 1


def test_one_seat_over_two_nodes_hands_every_task_out_one_at_a_time(
    nodes: list[ServerProcess], dw: ClusterClient
) -> None:
    topic, count = unique(), 10
    dw.topic_set(topic, {"concurrency": 1})
    learned(nodes, topic)
    ids = spread_ids(nodes, topic, count)
    for task_id in ids:
        dw.add(topic, task_id, id=task_id)
    # Five workers for one seat: one on each node directly, three on both.
    workers = Workers(workers_on_both(nodes, 1, 3), topic, count, hold_s=0.1)
    workers.join(EVERY_TASK_S)
    assert sorted(workers.ids) == sorted(ids)  # each once, both nodes'
    assert workers.most_held == 1, workers.report()


@pytest.fixture(scope="module")
def trio(module_redis_url: str) -> Iterator[list[ServerProcess]]:
    # A keyspace of its own beside the module's pair, on the same database.
    args = ("--tick", "0.02", "--http-allow", "127.0.0.1", "--redis-prefix", "trio")
    with nodes_named(module_redis_url, "abc", *args) as found:
        yield found


def test_two_seats_over_three_nodes_deliver_every_task_two_at_most_at_once(
    trio: list[ServerProcess], sink: Endpoint
) -> None:
    deliver_all(trio, sink, 2, 15)  # all three hold some of them
    assert 1 <= sink.max_in_flight <= 2


# -- a crash while holding the seat -----------------------------------------------


CRASH_LEASE_S = 1.5


@pytest.fixture
def crash_trio(redis_url: str) -> Iterator[list[ServerProcess]]:
    # The later --lease wins over clusternodes' own.
    with nodes_named(redis_url, "abc", "--tick", "0.02", "--lease", str(CRASH_LEASE_S)) as found:
        yield found


def ack_once_moved(seeds: list[str], task_id: str) -> None:
    """The worker's ack, sent again until the task's new owner takes it."""
    deadline_s = time.monotonic() + 30
    with ClusterClient(seeds) as dw:
        while True:
            try:
                assert dw.ack(task_id) is True
                return
            except DelaywheelError:
                if time.monotonic() > deadline_s:
                    raise
                time.sleep(0.2)


@pytest.mark.serial
def test_a_node_killed_holding_the_seat_gives_it_up_within_about_a_lease(
    crash_trio: list[ServerProcess],
) -> None:
    """Three nodes, concurrency 1: two nodes wait for the seat while the third
    holds it, its only task reserved; a kill -9 of that node hands the seat on
    once its registration expires (a lease), then the rest go out one at a time."""
    killed, *survivors = crash_trio
    seeds = [address(proc) for proc in survivors]
    topic = unique()
    held_id, *others = one_each(crash_trio, topic)
    with ClusterClient([address(proc) for proc in crash_trio]) as dw:
        dw.topic_set(topic, {"concurrency": 1})
        learned(crash_trio, topic)
        dw.add(topic, held_id, id=held_id, ttr=60)
        with Client(*killed.address) as direct:  # answered once its node has the seat
            task = direct.reserve(topic, 10)
        assert task is not None and task["id"] == held_id
        for task_id in others:
            dw.add(topic, task_id, id=task_id)
        time.sleep(2.0)  # four rounds: the others wait, and say so
        assert dw.reserve(topic, 0) is None
        assert [shares(proc, topic)["concurrency"] for proc in survivors] == [0, 0]  # type: ignore[index]
    killed.kill()
    killed_s = time.monotonic()
    wait_until(
        lambda: any(shares(proc, topic)["concurrency"] for proc in survivors),  # type: ignore[index]
        6 * CRASH_LEASE_S,
        "a survivor to hold the seat",
    )
    took_s = time.monotonic() - killed_s
    # Its registration expires within a lease, then one round: with room for a
    # loaded machine, two leases.
    assert took_s < 2 * CRASH_LEASE_S + 0.5, took_s
    ack_once_moved(seeds, held_id)  # its worker is done: the one held is out of flight
    got = []
    with ClusterClient(seeds) as dw:
        deadline_s = time.monotonic() + EVERY_TASK_S
        while len(got) < len(others) and time.monotonic() < deadline_s:
            task = dw.reserve(topic, 1)
            if task is not None:
                got.append(task["id"])
                assert dw.reserve(topic, 0) is None  # one seat: none other while it is out
                assert dw.ack(task["id"]) is True
    assert sorted(got) == sorted(others)

"""A topic's pause and limits on two nodes of one Redis keyspace: each node
learns the settings the other holds (ha/topics.py) and applies its share
(engine/shares.py), so the pause holds both nodes' tasks and the limits hold
for the topic as a whole: an HTTP sink sees no more than rate * t + burst in
any window of t, and never more than the concurrency at once.

One pair of nodes for the module (a fast tick); each test has a topic of its
own, whose settings' record may be on either node."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from clusternodes import PARTITIONS, address, node_pair, served
from delaywheel_client import Client, ClusterClient
from delaywheel_client.partitions import partition_of
from endpoint import Endpoint
from endpoint import endpoint as endpoint  # the fixture
from helpers import unique
from serverproc import ServerProcess
from test_topic_settings_server import most_in_any_window
from waiting import wait_until

pytestmark = [pytest.mark.process, pytest.mark.redis]

# A change reaches the other node within two coordinator rounds (half a
# second each with clusternodes' lease); generous for a loaded machine.
LEARN_TIMEOUT_S = 10.0


@pytest.fixture(scope="module")
def nodes(module_redis_url: str) -> Iterator[list[ServerProcess]]:
    with node_pair(module_redis_url, "--tick", "0.02", "--http-allow", "127.0.0.1") as pair:
        yield pair


@pytest.fixture
def dw(nodes: list[ServerProcess]) -> Iterator[ClusterClient]:
    with ClusterClient([address(proc) for proc in nodes]) as client:
        yield client


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


def test_a_pause_holds_both_nodes_tasks_until_resumed(
    nodes: list[ServerProcess], dw: ClusterClient
) -> None:
    topic = unique()
    ids = spread_ids(nodes, topic, 8)
    dw.topic_set(topic, {"paused_until": 253_402_300_799.0})
    learned(nodes, topic, paused_until=253_402_300_799.0)
    for task_id in ids:
        dw.add(topic, task_id, id=task_id)
    # reserve visits every node: neither hands one out, and each counts its ready.
    assert dw.reserve(topic, 0) is None
    ready = [dw.get(task_id)["state"] for task_id in ids]  # type: ignore[index]
    assert ready == ["ready"] * len(ids)
    dw.topic_set(topic, {"paused_until": None})
    wait_until(
        lambda: all(shares(proc, topic) is None for proc in nodes),
        LEARN_TIMEOUT_S,
        "both nodes to resume",
    )
    got = set()
    while (task := dw.reserve(topic, 0)) is not None:
        got.add(task["id"])
    assert got == set(ids)


@pytest.fixture
def sink(endpoint: Endpoint) -> Endpoint:
    endpoint.slow_s = 0.1
    return endpoint


def test_a_rate_over_two_nodes_holds_for_the_topic(
    nodes: list[ServerProcess], dw: ClusterClient, sink: Endpoint
) -> None:
    topic, rate, burst, count = unique(), 40.0, 4, 40
    dw.topic_set(topic, {"rate": rate, "burst": burst})
    # Eight partitions each: half the rate and half the burst.
    found = learned(nodes, topic, rate=rate / 2)
    assert [f["burst"] for f in found] == [2, 2]
    target = {"type": "http", "url": sink.url("/ok")}
    for task_id in spread_ids(nodes, topic, count):
        dw.add(topic, task_id, id=task_id, target=target)
    wait_until(lambda: len(sink.requests()) == count, 30, "every delivery")
    arrivals_s = [seen.at_s for seen in sink.requests()]
    # No more than rate * t + burst in any window t; more for the jitter between
    # a node's start of an attempt and its arrival here: one per node, and what
    # 50 ms of a stall here (a loaded machine) would bunch together.
    jitter = len(nodes) + rate * 0.05
    for window_s in (0.25, 0.5, 1.0):
        assert most_in_any_window(arrivals_s, window_s) <= rate * window_s + burst + jitter
    took_s = max(arrivals_s) - min(arrivals_s)
    assert took_s >= (count - burst) / rate - 0.1  # the two shares add up to the rate
    assert len({seen.body for seen in sink.requests()}) == count  # each once


def test_a_concurrency_over_two_nodes_holds_for_the_topic(
    nodes: list[ServerProcess], dw: ClusterClient, sink: Endpoint
) -> None:
    topic, concurrency, count = unique(), 3, 12
    dw.topic_set(topic, {"concurrency": concurrency})
    found = learned(nodes, topic)
    assert sorted(f["concurrency"] for f in found) == [1, 2]  # 1.5 each: the odd seat to one
    target = {"type": "http", "url": sink.url("/slow")}
    for task_id in spread_ids(nodes, topic, count):
        dw.add(topic, task_id, id=task_id, target=target)
    wait_until(lambda: len(sink.requests()) == count, 30, "every delivery")
    assert 1 < sink.max_in_flight <= concurrency  # both nodes sent, never more at once

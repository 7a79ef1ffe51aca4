"""A topic's pause and limits on two nodes of one Redis keyspace: each node
learns the settings the other holds (ha/topics.py) and applies its share
(engine/shares.py), so the pause holds both nodes' tasks and the limits hold
for the topic as a whole: an HTTP sink and workers reserving on both nodes
never see more than the concurrency at once (the rates, which assert timings,
are in test_topic_flow_timing.py). Each node hands its most urgent task first;
waits and results go to each task's owner.

One pair of nodes for the module (a fast tick); each test has a topic of its
own, whose settings' record may be on either node."""

from __future__ import annotations

import random
import time

import pytest
from clusternodes import address
from delaywheel_client import Client, ClusterClient
from delaywheel_client.errors import Moved
from endpoint import Endpoint
from endpoint import endpoint as endpoint  # the fixture
from flowcheck import (
    LEARN_TIMEOUT_S,
    Workers,
    blocked_waits,
    cluster_wait,
    learned,
    one_each,
    owner_of,
    shares,
    spread_ids,
    workers_on_both,
)
from flowcheck import dw as dw  # the fixtures
from flowcheck import nodes as nodes
from flowcheck import sink as sink
from helpers import unique
from serverproc import ServerProcess
from waiting import wait_until

pytestmark = [pytest.mark.process, pytest.mark.redis]


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


# -- limits on reserve ------------------------------------------------------------


def test_reserve_keeps_to_a_concurrency_over_two_nodes(
    nodes: list[ServerProcess], dw: ClusterClient
) -> None:
    topic, concurrency, count = unique(), 3, 18
    dw.topic_set(topic, {"concurrency": concurrency})
    assert sorted(f["concurrency"] for f in learned(nodes, topic)) == [1, 2]
    ids = spread_ids(nodes, topic, count)
    for task_id in ids:
        dw.add(topic, task_id, id=task_id)
    # Seven workers for three seats: two on each node directly, three on both.
    workers = Workers(workers_on_both(nodes, 2, 3), topic, count, hold_s=0.15)
    workers.join(60)
    assert sorted(workers.ids) == sorted(ids)  # each once
    # Never more than the limit held at once; more than one node's seats used.
    assert 1 < workers.most_held <= concurrency, workers.report()


# -- priority ---------------------------------------------------------------------


PRIORITIES = [*range(0, 2000, 250), 1024, 2**31 - 1]


def prioritised(dw: ClusterClient, nodes: list[ServerProcess], topic: str) -> dict[str, int]:
    """Tasks of ``topic`` on both nodes over many priorities with ties, some of
    them updated; their ids (in the order added) and priorities."""
    shuffled = random.Random(topic)
    ids = spread_ids(nodes, topic, 40)
    priority = {task_id: shuffled.choice(PRIORITIES) for task_id in ids}
    for task_id in ids:
        dw.add(topic, task_id, id=task_id, priority=priority[task_id])
    # Updates to priorities no other task has: an update queues the task
    # again, after the tasks of its priority and time queued before it.
    for task_id, new in zip(ids[::7], (1, 4000, 2, 3000, 3, 5000), strict=False):
        assert dw.update(task_id, priority=new)["priority"] == new
        priority[task_id] = new
    return priority


def urgent_first(ids: list[str], priority: dict[str, int]) -> list[str]:
    """``ids`` (in the order they became ready) in the order reserve must hand them."""
    return sorted(ids, key=lambda task_id: (priority[task_id], list(priority).index(task_id)))


def test_each_node_hands_its_most_urgent_task_first(
    nodes: list[ServerProcess], dw: ClusterClient
) -> None:
    topic = unique()
    priority = prioritised(dw, nodes, topic)
    for n, proc in enumerate(nodes):
        mine = [task_id for task_id in priority if owner_of(nodes, task_id) == n]
        got = []
        with Client(*proc.address) as direct:
            while (task := direct.reserve(topic, 0)) is not None:
                assert task["priority"] == priority[task["id"]]
                got.append(task["id"])
        assert got == urgent_first(mine, priority)


def test_a_cluster_reserve_never_passes_a_more_urgent_task_on_its_node(
    nodes: list[ServerProcess], dw: ClusterClient
) -> None:
    topic = unique()
    priority = prioritised(dw, nodes, topic)
    got = []
    while (task := dw.reserve(topic, 0)) is not None:
        got.append(task["id"])
    assert sorted(got) == sorted(priority)
    # The cluster client asks the nodes in turn: the order of the whole is
    # theirs interleaved, and each node's own is most urgent first.
    for n in range(len(nodes)):
        from_node = [task_id for task_id in got if owner_of(nodes, task_id) == n]
        assert from_node == urgent_first(from_node, priority)
    assert {owner_of(nodes, task_id) for task_id in got[:4]} == {0, 1}  # both in turn


# -- results and wait -------------------------------------------------------------


def test_a_wait_at_a_node_not_the_owner_is_moved_and_the_cluster_client_routes_it(
    nodes: list[ServerProcess], dw: ClusterClient
) -> None:
    topic = unique()
    ids = one_each(nodes, topic)
    for task_id in ids:
        dw.add(topic, task_id, id=task_id, retain=60)
    # A direct Client does not follow it: the other node names the owner.
    for n, task_id in enumerate(ids):
        with Client(*nodes[1 - n].address) as elsewhere, pytest.raises(Moved) as moved:
            elsewhere.wait(task_id, 5)
        assert moved.value.data is not None and moved.value.data["owner"] == address(nodes[n])
    waits = [cluster_wait(nodes, task_id, 30) for task_id in ids]
    blocked_waits(nodes, len(ids))
    for _ in ids:
        task = dw.reserve(topic, 5)
        assert task is not None
        assert dw.ack(task["id"], {"by": "worker", "id": task["id"]}) is True
    for task_id, waiting in zip(ids, waits, strict=True):
        answer = waiting.result()
        assert (answer["state"], answer["outcome"]) == ("done", "acked")
        assert answer["result"] == {"by": "worker", "id": task_id}
        assert dw.get(task_id)["result"] == answer["result"]  # type: ignore[index]


def test_waits_on_two_nodes_are_answered_on_death_delete_and_timeout(
    nodes: list[ServerProcess], dw: ClusterClient
) -> None:
    topic = unique()
    dying, deleted, idle = (one_each(nodes, f"{topic}-{kind}") for kind in ("d", "x", "i"))
    for task_id in dying:
        dw.add(topic, task_id, id=task_id, max_attempts=1)
    for task_id in deleted + idle:
        dw.add(topic, task_id, id=task_id, delay=3600)
    waits = {task_id: cluster_wait(nodes, task_id, 30) for task_id in dying + deleted}
    idles = [cluster_wait(nodes, task_id, 1.0) for task_id in idle]
    blocked_waits(nodes, len(waits) + len(idles))
    for _ in dying:
        task = dw.reserve(topic, 5)
        assert task is not None and task["id"] in dying
        dw.release(task["id"])  # its last attempt: dead
    for task_id in deleted:
        assert dw.delete(task_id) is True
    answers = {task_id: waiting.result() for task_id, waiting in waits.items()}
    assert {task_id: answers[task_id]["state"] for task_id in dying + deleted} == {
        **{task_id: "dead" for task_id in dying},
        **{task_id: "gone" for task_id in deleted},
    }
    assert [waiting.result() for waiting in idles] == [None, None]  # their timeouts
    assert [dw.get(task_id)["state"] for task_id in idle] == ["delayed"] * 2  # type: ignore[index]


def test_http_results_round_trip_on_two_nodes(
    nodes: list[ServerProcess], dw: ClusterClient, sink: Endpoint
) -> None:
    topic = unique()
    target = {"type": "http", "url": sink.url("/echo")}
    ids = one_each(nodes, topic)
    for task_id in ids:
        dw.add(topic, f"body of {task_id}", id=task_id, retain=60, target=target)
    for task_id in ids:
        answer = dw.wait(task_id, 30)
        assert answer is not None and (answer["state"], answer["outcome"]) == ("done", "HTTP 200")
        assert answer["result"] == {"status": 200, "body": f"body of {task_id}"}
    listed = {task["id"] for task in dw.iter_tasks(topic=topic, state="done")}
    assert listed == set(ids)


def test_a_topics_retain_applies_on_both_nodes_and_lapses(
    nodes: list[ServerProcess], dw: ClusterClient
) -> None:
    topic, retain_s = unique(), 1.5
    # The retain comes with the rest of the record; a concurrency no test
    # reaches gives each node a share to show that it learned the record.
    dw.topic_set(topic, {"retain": retain_s, "concurrency": 1000})
    learned(nodes, topic)
    ids = one_each(nodes, topic)
    for task_id in ids:  # no retain of their own: the topic's
        dw.add(topic, task_id, id=task_id)
    for _ in ids:
        task = dw.reserve(topic, 5)
        assert task is not None
        dw.ack(task["id"], {"was": task["id"]})
    done = [dw.get(task_id) for task_id in ids]
    assert [(task["state"], task["result"]) for task in done] == [  # type: ignore[index]
        ("done", {"was": task_id}) for task_id in ids
    ]
    for task in done:
        assert task is not None
        wait_until(lambda task=task: dw.get(task["id"]) is None, 10, "the done task to go")
        assert time.time() >= task["completed"] + retain_s - 0.05  # never before its time
